"""Terminal output of ``headscope report``: rich progress bars and the end-of-run summary.

Everything goes to stderr except the ``--json`` summary, so ``--json`` output can be piped.
:class:`StageProgress` is the ``progress(stage, done, total)`` callable that
:func:`headscope.reports.pipeline.build_report` accepts; ``quiet=True`` makes it silent.

>>> p = StageProgress(quiet=True)
>>> with p:
...     p("roles", 1, 4)
>>> p.seen
{'roles': (1, 4)}
"""

from __future__ import annotations

import json
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

#: a stage of at least this many items is long: in plain-line mode it says how far it is every HEARTBEAT_S seconds
LONG_STAGE_ITEMS = 1000
HEARTBEAT_S = 15.0


class StageProgress:
    """One rich progress bar per stage; ``__call__(stage, done, total)`` advances it.

    ``total`` may be ``None`` (unknown length: a pulsing bar). When stderr is not a
    terminal (a log file, CI), bars are replaced by one plain line when a stage starts
    and one when it ends, with its time, so a log shows where a run is; a long stage
    (``total`` of at least :data:`LONG_STAGE_ITEMS` items, or unknown) also prints
    ``headscope: <stage> <done>/<total> items, <s> s`` every :data:`HEARTBEAT_S`
    seconds. ``long_only=True`` keeps short stages silent there (only long ones print)."""

    def __init__(self, *, quiet: bool = False, console: Console | None = None, long_only: bool = False):
        self.quiet = quiet
        self.long_only = long_only
        self.console = console or Console(stderr=True)
        self.seen: dict[str, tuple] = {}
        self._progress = None
        self._tasks: dict[str, int] = {}
        self._started: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._ended: set[str] = set()

    def __enter__(self):
        if not self.quiet and self.console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]{task.description:<12}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None
        return False

    def __call__(self, stage: str, done: int, total: int | None = None) -> None:
        self.seen[stage] = (done, total)
        if self.quiet:
            return
        if self._progress is None:
            self._log_line(stage, done, total)
            return
        if stage not in self._tasks:
            self._tasks[stage] = self._progress.add_task(stage, total=total)
        self._progress.update(self._tasks[stage], completed=done, total=total)

    def _log_line(self, stage: str, done: int, total: int | None) -> None:
        long = total is None or total >= LONG_STAGE_ITEMS
        if self.long_only and not long:
            return
        now = time.perf_counter()
        if stage not in self._started:
            self._started[stage] = self._last[stage] = now
            self.console.print(f"headscope: {stage} started", markup=False, highlight=False)
        if total is not None and done >= total:
            if stage not in self._ended:
                self._ended.add(stage)
                self.console.print(
                    f"headscope: {stage} done in {now - self._started[stage]:.1f} s", markup=False, highlight=False
                )
        elif long and now - self._last[stage] >= HEARTBEAT_S:
            self._last[stage] = now
            of = f"/{total}" if total is not None else ""
            self.console.print(
                f"headscope: {stage} {done}{of} items, {now - self._started[stage]:.0f} s",
                markup=False,
                highlight=False,
            )


def summary_table(summary: dict) -> Table:
    """Top heads per role as a rich table."""
    t = Table(title=f"Top heads per role — {summary.get('model')}", title_justify="left")
    for c in ("role", "heads holding it", "top heads (score / baseline)", "ablating top vs random"):
        t.add_column(c)
    for role, info in summary.get("roles", {}).items():
        tops = ", ".join(f"{h['head']} ({h['score']:.2f}/{h['baseline']:.2f})" for h in info["top"])
        t.add_row(role, str(info["n_heads"]), tops or "—", info.get("causal") or "—")
    return t


def print_summary(summary: dict, *, as_json: bool = False, console: Console | None = None) -> None:
    """``as_json``: the summary as JSON on stdout; else a short table and lines on stderr."""
    if as_json:
        json.dump(summary, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
        return
    console = console or Console(stderr=True)
    console.print(summary_table(summary))
    for line in summary.get("pruning", []):
        console.print(f"pruning: {line}")
    if summary.get("pruning"):
        console.print(f"pruning figure: {summary.get('pruning_figure')}")
    if summary.get("skipped"):
        console.print(f"skipped items: {summary['skipped']} (see the report's 'Items skipped' section)")
    console.print(f"report: {summary.get('report')}  ({summary.get('seconds', 0):.0f} s)")
