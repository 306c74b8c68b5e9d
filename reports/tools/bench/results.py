"""The bench's result: one row per path (:data:`BENCH_COLUMNS`), one per target
(:data:`TARGET_COLUMNS`), and what was measured about the machine and the batches.

``ratio`` is a path's seconds over the reference's (``hf_sdpa``); ``gflops_per_s`` its
``gflop`` over its seconds; ``peak_pct`` that rate over the measured matmul peak of the
same dtype. A target's value is the median over rounds of two paths' times in the same
round (:func:`targets_frame`).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

import pandas as pd

from headscope.reports.tools.bench.targets import RATIO_TARGETS, SECONDS_TARGETS

__all__ = ["BENCH_COLUMNS", "REFERENCE", "TARGET_COLUMNS", "BenchResult", "path_frame", "targets_frame"]

BENCH_COLUMNS = [
    "path",
    "description",
    "status",
    "seconds",
    "ratio",
    "gflop",
    "gflops_per_s",
    "peak_pct",
    "rss_mb",
    "peak_rss_mb",
    "repeats",
    "median_seconds",
    "note",
]
TARGET_COLUMNS = ["target", "value", "threshold", "met", "note"]
#: the path every ratio is relative to
REFERENCE = "hf_sdpa"


@dataclass
class BenchResult:
    """``frame``: one row per path (:data:`BENCH_COLUMNS`); ``targets``: one row per target
    (:data:`TARGET_COLUMNS`); ``info``: machine, batches, padding, pattern memory."""

    frame: pd.DataFrame
    targets: pd.DataFrame
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "paths": json.loads(self.frame.to_json(orient="records")),
            "targets": json.loads(self.targets.to_json(orient="records")),
            "info": self.info,
        }


def path_frame(rows: list[dict], *, peak32: float, peak16: float | None, dtype: str) -> pd.DataFrame:
    """The :data:`BENCH_COLUMNS` frame of the path ``rows`` (``path``, ``description``,
    ``status``, ``seconds``, ``gflop``, ``rss_mb``, ``peak_rss_mb``, ``repeats``,
    ``median_seconds``, ``note``): ``ratio`` to the reference's seconds (NaN when it did
    not run), ``gflops_per_s``, and ``peak_pct`` of ``peak16`` (GFLOP/s) for bf16 rows
    where there is one, else of ``peak32``."""
    frame = pd.DataFrame(rows)
    ref = frame.loc[(frame.path == REFERENCE) & (frame.status == "ok"), "seconds"]
    frame["ratio"] = frame["seconds"] / float(ref.iloc[0]) if len(ref) else math.nan
    frame["gflops_per_s"] = frame["gflop"] / frame["seconds"]
    is16 = (frame.path == "bf16_forward") | (dtype == "bf16")
    peak = pd.Series([peak16 if (b and peak16) else peak32 for b in is16], index=frame.index)
    frame["peak_pct"] = 100 * frame["gflops_per_s"] / peak
    return frame[BENCH_COLUMNS]


def targets_frame(
    frame: pd.DataFrame, rounds: dict[str, list[float]] | None = None, model: str | None = None
) -> pd.DataFrame:
    """Each target of :data:`~headscope.reports.tools.bench.targets.RATIO_TARGETS` against the
    frame (:data:`TARGET_COLUMNS`). With ``rounds`` (seconds per interleaved round), a ratio
    is the median over rounds of the two paths' times in the same round: both ran minutes
    apart at most, so a machine that speeds up or slows down between rounds moves both
    alike, where the ratio of two fastest rounds may pair one path's lucky round with the
    other's ordinary one. The note gives the ratio of fastest rounds too. Each target of
    :data:`~headscope.reports.tools.bench.targets.SECONDS_TARGETS` whose path the bench ran follows:
    its path's fastest round, where the bench ran on the target's ``model``."""
    s = {r.path: r.seconds for r in frame.itertuples() if r.status == "ok"}
    rows = []
    for t in RATIO_TARGETS:
        num, den, note = t.numerator, t.denominator, t.note
        if num in s and den in s and s[den] > 0:
            v = s[num] / s[den]
            rn, rd = (rounds or {}).get(num, []), (rounds or {}).get(den, [])
            if len(rn) == len(rd) and rn and all(d > 0 for d in rd):
                note = f"{note}; median of {len(rn)} paired rounds (fastest rounds: {v:.2f})"
                v = statistics.median(a / b for a, b in zip(rn, rd))
            rows.append({"target": t.name, "value": v, "threshold": t.threshold, "met": t.met(v), "note": note})
        else:
            missing = [p for p in (num, den) if p not in s]
            rows.append(
                {
                    "target": t.name,
                    "value": float("nan"),
                    "threshold": t.threshold,
                    "met": None,
                    "note": f"not measured ({', '.join(missing)})",
                }
            )
    for t in SECONDS_TARGETS:
        if t.path not in set(frame["path"]):
            continue  # a bench whose --paths leave the path out
        row = {"target": t.name, "value": float("nan"), "threshold": t.threshold, "met": None, "note": t.note}
        if model != t.model:
            row["note"] = f"not measured (the target is on {t.model}; this bench ran {model})"
        elif t.path not in s:
            row["note"] = f"not measured ({t.path} did not run)"
        else:
            row.update(value=s[t.path], met=t.met(s[t.path]))
        rows.append(row)
    return pd.DataFrame(rows, columns=TARGET_COLUMNS)
