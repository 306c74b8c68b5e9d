"""The weights stage: circuits read from the model's per-head weights (OV copying, K-composition; the
in-house model's, or an hf-backend model's where they pass the check against its forward),
joined with the roles and, where it ran, patching (:func:`~headscope.analyses.run_weights.run_weights`).

Writes ``weights_heads``, ``weights_composition`` and the ``join_*`` frames; its summary is
run.json's ``weights_summary``. Its report part is "From the weights".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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

    def split(self, ctx: RunContext, cfg: WeightsConfig, n: int) -> list[WeightsPart]:
        """At most ``n`` parts (:class:`WeightsPart`), each with its share of three kinds of work: the
        per-head rows of a contiguous run of layers (against the model's null, same seed; the
        adjustment over all heads runs after the merge), the composition scores into some receiver
        layers (each with every earlier layer's senders, as one process holds them) and the nulls of
        some score families (each drawn from the one generator, stepped over the earlier families'
        draws). The receivers and families go, largest first, to the part with the least estimated
        work so far (:func:`_balance`); :meth:`finish` builds the tables from the merged pieces
        exactly as one process does, then the joins."""
        from headscope.reports.stages.sharded import contiguous

        L = int(ctx.model.spec.n_layers)
        runs = contiguous(L, n)
        parts = [list(r) for r in runs] + [[] for _ in range(n - len(runs))]
        bins = _balance(ctx.model.spec, cfg, parts)
        out = [WeightsPart(tuple(p), tuple(sorted(r)), tuple(sorted(f))) for p, (r, f) in zip(parts, bins)]
        return [p for p in out if p.layers or p.receivers or p.families]

    def run_part(self, ctx: RunContext, cfg: WeightsConfig, part: WeightsPart) -> StageResult:
        from headscope.analyses.run_weights import weights_composition_part, weights_head_rows

        frames = {"head_rows": weights_head_rows(ctx.model, cfg, part.layers)} if part.layers else {}
        return StageResult(frames, weights_composition_part(ctx.model, cfg, part.receivers, part.families))

    def merge(self, parts) -> StageResult:
        """The parts' head rows concatenated in order (their layers' order), their composition
        pieces listed in order (:func:`~headscope.analyses.run_weights.composition_from_parts`)."""
        import pandas as pd

        rows = [p.frames["head_rows"] for p in parts if "head_rows" in p.frames]
        return StageResult(
            {"head_rows": pd.concat(rows, ignore_index=True)}, {"composition": [p.summary for p in parts]}
        )

    def finish(self, ctx: RunContext, cfg: WeightsConfig, merged: StageResult) -> StageResult:
        from headscope.analyses.run_weights import composition_from_parts, run_weights

        comp = composition_from_parts(ctx.model, merged.summary["composition"])
        frames, summary = run_weights(ctx.model, ctx.frames, cfg, heads=merged.frames["head_rows"], composition=comp)
        return StageResult(frames, summary)

    def section(self, frames, meta) -> list:
        from headscope.reports.sections.weights import weights_section

        s = weights_section(frames, meta, int(meta["layers"]), int(meta["heads"]))
        return [] if s is None else [s]

    def leaves_out(self, ctx: RunContext, cfg: WeightsConfig) -> list[str]:
        from headscope.reports.stages.quick import stages_leave_out

        return stages_leave_out(None, cfg, context=ctx.context)


@dataclass(frozen=True)
class WeightsPart:
    """One worker's share of the weights stage: the per-head rows of ``layers``, the composition
    scores into the receiver layers ``receivers``, the nulls of the score families ``families``
    (indices into :data:`~headscope.analyses.circuits.weights.composition.FAMILIES`)."""

    layers: tuple[int, ...]
    receivers: tuple[int, ...]
    families: tuple[int, ...]

    def __repr__(self) -> str:
        def span(xs):
            if len(xs) < 2:
                return str(xs[0]) if xs else "none"
            return f"{xs[0]}-{xs[-1]}" if list(xs) == list(range(xs[0], xs[-1] + 1)) else ",".join(map(str, xs))

        return f"{span(self.layers)}; receivers {span(self.receivers)}; null families {span(self.families)}"


#: a family's null stepped over (the draws not made, the generator moved as they would move it) costs
#: about this share of drawing and scoring it (0.78 s of 6.6 s CPU on SmolLM2's shapes)
STEP_SHARE = 0.12


def _balance(spec, cfg: WeightsConfig, layers: list[list[int]]) -> list[tuple[list[int], list[int]]]:
    """``(receivers, families)`` for each part whose head-row layers are ``layers``: each receiver
    layer and each null family, largest first, to the part with the least work so far, in the
    reference-matmul GFLOP of :data:`~headscope.reports.stages.clock.FACTORS` (the estimate
    :meth:`WeightsStage.work` makes of the whole), a family's null with the stepping over the
    families before it. The same cut for the same shape, settings and ``n``."""
    from headscope.analyses.circuits.weights.composition import FAMILIES
    from headscope.reports.stages.clock import FACTORS

    f = FACTORS["weights"]
    h, kv, k, d = spec.n_heads, spec.n_kv_heads, spec.d_head, spec.d_model
    vocab = max(1, int(getattr(spec, "vocab_size", 0) or 0))
    head_layer = (cfg.draws + h) * 2 * k * d * vocab / 64 / 1e9 * f["gflop"]
    sender = h * (3 * h + 2 * kv) * 2 * k * k * d / 1e9 * f["gflop"]  # one sender layer into one receiver
    family = cfg.null * (f["calls"] + 8 * d * k * k / 1e9 * f["slow_gflop"])
    jobs = [(lb * sender, "r", lb) for lb in range(1, sum(len(ls) for ls in layers))]
    jobs += [(family * (1 + STEP_SHARE * i), "f", i) for i in range(len(FAMILIES))]
    load = [len(ls) * head_layer for ls in layers]
    out: list[tuple[list[int], list[int]]] = [([], []) for _ in layers]
    for cost, kind, unit in sorted(jobs, key=lambda j: (-j[0], j[1], j[2])):
        i = min(range(len(load)), key=lambda b: (load[b], b))
        load[i] += cost
        out[i][0 if kind == "r" else 1].append(unit)
    return out


STAGE = WeightsStage()
