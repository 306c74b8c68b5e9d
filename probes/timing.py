"""The time a run will take: :class:`TimeEstimate` times the first units of work and says, once,
how long the whole will take at that rate."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["REFERENCE_N", "TimeEstimate", "reference_rate"]


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


#: the side of the square float32 matmul :func:`reference_rate` times (4 MiB a matrix: in cache on no CPU,
#: so it is memory-bound about as much as a forward's projections are)
REFERENCE_N = 512


def reference_rate(seconds: float = 0.3, trials: int = 6, clock: Callable[[], float] = time.perf_counter) -> float:
    """This machine's float32 matmul rate, in GFLOP/s: the median of ``trials`` runs of
    ``REFERENCE_N``-square products, ``seconds`` in all, with torch's threads as set (on a busy
    machine, the share of the cores this process gets now). The time estimates divide by it
    (:mod:`headscope.reports.stages.clock`), so a factor measured on one machine reads on another
    at that machine's rate. ``clock=time.thread_time`` on one thread: the rate of a core of its
    own however busy the machine is (what ``make estimates`` measures on a shared machine).

    >>> reference_rate(0.02) > 0
    True
    """
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(REFERENCE_N, REFERENCE_N, generator=g)
    b = torch.randn(REFERENCE_N, REFERENCE_N, generator=g)
    torch.mm(a, b)  # warm: threads started, kernels chosen
    rates = []
    for _ in range(trials):
        n, t0 = 0, clock()
        while True:
            torch.mm(a, b)
            n += 1
            took = clock() - t0
            if took >= seconds / trials:
                break
        rates.append(2 * REFERENCE_N**3 * n / took / 1e9)
    return sorted(rates)[len(rates) // 2]


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
