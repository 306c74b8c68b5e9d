"""The contextualisation stage: from static embedding rows to contextual representations
(:func:`~headscope.analyses.context.run.run_context`), the report section "From static to
contextual". ``headscope context MODEL --sentence ... --word ...`` is derived from its config.
"""

from __future__ import annotations

from dataclasses import replace

from headscope.analyses.context.run import ContextConfig
from headscope.reports.stages.base import RunContext, Stage, StageAbsent, StageResult, WorkingSet

_STAT = {"value": "float64", "ci_low": "float64", "ci_high": "float64", "n": "int64"}

#: the quick report's share of the sense set (``--full``: all of it)
QUICK = {"max_per_sense": 6, "n_perm": 20, "n_boot": 500}


class ContextStage(Stage[ContextConfig]):
    name = "context"
    Config = ContextConfig
    help = "from static to contextual: self-similarity, senses, norm-based attention, distance by depth"
    unit = "items"
    summary_key = "context_summary"
    place = 45
    warn_absent = False
    default_on = False  # one forward per sentence today: over the 1.3x-roles price #41 sets, so asked for
    schemas = {
        "context_similarity": {"depth": "int64", "metric": "object", **_STAT},
        "context_senses": {
            "depth": "int64",
            "metric": "object",
            **_STAT,
            "baseline": "float64",
            "margin_ci_low": "float64",
            "margin_ci_high": "float64",
            "silhouette": "float64",
            "n_beyond_chance": "int64",
        },
        "context_heads": {"layer": "int64", "head": "int64", "metric": "object", **_STAT},
        "context_layers": {"layer": "int64", "qk_std": "float64", "reversals": "int64", "scale": "float64"},
        "context_contributions": {
            "layer": "int64",
            "method": "object",
            "context": "object",
            "position": "int64",
            "value": "float64",
            "rank": "int64",
        },
    }

    def config(self, ctx: RunContext, given: ContextConfig | None = None) -> ContextConfig:
        if given is not None:
            return given
        cfg = ContextConfig(seed=ctx.seed)
        return cfg if ctx.full else replace(cfg, **QUICK)

    def blocker(self, ctx: RunContext, cfg: ContextConfig) -> str | None:
        net = getattr(ctx.model, "network", None)
        if net is None or not hasattr(net, "blocks"):
            return "the contextualisation stage reads the in-house transformer (load with --backend inhouse)"
        return None

    def by_design(self, reason: str, backend: str | None) -> bool:
        """It reads the in-house transformer's states (its blocker says so off that backend)."""
        return backend != "inhouse" and "in-house transformer" in reason

    def plan(self, ctx: RunContext, cfg: ContextConfig) -> list[WorkingSet]:
        return []  # one sentence at a time: patterns of a few dozen tokens

    def run(self, ctx: RunContext, cfg: ContextConfig) -> StageResult:
        from headscope.analyses.context.run import run_context

        try:
            frames, summary = run_context(ctx.model, cfg)
        except ValueError as e:  # a word not in its sentence, a sense file with nothing left: said, not fatal
            raise StageAbsent(f"the contextualisation stage could not run: {str(e).splitlines()[0]}") from e
        return StageResult({f"context_{k}": v for k, v in frames.items()}, summary)

    def section(self, frames, meta) -> list:
        from headscope.reports.sections.context import context_section

        s = context_section(frames, meta)
        return [] if s is None else [s]

    def leaves_out(self, ctx: RunContext, cfg: ContextConfig) -> list[str]:
        if ctx.full:
            return []
        return [f"context: {QUICK['max_per_sense']} sentences per sense, {QUICK['n_perm']} permutations"]

    def merge(self, parts):
        """Bootstrap intervals and the trend test are drawn over all sentences at once: the frames
        of parts do not combine into the whole's. One part is returned as it is."""
        if len(parts) == 1:
            return parts[0]
        raise ValueError("stage 'context': its intervals are drawn over all sentences; run it on the whole")


STAGE = ContextStage()
