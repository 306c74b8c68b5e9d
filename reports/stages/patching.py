"""The patching stage: causal evidence per role, activation (denoising) and attribution patching
of every head on the task each role names (:func:`~headscope.analyses.run_patching.run_patching`).

Writes ``patching`` (``task`` + the patching frame's columns); its summary is run.json's
``patching_summary``. Its report part is the "Causal evidence" section.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from headscope.analyses.run_patching import CausalConfig
from headscope.reports.stages.base import RunContext, Stage, StageResult, WorkingSet

#: attribution patching's backward, in forwards of its rows: the gradient reaching every layer's ``z``
#: and the weights' (the model's parameters keep ``requires_grad``), each about a forward's products
BACKWARD_FORWARDS = 2


class PatchingStage(Stage[CausalConfig]):
    name = "patching"
    Config = CausalConfig
    command = "patch"
    help = "causal evidence per role: activation and attribution patching on each role's task"
    requires = ("roles",)
    unit = "heads"
    summary_key = "patching_summary"
    schemas = {
        "patching": {
            "task": "str",
            "layer": "int64",
            "head": "int64",
            "method": "str",
            "effect": "float64",
            "ci_low": "float64",
            "ci_high": "float64",
            "p_value": "float64",
            "significant": "bool",
            "n": "int64",
            "p_raw": "float64",
            "unit": "str",
            "definition": "str",
        },
    }

    def config(self, ctx: RunContext, given: CausalConfig | None = None) -> CausalConfig:
        from headscope.reports.stages.quick import QUICK_PATCHING_LARGE, is_large

        cfg = given if given is not None else CausalConfig(seed=ctx.seed)
        if ctx.full or ctx.shape is None or cfg.n_items is not None:
            return cfg
        s = ctx.shape
        if not is_large(n_params=s.n_params, n_heads=s.n_layers * s.n_heads, threshold=ctx.large_cost):
            return cfg
        return replace(cfg, **{k: min(v, getattr(cfg, k)) for k, v in QUICK_PATCHING_LARGE.items()})

    def blocker(self, ctx: RunContext, cfg: CausalConfig) -> str | None:
        from headscope.analyses.run_patching import patching_blocker

        return patching_blocker(ctx.model)

    def plan(self, ctx: RunContext, cfg: CausalConfig) -> list[WorkingSet]:
        from headscope.analyses.patching.activation import PatchConfig
        from headscope.reports.stages.plans import patch_stages, report_tasks, task_longest

        longest = max(task_longest(t, 10, ctx.tokenizer) for t in report_tasks())
        patch = PatchConfig(batch_size=cfg.batch_size, max_rows=cfg.max_rows)
        return patch_stages(ctx.shape, patch, longest=longest)

    def work(self, ctx: RunContext, cfg: CausalConfig):
        """:func:`patch_work` of the report's tasks, each at its longest sequence."""
        from headscope.reports.stages.plans import report_tasks, task_longest

        longest = {t: task_longest(t, 10, ctx.tokenizer) for t in report_tasks()}
        return patch_work(ctx.shape, cfg, longest, full=ctx.full)

    def fitted(self, cfg: CausalConfig, batch_sizes) -> CausalConfig:
        from headscope.reports.stages.plans import apply_patch

        fitted = apply_patch(cfg, batch_sizes)
        if (fitted.batch_size, fitted.max_rows) == (cfg.batch_size, cfg.max_rows):
            return cfg
        return replace(cfg, batch_size=fitted.batch_size, max_rows=fitted.max_rows)

    def run(self, ctx: RunContext, cfg: CausalConfig) -> StageResult:
        from headscope.analyses.run_patching import run_patching

        frame, summary = run_patching(ctx.model, ctx.frames["roles"], cfg, full=ctx.full)
        return StageResult({"patching": frame}, summary)

    def split(self, ctx: RunContext, cfg: CausalConfig, n: int) -> list:
        """``n`` interleaved parts: of activation patching's patched forwards (each patching a run of
        units, heads or KV groups, as one process does) and of attribution patching's batches of
        items (cut as one process cuts them). The effects of every unit and the estimates of every
        item are merged, then the frames, intervals, p-values and the adjustment over all units run
        in the driver (:meth:`finish`)."""
        from headscope.reports.stages.sharded import Interleaved

        return [Interleaved(k, n) for k in range(n)]

    def run_part(self, ctx: RunContext, cfg: CausalConfig, part) -> StageResult:
        from headscope.analyses.patching.parts import patching_part

        if isinstance(part, StudyPart):  # headscope patch --ray: its own task and settings
            from headscope.analyses.patching.activation import activation_deltas

            return StageResult({}, {"study": activation_deltas(ctx.model, part.task, part.patch, (part.k, part.n))})
        done = patching_part(ctx.model, ctx.frames["roles"], cfg, full=ctx.full, part=(part.k, part.n))
        return StageResult({}, done)  # per-unit effects, per-item estimates: merged and finished in the driver

    def merge(self, parts) -> StageResult:
        from headscope.analyses.patching.parts import merge_parts

        if parts and "study" in parts[0].summary:  # StudyPart's: each unit's effect from the part that ran it
            from headscope.analyses.patching.activation import merge_deltas

            done = [p.summary["study"] for p in parts]
            return StageResult({}, {"study": (merge_deltas([d for d, _ in done]), done[0][1])})
        return StageResult({}, merge_parts([dict(p.summary) for p in parts]))

    def finish(self, ctx: RunContext, cfg: CausalConfig, merged: StageResult) -> StageResult:
        from headscope.analyses.run_patching import run_patching

        done = merged.summary
        frame, summary = run_patching(
            ctx.model,
            ctx.frames["roles"],
            cfg,
            full=ctx.full,
            activation=done["activation"],
            attribution=done["attribution"],
        )
        return StageResult({"patching": frame}, summary)

    def section(self, frames, meta) -> list:
        from headscope.reports.sections.causal import causal_sections

        if not (meta.get(self.key()) or (meta.get("absent") or {}).get(self.name)):
            return []
        return causal_sections(frames, meta, int(meta["layers"]), int(meta["heads"]))

    def leaves_out(self, ctx: RunContext, cfg: CausalConfig) -> list[str]:
        if cfg.unit is not None or cfg.n_items is not None:
            return []
        return [
            f"patching: heads one by one on GQA models (quick patches a KV group as one unit); items per task "
            f"past {cfg.row_budget} // (units x tasks) (at least {cfg.min_items}; --full: {cfg.max_items})"
        ]


@dataclass(frozen=True)
class StudyPart:
    """Part ``k`` of ``n`` of one task's activation patching as ``headscope patch --ray`` sets it
    (``task``: the loaded :class:`~headscope.analyses.patching.items.Task`; ``patch``: its
    :class:`~headscope.analyses.patching.activation.PatchConfig`, not per position): the patched
    forwards ``k, k+n, ...`` of every batch (:func:`~headscope.analyses.patching.activation.activation_deltas`).
    The stage's :meth:`PatchingStage.merge` joins the parts' effects (each unit's from the forward
    one process patches it in) and the clean and corrupted runs' metrics (every part runs them)."""

    k: int
    n: int
    task: object
    patch: object

    def __repr__(self) -> str:
        return f"patched forwards {self.k}, {self.k + self.n}, ... of task {getattr(self.task, 'name', '?')}"


def study_parts(model, task, patch, workers: int) -> list[StudyPart]:
    """``task``'s activation patching in ``min(workers, units)`` :class:`StudyPart` s (a batch
    patches its units in at most that many forwards)."""
    from headscope.analyses.patching.activation import chosen_units

    n = max(1, min(workers, len(chosen_units(model.spec, patch))))
    return [StudyPart(k, n, task, patch) for k in range(n)]


def patch_work(shape, cfg: CausalConfig, longest: dict[str, int], *, full: bool):
    """The :class:`~headscope.reports.stages.clock.Work` of :func:`~headscope.analyses.run_patching.run_patching`
    on tasks of ``longest`` tokens (task -> its longest sequence, every item counted at it), from what
    its loop runs per batch of ``min(batch_size, items)`` items of each task:

    * activation and attribution patching each run the clean and the corrupted input (4 forwards);
    * activation patching: a row per unit, ``max_rows // batch`` units per forward, each forward
      resumed at its first unit's layer (the in-house backend) after one forward of the batch up to
      that layer; units are KV groups where :meth:`CausalConfig.unit_for` says so;
    * attribution patching: one forward with gradients and its backward (:data:`BACKWARD_FORWARDS`).

    ``gflop``: those rows' layers (:func:`~headscope.reports.stages.clock.token_gflop` per layer) and,
    on a decoder, each row's unembedding of its last position (``2 × d_model × vocab``); ``slow_gflop``:
    per forward that unembeds, one row's unembedding again: a product of a few rows reads the whole
    ``vocab × d_model`` matrix, at the memory's speed, not the matmul's (much of a 2-layer model's
    time, little of SmolLM2-135M's). ``calls``: none (each forward's hooks and Python, a few hundred
    forwards, are under what the calibration's four rows resolve).

    >>> from headscope.probes.budget import Shape
    >>> s = Shape(n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, d_head=16, d_mlp=256, vocab_size=1000,
    ...           n_params=200_000, causal=True)
    >>> w = patch_work(s, CausalConfig(), {"t": 10}, full=False)  # 64 items: 4 batches of 8 forwards
    >>> round(w.slow_gflop * 1e9 / (2 * 64 * 1000))
    32
    """
    from math import ceil

    from headscope.reports.stages.clock import Work, token_gflop

    n_layers = shape.n_layers
    per_layer = shape.n_kv_heads if cfg.unit_for(shape, full=full) == "kv_group" else shape.n_heads
    units = n_layers * per_layer
    items = cfg.items_per_task(n_heads=units, n_tasks=len(longest), full=full)
    batch = min(cfg.batch_size, items)
    per = max(1, cfg.max_rows // batch)
    firsts = [s // per_layer for s in range(0, units, per)]  # each patched forward's first layer
    patched_layers = sum(min(per, units - s) * (n_layers - s // per_layer) for s in range(0, units, per))
    whole = 4 + 1 + BACKWARD_FORWARDS  # per item: both runs of both methods, attribution's forward and backward
    row_layers = whole * n_layers + patched_layers + sum(set(firsts))  # per item, the prefixes' included
    unembed = 2 * shape.d_model * shape.vocab_size / 1e9 if shape.causal else 0.0
    work = Work()
    for t in longest.values():
        layer = t * token_gflop(shape, t) / n_layers
        reads = ceil(items / batch) * (whole + len(firsts)) * unembed
        work += Work(items * (row_layers * layer + (whole + units) * unembed), 0, reads)
    return work


STAGE = PatchingStage()
