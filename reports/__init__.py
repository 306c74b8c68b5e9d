"""headscope.reports: frames to figures, HTML, Markdown, tables and the command line.

:func:`load_run` reads an output folder back (see :mod:`headscope.reports.runs`); it is
imported on first use, so ``import headscope.reports`` stays cheap (no pandas, no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headscope.reports.runs import RunFolder, load_run

__all__ = ["RunFolder", "load_run"]


def __getattr__(name: str):
    if name in __all__:
        from headscope.reports import runs

        return getattr(runs, name)
    raise AttributeError(f"module 'headscope.reports' has no attribute {name!r}")
