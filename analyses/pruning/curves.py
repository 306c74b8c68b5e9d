"""Iterative pruning curves: metric against the fraction of heads removed, for several orders.

Each step removes the next ``k = round(step_fraction × n_units)`` units (query heads, or
whole GQA groups with ``unit="kv_group"``) and re-scores the metric:

=======================  ====================================================================
order                    which units go next
=======================  ====================================================================
``importance``           least gradient importance, re-estimated on the pruned model each step
``reverse_importance``   most important first (re-estimated each step): the pessimistic bound
``ablation``             smallest harm when ablated alone (single-head zero ablation, fixed)
``random``               a seeded random permutation (one curve per seed)
=======================  ====================================================================

A curve is driven one step at a time through a JSON-serialisable :class:`CurveState`,
so a study can save it after every step and resume a killed run exactly
(:mod:`headscope.analyses.pruning.study`), which advances all its curves together
(:func:`curve_round`: one replicated call scores a step of every curve). Pruning = zero
ablation through the head hooks' masks; importance gradients are taken through gates
set to the mask (:func:`~headscope.analyses.pruning.gates.head_gates`).

Rows per step (IMPACT_COLUMNS, ``study = "curve:" + order``, ``layer``/``head`` empty):
``metric = name`` (value, bootstrap SE over items in ``spread``), ``query_heads_pruned``,
``kv_heads_pruned`` (a KV head counts once all the query heads reading it are gone),
``kv_cache_bytes_saved_per_token`` (``2 × kv_heads_pruned × d_head × 4``, fp32 K and V).

>>> prunable_fraction([0.0, 0.1, 0.2, 0.3], [2.0, 2.01, 2.08, 2.5], higher_is_better=False, tolerance=0.01)
0.1
>>> prunable_fraction([0.0, 0.1, 0.2, 0.3], [2.0, 2.01, 2.08, 2.5], higher_is_better=False, tolerance=0.05)
0.2
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
import torch

from headscope.analyses.pruning.impact import bootstrap_se, harm, impact_frame, impact_rows
from headscope.analyses.pruning.importance import head_importance
from headscope.analyses.pruning.masks import mask_of, prune_units
from headscope.analyses.pruning.scoring import evaluate

ORDERS = ("importance", "ablation", "reverse_importance", "random")


@dataclass(frozen=True, kw_only=True)
class CurveSettings:
    """What every curve of a study shares."""

    step_fraction: float = 0.10
    max_fraction: float = 1.0
    unit: str = "head"
    per_example: bool = False
    normalize: bool = False
    n_boot: int = 200
    max_rows: int = 64

    def __post_init__(self):
        if not 0 < self.step_fraction <= 1:
            raise ValueError(f"step_fraction must be in (0, 1]; got {self.step_fraction}")
        if not 0 < self.max_fraction <= 1:
            raise ValueError(f"max_fraction must be in (0, 1]; got {self.max_fraction}")
        if self.unit not in ("head", "kv_group"):
            raise ValueError(f"unit must be 'head' or 'kv_group'; got {self.unit!r}")


@dataclass
class CurveState:
    """Where one curve stands: its order and seed, the step reached, the unit indices
    removed so far (in removal order), and whether it is finished."""

    order: str
    seed: int | None = None
    step: int = 0
    removed: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def key(self) -> str:
        return self.order if self.seed is None else f"{self.order}:{self.seed}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CurveState:
        return cls(
            order=d["order"],
            seed=d["seed"],
            step=int(d["step"]),
            removed=[int(x) for x in d["removed"]],
            done=bool(d["done"]),
        )


def kv_heads_pruned(spec, mask: torch.Tensor) -> int:
    """KV heads whose every query head is masked out."""
    groups = mask.view(spec.n_layers, spec.n_kv_heads, spec.group_size)
    return int((groups.sum(-1) == 0).sum())


def step_rows(
    model,
    metric,
    state: CurveState,
    mask: torch.Tensor,
    settings: CurveSettings,
    scored: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[dict]:
    """Score the metric at ``mask`` (or take ``scored = (values, weights)`` already
    computed there) and build the rows of ``state``'s current step."""
    spec = model.spec
    v, w = scored if scored is not None else evaluate(model, metric, mask[None], max_rows=settings.max_rows)
    value = float(metric.aggregate(v, w)[0])
    se = float(bootstrap_se(metric, v, w, n_boot=settings.n_boot, seed=state.seed or 0)[0])
    q = int((mask == 0).sum())
    kv = kv_heads_pruned(spec, mask)
    frac = q / (spec.n_layers * spec.n_heads)
    common = dict(step=state.step, fraction_pruned=frac, seed=state.seed, n=metric.n_items)
    study = f"curve:{state.order}"
    return [
        impact_rows(study, metric.name, value=value, spread=se, **common),
        impact_rows(study, "query_heads_pruned", value=q, **common),
        impact_rows(study, "kv_heads_pruned", value=kv, **common),
        impact_rows(study, "kv_cache_bytes_saved_per_token", value=2 * kv * spec.d_head * 4, **common),
    ]


def static_order(order: str, n_units: int, *, seed: int | None = None, harms=None) -> list[int]:
    """Fixed removal orders: ``random`` (seeded permutation) and ``ablation`` (ascending
    ``harms [unit]``, ties by index)."""
    if order == "random":
        return [int(x) for x in np.random.default_rng(seed).permutation(n_units)]
    if order == "ablation":
        if harms is None or len(harms) != n_units:
            raise ValueError(f"the ablation order needs one harm value per unit ({n_units})")
        return sorted(range(n_units), key=lambda u: (float(harms[u]), u))
    raise ValueError(f"{order!r} has no fixed order; fixed orders: 'random', 'ablation'")


def ablation_harms(
    model, metric, units, *, ablation_frame: pd.DataFrame | None = None, max_rows: int = 64
) -> list[float]:
    """Harm (worsening of the metric) of zero-ablating each unit alone. Taken from a
    single-head ablation frame (``study="ablation:zero"``) when it covers the units,
    else measured (replicated forwards)."""
    spec = model.spec
    if ablation_frame is not None and all(len(u) == 1 for u in units):
        d = ablation_frame[
            (ablation_frame["study"] == "ablation:zero") & (ablation_frame["metric"] == f"delta_{metric.name}")
        ]
        if len(d) == len(units):
            table = {(int(l), int(h)): float(v) for l, h, v in zip(d["layer"], d["head"], d["value"])}
            return [harm(metric, table[u[0]]) for u in units]
    base_v, w = evaluate(model, metric, max_rows=max_rows)
    base = float(metric.aggregate(base_v, w)[0])
    masks = torch.stack([mask_of(spec, units, [i]) for i in range(len(units))])
    v, _ = evaluate(model, metric, masks, max_rows=max_rows)
    return [harm(metric, float(x) - base) for x in metric.aggregate(v, w)]


def n_steps_units(n_units: int, settings: CurveSettings) -> tuple[int, int]:
    """``(units per step, units to remove in total)``."""
    k = max(1, int(round(settings.step_fraction * n_units)))
    total = min(n_units, int(round(settings.max_fraction * n_units)))
    return k, total


def next_state(
    spec, state: CurveState, settings: CurveSettings, *, fixed: list[int] | None = None, importance=None
) -> CurveState:
    """``state`` one step further: the next ``k`` units removed. ``importance [layer, unit]``:
    for the ``importance`` / ``reverse_importance`` orders, measured at ``state``'s mask;
    ``fixed``: the removal order of ``ablation`` and ``random`` curves."""
    units = prune_units(spec, settings.unit)
    k, total = n_steps_units(len(units), settings)
    if state.done:
        raise ValueError(f"curve {state.key!r} is finished (step {state.step}); nothing left to prune")
    removed = list(state.removed)
    gone = set(removed)
    left = [u for u in range(len(units)) if u not in gone]
    take = min(k, total - len(removed))
    if state.order in ("importance", "reverse_importance"):
        if importance is None:
            raise ValueError(f"the {state.order!r} curve needs the importance at its current mask")
        imp = importance.flatten()
        sign = 1.0 if state.order == "importance" else -1.0
        chosen = sorted(left, key=lambda u: (sign * float(imp[u]), u))[:take]
    else:
        if fixed is None:
            raise ValueError(f"the {state.order!r} curve needs its fixed removal order")
        chosen = [u for u in fixed if u not in gone][:take]
    new = CurveState(order=state.order, seed=state.seed, step=state.step + 1, removed=removed + chosen)
    new.done = len(new.removed) >= total
    return new


def needs_importance(state: CurveState) -> bool:
    """Whether the next step of ``state`` ranks units by gradient importance."""
    return state.order in ("importance", "reverse_importance")


def step_importance(model, metric, mask: torch.Tensor, settings: CurveSettings) -> torch.Tensor:
    """The importance an iterative order ranks by, at ``mask``."""
    return head_importance(
        model, metric, mask=mask, unit=settings.unit, per_example=settings.per_example, normalize=settings.normalize
    )


def curve_step(
    model, metric, state: CurveState, settings: CurveSettings, *, fixed: list[int] | None = None
) -> tuple[CurveState, list[dict]]:
    """Advance ``state`` by one pruning step; return the new state and the step's rows.

    Step 0 scores the unpruned model. ``fixed``: the removal order for ``ablation`` and
    ``random`` curves. (:func:`curve_round` advances several curves at once.)
    """
    spec = model.spec
    units = prune_units(spec, settings.unit)
    imp = (
        step_importance(model, metric, mask_of(spec, units, state.removed), settings)
        if needs_importance(state)
        else None
    )
    new = next_state(spec, state, settings, fixed=fixed, importance=imp)
    rows = step_rows(model, metric, new, mask_of(spec, units, new.removed), settings)
    return new, rows


def curve_round(
    model,
    metric,
    states: list[CurveState],
    settings: CurveSettings,
    *,
    fixed: dict,
    importance,
    importance_scored=None,
) -> list[tuple[CurveState, list[dict]]]:
    """One step of every curve in ``states``, the new masks scored in ONE replicated
    :func:`~headscope.analyses.pruning.scoring.evaluate` call: per curve its new state and
    rows, as :func:`curve_step` gives them. ``fixed``: curve key -> removal order (fixed
    orders); ``importance(mask) -> [layer, unit]`` (iterative orders; may serve a mask it has
    seen from a cache). ``importance_scored(mask) -> (importance, (values, weights))``, when
    given, scores the new mask of an unfinished iterative curve from the forwards that take
    the importance its next step ranks by (which ``importance`` should then serve)."""
    spec = model.spec
    units = prune_units(spec, settings.unit)
    new = [
        next_state(
            spec,
            s,
            settings,
            fixed=fixed.get(s.key),
            importance=importance(mask_of(spec, units, s.removed)) if needs_importance(s) else None,
        )
        for s in states
    ]
    masks = torch.stack([mask_of(spec, units, s.removed) for s in new])
    scored = {}
    if importance_scored is not None:
        scored = {i: importance_scored(masks[i])[1] for i, s in enumerate(new) if needs_importance(s) and not s.done}
    rest = [i for i in range(len(new)) if i not in scored]
    if rest:
        v, w = evaluate(model, metric, masks[rest], max_rows=settings.max_rows)
        scored.update({i: (v[j : j + 1], w) for j, i in enumerate(rest)})
    return [(s, step_rows(model, metric, s, masks[i], settings, scored[i])) for i, s in enumerate(new)]


def start_curve(
    model,
    metric,
    order: str,
    settings: CurveSettings,
    *,
    seed: int | None = None,
    unpruned: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[CurveState, list[dict]]:
    """Step 0 of a curve: the unpruned model's rows (``unpruned``: its ``(values, weights)``
    from :func:`~headscope.analyses.pruning.scoring.evaluate`, to skip re-scoring)."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; valid orders: {', '.join(ORDERS)}")
    state = CurveState(order=order, seed=seed)
    spec = model.spec
    rows = step_rows(model, metric, state, torch.ones(spec.n_layers, spec.n_heads), settings, unpruned)
    return state, rows


def pruning_curve(
    model,
    metric,
    order: str,
    settings: CurveSettings = CurveSettings(),
    *,
    seed: int | None = None,
    fixed: list[int] | None = None,
) -> pd.DataFrame:
    """A whole curve in one call (no saving; see :func:`~headscope.analyses.pruning.study.pruning_study`
    for resumable runs)."""
    state, rows = start_curve(model, metric, order, settings, seed=seed)
    units = prune_units(model.spec, settings.unit)
    if order == "random" and fixed is None:
        fixed = static_order("random", len(units), seed=seed)
    if order == "ablation" and fixed is None:
        fixed = static_order(
            "ablation", len(units), harms=ablation_harms(model, metric, units, max_rows=settings.max_rows)
        )
    while not state.done:
        state, r = curve_step(model, metric, state, settings, fixed=fixed)
        rows += r
    return impact_frame(rows)


# ----------------------------------------------------------------------------- summaries


def curve_summary(curves: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds per order and step (IMPACT_COLUMNS, ``seed`` empty): ``value`` the
    mean, ``spread`` the std over seeds where there are several (random), else the
    curve's own bootstrap SE; ``n`` the number of curves averaged."""
    rows = []
    for (study, metric, step), g in curves.groupby(["study", "metric", "step"], sort=True):
        vals = g["value"].to_numpy(dtype=float)
        spread = float(np.std(vals, ddof=1)) if len(vals) > 1 else float(g["spread"].iloc[0])
        rows.append(
            impact_rows(
                study,
                metric,
                step=int(step),
                fraction_pruned=float(g["fraction_pruned"].mean()),
                value=float(vals.mean()),
                spread=spread,
                seed=None,
                n=len(vals),
            )
        )
    return impact_frame(rows)


def prunable_fraction(fractions, values, *, higher_is_better: bool, tolerance: float) -> float:
    """Largest pruned fraction up to which every step stays within ``tolerance`` (relative)
    of the unpruned value (``values[0]`` at ``fractions[0] = 0``)."""
    base = float(values[0])
    best = float(fractions[0])
    for f, v in zip(fractions, values):
        worse = (base - v) if higher_is_better else (v - base)
        if worse > tolerance * abs(base) + 1e-12:
            break
        best = float(f)
    return best


PRUNABLE_COLUMNS = [
    "order",
    "tolerance",
    "fraction_pruned",
    "query_heads_pruned",
    "kv_heads_pruned",
    "value",
    "base_value",
]


def prunable_table(summary: pd.DataFrame, metric, tolerances=(0.01, 0.05)) -> pd.DataFrame:
    """Per order and tolerance, the largest fraction of heads prunable within it (mean curve)."""
    rows = []
    for study in sorted(summary["study"].unique()):
        s = summary[summary["study"] == study]
        m = s[s["metric"] == metric.name].sort_values("step")
        qh = dict(zip(s[s["metric"] == "query_heads_pruned"]["step"], s[s["metric"] == "query_heads_pruned"]["value"]))
        kv = dict(zip(s[s["metric"] == "kv_heads_pruned"]["step"], s[s["metric"] == "kv_heads_pruned"]["value"]))
        fr, vals, steps = m["fraction_pruned"].tolist(), m["value"].tolist(), m["step"].tolist()
        for tol in tolerances:
            f = prunable_fraction(fr, vals, higher_is_better=metric.higher_is_better, tolerance=tol)
            i = max(j for j, x in enumerate(fr) if x <= f + 1e-12)
            rows.append(
                {
                    "order": study.removeprefix("curve:"),
                    "tolerance": float(tol),
                    "fraction_pruned": f,
                    "query_heads_pruned": float(qh.get(steps[i], math.nan)),
                    "kv_heads_pruned": float(kv.get(steps[i], math.nan)),
                    "value": float(vals[i]),
                    "base_value": float(vals[0]),
                }
            )
    return pd.DataFrame(rows, columns=PRUNABLE_COLUMNS).astype({"order": "str"})
