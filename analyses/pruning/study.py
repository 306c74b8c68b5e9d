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

import json
import logging
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pandas as pd
import torch

from headscope.analyses.pruning.ablation import (
    all_but_one,
    bootstrap_se,
    check_head_hooks,
    evaluate,
    impact_frame,
    impact_rows,
    prune_units,
    remembered_scores,
    role_ablation,
    sharing,
    single_head_ablation,
    unshared,
)
from headscope.analyses.pruning.curves import (
    ORDERS,
    CurveSettings,
    CurveState,
    ablation_harms,
    curve_round,
    curve_step,
    curve_summary,
    prunable_table,
    start_curve,
    static_order,
)
from headscope.analyses.pruning.importance import head_importance, importance_frame
from headscope.analyses.pruning.metrics import METRICS, build_metric, default_metric
from headscope.analyses.roles.config import is_seed
from headscope.probes.errors import CheckpointError
from headscope.probes.models.backend import placement
from headscope.probes.outputs.atomic import write_frame, write_json
from headscope.probes.outputs.folder import claim_output, manifest_header

log = logging.getLogger(__name__)

STUDIES = ("ablation", "all_but_one", "importance", "curves")
STATE_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class PruneConfig:
    """Settings of a pruning study (written into ``state.json`` and ``run.json``).

    ``quick``: 24 items, curves up to 50% pruned, 100 bootstrap resamples.
    """

    metric: str | None = None  # None: lm_loss (decoder) / cosine_to_unpruned (encoder)
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


#: the file (CSV + Parquet stem in ``out_dir``, key of ``state.json``'s row counts) of each
#: :class:`PruneTables` field
TABLE_FILES = {
    "baseline": "baseline",
    "ablation": "ablation",
    "all_but_one": "all_but_one",
    "importance": "importance",
    "role_ablation": "roles",
    "curves": "curves",
    "curve_summary": "curve_summary",
    "prunable": "prunable",
}
_FIELD_OF_FILE = {v: k for k, v in TABLE_FILES.items()}


@dataclass
class PruneTables:
    """The study's tables; None for one not (yet) produced."""

    baseline: pd.DataFrame | None = None
    ablation: pd.DataFrame | None = None
    all_but_one: pd.DataFrame | None = None
    importance: pd.DataFrame | None = None
    role_ablation: pd.DataFrame | None = None
    curves: pd.DataFrame | None = None
    curve_summary: pd.DataFrame | None = None
    prunable: pd.DataFrame | None = None

    def by_file(self) -> dict[str, pd.DataFrame]:
        """The produced tables under their file names (:data:`TABLE_FILES`), in field order."""
        return {TABLE_FILES[f.name]: df for f in fields(self) if (df := getattr(self, f.name)) is not None}


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


class _Store:
    """The tables + state on disk (or only in memory when ``out_dir`` is None)."""

    def __init__(self, out_dir, cfg: PruneConfig, model_name: str, metric_name: str):
        self.dir = None if out_dir is None else Path(out_dir)
        self.tables = PruneTables()
        self.state = {
            **manifest_header("prune"),
            "version": STATE_VERSION,
            "config": cfg.to_dict(),
            "model": model_name,
            "metric": metric_name,
            "done": [],
            "curves": {},
            "rows": {},
            "complete": False,
        }
        if self.dir is not None and (self.dir / "state.json").exists():
            self._load(cfg, model_name, metric_name)

    def _load(self, cfg, model_name, metric_name):
        path = self.dir / "state.json"
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: unreadable pruning state ({e}); delete it to start over") from None
        if state.get("version") != STATE_VERSION:
            raise CheckpointError(
                f"{path}: state version {state.get('version')!r}, expected {STATE_VERSION}; use a new --out"
            )
        mine = {"config": cfg.to_dict(), "model": model_name, "metric": metric_name}
        for k, v in mine.items():
            if state.get(k) != v:
                raise CheckpointError(
                    f"{path} holds a run with a different {k} ({state.get(k)!r} vs {v!r}); "
                    "use a new output folder or delete state.json to start over"
                )
        for name, n in state["rows"].items():
            if name not in _FIELD_OF_FILE:
                raise CheckpointError(f"{path} counts rows of an unknown table {name!r}; delete it to start over")
            pq = self.dir / f"{name}.parquet"
            if not pq.exists():
                raise CheckpointError(
                    f"{pq} is missing but state.json says it holds {n} rows; delete state.json to start over"
                )
            try:
                df = pd.read_parquet(pq)
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a damaged file
                raise CheckpointError(
                    f"{pq}: unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                    "delete state.json to start over"
                ) from None
            if len(df) < n:  # rows are written before state.json counts them: fewer means the file was cut or replaced
                raise CheckpointError(
                    f"{pq} holds {len(df)} rows but state.json says {n} were committed (the file was cut "
                    "short or replaced); delete state.json to start over"
                )
            setattr(self.tables, _FIELD_OF_FILE[name], df.iloc[:n].reset_index(drop=True))
        self.state = state
        log.info("resuming pruning study from %s: done %s", path, state["done"])

    def done(self, stage: str) -> bool:
        return stage in self.state["done"]

    def put(self, table: str, df: pd.DataFrame, *, append: bool = False) -> None:
        """Set (or with ``append``, extend) the :class:`PruneTables` field ``table``."""
        old = getattr(self.tables, table)
        if append and old is not None:
            df = pd.concat([old, df], ignore_index=True)
        setattr(self.tables, table, df.reset_index(drop=True))

    def commit(self, stage: str | None = None, tables: tuple[str, ...] = ()) -> None:
        """Write ``tables`` (field names), then ``state.json`` counting their rows."""
        if stage is not None and stage not in self.state["done"]:
            self.state["done"].append(stage)
        for table in tables:
            df, name = getattr(self.tables, table), TABLE_FILES[table]
            self.state["rows"][name] = int(len(df))
            if self.dir is not None:
                write_frame(df, self.dir / name)
        if self.dir is not None:
            write_json(self.state, self.dir / "state.json")


def pruning_study(
    model,
    cfg: PruneConfig = PruneConfig(),
    out_dir=None,
    *,
    metric=None,
    roles: pd.DataFrame | None = None,
    step_limit: int | None = None,
    progress=None,
    shared: bool = True,
) -> PruneResult:
    """Run (or resume) a pruning study; see the module docstring for the stages and frames.

    ``metric``: a prepared metric object (e.g. a :class:`~headscope.analyses.pruning.metrics.CallableMetric`)
    instead of ``cfg.metric``'s shipped data. ``progress(stage, done, total)``, when given,
    is called with stage ``"pruning"`` as each part of the study ends (baseline, each
    ablation mode, all-but-one, importance, role ablation, each curve; parts found done in
    ``out_dir`` count as done); it changes no figure. Raises :class:`CheckpointError` when
    ``out_dir`` holds a run with another config, and ``ValueError`` when it is a file,
    holds anything but an earlier pruning study, or another run is writing it
    (:func:`~headscope.probes.outputs.folder.claim_output`).

    ``shared=False`` runs the previous algorithm (:func:`~headscope.analyses.pruning.ablation.unshared`):
    the same tables, slower; ``headscope bench`` times the two (``quick_pruning_before``).
    """
    with nullcontext() if shared else unshared(), remembered_scores() if shared else nullcontext():
        if out_dir is None:
            return _study(model, cfg, None, metric=metric, roles=roles, step_limit=step_limit, progress=progress)
        with claim_output(out_dir, "prune"):
            return _study(model, cfg, out_dir, metric=metric, roles=roles, step_limit=step_limit, progress=progress)


def _parts(cfg: PruneConfig, with_roles: bool) -> int:
    """How many parts :func:`_study` reports to ``progress``."""
    n = 1 + ("ablation" in cfg.studies) * len(cfg.ablation_modes) + ("all_but_one" in cfg.studies)
    n += ("importance" in cfg.studies) + with_roles
    return n + (len(curve_keys(cfg)) if "curves" in cfg.studies else 0)


def _study(model, cfg: PruneConfig, out_dir, *, metric, roles, step_limit, progress=None) -> PruneResult:
    check_head_hooks(model)
    n_parts, parts_done = _parts(cfg, roles is not None), 0

    def part_done():
        nonlocal parts_done
        parts_done += 1
        if progress is not None:
            progress("pruning", parts_done, n_parts)

    if progress is not None:
        progress("pruning", 0, n_parts)
    torch.manual_seed(cfg.seed)
    if metric is None:
        metric = build_metric(
            cfg.metric or default_metric(model.spec), model, n_items=cfg.items, batch_size=cfg.batch_size
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
    store = _Store(out_dir, cfg, model.spec.name, metric.name)
    settings = cfg.curve_settings()
    boots, mr = cfg.boots, cfg.max_rows

    unpruned = evaluate(model, metric, max_rows=mr)  # (values, weights): scored once, shared by every stage
    seen_importance: dict[bytes, torch.Tensor] = {}

    def importance_at(mask: torch.Tensor, scores: bool = False):
        """Gradient importance at ``mask`` (with ``scores``: and the metric there, from the
        same forwards). The importance stage and the first step of both iterative orders ask
        for the unpruned mask's, and a step of an iterative order for the mask its previous
        step scored: each is computed once (kept for this call only: a resumed run
        recomputes it, to the same numbers)."""
        key = mask.numpy().tobytes()
        kw = dict(mask=mask, unit=cfg.unit, per_example=cfg.per_example, normalize=cfg.normalize_importance)
        if scores:
            imp, scored = head_importance(model, metric, scores=True, **kw)
            seen_importance[key] = imp
            return imp, scored
        if key not in seen_importance or not sharing():
            seen_importance[key] = head_importance(model, metric, **kw)
        return seen_importance[key]

    if not store.done("baseline"):
        v, w = unpruned
        se = bootstrap_se(metric, v, w, n_boot=boots, seed=cfg.seed)[0]
        store.put(
            "baseline",
            impact_frame(
                [
                    impact_rows(
                        "baseline",
                        metric.name,
                        value=metric.aggregate(v, w)[0],
                        spread=se,
                        seed=cfg.seed,
                        n=metric.n_items,
                    )
                ]
            ),
        )
        store.commit("baseline", ("baseline",))
    part_done()
    if "ablation" in cfg.studies:
        for mode in cfg.ablation_modes:
            if not store.done(f"ablation:{mode}"):
                df = single_head_ablation(
                    model, metric, mode=mode, n_boot=boots, seed=cfg.seed, max_rows=mr, unpruned=unpruned
                )
                store.put("ablation", df, append=True)
                store.commit(f"ablation:{mode}", ("ablation",))
            part_done()
    if "all_but_one" in cfg.studies:
        if not store.done("all_but_one"):
            store.put(
                "all_but_one", all_but_one(model, metric, n_boot=boots, seed=cfg.seed, max_rows=mr, unpruned=unpruned)
            )
            store.commit("all_but_one", ("all_but_one",))
        part_done()
    if "importance" in cfg.studies:
        if not store.done("importance"):
            imp = importance_at(torch.ones(model.spec.n_layers, model.spec.n_heads))
            store.put("importance", importance_frame(imp, metric.name, unit=cfg.unit, seed=cfg.seed, n=metric.n_items))
            store.commit("importance", ("importance",))
        part_done()
    if roles is not None:
        if not store.done("roles"):
            store.put(
                "role_ablation",
                role_ablation(
                    model,
                    metric,
                    roles,
                    k=cfg.role_k,
                    n_draws=cfg.role_draws,
                    seed=cfg.seed,
                    max_rows=mr,
                    unpruned=unpruned,
                ),
            )
            store.commit("roles", ("role_ablation",))
        part_done()

    steps_run = 0
    complete = True
    if "curves" in cfg.studies:
        units = prune_units(model.spec, cfg.unit)
        fixed = {}
        for order, seed in curve_keys(cfg):
            key = order if seed is None else f"{order}:{seed}"
            if order == "random":
                fixed[key] = static_order("random", len(units), seed=seed)
            elif order == "ablation" and not (store.state["curves"].get(key) or {}).get("done"):
                harms = ablation_harms(model, metric, units, ablation_frame=store.tables.ablation, max_rows=mr)
                fixed[key] = static_order("ablation", len(units), harms=harms)
        run = _curves_in_rounds if sharing() else _curves_one_by_one
        steps_run, complete = run(
            model, metric, cfg, settings, store, fixed, unpruned, importance_at, step_limit, part_done
        )
        if complete:
            store.put("curves", _curve_major(store.tables.curves, cfg))
            summary = curve_summary(store.tables.curves)
            store.put("curve_summary", summary)
            store.put("prunable", prunable_table(summary, metric))
            store.state["complete"] = True
            store.commit("summary", ("curves", "curve_summary", "prunable"))
    else:
        store.state["complete"] = True
        store.commit("summary")

    summary = study_summary(store.tables, metric, model.spec, cfg)
    summary["complete"] = complete
    if store.dir is not None and complete:
        write_json(
            {
                **manifest_header("prune"),
                "config": cfg.to_dict(),
                "model": model.spec.name,
                "backend": model.backend,
                "backend_choice": getattr(model, "backend_choice", model.backend),
                **placement(model),
                "summary": summary,
                "trust_remote_code": model.trust_remote_code,
            },
            store.dir / "run.json",
        )
    return PruneResult(tables=store.tables, summary=summary, config=cfg, complete=complete)


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


def _start_curves(model, metric, settings, store, keys, unpruned) -> None:
    """Step 0 (the unpruned model's rows) of every curve in ``keys`` not started yet."""
    for order, seed in keys:
        key = order if seed is None else f"{order}:{seed}"
        if key not in store.state["curves"]:
            state, rows = start_curve(model, metric, order, settings, seed=seed, unpruned=unpruned)
            store.put("curves", impact_frame(rows), append=True)
            store.state["curves"][key] = state.to_dict()
            store.commit(None, ("curves",))


def _curves_in_rounds(model, metric, cfg, settings, store, fixed, unpruned, importance_at, step_limit, part_done):
    """Every unfinished curve advances one step per round, the round's masks scored in one
    replicated call (:func:`curve_round`); a round is committed as a whole. Returns
    ``(steps run, complete)``."""
    keys = curve_keys(cfg)
    for order, seed in keys:
        key = order if seed is None else f"{order}:{seed}"
        if key in store.state["curves"] and store.state["curves"][key]["done"]:
            part_done()
    steps_run = 0
    if (
        step_limit is not None
        and step_limit <= 0
        and any(not store.state["curves"].get(o if s is None else f"{o}:{s}", {}).get("done") for o, s in keys)
    ):
        return 0, False
    _start_curves(model, metric, settings, store, keys, unpruned)
    while True:
        states = [CurveState.from_dict(store.state["curves"][o if s is None else f"{o}:{s}"]) for o, s in keys]
        active = [st for st in states if not st.done]
        if not active:
            return steps_run, True
        if step_limit is not None:
            if steps_run >= step_limit:
                return steps_run, False
            active = active[: step_limit - steps_run]
        fused = None if cfg.per_example else (lambda mask: importance_at(mask, scores=True))
        stepped = curve_round(
            model, metric, active, settings, fixed=fixed, importance=importance_at, importance_scored=fused
        )
        for state, rows in stepped:
            store.put("curves", impact_frame(rows), append=True)
            store.state["curves"][state.key] = state.to_dict()
            log.info("curve %s: step %d, %d units removed", state.key, state.step, len(state.removed))
        steps_run += len(stepped)
        store.commit(None, ("curves",))
        for state, _ in stepped:
            if state.done:
                part_done()


def _curves_one_by_one(model, metric, cfg, settings, store, fixed, unpruned, importance_at, step_limit, part_done):
    """The previous algorithm (:func:`~headscope.analyses.pruning.ablation.unshared`): each
    curve to its end, a step at a time. Returns ``(steps run, complete)``."""
    steps_run = 0
    for order, seed in curve_keys(cfg):
        key = order if seed is None else f"{order}:{seed}"
        if key in store.state["curves"] and store.state["curves"][key]["done"]:
            part_done()
            continue
        if step_limit is not None and steps_run >= step_limit:
            return steps_run, False
        _start_curves(model, metric, settings, store, [(order, seed)], unpruned)
        state = CurveState.from_dict(store.state["curves"][key])
        while not state.done:
            if step_limit is not None and steps_run >= step_limit:
                return steps_run, False
            state, rows = curve_step(model, metric, state, settings, fixed=fixed.get(key))
            steps_run += 1
            store.put("curves", impact_frame(rows), append=True)
            store.state["curves"][key] = state.to_dict()
            store.commit(None, ("curves",))
            log.info("curve %s: step %d, %d units removed", key, state.step, len(state.removed))
        part_done()
    return steps_run, True


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
