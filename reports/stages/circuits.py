"""The circuits stage: an edge circuit of the model on one patching task (induction by default),
scored by EAP-IG, its faithfulness at a few of MIB's budgets beside random circuits, and the
circuit at one budget drawn (:func:`~headscope.analyses.circuits.edges.study.run_circuits`).

Writes ``circuit_edges`` and ``circuit_faithfulness``; its summary is run.json's
``circuits_summary``. Its report part is "Circuits". Off by default (``--circuits`` or
``--only ...,circuits``): on SmolLM2-135M it adds about a minute of one core (docs/guide/circuits.md).
Blocked, with the reason, on encoders (the task reads next-token logits) and on models whose
forward is no sum of sender outputs (another backend, post-norm, sandwich norms, pruned or gated heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from headscope.analyses.circuits.edges.study import CircuitsConfig
from headscope.reports.stages.base import RunContext, Stage, StageAbsent, StageResult, WorkingSet

if TYPE_CHECKING:
    import torch


class CircuitsStage(Stage[CircuitsConfig]):
    name = "circuits"
    Config = CircuitsConfig
    command = "circuit"
    help = "an edge circuit (EAP-IG) on the induction task: faithfulness at budgets beside random circuits"
    unit = "items"
    summary_key = "circuits_summary"
    default_on = False
    warn_absent = False
    schemas = {
        "circuit_edges": {
            "sender": "category",
            "receiver": "category",
            "via": "category",
            "score": "float64",
            "rank": "int64",
            "method": "category",
            "kept_at": "float64",
        },
        "circuit_faithfulness": {
            "budget": "float64",
            "n_edges": "int64",
            "n_edges_pruned": "int64",
            "metric": "float64",
            "faithfulness": "float64",
            "random_mean": "float64",
            "random_std": "float64",
            "random_min": "float64",
            "random_max": "float64",
            "n_seeds": "int64",
        },
    }

    def config(self, ctx: RunContext, given: CircuitsConfig | None = None) -> CircuitsConfig:
        """The given settings, else the quick ones; ``--full``: MIB's ten budgets, 16 items, 5 random circuits."""
        if given is not None:
            return given
        if not ctx.full:
            return CircuitsConfig(seed=ctx.seed)
        from headscope.analyses.circuits.edges.graph import MIB_BUDGETS

        return CircuitsConfig(seed=ctx.seed, n_items=16, budgets=MIB_BUDGETS, seeds=5)

    def leaves_out(self, ctx: RunContext, cfg: CircuitsConfig) -> list[str]:
        if ctx.full or cfg != CircuitsConfig(seed=ctx.seed):
            return []
        return [
            f"circuits: {cfg.n_items} items, {len(cfg.budgets)} of MIB's 10 budgets, {cfg.seeds} random circuits each "
            "(--full: 16 items, all 10 budgets, 5 random circuits)"
        ]

    def blocker(self, ctx: RunContext, cfg: CircuitsConfig) -> str | None:
        from headscope.probes.errors import ModelIncompatibleError
        from headscope.probes.models.inhouse.edge_forward import check_graph_model

        spec = getattr(ctx.model, "spec", None)
        if spec is not None and not getattr(spec, "causal", True):
            return f"edge circuits need next-token logits; {spec.name} is an encoder"
        try:
            check_graph_model(ctx.model)
        except ModelIncompatibleError as e:
            return str(e).splitlines()[0]
        return None

    def by_design(self, reason: str, backend: str | None) -> bool:
        """Edge circuits need a forward that is a sum of sender outputs: the in-house pre-norm decoders."""
        return "edge circuits need" in reason

    def plan(self, ctx: RunContext, cfg: CircuitsConfig) -> list[WorkingSet]:
        from headscope.reports.stages.plans import circuit_stages, task_longest

        if not ctx.shape.causal:
            return []
        longest = task_longest(cfg.task, cfg.seq_len, ctx.tokenizer)
        return circuit_stages(ctx.shape, batch_size=cfg.batch_size, longest=longest, n_items=cfg.n_items)

    def work(self, ctx: RunContext, cfg: CircuitsConfig):
        """Its passes over the task's items at the longest item's length, with their logits: the edge
        scores' clean run and, per interpolation step, a forward and its backward (three passes;
        EAP: one step; EAP-IG-activations: ``2 × layers + 1`` node runs per step), then the
        faithfulness's clean and corrupted runs and one per budget for its circuit and each random
        one; calls: the passes' items × layers."""
        from headscope.reports.stages.clock import Work, forward_work
        from headscope.reports.stages.plans import task_longest

        if not ctx.shape.causal:
            return Work()
        steps = {"eap": 1, "eap-ig": cfg.steps}.get(cfg.method, (2 * ctx.shape.n_layers + 1) * cfg.steps)
        passes = 1 + 3 * steps + 2 + len(cfg.budgets) * (1 + cfg.seeds)
        t = task_longest(cfg.task, cfg.seq_len, ctx.tokenizer)
        return forward_work(ctx.shape, passes * cfg.n_items, t, logits=True)

    def fitted(self, cfg: CircuitsConfig, batch_sizes) -> CircuitsConfig:
        from dataclasses import replace

        asked = min(cfg.batch_size, cfg.n_items)  # the plan's batch (circuit_stages): no more than the items
        b = min([batch_sizes.get(n, asked) for n in ("circuit scores", "circuit evaluation")])
        return cfg if b >= asked else replace(cfg, batch_size=b)

    def run(self, ctx: RunContext, cfg: CircuitsConfig) -> StageResult:
        return self._study(ctx, cfg, None, None)

    def _study(self, ctx: RunContext, cfg: CircuitsConfig, sums: dict | None, evaluate) -> StageResult:
        from headscope.analyses.circuits.edges.study import run_circuits

        try:
            frames, summary = run_circuits(ctx.model, cfg, sums, evaluate)
        except ValueError as e:  # a task the model's tokenizer cannot give, or one that does not move the metric
            raise StageAbsent(f"the circuits stage could not run: {str(e).splitlines()[0]}") from e
        return StageResult(frames, summary)

    def split(self, ctx: RunContext, cfg: CircuitsConfig, n: int) -> list:
        """Interleaved parts of the task's batches of items (cut as one process cuts them: ``cfg.batch_size``
        items of one length each), at most one per batch: each worker returns its batches' sums of
        the edge scores over their items; the driver adds them in batch order (the same floats as one
        process, so the tables are equal) and runs the circuit search, faithfulness and random
        circuits on the merged scores (:meth:`finish`). The quick settings' 8 items are one batch of
        16: ``--batch-size 4`` gives two workers two batches each."""
        from headscope.analyses.circuits.edges.study import circuit_task, n_batches
        from headscope.reports.stages.sharded import Interleaved

        try:
            task = circuit_task(ctx.model, cfg)
        except ValueError as e:  # as in run(): the task the model cannot give, said before any worker starts
            raise StageAbsent(f"the circuits stage could not run: {str(e).splitlines()[0]}") from e
        m = max(1, min(n, n_batches(task, cfg.batch_size)))
        return [Interleaved(k, m) for k in range(m)]

    def run_part(self, ctx: RunContext, cfg: CircuitsConfig, part) -> StageResult:
        from headscope.analyses.circuits.edges.study import evaluate_part, score_part

        if isinstance(part, CircuitEvaluation):  # the second round: circuits' metrics (finish)
            which = list(range(part.k, len(part.masks), part.n))
            return StageResult({}, {"metrics": evaluate_part(ctx.model, cfg, part.masks, which)})
        return StageResult({}, {"sums": score_part(ctx.model, cfg, (part.k, part.n))})

    def merge(self, parts) -> StageResult:
        """The parts' batch sums in one ``{batch: [sender, receiver]}`` (the parts' batches are
        disjoint; ``ValueError`` if two parts computed one batch)."""
        sums: dict = {}
        for p in parts:
            twice = sorted(set(sums) & set(p.summary["sums"]))
            if twice:
                raise ValueError(f"the circuits stage's parts overlap: batches {twice} were computed twice")
            sums.update(p.summary["sums"])
        return StageResult({}, {"sums": sums})

    def finish(self, ctx: RunContext, cfg: CircuitsConfig, merged: StageResult) -> StageResult:
        """The study on the merged scores; with the run's workers (``ctx.shards``) its circuits'
        exact evaluation (the full and empty graphs, each budget's circuit and random ones) is
        shared among them too, interleaved by circuit: each circuit's metric is computed as one
        process computes it, over every batch, so the faithfulness frame is the same."""
        pool = ctx.shards
        evaluate = None if pool is None else (lambda masks: evaluate_on(pool, ctx, cfg, masks))
        return self._study(ctx, cfg, merged.summary["sums"], evaluate)

    def section(self, frames, meta) -> list:
        from headscope.reports.sections.circuits import circuits_section

        absent = (meta.get("absent") or {}).get(self.name)
        if ((meta.get("stages") or {}).get(self.name) or {}).get("status") == "off":
            return []  # turned off (by default, --skip, --no-circuits, not in --only): nothing to say
        s = circuits_section(frames, meta, meta.get(self.key()), absent)
        return [] if s is None else [s]

    def describe(self, frames, summary) -> str | None:
        if not summary:
            return None
        rows = ", ".join(f"{r['budget']:g}: {r['faithfulness']:.3f}" for r in summary.get("faithfulness", []))
        return f"circuits: faithfulness by budget {rows}; CPR {summary['cpr']:.3f} (random {summary['random_cpr']:.3f})"


@dataclass(frozen=True)
class CircuitEvaluation:
    """Part ``k`` of ``n`` of the circuits' evaluation: circuits ``k, k+n, ...`` of ``masks``
    (``[circuit, sender, receiver]`` bool, :func:`~headscope.analyses.circuits.edges.evaluate.circuit_masks`)."""

    k: int
    n: int
    masks: torch.Tensor

    def __repr__(self) -> str:
        return f"circuits {self.k}, {self.k + self.n}, ... of {len(self.masks)}"


class _Evaluation:
    """The circuits stage's second round on the workers (its :meth:`CircuitsStage.run_part` takes
    :class:`CircuitEvaluation` parts): the parts' metrics joined, nothing to finish."""

    name, unit = "circuits", "items"

    def merge(self, parts) -> StageResult:
        metrics: dict = {}
        for p in parts:
            metrics.update(p.summary["metrics"])
        return StageResult({}, {"metrics": metrics})

    def finish(self, ctx, cfg, merged: StageResult) -> StageResult:
        return merged


def evaluate_on(pool, ctx: RunContext, cfg: CircuitsConfig, masks: torch.Tensor) -> list[float]:
    """``m(C)`` of every circuit of ``masks``, the circuits interleaved over ``pool``'s workers (the
    stage's :meth:`CircuitsStage.finish` and ``headscope circuit --ray``)."""
    n = max(1, min(pool.workers, len(masks)))
    got = pool.run(ctx, _Evaluation(), cfg, [CircuitEvaluation(k, n, masks) for k in range(n)]).summary["metrics"]
    if sorted(got) != list(range(len(masks))):
        raise ValueError(f"the circuits' evaluation gave circuits {sorted(got)} of {len(masks)}")
    return [got[i] for i in range(len(masks))]


STAGE = CircuitsStage()
