"""``headscope bench MODEL --report``: where a default report's time goes on MODEL.

:func:`report_stages` runs :func:`~headscope.reports.pipeline.build_report` once, with the
settings ``headscope report MODEL`` uses (quick, as sized for the model:
:mod:`headscope.reports.stages.quick`), into a temporary folder, its progress clocked
by :class:`~headscope.analyses.bench.stage_clock.StageClock`; it returns the stage table,
the memory the run estimated and reached (run.json's ``memory``), what quick mode left out,
and the machine's load. :func:`print_report_stages` prints them (``--json``: as JSON).

Example (runs a report)::

    out = report_stages("minilm-l6")
    out["stages"][["stage", "part", "seconds", "cpu_seconds"]]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

__all__ = ["print_report_stages", "report_stages"]


def _load() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def report_stages(model, *, dtype: str = "fp32", device=None, notice=None, progress=None) -> dict:
    """Run the default report on ``model`` and time each stage (see the module doc). Returns
    ``{"model", "stages" (frame), "seconds", "cpu_seconds", "memory", "quick", "machine"}``;
    ``notice(line)`` receives the report's own notes (the memory plan, the estimated time);
    ``progress(stage, done, total)`` is told of every stage too (the CLI's progress lines)."""
    from headscope.analyses.bench.stage_clock import RssWindow, StageClock, pruning_part_names
    from headscope.analyses.pruning.study import PruneConfig
    from headscope.reports.pipeline import build_report
    from headscope.reports.stages.config import RunConfig

    config = RunConfig(dtype=dtype, device=device)
    window = RssWindow()  # each stage's own peak (the process's high-water mark is the load's)
    clock = StageClock(progress, parts={"pruning": []}, emit=notice, window=window)  # parts named once the run says
    load_before, t0, c0 = _load(), time.perf_counter(), time.process_time()
    try:
        with tempfile.TemporaryDirectory(prefix="headscope-bench-report-") as tmp:
            result = build_report(model, config, out_dir=Path(tmp) / "report", progress=clock, notice=notice)
            run = json.loads(result.paths["run_json"].read_text(encoding="utf-8"))
    finally:
        window.stop()
    pcfg = run.get("config", {}).get("pruning")
    if pcfg:
        clock.part_names["pruning"] = pruning_part_names(PruneConfig.from_dict(pcfg), with_roles=True)
    return {
        "model": run.get("model"),
        "stages": clock.frame(),
        "seconds": round(time.perf_counter() - t0, 1),
        "cpu_seconds": round(time.process_time() - c0, 1),
        "memory": run.get("memory") or {},
        "quick": run.get("quick") or {},
        "machine": {
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": _load(),
        },
    }


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def render(out: dict) -> str:
    """The plain-text table of :func:`report_stages`' result."""
    m, mem, frame = out["machine"], out["memory"], out["stages"]
    lines = [
        f"headscope bench --report: {out['model']}, the default report (quick), {m['threads']} threads, "
        f"{m['cpus']} CPUs, load average {m['load_average_before']} before, {m['load_average_after']} after",
        "",
    ]
    cols = ("stage", "part", "seconds", "CPU s", "cores", "share", "items", "peak MiB", "stage MiB")
    rows = [list(cols)]
    for r in frame.itertuples():
        rows.append(
            [
                r.stage,
                r.part,
                f"{r.seconds:.1f}",
                f"{r.cpu_seconds:.1f}",
                "-" if r.cores is None or r.cores != r.cores else f"{r.cores:.2f}",
                f"{r.share:.1%}",
                "-" if r.items is None or r.items != r.items else f"{int(r.items)}",
                "-" if r.peak_rss_mb is None or r.peak_rss_mb != r.peak_rss_mb else f"{int(r.peak_rss_mb)}",
                "-" if r.stage_peak_mb is None or r.stage_peak_mb != r.stage_peak_mb else f"{int(r.stage_peak_mb)}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines += [
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows
    ]
    lines += [
        "",
        f"total: {out['seconds']:.1f} s wall, {out['cpu_seconds']:.1f} CPU s; memory: ~{_gib(mem.get('estimate_bytes'))} "
        f"estimated, {_gib(mem.get('peak_rss_bytes'))} peak",
    ]
    left = (out.get("quick") or {}).get("leaves_out")
    if left:
        lines.append(f"quick mode leaves out: {left}")
    lines.append("(CPU s: this process, all threads; on a machine shared with other work, wall = CPU / cores it got)")
    lines.append(
        "(peak MiB: the process's high-water mark when the stage ended; stage MiB: the most resident during it)"
    )
    est = (mem.get("phases") or {}) if isinstance(mem, dict) else {}
    if est:
        phases = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in est.items())
        lines.append(f"estimated peak per phase, GiB: {phases}")
    return "\n".join(lines)


def print_report_stages(model, *, dtype: str = "fp32", device=None, as_json: bool = False) -> int:
    """``headscope bench MODEL --report``: print :func:`report_stages`' table (or JSON); 0."""
    from headscope.reports.budget import emitter
    from headscope.reports.cli.terminal import StageProgress

    with StageProgress(quiet=as_json) as progress:
        out = report_stages(
            model, dtype=dtype, device=device, notice=None if as_json else emitter(False), progress=progress
        )
    if as_json:
        doc = {**out, "stages": json.loads(out["stages"].to_json(orient="records"))}
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(render(out), file=sys.stdout)
    return 0
