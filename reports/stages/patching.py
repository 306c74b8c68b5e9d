"""The patching stage: causal evidence per role, activation (denoising) and attribution patching
of every head on the task each role names (:func:`~headscope.analyses.run_patching.run_patching`).

Writes ``patching`` (``task`` + the patching frame's columns); its summary is run.json's
``patching_summary``. Its report part is the "Causal evidence" section.
"""

from __future__ import annotations

from dataclasses import replace

from headscope.analyses.run_patching import CausalConfig
from headscope.reports.stages.base import RunContext, Stage, StageResult, WorkingSet

#: a patched row's cost beside its forward, in GFLOP of work: its hooks' reads and writes, its metric
#: and its share of the statistics. Set from the calibration's patching rows, where it dominates (MiniLM-L6
#: and a 2-layer Qwen2 shape take 6-7 ms a row on one core whatever their forward's FLOPs), not fitted
PATCH_ROW_GFLOP = 2.0


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
        """Its patched rows (items per task × heads × tasks, :meth:`CausalConfig.items_per_task`),
        each a forward of the tasks' longest sequence plus :data:`PATCH_ROW_GFLOP`; calls: the
        rows × layers."""
        from headscope.reports.stages.clock import Work, forward_work
        from headscope.reports.stages.plans import report_tasks

        s, tasks = ctx.shape, report_tasks()
        heads = s.n_layers * s.n_heads
        rows = cfg.items_per_task(n_heads=heads, n_tasks=len(tasks), full=ctx.full) * heads * len(tasks)
        t = max(w.longest for w in ctx.plans.get(self.name) or self.plan(ctx, cfg))
        return forward_work(s, rows, t) + Work(rows * PATCH_ROW_GFLOP)

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

        done = patching_part(ctx.model, ctx.frames["roles"], cfg, full=ctx.full, part=(part.k, part.n))
        return StageResult({}, done)  # per-unit effects, per-item estimates: merged and finished in the driver

    def merge(self, parts) -> StageResult:
        from headscope.analyses.patching.parts import merge_parts

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


STAGE = PatchingStage()
