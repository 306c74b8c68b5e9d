"""Where a run's time goes: ``headscope bench MODEL --report`` times each stage of the report.

:class:`StageClock` is a ``progress(stage, done, total)`` callable (the one every stage of
``headscope report`` already calls): it keeps, per stage, the wall-clock and CPU seconds
(this process, all its threads) from the stage's first call to the call that ends it
(``done >= total``), and the peak resident memory when it ended. A stage named in ``parts``
that reports a few parts (``total`` at most :data:`PART_LIMIT`: the pruning study's baseline,
ablation, importance, role ablation and curves) keeps each part's seconds too, named by
``parts[stage]`` once the caller knows them (:func:`pruning_part_names`). :meth:`frame`
is the table the bench prints, one row per stage (and per part) in the order they started.

CPU seconds say what a stage costs on a machine shared with other work: its wall-clock time
there is longer by the share of the cores other processes took (``cores`` = CPU / wall).

The process's peak is a high-water mark: once the load has set it, no later stage shows its
own. With ``window`` (an :class:`RssWindow`, which samples the resident memory every few
milliseconds), each stage's row also has ``stage_peak_mb``, the most resident while it ran.

>>> ticks = iter([0.0, 1.0, 1.0, 4.0])
>>> clock = StageClock(clock=ticks.__next__, cpu=iter([0.0, 2.0, 2.0, 8.0]).__next__, rss=lambda: 0.0)
>>> clock("load", 0, None); clock("load", 1, 1); clock("roles", 0, 10); clock("roles", 10, 10)
>>> clock.frame()[["stage", "seconds", "cpu_seconds", "cores"]].to_dict("records")
[{'stage': 'load', 'seconds': 1.0, 'cpu_seconds': 2.0, 'cores': 2.0}, {'stage': 'roles', 'seconds': 3.0, 'cpu_seconds': 6.0, 'cores': 2.0}]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from headscope.analyses.bench.machine import peak_rss_mb

__all__ = ["PART_LIMIT", "STAGE_COLUMNS", "RssWindow", "StageClock", "pruning_part_names"]

#: a stage whose ``total`` is at most this reports parts (each call a part ended), not items
PART_LIMIT = 16
#: columns of :meth:`StageClock.frame`
STAGE_COLUMNS = ("stage", "part", "seconds", "cpu_seconds", "cores", "share", "items", "peak_rss_mb", "stage_peak_mb")


class RssWindow:
    """The most resident memory (MiB) while each named window was open, sampled from
    ``/proc/self/statm`` every ``interval`` seconds by a daemon thread (started by :meth:`open`,
    stopped by :meth:`stop`); None where ``/proc`` cannot be read.

    >>> w = RssWindow(interval=0.001)
    >>> w.open("a"); x = bytearray(64 << 20); peak = w.close("a"); w.stop()
    >>> peak is None or peak >= 64
    True
    """

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.peaks: dict[str, float] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        try:
            import os

            self._page = os.sysconf("SC_PAGE_SIZE") / 2**20
            self._now()
        except (OSError, ValueError, AttributeError):
            self._page = None

    def _now(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = self._now()
            with self._lock:
                for k, v in self.peaks.items():
                    if rss > v:
                        self.peaks[k] = rss

    def open(self, name: str) -> None:
        if self._page is None:
            return
        with self._lock:
            self.peaks[name] = self._now()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="headscope-rss-window", daemon=True)
            self._thread.start()

    def close(self, name: str) -> float | None:
        if self._page is None:
            return None
        rss = self._now()
        with self._lock:
            return max(rss, self.peaks.pop(name, rss))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


@dataclass
class _Open:
    started: float
    cpu: float
    last: float
    last_cpu: float
    done: int = 0
    total: int | None = None
    parts: list[tuple[float, float]] = field(default_factory=list)  # (wall, cpu) seconds of each part


class StageClock:
    """``progress(stage, done, total)`` that clocks every stage (see the module doc). ``inner``:
    the progress callable it wraps (called after); ``parts``: ``{stage: [part names]}``, the
    stages whose parts are timed (an empty list: unnamed, ``part i/n``);
    ``emit(line)``: told of each part as it ends (a run too long to wait for says where its time
    went so far)."""

    def __init__(
        self,
        inner: Callable | None = None,
        *,
        parts: dict[str, list[str]] | None = None,
        emit: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], float] = time.process_time,
        rss: Callable[[], float] = peak_rss_mb,
        window: RssWindow | None = None,
    ):
        self.inner, self.part_names, self.emit = inner, dict(parts or {}), emit
        self.clock, self.cpu, self.rss, self.window = clock, cpu, rss, window
        self.open: dict[str, _Open] = {}
        self.rows: list[dict] = []

    def __call__(self, stage: str, done: int, total: int | None = None) -> None:
        now, cpu = self.clock(), self.cpu()
        st = self.open.get(stage)
        if st is None:
            st = self.open[stage] = _Open(started=now, cpu=cpu, last=now, last_cpu=cpu)
            if self.window is not None:
                self.window.open(stage)
        elif stage in self.part_names and total is not None and total <= PART_LIMIT and done > st.done:
            st.parts.append((now - st.last, cpu - st.last_cpu))
            st.last, st.last_cpu = now, cpu
            if self.emit is not None and total > 1:
                names = self.part_names.get(stage) or []
                name = names[done - 1] if len(names) == total else ""
                self.emit(
                    f"{stage} part {done}/{total}{f' ({name})' if name else ''}: {st.parts[-1][0]:.1f} s, "
                    f"{st.parts[-1][1]:.1f} CPU s"
                )
        st.done, st.total = done, total
        if total is not None and done >= total and not any(r["stage"] == stage for r in self.rows):
            self._close(stage, st, now, cpu)
        if self.inner is not None:
            self.inner(stage, done, total)

    def _close(self, stage: str, st: _Open, now: float, cpu: float) -> None:
        many = st.total is not None and st.total > PART_LIMIT
        self.rows.append(
            {"stage": stage, "seconds": now - st.started, "cpu_seconds": cpu - st.cpu, "start": st.started}
            | {"items": st.total if many else None, "peak_rss_mb": self.rss(), "parts": list(st.parts)}
            | {"stage_peak_mb": self.window.close(stage) if self.window is not None else None}
        )

    def unfinished(self) -> list[str]:
        """Stages that started and never ended (a run that raised)."""
        ended = {r["stage"] for r in self.rows}
        return [s for s in self.open if s not in ended]

    def frame(self) -> pd.DataFrame:
        """One row per stage (then its parts, where it had more than one), in the order the
        stages started: ``seconds`` and ``cpu_seconds`` (rounded to 0.1 s), ``cores`` (CPU /
        wall), ``share`` (of the wall time of all stages), ``items`` (the stage's items, where
        it counts items), ``peak_rss_mb`` (the process's peak when the stage ended). Parts are
        named by ``parts[stage]`` when it names as many as there were, else ``part i/n``."""
        rows = sorted(self.rows, key=lambda r: r["start"])
        whole = sum(r["seconds"] for r in rows) or 1.0
        out = []
        for r in rows:
            row = _row(r["stage"], "", r["seconds"], r["cpu_seconds"], whole, r["items"], r["peak_rss_mb"])
            sp = r.get("stage_peak_mb")
            out.append({**row, "stage_peak_mb": None if sp is None else round(sp)})
            names = self.part_names.get(r["stage"]) or []
            if len(r["parts"]) > 1:
                n = len(r["parts"])
                for i, (wall, c) in enumerate(r["parts"]):
                    name = names[i] if len(names) == n else f"part {i + 1}/{n}"
                    out.append(_row(r["stage"], name, wall, c, whole, None, None))
        return pd.DataFrame(out, columns=list(STAGE_COLUMNS))


def _row(stage, part, seconds, cpu, whole, items, peak) -> dict:
    return {
        "stage": stage,
        "part": part,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "cores": round(cpu / seconds, 2) if seconds > 0 else None,
        "share": round(seconds / whole, 3),
        "items": items,
        "peak_rss_mb": None if peak is None else round(peak),
        "stage_peak_mb": None,
    }


def pruning_part_names(cfg, *, with_roles: bool) -> list[str]:
    """The parts the pruning study reports, in order (``pruning_study``'s ``_parts``): the
    baseline (with the unpruned pass), each ablation mode, all-but-one, importance, the role
    ablation, then one per curve.

    >>> from headscope.analyses.pruning.study import PruneConfig
    >>> from headscope.reports.stages.quick import QUICK_PRUNING
    >>> pruning_part_names(PruneConfig(**QUICK_PRUNING), with_roles=True)[:4]
    ['baseline', 'ablation:zero', 'importance', 'role ablation']
    """
    from headscope.analyses.pruning.study import curve_keys

    names = ["baseline"]
    if "ablation" in cfg.studies:
        names += [f"ablation:{m}" for m in cfg.ablation_modes]
    if "all_but_one" in cfg.studies:
        names.append("all_but_one")
    if "importance" in cfg.studies:
        names.append("importance")
    if with_roles:
        names.append("role ablation")
    if "curves" in cfg.studies:
        names += [f"curve {o}" if s is None else f"curve {o}:{s}" for o, s in curve_keys(cfg)]
    return names
