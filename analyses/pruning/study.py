"""One pruning study end to end, deterministic for a seed and resumable.

:func:`pruning_study` runs, in order: the unpruned ``baseline``; single-head ``ablation``
(zero and mean); ``all_but_one``; the initial gradient ``importance``; ``roles`` vs
random heads (when a roles frame is given); the pruning ``curves`` for every order (and
random seed); then ``curve_summary`` and ``prunable`` (fraction prunable within 1% / 5%
of the unpruned metric).

With ``out_dir``, after every stage and every pruning step the frames so far are
written (CSV + Parquet, atomically) and then ``state.json`` records what is done and
how many rows of each frame are committed. Run again with the same ``out_dir`` and
config and it continues where it stopped (rows past the committed count, from a crash
between the two writes, are dropped); the tables are the same as an uninterrupted
run's. ``step_limit`` stops a call after that many pruning steps (for tests and for
splitting long runs).

Work is shared across stages: the unpruned model is scored once; the importance stage
and the iterative orders' first steps take one gradient; the curves advance in rounds, a
step of every unfinished curve per round with all the round's masks scored in one
replicated call (an iterative curve's mask is scored by the forwards that take the
gradient its next step ranks by); ``curves`` is then put in curve order (curve by curve,
each by step), as a run drawing one curve after the other writes it.

Tables (:class:`PruneTables`, ``PruneResult.tables``): ``baseline``, ``ablation``,
``all_but_one``, ``importance``, ``curves``, ``curve_summary`` (IMPACT_COLUMNS),
``prunable`` (PRUNABLE_COLUMNS), ``role_ablation`` (ROLE_ABLATION_COLUMNS; its file in
``out_dir`` is ``roles``, see :data:`TABLE_FILES`).

>>> PruneConfig(step=0.0)
Traceback (most recent call last):
...
ValueError: The 'step' parameter of PruneConfig must be in (0, 1]; got 0.0 instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from headscope.analyses.pruning.ablation import all_but_one, role_ablation, single_head_ablation
from headscope.analyses.pruning.curves import (
    ORDERS,
    CurveSettings,
    CurveState,
    ablation_harms,
    curve_round,
    curve_summary,
    prunable_table,
    start_curve,
    static_order,
)
from headscope.analyses.pruning.impact import bootstrap_se, impact_frame, impact_rows
from headscope.analyses.pruning.importance import head_importance, importance_frame
from headscope.analyses.pruning.masks import check_head_hooks, prune_units
from headscope.analyses.pruning.memo import Scored, remembered_scores
from headscope.analyses.pruning.metrics import METRICS, build_metric, default_metric, metric_notes
from headscope.analyses.pruning.scoring import evaluate
from headscope.analyses.pruning.store import TABLE_FILES, PruneTables, StudyStore
from headscope.analyses.roles.config import is_seed
from headscope.analyses.run_json import model_record, run_json
from headscope.probes.outputs.atomic import write_json
from headscope.probes.outputs.folder import claim_output

__all__ = [
    "STUDIES",
    "TABLE_FILES",
    "PruneConfig",
    "PruneResult",
    "PruneTables",
    "curve_keys",
    "pruning_study",
    "study_metric",
    "study_summary",
]

log = logging.getLogger(__name__)

STUDIES = ("ablation", "all_but_one", "importance", "curves")


@dataclass(frozen=True, kw_only=True)
class PruneConfig:
    """Settings of a pruning study (written into ``state.json`` and ``run.json``).

    ``quick``: 24 items, curves up to 50% pruned, 100 bootstrap resamples.
    """

    metric: str | None = None  # None: lm_loss (a language model) / cosine_to_unpruned (an embedding model)
    step: float = 0.10
    max_fraction: float | None = None  # None: 1.0 (0.5 when quick)
    orders: tuple[str, ...] = ORDERS
    n_random_seeds: int = 3
    seed: int = 0
    quick: bool = False
    batch_size: int = 16
    n_items: int | None = None  # None: all (24 when quick)
    unit: str = "head"  # "head" | "kv_group"
    ablation_modes: tuple[str, ...] = ("zero", "mean")
    studies: tuple[str, ...] = STUDIES
    per_example: bool = False
    normalize_importance: bool = False
    n_boot: int | None = None  # None: 200 (100 when quick)
    max_rows: int = 64
    role_k: int = 3
    role_draws: int = 5
    #: an embedding model's prompt, by name (its config_sentence_transformers.json); None: its default
    prompt: str | None = None

    def __post_init__(self):
        def bad(name, rule):
            raise ValueError(
                f"The {name!r} parameter of PruneConfig must be {rule}; got {getattr(self, name)!r} instead."
            )

        if self.metric is not None and self.metric not in METRICS:
            bad("metric", f"one of {', '.join(METRICS)}")
        if not 0 < self.step <= 1:
            bad("step", "in (0, 1]")
        if self.max_fraction is not None and not 0 < self.max_fraction <= 1:
            bad("max_fraction", "in (0, 1]")
        object.__setattr__(self, "orders", tuple(self.orders))
        if not self.orders or any(o not in ORDERS for o in self.orders):
            bad("orders", f"a non-empty subset of {ORDERS}")
        object.__setattr__(self, "studies", tuple(self.studies))
        if any(s not in STUDIES for s in self.studies):
            bad("studies", f"a subset of {STUDIES}")
        object.__setattr__(self, "ablation_modes", tuple(self.ablation_modes))
        if any(m not in ("zero", "mean") for m in self.ablation_modes):
            bad("ablation_modes", "a subset of ('zero', 'mean')")
        for name in ("n_random_seeds", "batch_size", "max_rows", "role_k", "role_draws"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(name, "a positive int")
        if self.n_items is not None and (not isinstance(self.n_items, int) or self.n_items < 2):
            bad("n_items", "None or an int >= 2")
        if self.n_boot is not None and (not isinstance(self.n_boot, int) or self.n_boot < 2):
            bad("n_boot", "None or an int >= 2")
        if self.unit not in ("head", "kv_group"):
            bad("unit", "'head' or 'kv_group'")
        if not is_seed(self.seed):
            bad("seed", "an int in [0, 2**32 - 1]")

    @property
    def items(self) -> int | None:
        return self.n_items if self.n_items is not None else (24 if self.quick else None)

    @property
    def fraction_limit(self) -> float:
        return self.max_fraction if self.max_fraction is not None else (0.5 if self.quick else 1.0)

    @property
    def boots(self) -> int:
        return self.n_boot if self.n_boot is not None else (100 if self.quick else 200)

    def curve_settings(self) -> CurveSettings:
        return CurveSettings(
            step_fraction=self.step,
            max_fraction=self.fraction_limit,
            unit=self.unit,
            per_example=self.per_example,
            normalize=self.normalize_importance,
            n_boot=self.boots,
            max_rows=self.max_rows,
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("orders", "studies", "ablation_modes"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PruneConfig:
        d = dict(d)
        for k in ("orders", "studies", "ablation_modes"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


@dataclass
class PruneResult:
    """The tables, a JSON-able ``summary`` (:func:`study_summary`), the config, and whether
    every step ran."""

    tables: PruneTables
    summary: dict
    config: PruneConfig
    complete: bool

    @property
    def frames(self) -> dict[str, pd.DataFrame]:
        """The tables under their file names, as in ``out_dir``."""
        return self.tables.by_file()


def curve_keys(cfg: PruneConfig) -> list[tuple[str, int | None]]:
    """``(order, seed)`` of every curve: random orders get ``n_random_seeds`` seeds."""
    keys = []
    for o in cfg.orders:
        if o == "random":
            keys += [(o, cfg.seed + i) for i in range(cfg.n_random_seeds)]
        else:
            keys.append((o, None))
    return keys


def pruning_study(
    model,
    cfg: PruneConfig = PruneConfig(),
    out_dir=None,
    *,
    metric=None,
    roles: pd.DataFrame | None = None,
    step_limit: int | None = None,
    progress=None,
) -> PruneResult:
    """Run (or resume) a pruning study; see the module docstring for the stages and frames.

    ``metric``: a prepared metric object (e.g. a :class:`~headscope.analyses.pruning.metrics.CallableMetric`)
    instead of ``cfg.metric``'s shipped data. ``progress(stage, done, total)``, when given,
    is called with stage ``"pruning"`` as each part of the study ends (baseline, each
    ablation mode, all-but-one, importance, role ablation, each curve; parts found done in
    ``out_dir`` count as done); it changes no figure. Raises :class:`~headscope.probes.errors.CheckpointError` when
    ``out_dir`` holds a run with another config, and ``ValueError`` when it is a file,
    holds anything but an earlier pruning study, or another run is writing it
    (:func:`~headscope.probes.outputs.folder.claim_output`).
    """
    with remembered_scores():
        if out_dir is None:
            return _study(model, cfg, None, metric=metric, roles=roles, step_limit=step_limit, progress=progress)
        with claim_output(out_dir, "prune"):
            return _study(model, cfg, out_dir, metric=metric, roles=roles, step_limit=step_limit, progress=progress)


def _parts(cfg: PruneConfig, with_roles: bool) -> int:
    """How many parts :func:`_study` reports to ``progress``."""
    n = 1 + ("ablation" in cfg.studies) * len(cfg.ablation_modes) + ("all_but_one" in cfg.studies)
    n += ("importance" in cfg.studies) + with_roles
    return n + (len(curve_keys(cfg)) if "curves" in cfg.studies else 0)


class _Progress:
    """Calls ``progress("pruning", done, total)`` (when given) as each part of the study ends."""

    def __init__(self, progress, total: int):
        self.progress, self.total, self.n = progress, total, 0
        if progress is not None:
            progress("pruning", 0, total)

    def part_done(self) -> None:
        self.n += 1
        if self.progress is not None:
            self.progress("pruning", self.n, self.total)


class _Importance:
    """Gradient importance at a mask, each asked-for mask computed once per call of the
    study (a resumed run recomputes it, to the same numbers): the importance stage and the
    first step of both iterative orders ask for the unpruned mask's, and a step of an
    iterative order for the mask its previous step scored."""

    def __init__(self, model, metric, cfg: PruneConfig):
        self.model, self.metric = model, metric
        self.kw = dict(unit=cfg.unit, per_example=cfg.per_example, normalize=cfg.normalize_importance)
        self.seen: dict[bytes, torch.Tensor] = {}

    def __call__(self, mask: torch.Tensor) -> torch.Tensor:
        """Importance ``[layer, head or kv_head]`` at ``mask [layer, head]``."""
        key = mask.numpy().tobytes()
        if key not in self.seen:
            self.seen[key] = head_importance(self.model, self.metric, mask=mask, **self.kw)
        return self.seen[key]

    def scored(self, mask: torch.Tensor):
        """``(importance, (values [1, n_items], weights [n_items]))``: the importance and the
        metric at ``mask`` from the same forwards; the importance is kept for :meth:`__call__`."""
        imp, scored = head_importance(self.model, self.metric, mask=mask, scores=True, **self.kw)
        self.seen[mask.numpy().tobytes()] = imp
        return imp, scored


@dataclass(frozen=True)
class _Stage:
    """A stage before the curves: its name in ``state.json``, the :class:`PruneTables` field
    it fills (extends with ``append``), and ``compute() -> frame`` (no writing)."""

    name: str
    table: str
    compute: Callable[[], pd.DataFrame]
    append: bool = False


def _baseline_frame(metric, unpruned: Scored, cfg: PruneConfig) -> pd.DataFrame:
    """The unpruned metric, bootstrap SE over items in ``spread`` (IMPACT_COLUMNS, one row)."""
    v, w = unpruned
    se = bootstrap_se(metric, v, w, n_boot=cfg.boots, seed=cfg.seed)[0]
    value = metric.aggregate(v, w)[0]
    return impact_frame([impact_rows("baseline", metric.name, value=value, spread=se, seed=cfg.seed, n=metric.n_items)])


def _stages(model, metric, cfg: PruneConfig, roles, unpruned: Scored, importance: _Importance) -> list[_Stage]:
    """The stages before the curves, in order, each computed only when called."""
    common = dict(n_boot=cfg.boots, seed=cfg.seed, max_rows=cfg.max_rows, unpruned=unpruned)
    stages = [_Stage("baseline", "baseline", lambda: _baseline_frame(metric, unpruned, cfg))]
    if "ablation" in cfg.studies:
        for mode in cfg.ablation_modes:
            stages.append(
                _Stage(
                    f"ablation:{mode}",
                    "ablation",
                    lambda mode=mode: single_head_ablation(model, metric, mode=mode, **common),
                    append=True,
                )
            )
    if "all_but_one" in cfg.studies:
        stages.append(_Stage("all_but_one", "all_but_one", lambda: all_but_one(model, metric, **common)))
    if "importance" in cfg.studies:
        ones = torch.ones(model.spec.n_layers, model.spec.n_heads)
        stages.append(
            _Stage(
                "importance",
                "importance",
                lambda: importance_frame(importance(ones), metric.name, unit=cfg.unit, seed=cfg.seed, n=metric.n_items),
            )
        )
    if roles is not None:
        roles_kw = dict(k=cfg.role_k, n_draws=cfg.role_draws, seed=cfg.seed, max_rows=cfg.max_rows, unpruned=unpruned)
        stages.append(_Stage("roles", "role_ablation", lambda: role_ablation(model, metric, roles, **roles_kw)))
    return stages


def study_metric(model, cfg: PruneConfig, metric):
    """The metric the study scores (``cfg.metric``'s on its shipped data unless one is passed);
    ``ValueError`` when it disagrees with ``cfg`` or cannot serve the studies asked for."""
    if metric is None:
        metric = build_metric(
            cfg.metric or default_metric(model), model, n_items=cfg.items, batch_size=cfg.batch_size, prompt=cfg.prompt
        )
        if cfg.prompt is not None and not hasattr(metric, "pipeline"):
            raise ValueError(
                f"prompt {cfg.prompt!r} goes with an embedding metric; {metric.name} reads no sentence embedding"
            )
    elif cfg.metric is not None and cfg.metric != metric.name:
        raise ValueError(f"cfg.metric is {cfg.metric!r} but the metric passed is {metric.name!r}; make them agree")
    grad = sorted({"importance", "reverse_importance"} & set(cfg.orders)) + (
        ["importance"] if "importance" in cfg.studies else []
    )
    if (grad and not metric.differentiable) or ("mean" in cfg.ablation_modes and not metric.has_corpus):
        raise ValueError(
            f"metric {metric.name!r} is a plain callable: no gradients and no corpus for mean ablation; "
            "use orders=('ablation', 'random'), studies without 'importance' and ablation_modes=('zero',)"
        )
    return metric


def _study(model, cfg: PruneConfig, out_dir, *, metric, roles, step_limit, progress=None) -> PruneResult:
    """:func:`pruning_study` inside its output folder claim and the memo of scored masks."""
    check_head_hooks(model)
    parts = _Progress(progress, _parts(cfg, roles is not None))
    torch.manual_seed(cfg.seed)
    metric = study_metric(model, cfg, metric)
    store = StudyStore(out_dir, cfg.to_dict(), model.spec.name, metric.name)
    unpruned = evaluate(model, metric, max_rows=cfg.max_rows)  # (values, weights): scored once, shared by every stage
    importance = _Importance(model, metric, cfg)
    for stage in _stages(model, metric, cfg, roles, unpruned, importance):
        if not store.done(stage.name):
            store.put(stage.table, stage.compute(), append=stage.append)
            store.commit(stage.name, (stage.table,))
        parts.part_done()
    complete = True
    if "curves" in cfg.studies:
        fixed = _fixed_orders(model, metric, cfg, store)
        _, complete = _curves_in_rounds(model, metric, cfg, store, fixed, unpruned, importance, step_limit, parts)
        if complete:
            _commit_curve_summary(store, cfg, metric)
    else:
        store.state["complete"] = True
        store.commit("summary")
    summary = study_summary(store.tables, metric, model.spec, cfg)
    summary.update(metric_notes(model, metric.name, summary.get("base_value")))  # what it measures; #47 caveat
    summary["complete"] = complete
    if store.dir is not None and complete:
        _write_run_json(store.dir / "run.json", model, cfg, summary)
    return PruneResult(tables=store.tables, summary=summary, config=cfg, complete=complete)


def _fixed_orders(model, metric, cfg: PruneConfig, store: StudyStore) -> dict[str, list[int]]:
    """Curve key -> removal order of the fixed orders (``random`` per seed; ``ablation`` from
    the single-head ablation table, unless that curve is done)."""
    units = prune_units(model.spec, cfg.unit)
    fixed = {}
    for order, seed in curve_keys(cfg):
        key = order if seed is None else f"{order}:{seed}"
        if order == "random":
            fixed[key] = static_order("random", len(units), seed=seed)
        elif order == "ablation" and not (store.state["curves"].get(key) or {}).get("done"):
            harms = ablation_harms(model, metric, units, ablation_frame=store.tables.ablation, max_rows=cfg.max_rows)
            fixed[key] = static_order("ablation", len(units), harms=harms)
    return fixed


def _commit_curve_summary(store: StudyStore, cfg: PruneConfig, metric) -> None:
    """The finished curves in curve order, their summary and the prunable table, committed."""
    store.put("curves", _curve_major(store.tables.curves, cfg))
    summary = curve_summary(store.tables.curves)
    store.put("curve_summary", summary)
    store.put("prunable", prunable_table(summary, metric))
    store.state["complete"] = True
    store.commit("summary", ("curves", "curve_summary", "prunable"))


def _write_run_json(path: Path, model, cfg: PruneConfig, summary: dict) -> None:
    write_json(run_json("prune", model_record(model), config=cfg.to_dict(), summary=summary), path)


def _curve_major(curves: pd.DataFrame, cfg: PruneConfig) -> pd.DataFrame:
    """The curves' rows curve by curve (:func:`curve_keys` order), each by step: the order of
    a run that drew the curves one after the other, whatever order the steps ran in."""
    rank = {(o, s): i for i, (o, s) in enumerate(curve_keys(cfg))}
    key = [
        (rank[(st.removeprefix("curve:"), None if pd.isna(sd) else int(sd))], int(step))
        for st, sd, step in zip(curves["study"], curves["seed"], curves["step"])
    ]
    order = sorted(range(len(curves)), key=lambda i: key[i])  # stable: a step's rows keep their order
    return curves.iloc[order].reset_index(drop=True)


def _record_steps(store: StudyStore, stepped: list[tuple[CurveState, list[dict]]]) -> None:
    """Append each curve's step rows and its new state, then commit them together."""
    for state, rows in stepped:
        store.put("curves", impact_frame(rows), append=True)
        store.state["curves"][state.key] = state.to_dict()
    store.commit(None, ("curves",))


def _start_curves(model, metric, settings, store: StudyStore, keys, unpruned: Scored) -> None:
    """Step 0 (the unpruned model's rows) of every curve in ``keys`` not started yet."""
    for order, seed in keys:
        key = order if seed is None else f"{order}:{seed}"
        if key not in store.state["curves"]:
            _record_steps(store, [start_curve(model, metric, order, settings, seed=seed, unpruned=unpruned)])


def _curves_in_rounds(
    model,
    metric,
    cfg: PruneConfig,
    store: StudyStore,
    fixed,
    unpruned: Scored,
    importance: _Importance,
    step_limit,
    parts,
) -> tuple[int, bool]:
    """Every unfinished curve advances one step per round, the round's masks scored in one
    replicated call (:func:`curve_round`); a round is committed as a whole. Returns
    ``(steps run, complete)``."""
    settings = cfg.curve_settings()
    keys = curve_keys(cfg)
    curve_of = {(o, s): o if s is None else f"{o}:{s}" for o, s in keys}
    for k in keys:
        if curve_of[k] in store.state["curves"] and store.state["curves"][curve_of[k]]["done"]:
            parts.part_done()
    steps_run = 0
    if (
        step_limit is not None
        and step_limit <= 0
        and any(not store.state["curves"].get(curve_of[k], {}).get("done") for k in keys)
    ):
        return 0, False
    _start_curves(model, metric, settings, store, keys, unpruned)
    fused = None if cfg.per_example else importance.scored
    while True:
        active = [st for st in (CurveState.from_dict(store.state["curves"][curve_of[k]]) for k in keys) if not st.done]
        if not active:
            return steps_run, True
        if step_limit is not None:
            if steps_run >= step_limit:
                return steps_run, False
            active = active[: step_limit - steps_run]
        stepped = curve_round(
            model, metric, active, settings, fixed=fixed, importance=importance, importance_scored=fused
        )
        _record_steps(store, stepped)
        for state, _ in stepped:
            log.info("curve %s: step %d, %d units removed", state.key, state.step, len(state.removed))
        steps_run += len(stepped)
        for state, _ in stepped:
            if state.done:
                parts.part_done()


def study_summary(tables: PruneTables, metric, spec, cfg: PruneConfig) -> dict:
    """JSON-able headline figures: unpruned value, most/least harmful single head, and
    ``prunable``: per order and tolerance (1% / 5%), the fraction prunable within it,
    as records ``{"order", "tolerance", "fraction_pruned"}``."""
    out = {"model": spec.name, "metric": metric.name, "higher_is_better": metric.higher_is_better, "unit": cfg.unit}
    if tables.baseline is not None:
        out["base_value"] = float(tables.baseline["value"].iloc[0])
    if tables.ablation is not None:
        d = tables.ablation
        d = d[(d["study"] == "ablation:zero") & (d["metric"] == f"delta_{metric.name}")]
        if len(d):
            sign = -1 if metric.higher_is_better else 1
            worst = d.loc[(sign * d["value"]).idxmax()]
            least = d.loc[(sign * d["value"]).abs().idxmin()]
            out["most_harmful_head"] = {
                "layer": int(worst["layer"]),
                "head": int(worst["head"]),
                "delta": float(worst["value"]),
            }
            out["least_harmful_head"] = {
                "layer": int(least["layer"]),
                "head": int(least["head"]),
                "delta": float(least["value"]),
            }
    if tables.prunable is not None:
        p = tables.prunable
        out["prunable"] = [
            {"order": str(o), "tolerance": float(t), "fraction_pruned": float(f)}
            for o, t, f in zip(p["order"], p["tolerance"], p["fraction_pruned"])
        ]
    return out
