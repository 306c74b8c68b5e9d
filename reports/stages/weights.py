"""The weights stage: circuits read from the model's per-head weights (OV copying, K-composition; the
in-house model's, or an hf-backend model's where they pass the check against its forward),
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
    command = "weights"
    help = "circuits from the weights: OV copying and K-composition, joined with the roles and patching"
    requires = ("roles",)
    after = ("patching",)
    unit = "layers"
    summary_key = "weights_summary"
    schemas = {
        "weights_heads": {
            "layer": "int64",
            "head": "int64",
            "kv_head": "int64",
            "statistic": "category",
            "value": "float64",
            "method": "category",
            "baseline_mean": "float64",
            "baseline_sd": "float64",
            "margin": "float64",
            "p_value": "float64",
            "p_adjusted": "float64",
            "n": "int64",
            "verdict": "category",
            "note": "str",
        },
        "weights_composition": {
            "sender_layer": "int64",
            "sender_head": "int64",
            "receiver_layer": "int64",
            "receiver_head": "Int64",
            "receiver_kv_head": "int64",
            "mode": "category",
            "level": "category",
            "value": "float32",
            "baseline_mean": "float64",
            "baseline_sd": "float64",
            "margin": "float64",
            "p_value": "float64",
            "p_adjusted": "float64",
            "n": "int64",
            "verdict": "category",
        },
        "join_k_composition": {
            "receiver": "str",
            "receiver_basis": "str",
            "receiver_layer": "int64",
            "receiver_head": "Int64",
            "receiver_kv_head": "Int64",
            "level": "str",
            "n_senders": "int64",
            "n_role_senders": "int64",
            "role_senders": "str",
            "top_senders": "str",
            "k": "int64",
            "role_in_top_k": "int64",
            "expected_in_top_k": "float64",
            "best_role_rank": "Int64",
            "rank_biserial": "float64",
            "p_value": "float64",
            "note": "str",
        },
        "join_copying": {
            "task": "str",
            "method": "str",
            "n_heads": "int64",
            "spearman": "float64",
            "spearman_p": "float64",
            "k": "int64",
            "top_k_overlap": "float64",
            "top_copying": "str",
            "top_by_patching": "str",
            "copying_heads_significant": "str",
            "note": "str",
        },
    }

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

    def by_design(self, reason: str, backend: str | None) -> bool:
        """Off the in-house backend the stage runs only on matrices its forward reproduces: the bridge
        has none, and an hf family whose module tree is not understood or whose matrices fail that
        check is refused (the reason names the module or the check). Both are by design: the stage
        never reports unchecked weights. Which hf families pass is measured per family by
        ``make weights-families`` (``data/figures/hf_weights_families.json``), not by the sweep."""
        return backend != "inhouse" and "per-head weights" in reason

    def work(self, ctx: RunContext, cfg: WeightsConfig):
        """Its products: every sender head's ``[d_head, d_model]`` factor against every later layer's
        receivers (Q, K, V per head and KV group: ``2 × d_head² × d_model`` a pair), the null's
        draws (a QR and three products of ``d_model × d_head²`` each, per draw and family), the head
        baselines' Gaussian heads against the unembedding (``draws`` per layer, ``d_model × vocab``);
        calls: the null's draws per family (each a QR and its Python, whatever the shape); the null's
        GFLOP are its slow GFLOP (QR factorisations, not batched products: their own factor)."""
        from headscope.analyses.circuits.weights.composition import FAMILIES
        from headscope.reports.stages.clock import Work

        s = ctx.shape
        L, h, kv, k, d = s.n_layers, s.n_heads, s.n_kv_heads, s.d_head, s.d_model
        pairs = L * (L - 1) // 2 * h * (3 * h + 2 * kv)
        nulls = len(FAMILIES) * cfg.null * 8 * d * k * k
        heads = L * (cfg.draws + h) * 2 * k * d * max(1, s.vocab_size) / 64  # the unembedding in chunks of rows
        return Work((pairs * 2 * k * k * d + heads) / 1e9, len(FAMILIES) * cfg.null, nulls / 1e9)

    def plan(self, ctx: RunContext, cfg: WeightsConfig) -> list[WorkingSet]:
        from headscope.reports.stages.plans import weights_stage

        return [weights_stage(ctx.shape, cfg)]

    def run(self, ctx: RunContext, cfg: WeightsConfig) -> StageResult:
        from headscope.analyses.run_weights import run_weights

        frames, summary = run_weights(ctx.model, ctx.frames, cfg)
        return StageResult(frames, summary)

    def split(self, ctx: RunContext, cfg: WeightsConfig, n: int) -> list[tuple[int, ...]]:
        """The model's layers in ``n`` contiguous runs (fewer when it has fewer layers): each
        shard computes its heads' rows against the model's null (same seed), the adjustment over
        all heads, the composition scores (their nulls are drawn over every pair from one
        generator) and the joins run once after the merge (:meth:`finish`)."""
        from headscope.reports.stages.sharded import contiguous

        return contiguous(int(ctx.model.spec.n_layers), n)

    def run_part(self, ctx: RunContext, cfg: WeightsConfig, part: tuple[int, ...]) -> StageResult:
        from headscope.analyses.run_weights import weights_head_rows

        return StageResult({"head_rows": weights_head_rows(ctx.model, cfg, part)})

    def finish(self, ctx: RunContext, cfg: WeightsConfig, merged: StageResult) -> StageResult:
        from headscope.analyses.run_weights import run_weights

        frames, summary = run_weights(ctx.model, ctx.frames, cfg, heads=merged.frames["head_rows"])
        return StageResult(frames, summary)

    def section(self, frames, meta) -> list:
        from headscope.reports.sections.weights import weights_section

        s = weights_section(frames, meta, int(meta["layers"]), int(meta["heads"]))
        return [] if s is None else [s]

    def leaves_out(self, ctx: RunContext, cfg: WeightsConfig) -> list[str]:
        from headscope.reports.stages.quick import stages_leave_out

        return stages_leave_out(None, cfg, context=ctx.context)


STAGE = WeightsStage()
