"""One patching run as the CLI makes it: the methods asked for on one task -> one frame
(:data:`~headscope.analyses.patching.frames.PATCH_COLUMNS`) and a summary dict.

``methods``: any of :data:`METHODS`. Activation and attribution patching run in
``cfg.patch.directions``; with both, the summary gives their agreement per direction
(Spearman over heads, top-k overlap; with ``per_position``, over (head, position) cells). Ablation runs ``cfg.patch.ablations`` on the clean run. Path
patching runs for ``receiver`` through each of ``vias`` (``senders``: default every head
below the receiver) in ``path_direction``. The summary's ``"measures"`` says in words
what the task's metric measures (an encoder's: the pooled-embedding cosine).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import pandas as pd

from headscope.analyses.patching.ablation import ablation_patching
from headscope.analyses.patching.activation import (
    PatchConfig,
    activation_patching,
    chosen_units,
    direction_frames,
    measures,
)
from headscope.analyses.patching.attribution import attribution_frames, attribution_patching
from headscope.analyses.patching.frames import agreement, top_heads
from headscope.analyses.patching.items import Task
from headscope.analyses.patching.path import READS, VIAS, check_path, path_patching

METHODS = ("activation", "attribution", "path", "ablation")


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    """What to run: ``methods``, ``patch`` (:class:`PatchConfig`), path patching's
    ``receiver``/``senders``/``vias``/``path_direction``/``path_reads`` (whose read of a shared
    K/V is patched: the receiver's alone or its KV group's, :data:`~headscope.analyses.patching.path.READS`),
    and ``top_k`` for the summary."""

    methods: tuple[str, ...] = ("activation", "attribution")
    patch: PatchConfig = field(default_factory=PatchConfig)
    receiver: tuple[int, int] | None = None
    senders: tuple[tuple[int, int], ...] | None = None
    vias: tuple[str, ...] = VIAS
    path_direction: str = "noising"
    path_reads: str = "head"
    top_k: int = 10

    def __post_init__(self):
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(f"methods must be a non-empty subset of {METHODS}; got {self.methods}")
        if "path" in self.methods and self.receiver is None:
            raise ValueError("path patching needs a receiver head (--receiver L.H)")
        bad = [v for v in self.vias if v not in VIAS]
        if bad or not self.vias:
            raise ValueError(f"vias must be a non-empty subset of {VIAS}; got {self.vias}")
        if self.path_reads not in READS:
            raise ValueError(f"path_reads must be one of {READS}; got {self.path_reads!r}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1; got {self.top_k}")


@dataclass
class PatchResult:
    """What :func:`patching_study` returns: ``frame`` (:data:`~headscope.analyses.patching.frames.PATCH_COLUMNS`,
    every method's rows) and ``summary`` (the task's clean and corrupted metric, the top heads of
    each method, their agreement, what the metric measures, the timings)."""

    frame: pd.DataFrame
    summary: dict


def _heads(pairs) -> list[str]:
    return [f"L{l}H{h}" for l, h in pairs]


def _top_units(frame: pd.DataFrame, k: int) -> list[str]:
    """Top ``k`` rows by effect as ``"L{l}H{h}"``, or ``"L{l}H{h}@{position}"`` for per-position rows."""
    if "position" not in frame or frame["position"].isna().all():
        return _heads(top_heads(frame, k))
    f = frame.dropna(subset=["effect"]).sort_values(
        ["effect", "layer", "head", "position"], ascending=[False, True, True, True]
    )
    return [f"L{int(r.layer)}H{int(r.head)}@{int(r.position)}" for r in f.head(k).itertuples()]


def patching_study(
    model, task: Task, cfg: StudyConfig = StudyConfig(), activation=None, attribution=None
) -> PatchResult:
    """Run ``cfg.methods`` on ``task`` -> :class:`PatchResult` (one frame, a summary with the
    clean/corrupted metric, the top heads per method, agreement and timings). ``activation``:
    activation patching's ``(effects, run metrics)`` (:func:`~headscope.analyses.patching.activation.activation_deltas`)
    computed already, by a sharded run's parts: its frame and statistics are made here;
    ``attribution``: attribution patching's ``(estimates, run metrics)`` likewise
    (:func:`~headscope.analyses.patching.attribution.attribution_deltas`)."""
    if "path" in cfg.methods:  # refused (backend, heads) before any long run
        for via in cfg.vias:
            check_path(model, cfg.receiver, via, None if cfg.senders is None else list(cfg.senders))
    frames, timings = [], {}
    run = None
    if "activation" in cfg.methods:
        t = time.perf_counter()
        if activation is None:
            f, run = activation_patching(model, task, cfg.patch)
        else:
            run = activation[1]
            f = direction_frames(activation[0], run, chosen_units(model.spec, cfg.patch), cfg.patch, "activation")
        frames.append(f)
        timings["activation"] = round(time.perf_counter() - t, 2)
    if "attribution" in cfg.methods:
        t = time.perf_counter()
        if attribution is None:
            f, run = attribution_patching(model, task, cfg.patch)
        else:
            run = attribution[1]
            f = attribution_frames(model, attribution[0], run, cfg.patch)
        frames.append(f)
        timings["attribution"] = round(time.perf_counter() - t, 2)
    if "ablation" in cfg.methods:
        t = time.perf_counter()
        f, run = ablation_patching(model, task, cfg.patch)
        frames.append(f)
        timings["ablation"] = round(time.perf_counter() - t, 2)
    if "path" in cfg.methods:
        t = time.perf_counter()
        for via in cfg.vias:
            f, run = path_patching(
                model,
                task,
                receiver=cfg.receiver,
                via=via,
                senders=None if cfg.senders is None else list(cfg.senders),
                direction=cfg.path_direction,
                reads=cfg.path_reads,
                cfg=cfg.patch,
            )
            frames.append(f)
        timings["path"] = round(time.perf_counter() - t, 2)
    frame = pd.concat(frames, ignore_index=True)
    frame["method"] = frame["method"].astype("category")
    summary = {
        "task": task.summary(),
        "measures": measures(model, task.metric),
        "metric_clean": float(run.clean.mean()),
        "metric_corrupted": float(run.corrupted.mean()),
        "gap": float(run.gap.mean()),
        "config": {**asdict(cfg), "patch": asdict(cfg.patch)},
        "seconds": timings,
        "top_heads": {},
        "significant_heads": {},
        "agreement": {},
    }
    for method, f in frame.groupby("method", observed=True):
        summary["top_heads"][method] = _top_units(f, cfg.top_k)
        summary["significant_heads"][method] = _heads(
            sorted({(int(r.layer), int(r.head)) for r in f[f["significant"]].itertuples()})
        )
    if "activation" in cfg.methods and "attribution" in cfg.methods:
        for d in cfg.patch.directions:
            a = frame[frame["method"] == f"activation_{d}"]
            m = frame["method"].astype(str)
            b = frame[m.str.startswith("attribution") & m.str.endswith(f"_{d}")]
            if cfg.patch.atp_fix in ("graddrop", "both"):  # GradDrop estimates magnitudes: compared with |effect|
                a = a.assign(effect=a["effect"].abs())
            summary["agreement"][d] = agreement(a, b, k=cfg.top_k)
    return PatchResult(frame=frame, summary=summary)
