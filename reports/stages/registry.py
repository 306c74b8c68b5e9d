"""The registry of report stages, :data:`STAGES`: one line per stage module (each exposes ``STAGE``,
a :class:`~headscope.reports.stages.base.Stage`). The report, its memory plan, run.json, the CLI's
``--only``/``--skip``/``--no-<stage>`` and the per-stage subcommands iterate it.

Registry order is the order of the report's sections (with :attr:`~.base.Stage.place`) and breaks
ties in the run order, which :func:`run_order` derives from each stage's ``requires`` and ``after``.

>>> list(STAGES)
['roles', 'pruning', 'patching', 'weights', 'kv', 'context', 'circuits']
>>> [s.name for s in run_order(["kv", "patching", "roles"])]
['roles', 'patching', 'kv']
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from headscope.reports.stages.base import Stage

_MODULES = (
    "headscope.reports.stages.roles",
    "headscope.reports.stages.pruning",
    "headscope.reports.stages.patching",
    "headscope.reports.stages.weights",
    "headscope.reports.stages.kv",
    "headscope.reports.stages.context",
    "headscope.reports.stages.circuits",
)

#: stage name -> stage, in registry order
STAGES: dict[str, Stage] = {s.name: s for s in (importlib.import_module(m).STAGE for m in _MODULES)}


def check_names(names: Iterable[str], flag: str = "--only") -> tuple[str, ...]:
    """``names`` as a tuple, each a registered stage; raises ``ValueError`` listing the known
    stages for an unknown one (the CLI: one line, exit 2)."""
    out = tuple(n.strip() for n in names if n.strip())
    for n in out:
        if n not in STAGES:
            raise ValueError(f"{flag}: unknown stage {n!r}; known stages: {', '.join(STAGES)}")
    return out


def run_order(names: Iterable[str] | None = None) -> list[Stage]:
    """The stages ``names`` (None: all) in the order they run: each after the stages it
    ``requires`` or runs ``after`` (those among ``names``), ties broken by registry order.
    Raises ``ValueError`` on a cycle."""
    wanted = list(STAGES) if names is None else [n for n in STAGES if n in set(names)]
    done: list[str] = []
    todo = list(wanted)
    while todo:
        for n in todo:
            s = STAGES[n]
            if all(d in done or d not in wanted for d in (*s.requires, *s.after)):
                done.append(n)
                todo.remove(n)
                break
        else:
            raise ValueError(f"the stages {todo} require each other in a cycle; check their requires/after")
    return [STAGES[n] for n in done]


def table_dtypes() -> dict[str, dict]:
    """Every frame a registered stage may write -> ``{"stage": name, "columns": {column: dtype}}``
    (its ``schemas``), in registry order: what ``data/schemas/report_tables.json`` holds for
    :func:`~headscope.reports.runs.load_run`, which reads a report without importing the stages.

    >>> table_dtypes()["skipped"]
    {'stage': 'roles', 'columns': {'analysis': 'str', 'reason': 'str', 'count': 'int64'}}
    """
    return {f: {"stage": s.name, "columns": dict(c)} for s in STAGES.values() for f, c in s.schemas.items()}


def report_order() -> list[Stage]:
    """Every stage in the order its sections appear: by ``place``, then registry order."""
    return sorted(STAGES.values(), key=lambda s: s.place)
