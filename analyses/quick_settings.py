"""The quick pruning stage's settings, defined once, and sized by the model's cost.

The report's default pruning stage (``headscope report`` without ``--full``,
``analyses.run.RunConfig.pruning``) and the bench's ``quick_pruning`` paths (which time that stage) both
build their :class:`~headscope.analyses.pruning.study.PruneConfig` from
:data:`QUICK_PRUNING`, so the bench times what the report runs. The quick stage leaves out
mean ablation (an extra corpus pass and H more evaluations) and all-but-one (H more
evaluations); ``--full`` runs every study, both ablation modes, on all items.

On a model whose single-head ablation costs more than :data:`LARGE_COST` (parameters ×
heads: every head is ablated alone, each a forward of the rest of the model and its
unembedding over the items), the report's memory plan (:func:`quick_pruning_for`, called by
:func:`headscope.reports.budget.report_start` from the model's config) takes
:data:`QUICK_PRUNING_LARGE` instead: no single-head ablation, and the curves by importance
and at random only (not by ablation order, which needs the single-head ablation, nor by
reverse importance, a backward per step), on half the items and with 3 random draws against
each role's heads instead of 5. Qwen2-0.5B (494 M parameters × 336 heads,
1.7e11) is over it; the shipped models are far under it (SmolLM2-135M 3.6e10, MiniLM-L6
1.6e9) and keep :data:`QUICK_PRUNING`. :func:`leaves_out` says, in one line, what a pruning
configuration leaves out of ``--full``; the report's Run section and run.json (``quick``) state it.

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

__all__ = ["LARGE_COST", "QUICK_PRUNING", "QUICK_PRUNING_LARGE", "QUICK_STUDIES", "leaves_out", "quick_pruning_for"]

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


def quick_pruning_for(*, n_params: int, n_heads: int) -> Mapping[str, object]:
    """:data:`QUICK_PRUNING`, or :data:`QUICK_PRUNING_LARGE` when ``n_params × n_heads`` (all
    heads, every layer's) is over :data:`LARGE_COST`."""
    return QUICK_PRUNING_LARGE if n_params * n_heads > LARGE_COST else QUICK_PRUNING


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
