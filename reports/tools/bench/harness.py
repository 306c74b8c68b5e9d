"""What capturing attention costs: every path of the registry, timed on the same batches.

:func:`run_bench` builds the shared state (:class:`~headscope.reports.tools.bench.state.BenchState`:
sentences of :mod:`headscope.probes.corpora.bench_sentences`, 12–40 words from a seeded
word list, or lines of a text file, cut into length-bucketed batches once) and times each
*path* of :data:`~headscope.reports.tools.bench.registry.PATHS` over all batches: every path is
warmed up on one batch, then ``repeats`` interleaved rounds each time every path once (so
load changes on a shared machine hit all paths alike), and a path's time is its fastest
round (as :mod:`timeit` advises: slower rounds measure other processes; the median is
kept in ``median_seconds``). The reference (ratio 1.0) is the plain HF transformers
forward with SDPA attention. A target's ratio of two paths is the median over rounds of
their times in the same round (the fastest-round ratio is in its note).

A path this machine cannot run (:class:`PathSkipped`: bf16 without native bf16) is kept
as a row with ``status = "skipped"`` and a note. Each path's time is compared with the
targets of :mod:`headscope.reports.tools.bench.targets`. The frame
(:data:`~headscope.reports.tools.bench.results.BENCH_COLUMNS`) has one row per path; ``gflop``
counts model FLOPs as ``2 × linear parameters × real tokens + 4 × layers × d_model × n²``
per sequence (×2 for the gate-gradient pass, whose backward stops at activations,
:mod:`~headscope.reports.tools.bench.counts`), ``peak_pct`` relates the achieved rate to a
measured 2048×2048 matmul loop of the same dtype.

This module is also the bench's front door: ``headscope bench`` calls :func:`run_bench`
and :func:`~headscope.reports.tools.bench.memory.memory_scaling` from here (the bench's modules:
:mod:`headscope.reports.tools.bench`).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict

import torch

from headscope.probes.capture import pattern_bytes
from headscope.reports.tools.bench.config import BenchConfig
from headscope.reports.tools.bench.counts import padding_ratio
from headscope.reports.tools.bench.machine import (
    bf16_support,
    check_device,
    matmul_peak_gflops,
    peak_rss_mb,
    rss_mb,
    sync,
)
from headscope.reports.tools.bench.memory import memory_scaling
from headscope.reports.tools.bench.registry import PATHS
from headscope.reports.tools.bench.results import BenchResult, path_frame, targets_frame
from headscope.reports.tools.bench.state import BenchState, PathSkipped

__all__ = [
    "PATHS",
    "BenchConfig",
    "BenchResult",
    "PathSkipped",
    "bf16_support",
    "check_device",
    "memory_scaling",
    "run_bench",
]

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


def _failure(name: str, e: Exception) -> str:
    log.warning("bench path %s failed: %s: %s", name, type(e).__name__, e)
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _warm_up(bench: BenchState, wanted: list[str], progress: Progress | None) -> tuple[dict, dict]:
    """``(rows, prepared)``: every path of ``wanted`` built and warmed up (one batch), in
    order; ``rows[name]`` its row so far (RSS read after the warm-up: its models loaded),
    ``prepared[name]`` its timed pass for those that are ready."""
    rows, prepared = {}, {}
    for name in wanted:
        if progress:
            progress(f"{name}: warm-up")
        row = {
            "path": name,
            "description": PATHS[name].description,
            "status": "ok",
            "seconds": math.nan,
            "gflop": math.nan,
            "repeats": 0,
            "median_seconds": math.nan,
            "note": "",
        }
        try:
            one_pass, warm, gflop, note = PATHS[name].fn(bench)
            warm()
            sync(bench.device)
            prepared[name] = one_pass
            row.update(gflop=gflop if gflop is not None else math.nan, note=note)
        except PathSkipped as e:
            row.update(status="skipped", note=str(e))
        except Exception as e:  # noqa: BLE001 - one failing path must not lose the others' figures
            row.update(status="failed", note=_failure(name, e))
        row["rss_mb"] = rss_mb()
        row["peak_rss_mb"] = peak_rss_mb()
        rows[name] = row
    return rows, prepared


def _timed_rounds(
    bench: BenchState, rows: dict, prepared: dict, repeats: int, progress: Progress | None
) -> dict[str, list[float]]:
    """Seconds of each prepared path per round. Interleaved rounds: each round times every
    path once, so a load change on a shared machine hits all paths alike instead of the ones
    that happened to run during it. A path that raises is marked failed in ``rows`` and
    dropped from ``prepared``; the others' ``seconds``, ``median_seconds`` and ``repeats``
    are written into their rows."""
    times: dict[str, list[float]] = {name: [] for name in prepared}
    for r in range(repeats):
        for name in list(prepared):
            if progress:
                progress(f"{name}: round {r + 1}/{repeats}")
            gc.collect()  # no collection of an earlier path's garbage inside this path's time
            try:
                t0 = time.perf_counter()
                prepared[name]()
                sync(bench.device)
                times[name].append(time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001
                rows[name].update(status="failed", note=_failure(name, e))
                del prepared[name]
    for name in prepared:
        rows[name].update(
            seconds=min(times[name]), median_seconds=statistics.median(times[name]), repeats=len(times[name])
        )
    return times


def _info(cfg: BenchConfig, bench: BenchState, machine: dict, times: dict[str, list[float]]) -> dict:
    """The result's ``info``: config, model, machine, batches, padding, pattern memory, rounds."""
    spec = bench.spec
    per_batch = [pattern_bytes(len(b.lengths), b.shape[1], spec.n_heads, spec.n_layers) for b in bench.batches]
    return {
        "config": asdict(cfg),
        "model": spec.name,
        "machine": machine,
        "sentences": len(bench.sentences),
        "skipped_longer_than_context": bench.n_skipped,
        "batches": len(bench.batches),
        "real_tokens": sum(bench.lengths),
        "linear_params": bench.linear,
        "forward_gflop": bench.fwd_gflop,
        "padding_ratio_bucketed": padding_ratio(bench.lengths, bench.groups),
        "padding_ratio_unsorted": padding_ratio(bench.lengths, bench.unsorted_groups),
        "pattern_bytes_store_all": sum(per_batch),
        "pattern_bytes_streaming": max(per_batch),
        "round_seconds": times,
    }


def run_bench(cfg: BenchConfig = BenchConfig(), progress: Progress | None = None) -> BenchResult:
    """Time every path of :data:`PATHS` (or ``cfg.paths``) on the same batches.

    Every path is built and warmed up first (one batch); then ``cfg.repeats`` rounds each
    time every path once over all batches; a path's ``seconds`` is its fastest round
    (``median_seconds``: its median).
    ``rss_mb``/``peak_rss_mb`` are read after the path's warm-up (its models loaded).
    ``progress(message)`` is called before each warm-up and each timed pass.

    Returns a :class:`BenchResult`; ``frame`` has one row per path, in :data:`PATHS`
    order, ``ratio = seconds / seconds of hf_sdpa`` (NaN when the reference was not run).
    A path that raises is kept with ``status = "failed"`` and the error as note; one that
    cannot run here (:class:`PathSkipped`) gives ``status = "skipped"``. Raises
    ``TypeError`` when ``cfg`` is not a :class:`BenchConfig`.
    """
    if not isinstance(cfg, BenchConfig):
        raise TypeError(f"cfg must be a BenchConfig; got {type(cfg).__name__}")
    t_start = time.perf_counter()
    bench = BenchState(cfg)
    wanted = list(cfg.paths or PATHS)
    peak32 = matmul_peak_gflops(torch.float32, size=cfg.peak_size, seconds=cfg.peak_seconds, device=bench.device)
    bf16_ok, bf16_why = bench.bf16
    peak16 = (
        matmul_peak_gflops(torch.bfloat16, size=cfg.peak_size, seconds=cfg.peak_seconds, device=bench.device)
        if bf16_ok
        else None
    )
    rows, prepared = _warm_up(bench, wanted, progress)
    times = _timed_rounds(bench, rows, prepared, cfg.repeats, progress)
    frame = path_frame([rows[name] for name in wanted], peak32=peak32, peak16=peak16, dtype=cfg.dtype)
    machine = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "device": str(bench.device),
        "fp32_peak_gflops": peak32,
        "bf16_peak_gflops": peak16,
        "bf16_native": bf16_ok,
        "bf16_note": bf16_why,
    }
    info = {**_info(cfg, bench, machine, times), "wall_seconds": time.perf_counter() - t_start}
    return BenchResult(frame=frame, targets=targets_frame(frame, rounds=times, model=cfg.model), info=info)
