"""The KV-cache stage, on a causal decoder: the KV-cache compression study and the long-context
roles (:func:`~headscope.analyses.kvcache.stage.run_kv`).

Writes the ``kv_*`` and long-context frames; its summary is run.json's ``kv_summary``. Its report
part is "Long context and the KV cache". Inputs the tokenizer or the context cannot give make it
absent with the reason, never fatal.
"""

from __future__ import annotations

from dataclasses import replace

from headscope.analyses.kvcache.stage import KVStageConfig
from headscope.reports.stages.base import RunContext, Stage, StageAbsent, StageResult, WorkingSet


def _tokens(cfg: KVStageConfig) -> int:
    from headscope.analyses.kvcache.study import REPORT_KV

    if cfg.study is not None:
        return cfg.study.tokens
    return REPORT_KV.tokens if cfg.tokens is None else cfg.tokens


class KVStage(Stage[KVStageConfig]):
    name = "kv"
    Config = KVStageConfig
    command = "kv"
    help = "long context and the KV cache: what compressing the cache costs, the long-context roles"
    unit = "kv_groups"
    summary_key = "kv_summary"
    warn_absent = False
    schemas = {
        "long_context_roles": {
            "layer": "int64",
            "head": "int64",
            "role": "str",
            "relation": "str",
            "direction": "str",
            "score": "float64",
            "baseline": "float64",
            "margin": "float64",
            "ci_low": "float64",
            "ci_high": "float64",
            "p_value": "float64",
            "n": "int64",
            "verdict": "bool",
            "p_raw": "float64",
            "test": "str",
            "interval": "str",
            "family": "str",
            "meets_threshold": "bool",
            "window": "Int64",
            "bos": "boolean",
            "top_key": "Int64",
            "top_key_token": "str",
            "top_key_mass": "float64",
        },
        "long_context_causal": {
            "condition": "str",
            "draw": "Int64",
            "item": "int64",
            "depth": "float64",
            "heads": "str",
            "n_masked": "int64",
            "copy_accuracy": "float64",
            "damage": "float64",
        },
        "kv_study": {
            "study": "category",
            "draw": "int64",
            "step": "int64",
            "layer": "Int64",
            "kv_group": "Int64",
            "full_groups": "int64",
            "restricted_groups": "int64",
            "bytes_saved": "int64",
            "fraction_saved": "float64",
            "bytes_saved_max": "int64",
            "fraction_saved_max": "float64",
            "metric": "category",
            "value": "float64",
            "change": "float64",
        },
        "kv_roles": {
            "layer": "int64",
            "kv_group": "object",
            "greedy_rank": "int64",
            "kept_full": "bool",
            "retrieval_score": "float64",
            "retrieval_heads": "int64",
        },
    }

    def config(self, ctx: RunContext, given: KVStageConfig | None = None) -> KVStageConfig:
        from headscope.reports.stages.plans import kv_logit_rows
        from headscope.reports.stages.quick import QUICK_KV_LARGE, is_large

        cfg = given if given is not None else KVStageConfig()
        s = ctx.shape
        if s is None:
            return cfg
        if not ctx.full and is_large(n_params=s.n_params, n_heads=s.n_layers * s.n_heads, threshold=ctx.large_cost):
            cfg = replace(cfg, **QUICK_KV_LARGE)
        if cfg.logit_rows is None:
            cfg = replace(cfg, logit_rows=kv_logit_rows(s, _tokens(cfg)))
        return cfg

    def blocker(self, ctx: RunContext, cfg: KVStageConfig) -> str | None:
        from headscope.analyses.kvcache.stage import report_blocker

        return report_blocker(ctx.model)

    def by_design(self, reason: str, backend: str | None) -> bool:
        """It restricts caches inside the in-house attention, and an encoder (or an embedding model)
        has no KV cache."""
        return (
            (backend != "inhouse" and "in-house attention" in reason)
            or "is an encoder" in reason
            or "is an embedding model" in reason
        )

    def plan(self, ctx: RunContext, cfg: KVStageConfig) -> list[WorkingSet]:
        from headscope.reports.stages.plans import kv_stages

        return kv_stages(ctx.shape, cfg, tokens=_tokens(cfg)) if ctx.shape.causal else []

    def work(self, ctx: RunContext, cfg: KVStageConfig):
        """The study's forwards of its input (the full cache; each group restricted alone, a group
        being a layer or a layer's KV head as :data:`REPORT_KV` says; every group restricted; each
        order's points, the greedy's and the random ones'; the greedy's candidates where its pool
        is over 1; the causal items), each of ``tokens`` tokens with its logits, and the
        long-context roles' needle items at ``role_tokens``; calls: their sequences × layers."""
        from headscope.analyses.kvcache.study import REPORT_KV
        from headscope.reports.stages.clock import Work, forward_work

        s, t, kv = ctx.shape, _tokens(cfg), cfg.study or REPORT_KV
        if not s.causal:
            return Work()
        groups = s.n_layers * (1 if kv.unit == "layer" else s.n_kv_heads)
        points = len(kv.points) if kv.points is not None else groups
        greedy = 0 if kv.pool == 1 else sum(min(kv.pool or n, n) for n in range(2, groups + 1))
        study = 2 + groups + (1 + kv.orders) * points + greedy + cfg.causal_items
        return forward_work(s, study, t, logits=True) + forward_work(s, cfg.role_items, cfg.role_tokens)

    def fitted(self, cfg: KVStageConfig, batch_sizes) -> KVStageConfig:
        rows = batch_sizes.get("kv logits")
        if rows is None or rows >= (cfg.logit_rows or _tokens(cfg)):
            return cfg
        return replace(cfg, logit_rows=rows)

    def run(self, ctx: RunContext, cfg: KVStageConfig) -> StageResult:
        return self._run(ctx, cfg)

    def _run(self, ctx: RunContext, cfg: KVStageConfig, **sharded) -> StageResult:
        from headscope.analyses.kvcache.stage import run_kv
        from headscope.probes.errors import HeadscopeError

        try:
            frames, summary = run_kv(
                ctx.model,
                cfg.study_config(ctx.model, ctx.seed),
                role_items=cfg.role_items,
                role_tokens=cfg.role_tokens,
                causal_items=cfg.causal_items,
                bos_pass=cfg.bos_pass,
                logit_rows=cfg.logit_rows,
                **sharded,
            )
        except (HeadscopeError, ValueError) as e:  # inputs the tokenizer or context cannot give: said, not fatal
            raise StageAbsent(f"the KV-cache stage could not run: {str(e).splitlines()[0]}") from e
        return StageResult(frames, summary)

    def split(self, ctx: RunContext, cfg: KVStageConfig, n: int) -> list:
        """``n`` workers' parts of the study, cut by KV groups (:mod:`~headscope.reports.stages.kv_shards`):
        the first pass builds each worker's inputs and unrestricted pass (and, on the first, runs the
        long-context roles); then every round of configurations (each group alone, a greedy step's
        candidates, an order's checkpoints) goes out in contiguous runs, one per worker, from the
        driver, which runs the greedy choice, the bytes and the frames (:meth:`finish`)."""
        from headscope.reports.stages.sharded import Interleaved

        return [Interleaved(k, n) for k in range(n)]

    def run_part(self, ctx: RunContext, cfg: KVStageConfig, part) -> StageResult:
        from headscope.analyses.kvcache.stage import long_roles_config, run_long_roles
        from headscope.probes.errors import HeadscopeError
        from headscope.reports.stages.kv_shards import KVRequest, serve_kv

        kcfg = cfg.study_config(ctx.model, ctx.seed)
        if isinstance(part, KVRequest):
            return StageResult({}, {"reply": serve_kv(ctx.model, kcfg, cfg.logit_rows, part.configs)})
        try:
            reply, frames = serve_kv(ctx.model, kcfg, cfg.logit_rows, ()), {}
            if part.k == 0 and cfg.role_items:  # one unit: on the first worker, while the others run their full pass
                lcfg = long_roles_config(
                    kcfg, cfg.role_items, tokens=cfg.role_tokens, causal_items=cfg.causal_items, bos_pass=cfg.bos_pass
                )
                frames, reply["long_summary"] = run_long_roles(ctx.model, lcfg)
        except (HeadscopeError, ValueError) as e:  # inputs the tokenizer or context cannot give: absent in finish
            return StageResult({}, {"reply": {"error": str(e).splitlines()[0]}})
        return StageResult(frames, {"reply": reply})

    def merge(self, parts) -> StageResult:
        return StageResult(dict(parts[0].frames), {"replies": [p.summary["reply"] for p in parts]})

    def finish(self, ctx: RunContext, cfg: KVStageConfig, merged: StageResult) -> StageResult:
        """The study in the driver, its configurations measured on the workers (:class:`ShardedEvaluator`)."""
        from headscope.reports.stages.kv_shards import ShardedEvaluator

        replies = merged.summary["replies"]
        if errors := [r["error"] for r in replies if "error" in r]:
            raise StageAbsent(f"the KV-cache stage could not run: {errors[0]}")
        long = (dict(merged.frames), replies[0]["long_summary"]) if cfg.role_items else None

        def call(requests):
            return [r.summary["reply"] for r in ctx.shards.each(ctx, self, cfg, requests)]

        return self._run(ctx, cfg, evaluator=ShardedEvaluator(call, len(replies), replies[0]), long=long)

    def section(self, frames, meta) -> list:
        from headscope.reports.sections.long_context import long_context_section

        s = long_context_section(frames, meta)
        return [] if s is None else [s]

    def leaves_out(self, ctx: RunContext, cfg: KVStageConfig) -> list[str]:
        from headscope.reports.stages.quick import stages_leave_out

        return stages_leave_out(cfg, None, context=ctx.context)


STAGE = KVStage()
