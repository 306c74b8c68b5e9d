"""The pruning stage: what removing heads costs (:func:`~headscope.analyses.pruning.study.pruning_study`),
with each role's top heads ablated against random ones (it reads the ``roles`` frame).

Quick mode runs :data:`~headscope.reports.stages.quick.QUICK_PRUNING` (on a model over
:data:`~headscope.reports.stages.quick.LARGE_COST`, ``QUICK_PRUNING_LARGE``); ``--full`` every study.
Writes the ``prune_*`` frames and ``roles_vs_importance``; its summary is run.json's
``pruning_summary`` (its ``metric`` the report's ``prune_metric``).
"""

from __future__ import annotations

from dataclasses import replace

from headscope.analyses.frames import IMPACT_DTYPES
from headscope.analyses.pruning.study import PruneConfig
from headscope.reports.stages.base import RunContext, Stage, StageResult, WorkingSet

#: the columns of every pruning study's rows (baseline, ablation, importance, curves and their summary)
_STUDY_ROWS = IMPACT_DTYPES


class PruningStage(Stage[PruneConfig]):
    name = "pruning"
    Config = PruneConfig
    command = "prune"
    help = "what removing heads costs: single-head ablation, importance, pruning curves"
    requires = ("roles",)
    unit = "heads"
    place = 90
    reports_progress = True
    summary_key = "prune_summary"
    schemas = {
        "prune_baseline": _STUDY_ROWS,
        "prune_ablation": _STUDY_ROWS,
        "prune_importance": _STUDY_ROWS,
        "prune_curves": _STUDY_ROWS,
        "prune_curve_summary": _STUDY_ROWS,
        "prune_prunable": {
            "order": "str",
            "tolerance": "float64",
            "fraction_pruned": "float64",
            "query_heads_pruned": "float64",
            "kv_heads_pruned": "float64",
            "value": "float64",
            "base_value": "float64",
        },
        "roles_vs_importance": {
            "role": "str",
            "k": "int64",
            "metric": "str",
            "value_role": "float64",
            "value_random_mean": "float64",
            "value_random_std": "float64",
            "n_draws": "int64",
        },
    }

    def config(self, ctx: RunContext, given: PruneConfig | None = None) -> PruneConfig:
        from headscope.reports.stages.quick import QUICK_PRUNING, quick_pruning_for

        if given is not None:
            return given
        if ctx.full:
            return PruneConfig(seed=ctx.seed)
        cfg = PruneConfig(**QUICK_PRUNING, seed=ctx.seed)
        if ctx.shape is None:
            return cfg
        s = ctx.shape
        tier = quick_pruning_for(n_params=s.n_params, n_heads=s.n_layers * s.n_heads, threshold=ctx.large_cost)
        return cfg if tier is QUICK_PRUNING else replace(cfg, **tier)

    def blocker(self, ctx: RunContext, cfg: PruneConfig) -> str | None:
        from headscope.analyses.pruning.metrics import METRICS, check_kind, default_metric
        from headscope.probes.errors import ModelIncompatibleError
        from headscope.probes.models.backends.protocol import check_head_hooks

        metric = cfg.metric or default_metric(ctx.model)
        try:
            check_head_hooks(ctx.model)
            check_kind(metric, METRICS[metric], ctx.model)
        except (ModelIncompatibleError, ValueError) as e:
            return str(e)
        return None

    def plan(self, ctx: RunContext, cfg: PruneConfig) -> list[WorkingSet]:
        from headscope.reports.stages.plans import prune_stages

        return prune_stages(ctx.shape, cfg, ctx.tokenizer)

    def work(self, ctx: RunContext, cfg: PruneConfig):
        """Evaluations of the metric's items, each a forward of its longest item: one per head
        ablated alone (per ablation mode), one per step of every curve (``fraction_limit / step``
        steps), the role ablation's draws, and three for a gradient (forward and backward); calls:
        the evaluations' sequences × layers."""
        import math

        from headscope.analyses.pruning.metrics import default_metric
        from headscope.analyses.pruning.study import curve_keys
        from headscope.reports.stages.clock import forward_work
        from headscope.reports.stages.plans import _prune_data, longest_tokens

        s = ctx.shape
        heads = s.n_layers * s.n_heads
        items, words = _prune_data(cfg.metric or default_metric(s), cfg.items)
        t = longest_tokens(items, ctx.tokenizer, words=words)
        passes = heads * len(cfg.ablation_modes) * ("ablation" in cfg.studies)
        if "curves" in cfg.studies:
            passes += len(curve_keys(cfg)) * math.ceil(cfg.fraction_limit / cfg.step)
        passes += 3 * ("importance" in cfg.studies or "curves" in cfg.studies) + cfg.role_draws + 1
        return forward_work(s, passes * len(items), t, logits=s.causal)

    def fitted(self, cfg: PruneConfig, batch_sizes) -> PruneConfig:
        from headscope.reports.stages.plans import apply_prune

        return apply_prune(cfg, batch_sizes)

    def run(self, ctx: RunContext, cfg: PruneConfig) -> StageResult:
        from headscope.analyses.pruning.study import pruning_study
        from headscope.reports.stages.frames import prune_frames

        pr = pruning_study(ctx.model, cfg, None, roles=ctx.frames.get("roles"), progress=ctx.progress)
        return StageResult(prune_frames(pr.tables), pr.summary)

    def split(self, ctx: RunContext, cfg: PruneConfig, n: int) -> list:
        """``n`` interleaved parts of the metric's items (every ``n``-th batch, cut as one process
        cuts them): the study runs in the driver (:meth:`finish`), each of its forwards a round over
        the parts (:mod:`~headscope.reports.stages.prune_shards`): single-head ablation and every
        other score by items, gradient importance by items (per-batch gradients back in batch
        order), curves by items, a round per step. The first pass builds each part's metric."""
        from headscope.reports.stages.sharded import Interleaved

        return [Interleaved(k, n) for k in range(n)]

    def run_part(self, ctx: RunContext, cfg: PruneConfig, part) -> StageResult:
        from headscope.reports.stages.prune_shards import PruneRequest, serve

        req = part if isinstance(part, PruneRequest) else PruneRequest("items", part.k, part.n)
        return StageResult({}, {"reply": serve(ctx.model, cfg, req)})

    def merge(self, parts) -> StageResult:
        return StageResult({}, {"replies": [p.summary["reply"] for p in parts]})

    def finish(self, ctx: RunContext, cfg: PruneConfig, merged: StageResult) -> StageResult:
        """The study in the driver, its forwards on the workers (:class:`ShardedMetric`); its
        bootstrap, summaries and tables here, on the merged per-item values."""
        from headscope.analyses.pruning.study import pruning_study
        from headscope.reports.stages.frames import prune_frames

        sharded = sharded_metric(ctx, cfg, merged)
        pr = pruning_study(ctx.model, cfg, None, metric=sharded, roles=ctx.frames.get("roles"), progress=ctx.progress)
        return StageResult(prune_frames(pr.tables), pr.summary)

    def section(self, frames, meta) -> list:
        from headscope.reports.sections.pruning import pruning_absent_section, pruning_section

        why = (meta.get("absent") or {}).get("pruning")
        if why:
            return [pruning_absent_section(why)]
        rvi = frames.get("roles_vs_importance")
        return [
            pruning_section(
                frames,
                rvi,
                int(meta["layers"]),
                int(meta["heads"]),
                meta.get("prune_metric"),
                meta.get("prune_summary"),
            )
        ]

    def leaves_out(self, ctx: RunContext, cfg: PruneConfig) -> list[str]:
        from headscope.reports.stages.quick import leaves_out

        said = leaves_out(cfg)
        return [f"pruning: {said}"] if said else []


def sharded_metric(ctx: RunContext, cfg: PruneConfig, merged: StageResult):
    """The study's metric in the driver with its forwards on ``ctx.shards``' workers
    (:class:`~headscope.reports.stages.prune_shards.ShardedMetric`), from the :meth:`PruningStage.merge`
    of the parts' first pass (which items each part holds: each of the metric's once, else
    ``RuntimeError``). The stage's :meth:`PruningStage.finish` and ``headscope prune --ray`` run
    :func:`~headscope.analyses.pruning.study.pruning_study` with it."""
    from headscope.analyses.pruning.study import study_metric
    from headscope.reports.stages.prune_shards import ShardedMetric

    replies = merged.summary["replies"]
    metric = study_metric(ctx.model, cfg, None)
    held = sorted(i for r in replies for i in r["items"])
    if held != list(range(metric.n_items)):
        raise RuntimeError(f"the pruning shards hold {len(held)} items, not each of the metric's {metric.n_items} once")

    def call(requests):
        return [r.summary["reply"] for r in ctx.shards.each(ctx, STAGE, cfg, requests)]

    return ShardedMetric(metric, call, len(replies), ctx.model.spec)


STAGE = PruningStage()
