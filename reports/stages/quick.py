"""The quick pruning stage's settings, defined once, and sized by the model's cost.

The report's default pruning stage (``headscope report`` without ``--full``,
the pruning stage's :meth:`~headscope.reports.stages.pruning.PruningStage.config`) and the bench's ``quick_pruning`` paths (which time that stage) both
build their :class:`~headscope.analyses.pruning.study.PruneConfig` from
:data:`QUICK_PRUNING`, so the bench times what the report runs. The quick stage leaves out
mean ablation (an extra corpus pass and H more evaluations) and all-but-one (H more
evaluations); ``--full`` runs every study, both ablation modes, on all items.

On a model whose single-head ablation costs more than :data:`LARGE_COST` (parameters ×
heads: every head is ablated alone, each a forward of the rest of the model and its
unembedding over the items), the report's memory plan (:func:`quick_pruning_for`, called by
:meth:`~headscope.reports.stages.pruning.PruningStage.config` from the model's shape) takes
:data:`QUICK_PRUNING_LARGE` instead: no single-head ablation, and the curves by importance
and at random only (not by ablation order, which needs the single-head ablation, nor by
reverse importance, a backward per step), on half the items and with 3 random draws against
each role's heads instead of 5. Qwen2-0.5B (494 M parameters × 336 heads,
1.7e11) is over it; the shipped models are far under it (SmolLM2-135M 3.6e10, MiniLM-L6
1.6e9) and keep :data:`QUICK_PRUNING`. :func:`leaves_out` says, in one line, what a pruning
configuration leaves out of ``--full``; the report's Run section and run.json (``quick``) state it.

The same cost sizes the report's other stages in quick mode (:func:`is_large`): over it, the
KV-cache stage runs :data:`QUICK_KV_LARGE` (shorter inputs, fewer causal items), the weights
stage :data:`QUICK_WEIGHTS_LARGE` (fewer Gaussian draws) and the patching stage
:data:`QUICK_PATCHING_LARGE` (a smaller row budget); :func:`stages_leave_out` says what the first
two leave out (the patching stage's clause names its row budget).

>>> dict(QUICK_PRUNING)
{'quick': True, 'ablation_modes': ('zero',), 'studies': ('ablation', 'importance', 'curves')}
>>> quick_pruning_for(n_params=134_515_008, n_heads=270) is QUICK_PRUNING
True
>>> quick_pruning_for(n_params=494_032_768, n_heads=336) is QUICK_PRUNING_LARGE
True
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "LARGE_COST",
    "QUICK_KV_LARGE",
    "QUICK_PATCHING_LARGE",
    "QUICK_PRUNING",
    "QUICK_PRUNING_LARGE",
    "QUICK_STUDIES",
    "QUICK_WEIGHTS_LARGE",
    "is_large",
    "leaves_out",
    "quick_pruning_for",
    "stages_leave_out",
]

#: pruning studies of the default (quick) report; ``--full`` runs them all
QUICK_STUDIES: tuple[str, ...] = ("ablation", "importance", "curves")

#: ``PruneConfig`` keywords of the quick stage (read-only): ``PruneConfig(**QUICK_PRUNING, seed=seed)``
QUICK_PRUNING: Mapping[str, object] = MappingProxyType(
    {"quick": True, "ablation_modes": ("zero",), "studies": QUICK_STUDIES}
)

#: parameters × heads over which the quick stage is :data:`QUICK_PRUNING_LARGE` (SmolLM2-135M's
#: 3.6e10 took 456 s of quick pruning on 2 cores; Qwen2-0.5B's 1.7e11 would take ~4.6× that)
LARGE_COST = 5e10

#: the quick stage of a model over :data:`LARGE_COST`: importance and the curves by importance
#: and at random (no single-head ablation, no ablation-ordered or reverse-importance curve), on
#: 12 of the metric's items, the role ablation against 3 random draws (the quick stage: 24 and 5)
QUICK_PRUNING_LARGE: Mapping[str, object] = MappingProxyType(
    {
        "quick": True,
        "ablation_modes": ("zero",),
        "studies": ("importance", "curves"),
        "orders": ("importance", "random"),
        "n_items": 12,
        "role_draws": 3,
    }
)


#: the KV-cache stage of a model over :data:`LARGE_COST` (``KVStageConfig`` keywords): the study at
#: 512 tokens (the stage: 1,024; its window and sink scaled with it), the long-context roles on its
#: 16 needle items at 256 tokens (512), the causal check on 2 of them (4). On Qwen2-0.5B the stage
#: took 576 CPU s with the stage's settings, each 1,024-token forward ~25 CPU s
QUICK_KV_LARGE: Mapping[str, object] = MappingProxyType(
    {"tokens": 512, "role_items": 16, "role_tokens": 256, "causal_items": 2}
)
#: the weights stage of a model over :data:`LARGE_COST` (``WeightsConfig`` keywords): 100 Gaussian
#: heads per head baseline (200) and 250 draws per composition null (1,000)
QUICK_WEIGHTS_LARGE: Mapping[str, object] = MappingProxyType({"draws": 100, "null": 250})
#: the patching stage of a model over :data:`LARGE_COST` (``CausalConfig`` keywords): a row budget
#: of 768 (1,500): on Qwen2-0.5B's 48 KV groups and 4 tasks, 4 items per task instead of 7
QUICK_PATCHING_LARGE: Mapping[str, object] = MappingProxyType({"row_budget": 768})


def is_large(*, n_params: int, n_heads: int, threshold: float | None = None) -> bool:
    """Whether ``n_params × n_heads`` (all heads, every layer's) is over ``threshold`` (None:
    :data:`LARGE_COST`; a test lowers it to run the large tier on a tiny model)."""
    return n_params * n_heads > (LARGE_COST if threshold is None else threshold)


def quick_pruning_for(*, n_params: int, n_heads: int, threshold: float | None = None) -> Mapping[str, object]:
    """:data:`QUICK_PRUNING`, or :data:`QUICK_PRUNING_LARGE` when ``n_params × n_heads`` (all
    heads, every layer's) is over ``threshold`` (None: :data:`LARGE_COST`)."""
    large = is_large(n_params=n_params, n_heads=n_heads, threshold=threshold)
    return QUICK_PRUNING_LARGE if large else QUICK_PRUNING


def stages_leave_out(kv=None, weights=None, *, context: int | None = None) -> list[str]:
    """What the KV-cache stage's ``kv`` (a ``KVStageConfig``) and the weights stage's ``weights``
    (a ``WeightsConfig``) leave out of their defaults, one ``"stage: ..."`` clause each ([] when
    nothing; None: the stage does not run); ``context``: the model's, which caps both the
    settings' lengths and the defaults' (a model of 128 positions runs both at 128: nothing left out).

    >>> from headscope.analyses.kvcache.stage import KVStageConfig
    >>> from headscope.analyses.run_weights import WeightsConfig
    >>> stages_leave_out(KVStageConfig(**QUICK_KV_LARGE), WeightsConfig(**QUICK_WEIGHTS_LARGE))  # doctest: +NORMALIZE_WHITESPACE
    ['kv: the study past 512 tokens (of 1024); the long-context roles past 256 tokens (of 512);
      the causal check past 2 items (of 4)',
     'weights: the head baselines past 100 draws (of 200); the composition nulls past 250 draws (of 1000)']
    >>> stages_leave_out(KVStageConfig(), WeightsConfig())
    []
    """
    from headscope.analyses.kvcache.stage import KVStageConfig
    from headscope.analyses.kvcache.study import REPORT_KV
    from headscope.analyses.run_weights import WeightsConfig

    def cap(n):
        return n if context is None else min(n, context)

    out = []
    if kv is not None:
        d, parts = KVStageConfig(), []
        study, full = cap(REPORT_KV.tokens if kv.tokens is None else kv.tokens), cap(REPORT_KV.tokens)
        if study < full:
            parts.append(f"the study past {study} tokens (of {full})")
        if kv.role_items < d.role_items:
            parts.append(f"the long-context roles past {kv.role_items} items (of {d.role_items})")
        roles, full = cap(min(kv.role_tokens, study)), cap(min(d.role_tokens, full))
        if roles < full:
            parts.append(f"the long-context roles past {roles} tokens (of {full})")
        if kv.causal_items < d.causal_items:
            parts.append(f"the causal check past {kv.causal_items} items (of {d.causal_items})")
        if parts:
            out.append("kv: " + "; ".join(parts))
    if weights is not None:
        d, parts = WeightsConfig(), []
        if weights.draws < d.draws:
            parts.append(f"the head baselines past {weights.draws} draws (of {d.draws})")
        if weights.null < d.null:
            parts.append(f"the composition nulls past {weights.null} draws (of {d.null})")
        if parts:
            out.append("weights: " + "; ".join(parts))
    return out


def leaves_out(pcfg) -> str:
    """What the pruning configuration ``pcfg`` leaves out of ``--full``'s study, in one line
    ("" when nothing).

    >>> from headscope.analyses.pruning.study import PruneConfig
    >>> leaves_out(PruneConfig(**QUICK_PRUNING))
    "mean ablation; all-but-one; curves past 50% pruned; the metric's items past the first 24"
    >>> leaves_out(PruneConfig(**QUICK_PRUNING_LARGE))  # doctest: +NORMALIZE_WHITESPACE
    "single-head ablation; all-but-one; the ablation-ordered and reverse-importance curves;
     curves past 50% pruned; the metric's items past the first 12; the role ablation's random
     draws past 3 (of 5)"
    """
    from headscope.analyses.pruning.study import ORDERS, STUDIES, PruneConfig

    full = PruneConfig()
    out = []
    if "ablation" not in pcfg.studies:
        out.append("single-head ablation")
    else:
        out += [f"{m} ablation" for m in full.ablation_modes if m not in pcfg.ablation_modes]
    names = {"all_but_one": "all-but-one", "importance": "gradient importance", "curves": "pruning curves"}
    out += [names[s] for s in STUDIES if s != "ablation" and s not in pcfg.studies]
    if "curves" in pcfg.studies:
        missing = [o.replace("_", "-") for o in ORDERS if o not in pcfg.orders]
        if missing:
            out.append(f"the {' and '.join(f'{o}-ordered' if o == 'ablation' else o for o in missing)} curves")
        frac = pcfg.fraction_limit
        if frac < 1:
            out.append(f"curves past {frac:.0%} pruned")
    if pcfg.items is not None:
        out.append(f"the metric's items past the first {pcfg.items}")
    if pcfg.role_draws < full.role_draws:
        out.append(f"the role ablation's random draws past {pcfg.role_draws} (of {full.role_draws})")
    return "; ".join(out)
