"""The weights stage: circuits read from the in-house model's weights (OV copying, K-composition),
joined with the roles and, where it ran, patching (:func:`~headscope.analyses.run_weights.run_weights`).

Writes ``weights_heads``, ``weights_composition`` and the ``join_*`` frames; its summary is
run.json's ``weights_summary``. Its report part is "From the weights".
"""

from __future__ import annotations

from dataclasses import replace

from headscope.analyses.run_weights import WeightsConfig
from headscope.reports.stages.base import RunContext, Stage, StageResult, WorkingSet


class WeightsStage(Stage[WeightsConfig]):
    name = "weights"
    Config = WeightsConfig
    help = "circuits from the weights: OV copying and K-composition, joined with the roles and patching"
    requires = ("roles",)
    after = ("patching",)
    unit = "layers"
    summary_key = "weights_summary"
    schemas = {}

    def config(self, ctx: RunContext, given: WeightsConfig | None = None) -> WeightsConfig:
        from headscope.reports.stages.quick import QUICK_WEIGHTS_LARGE, is_large

        cfg = given if given is not None else WeightsConfig(seed=ctx.seed)
        s = ctx.shape
        if ctx.full or s is None:
            return cfg
        large = is_large(n_params=s.n_params, n_heads=s.n_layers * s.n_heads, threshold=ctx.large_cost)
        return replace(cfg, **QUICK_WEIGHTS_LARGE) if large else cfg

    def blocker(self, ctx: RunContext, cfg: WeightsConfig) -> str | None:
        from headscope.analyses.run_weights import weights_blocker

        return weights_blocker(ctx.model)

    def plan(self, ctx: RunContext, cfg: WeightsConfig) -> list[WorkingSet]:
        from headscope.reports.stages.plans import weights_stage

        return [weights_stage(ctx.shape, cfg)]

    def run(self, ctx: RunContext, cfg: WeightsConfig) -> StageResult:
        from headscope.analyses.run_weights import run_weights

        frames, summary = run_weights(ctx.model, ctx.frames, cfg)
        return StageResult(frames, summary)

    def section(self, frames, meta) -> list:
        from headscope.reports.sections.weights import weights_section

        s = weights_section(frames, meta, int(meta["layers"]), int(meta["heads"]))
        return [] if s is None else [s]

    def leaves_out(self, ctx: RunContext, cfg: WeightsConfig) -> list[str]:
        from headscope.reports.stages.quick import stages_leave_out

        return stages_leave_out(None, cfg, context=ctx.context)


STAGE = WeightsStage()
