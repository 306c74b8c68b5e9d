"""The contextualisation stage: from static embedding rows to contextual representations
(:func:`~headscope.analyses.context.run.run_context`), the report section "From static to
contextual". ``headscope context MODEL --sentence ... --word ...`` is derived from its config.
"""

from __future__ import annotations

from dataclasses import fields, replace

from headscope.analyses.context.run import ContextConfig
from headscope.probes.budget import Shape
from headscope.reports.stages.base import RunContext, Stage, StageAbsent, StageResult, WorkingSet

_STAT = {"value": "float64", "ci_low": "float64", "ci_high": "float64", "n": "int64"}

#: the quick report's share of the sense set (``--full``: all of it)
QUICK = {"max_per_sense": 5, "attention_sentences": 24, "n_perm": 20, "n_boot": 500}


def context_working_set(shape: Shape, cfg: ContextConfig, n_sentences: int, longest: int) -> WorkingSet:
    """One padded forward of ``cfg.batch_size`` sentences of up to ``longest`` tokens: every
    layer's pattern and raw ``q·k`` kept (``kept_layers`` twice the layers, quadratic in length as
    any pattern); besides them, linear in length: per sentence of the batch its residual stream
    at every depth (captured, then stacked), its values repeated per query head and its attention
    outputs, and, kept for the whole run, each sentence's content-token states at every depth
    (the anisotropy baseline draws from all of them), spread over the batch's rows. The pair-wise
    norm-based contributions are streamed in query chunks (no ``[query, key, d_model]`` tensor)."""
    f32, t, d, L = 4, longest, shape.d_model, shape.n_layers
    per_row = f32 * t * (2 * (L + 1) * d + L * shape.n_heads * shape.d_head + L * d)
    kept = f32 * t * (L + 2) * d * -(-n_sentences // cfg.batch_size)  # [depth, pos, d_model] per sentence
    return WorkingSet(
        name="context",
        batch_size=cfg.batch_size,
        longest=longest,
        kept_layers=2 * L,
        logits="all" if shape.causal else "none",  # a decoder's forward unembeds every position
        statistics=True,
        cache_per_row=per_row + kept,
    )


class ContextStage(Stage[ContextConfig]):
    name = "context"
    Config = ContextConfig
    help = "from static to contextual: self-similarity, senses, norm-based attention, distance by depth"
    unit = "items"
    summary_key = "context_summary"
    place = 45
    warn_absent = False
    default_on = True  # batched forwards: well under the 1.3x-roles price #41 sets
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
        """The given config (``ValueError`` before anything loads when its ``word`` is not in its
        ``sentence``: the sentence's words and pieces in one line), else the defaults; without
        ``--full``, the fields left at their defaults take the quick settings."""
        if given is not None:
            tokenizer = ctx.tokenizer or getattr(ctx.model, "tokenizer", None)
            if given.sentence is not None and tokenizer is not None:
                from headscope.analyses.context.contributions import check_target

                check_target(tokenizer, given.sentence, given.word, given.pooling, given.piece)
        cfg = given if given is not None else ContextConfig(seed=ctx.seed)
        if ctx.full:
            return cfg
        defaults = {f.name: f.default for f in fields(ContextConfig)}
        return replace(cfg, **{k: v for k, v in QUICK.items() if getattr(cfg, k) == defaults[k]})

    def blocker(self, ctx: RunContext, cfg: ContextConfig) -> str | None:
        net = getattr(ctx.model, "network", None)
        if net is None or not hasattr(net, "blocks"):
            return "the contextualisation stage reads the in-house transformer (load with --backend inhouse)"
        return None

    def by_design(self, reason: str, backend: str | None) -> bool:
        """It reads the in-house transformer's states (its blocker says so off that backend)."""
        return backend != "inhouse" and "in-house transformer" in reason

    def plan(self, ctx: RunContext, cfg: ContextConfig) -> list[WorkingSet]:
        from headscope.analyses.context.run import run_sentences
        from headscope.reports.stages.plans import longest_tokens

        sentences = run_sentences(cfg)
        return [context_working_set(ctx.shape, cfg, len(sentences), longest_tokens(sentences, ctx.tokenizer))]

    def work(self, ctx: RunContext, cfg: ContextConfig):
        """One forward per distinct sentence at the longest one's length (the contributions and
        the anisotropy baseline ride on its captured states); calls: its sentences × layers."""
        from headscope.analyses.context.run import run_sentences
        from headscope.reports.stages.clock import forward_work
        from headscope.reports.stages.plans import longest_tokens

        sentences = run_sentences(cfg)
        t = longest_tokens(sentences, ctx.tokenizer)
        return forward_work(ctx.shape, len(sentences), t, logits=ctx.shape.causal)

    def fitted(self, cfg: ContextConfig, batch_sizes) -> ContextConfig:
        b = batch_sizes.get("context")
        return replace(cfg, batch_size=b) if b is not None and b < cfg.batch_size else cfg

    def run(self, ctx: RunContext, cfg: ContextConfig) -> StageResult:
        return self._frames(ctx, cfg, None)

    def _frames(self, ctx: RunContext, cfg: ContextConfig, collected: dict | None) -> StageResult:
        from headscope.analyses.context.run import run_context

        try:
            frames, summary = run_context(ctx.model, cfg, collected)
        except ValueError as e:  # a word not in its sentence, a sense file with nothing left: said, not fatal
            raise StageAbsent(f"the contextualisation stage could not run: {str(e).splitlines()[0]}") from e
        # the declared dtypes (strings as object, whatever pandas' default string dtype)
        named = {f"context_{k}": v for k, v in frames.items()}
        return StageResult({k: v.astype(dict(self.schemas[k])) for k, v in named.items()}, summary)

    def split(self, ctx: RunContext, cfg: ContextConfig, n: int) -> list:
        """``n`` interleaved parts of the sense set's batches of sentences (cut as one process cuts
        them): each sentence's states, word reps and head statistics come back; the similarity,
        sense probes, permutations, bootstrap and trends run after the merge (:meth:`finish`)."""
        from headscope.reports.stages.sharded import Interleaved

        return [Interleaved(k, n) for k in range(n)]

    def run_part(self, ctx: RunContext, cfg: ContextConfig, part) -> StageResult:
        from headscope.analyses.context.run import collect_part

        return StageResult({}, {"collected": collect_part(ctx.model, cfg, (part.k, part.n))})

    def merge(self, parts) -> StageResult:
        """The parts' collected values in one; the bootstrap intervals and the trend test are drawn
        over all sentences at once, in :meth:`finish`."""
        from headscope.analyses.context.run import merge_collected

        return StageResult({}, {"collected": merge_collected([p.summary["collected"] for p in parts])})

    def finish(self, ctx: RunContext, cfg: ContextConfig, merged: StageResult) -> StageResult:
        return self._frames(ctx, cfg, merged.summary["collected"])

    def section(self, frames, meta) -> list:
        from headscope.reports.sections.context import context_section

        s = context_section(frames, meta)
        return [] if s is None else [s]

    def describe(self, frames, summary) -> str | None:
        """The ranked context words of ``--word`` (per layer by norm-based contribution, and by
        rollout), else the verdicts: self-similarity by depth, senses, distance by depth."""
        from headscope.reports.sections.context import describe_context

        return describe_context(frames, summary)

    def leaves_out(self, ctx: RunContext, cfg: ContextConfig) -> list[str]:
        if ctx.full:
            return []
        return [
            f"context: {QUICK['max_per_sense']} sentences per sense, {QUICK['attention_sentences']} sentences of "
            f"attention statistics, {QUICK['n_perm']} permutations"
        ]


STAGE = ContextStage()
