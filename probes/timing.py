"""The time a run will take: :class:`TimeEstimate` times the first units of work and says, once,
how long the whole will take at that rate."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["TimeEstimate"]


class TimeEstimate:
    """A ``progress(stage, done, total)`` wrapper that, once the first batch of a run is
    timed, calls ``emit`` once with the estimated time of the run: the seconds of the work
    done so far, per unit, times the run's ``total_work`` (0: the ``total`` of that call).
    ``stages``: only calls of these stages are timed (None: any); ``inner``: the progress
    callable it wraps.

    >>> lines = []
    >>> clock = TimeEstimate(total_work=100, emit=lines.append, clock=iter([0.0, 2.0]).__next__)
    >>> clock("text", 10, 50); clock("text", 20, 50)
    >>> lines
    ['estimated time: ~20 s for 100 items at the rate of the first 10 (2.0 s)']
    """

    def __init__(
        self,
        total_work: float,
        emit: Callable[[str], None],
        *,
        inner: Callable | None = None,
        unit: str = "items",
        stages: set[str] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.total_work = total_work
        self.emit = emit
        self.inner = inner
        self.unit = unit
        self.stages = stages
        self.clock = clock
        self.started = clock()
        self.seconds: float | None = None

    def __call__(self, stage: str, done: int, total: int | None = None) -> None:
        whole = self.total_work or total
        if self.seconds is None and done and whole and (self.stages is None or stage in self.stages):
            took = self.clock() - self.started
            self.seconds = took / done * whole
            self.emit(
                f"estimated time: ~{_duration(self.seconds)} for {whole:,.0f} {self.unit} at the rate of "
                f"the first {done:,} ({took:.1f} s)"
            )
        if self.inner is not None:
            self.inner(stage, done, total)


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
