"""The KV-cache compression study: damage of restricting each KV group's cache to sink + window,
a greedy choice of the groups that keep a full cache, a random-order band, and the bytes saved.

Start: every group restricted. One greedy step gives back the full cache of the group whose full
cache helps most (the lowest :func:`quality_change` once it is full), among the ``pool`` restricted
groups that damage the model most when restricted alone (``pool=None``: all of them, the exact
greedy; ``pool=1``: the order of the single-group damage, nothing evaluated but the curve's points).
A random order gives the groups back in a seeded random order. Each order is measured at
``points`` numbers of full groups (None: every step).

:func:`kv_study` returns one tidy frame, :data:`COLUMNS`: one row per measured configuration and
metric (``lm_loss``, ``copy_accuracy``). ``study``: ``single`` (only ``layer``/``kv_group``
restricted; ``kv_group`` NA where the unit is a whole layer), ``greedy`` or ``random`` (``draw`` its order; ``layer``/``kv_group`` the group given
back at that ``step``, NA at step 0, every group restricted). ``change``: the quality lost
against the unrestricted model (LM loss: relative increase; copy accuracy: the drop).
``bytes_saved``: KV bytes the restricted groups save at the run's context, ``bytes_saved_max``
at the model's maximum context (:mod:`~headscope.analyses.kvcache.bytes`).

>>> quality_change({"lm_loss": 2.02, "copy_accuracy": 0.9}, {"lm_loss": 2.0, "copy_accuracy": 1.0})
0.1
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass

import pandas as pd

COLUMNS = [
    "study",
    "draw",
    "step",
    "layer",
    "kv_group",
    "full_groups",
    "restricted_groups",
    "bytes_saved",
    "fraction_saved",
    "bytes_saved_max",
    "fraction_saved_max",
    "metric",
    "value",
    "change",
]
METRICS = ("lm_loss", "copy_accuracy")
UNITS = ("group", "layer")
#: the quality change the savings are read at (1 %)
TOLERANCE = 0.01


@dataclass(frozen=True, kw_only=True)
class KVConfig:
    """``tokens``: each input's length; ``sink``, ``window``: what a restricted cache keeps;
    ``items``: needle items; ``texts``: extra long texts for the LM loss; ``pool``: greedy
    candidates per step (None: all); ``points``: numbers of full groups measured, as fractions
    of the groups (None: every step); ``orders``: random orders; ``seed``; ``unit``: what one
    step restricts or gives back, ``"group"`` (one KV group) or ``"layer"`` (all of a layer's KV
    groups together: the quick settings', a 1/``n_kv_heads`` share of the single-unit runs)."""

    tokens: int = 2048
    sink: int = 4
    window: int = 256
    items: int = 4
    texts: int = 1
    pool: int | None = 4
    points: tuple[float, ...] | None = None
    orders: int = 5
    seed: int = 0
    unit: str = "group"

    def __post_init__(self):
        for name in ("tokens", "window", "items", "orders"):
            if getattr(self, name) < (0 if name == "items" else 1):
                raise ValueError(f"KVConfig.{name} must be positive; got {getattr(self, name)}")
        if self.sink < 0 or self.texts < 0 or (self.pool is not None and self.pool < 1):
            raise ValueError(f"KVConfig: sink, texts >= 0 and pool >= 1; got {self.sink}, {self.texts}, {self.pool}")
        if self.unit not in UNITS:
            raise ValueError(f"KVConfig.unit must be one of {', '.join(UNITS)}; got {self.unit!r}")
        if self.items + self.texts < 1:
            raise ValueError("KVConfig: the study needs at least one needle item or long text")

    def settings(self) -> dict:
        return asdict(self)


#: ``headscope kv --quick`` and the report's stage (sized on SmolLM2 on 2 cores: see the README)
QUICK_KV = KVConfig(items=1, texts=0, pool=1, points=(1 / 8, 1 / 4, 1 / 2), orders=2, unit="layer")
REPORT_KV = KVConfig(tokens=1024, window=128, items=1, texts=0, pool=1, points=(1 / 4, 1 / 2), orders=2, unit="layer")


def quality_change(result: dict, full: dict) -> float:
    """The worst of the metrics' losses against ``full``: the LM loss's relative increase and
    the copy accuracy's drop (a metric a run lacks counts 0)."""
    return max(_changes(result, full).values())


def _changes(result: dict, full: dict) -> dict:
    out = {}
    for m in METRICS:
        v, v0 = result.get(m), full.get(m)
        if v is None or v0 is None:
            out[m] = 0.0
        elif m == "lm_loss":
            out[m] = round((v - v0) / v0, 12) if v0 else 0.0
        else:
            out[m] = round(v0 - v, 12)
    return out


def _checkpoints(n: int, points) -> list[int]:
    """The numbers of full groups an order is measured at: 0, the ``points`` (fractions of ``n``)
    and ``n``; None: every step."""
    if points is None:
        return list(range(n + 1))
    return sorted({0, n, *(max(1, min(n, round(p * n))) for p in points)})


class _Study:
    """The running study: evaluator, groups, bytes and the rows measured."""

    def __init__(self, evaluate, groups, nbytes, nbytes_max, cfg: KVConfig):
        self.evaluate, self.groups, self.cfg = evaluate, list(groups), cfg
        self.nbytes, self.nbytes_max = nbytes, nbytes_max
        self.total = sum(f for f, _ in nbytes.values())
        self.total_max = sum(f for f, _ in nbytes_max.values())
        self.rows: list[dict] = []
        self.full = evaluate({})
        self._memo: dict = {frozenset(): self.full}

    def measure(self, restricted) -> dict:
        self.measure_all([restricted])
        return self._memo[frozenset(restricted)]

    def measure_all(self, configs) -> None:
        """Each configuration of ``configs`` (lists of restricted groups) not measured yet, measured
        once: in one call of ``evaluate.many`` where the evaluator has it (a sharded run's, which
        cuts the list over its workers), else one by one. Each result is the configuration's alone."""
        todo = list(dict.fromkeys(k for k in map(frozenset, configs) if k not in self._memo))
        windows = [{g: (self.cfg.sink, self.cfg.window) for g in sorted(k)} for k in todo]
        many = getattr(self.evaluate, "many", None)
        results = many(windows) if many is not None and windows else [self.evaluate(w) for w in windows]
        self._memo.update(zip(todo, results))

    def record(self, study, draw, step, group, restricted, result):
        saved = sum(self.nbytes[g][0] - self.nbytes[g][1] for g in restricted)
        saved_max = sum(self.nbytes_max[g][0] - self.nbytes_max[g][1] for g in restricted)
        base = {
            "study": study,
            "draw": draw,
            "step": step,
            "layer": pd.NA if group is None else group[0],
            "kv_group": pd.NA if group is None else group[1],
            "full_groups": len(self.groups) - len(restricted),
            "restricted_groups": len(restricted),
            "bytes_saved": saved,
            "fraction_saved": saved / self.total if self.total else 0.0,
            "bytes_saved_max": saved_max,
            "fraction_saved_max": saved_max / self.total_max if self.total_max else 0.0,
        }
        changes = _changes(result, self.full)
        for m in METRICS:
            if result.get(m) is not None:
                self.rows.append({**base, "metric": m, "value": float(result[m]), "change": changes[m]})

    def single(self) -> dict:
        """Each group restricted alone -> its quality change."""
        damage = {}
        self.measure_all([[g] for g in self.groups])
        for i, g in enumerate(self.groups):
            r = self.measure([g])
            self.record("single", 0, i, g, [g], r)
            damage[g] = (quality_change(r, self.full), r.get("lm_loss") or 0.0)
        return damage

    def order(self, study, draw, sequence, checkpoints):
        """Give the groups back in ``sequence``; measure at ``checkpoints`` full groups."""
        restricted = list(self.groups)
        left, at = list(restricted), [list(restricted)]
        for step, g in enumerate(sequence, 1):
            left.remove(g)
            if step in checkpoints:
                at.append(list(left))
        self.measure_all(at)
        self.record(study, draw, 0, None, restricted, self.measure(restricted))
        for step, g in enumerate(sequence, 1):
            restricted.remove(g)
            if step in checkpoints:
                self.record(study, draw, step, g, restricted, self.measure(restricted))

    def greedy(self, damage, checkpoints) -> list:
        """The greedy order (see the module): each step gives back the group among the ``pool``
        most damaging alone whose full cache leaves the lowest quality change."""
        restricted, sequence = list(self.groups), []
        ranked = sorted(self.groups, key=lambda g: (-damage[g][0], -damage[g][1], g))
        while restricted:
            pool = [g for g in ranked if g in restricted][: self.cfg.pool or len(restricted)]
            if len(pool) == 1:
                best = pool[0]
            else:
                self.measure_all([[x for x in restricted if x != g] for g in pool])
                scored = []
                for g in pool:
                    r = self.measure([x for x in restricted if x != g])
                    scored.append((quality_change(r, self.full), r.get("lm_loss") or 0.0, ranked.index(g), g))
                best = min(scored)[-1]
            restricted.remove(best)
            sequence.append(best)
        self.order("greedy", 0, sequence, checkpoints)
        return sequence


def kv_study(evaluate, groups, nbytes: dict, nbytes_max: dict, cfg: KVConfig) -> tuple[pd.DataFrame, dict]:
    """``(frame, summary)``. ``evaluate(windows) -> {"lm_loss", "copy_accuracy"}`` measures a
    configuration (:class:`~headscope.analyses.kvcache.quality.Evaluator`); ``groups``:
    ``[(layer, kv_group)]``; ``nbytes``/``nbytes_max``: ``{group: (full, restricted)}`` bytes at the
    run's and the maximum context (:func:`~headscope.analyses.kvcache.bytes.groups_bytes`).
    ``summary``: the unrestricted quality, the greedy order, the savings at :data:`TOLERANCE`
    (:func:`savings_at`) and the seconds of each part."""
    t0 = time.perf_counter()
    s = _Study(evaluate, groups, nbytes, nbytes_max, cfg)
    damage = s.single()
    t1 = time.perf_counter()
    checkpoints = _checkpoints(len(s.groups), cfg.points)
    sequence = s.greedy(damage, checkpoints)
    t2 = time.perf_counter()
    for d in range(cfg.orders):
        seq = list(s.groups)
        random.Random(cfg.seed * 1000 + d).shuffle(seq)
        s.order("random", d, seq, checkpoints)
    t3 = time.perf_counter()
    frame = study_frame(s.rows)
    summary = {
        "full": s.full,
        "unit": cfg.unit,
        "greedy_order": [[int(l), None if g is None else int(g)] for l, g in sequence],
        "kv_bytes_full": s.total,
        "kv_bytes_full_max": s.total_max,
        "savings_at_tolerance": savings_at(frame),
        "evaluations": len(s._memo),
        "timings": {"single_s": round(t1 - t0, 3), "greedy_s": round(t2 - t1, 3), "random_s": round(t3 - t2, 3)},
    }
    return frame, summary


def study_frame(rows: list[dict]) -> pd.DataFrame:
    """:data:`COLUMNS`, ``study``/``metric`` categories, ``layer``/``kv_group`` nullable ints."""
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["study"] = pd.Categorical(df["study"], categories=["single", "greedy", "random"])
    df["metric"] = pd.Categorical(df["metric"], categories=list(METRICS))
    for c in ("layer", "kv_group"):
        df[c] = df[c].astype("Int64")
    for c in ("draw", "step", "full_groups", "restricted_groups", "bytes_saved", "bytes_saved_max"):
        df[c] = df[c].astype("int64")
    return df


def curve_quality(frame: pd.DataFrame, study: str = "greedy") -> pd.DataFrame:
    """Per measured point of ``study``: ``draw``, ``step``, ``full_groups``, the bytes saved and
    ``quality_change`` (the worst metric's ``change``)."""
    d = frame[frame["study"] == study]
    keys = ["draw", "step", "full_groups", "bytes_saved", "fraction_saved", "bytes_saved_max", "fraction_saved_max"]
    return d.groupby(keys, as_index=False, observed=True)["change"].max().rename(columns={"change": "quality_change"})


def curve_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The curve of the study: :func:`curve_quality` of the greedy order and of each random
    order, one row per measured point, ``study`` first."""
    parts = [curve_quality(frame, s).assign(study=s) for s in ("greedy", "random")]
    out = pd.concat(parts, ignore_index=True)
    return out[["study", *[c for c in out.columns if c != "study"]]]


def savings_at(frame: pd.DataFrame, tolerance: float = TOLERANCE) -> dict | None:
    """The greedy point that saves the most bytes while its quality change is ``<= tolerance``
    (``full_groups``, bytes and fractions saved at the run's and the maximum context); None
    when no measured point (not even every group full) is within it."""
    q = curve_quality(frame)
    ok = q[q["quality_change"] <= tolerance]
    if ok.empty:
        return None
    r = ok.sort_values(["bytes_saved", "step"], ascending=[False, True]).iloc[0]
    return {
        "tolerance": tolerance,
        "full_groups": int(r.full_groups),
        "quality_change": float(r.quality_change),
        "bytes_saved": int(r.bytes_saved),
        "fraction_saved": float(r.fraction_saved),
        "bytes_saved_max": int(r.bytes_saved_max),
        "fraction_saved_max": float(r.fraction_saved_max),
    }


def kept_groups(frame: pd.DataFrame, summary: dict) -> list[tuple[int, int]]:
    """The groups that keep a full cache at :func:`savings_at`'s point (the first
    ``full_groups`` of the greedy order)."""
    at = summary.get("savings_at_tolerance")
    if at is None:
        return [tuple(g) for g in summary["greedy_order"]]
    return [tuple(g) for g in summary["greedy_order"][: at["full_groups"]]]
