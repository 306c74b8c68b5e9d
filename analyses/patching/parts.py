"""The report's patching in parts, for a sharded run (``--ray``): activation patching by heads.

Each part ``(k, n)`` runs the report's tasks (:func:`~headscope.analyses.run_patching.patching_plan`:
the same tasks, items and settings as one process) and, of every batch, the patched forwards
``k, k+n, ...`` (:func:`~headscope.analyses.patching.activation.activation_deltas`): each forward
patches the units one process patches in it, so each unit's effect is the same float.
:func:`merge_activation` joins the parts' effects; :func:`~headscope.analyses.run_patching.run_patching`
then makes the frames, bootstrap intervals, permutation p-values and the adjustment over all units
from them, and runs attribution patching (one forward and backward per batch, for every head) itself.

>>> parts = [activation_part(model, roles, cfg, full=False, part=(k, 2)) for k in range(2)]  # doctest: +SKIP
>>> frame, summary = run_patching(model, roles, cfg, full=False, activation=merge_activation(parts))  # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd

from headscope.analyses.patching.activation import activation_deltas, merge_deltas
from headscope.analyses.patching.tasks import load_task
from headscope.analyses.run_patching import CausalConfig, patching_plan
from headscope.probes.errors import HeadscopeError

__all__ = ["activation_part", "merge_activation"]


def activation_part(model, roles: pd.DataFrame, cfg: CausalConfig, *, full: bool, part: tuple[int, int]) -> dict:
    """``{task: (effects {direction: [n_items, n_units]}, run metrics) or None}`` of part ``part``
    of every task's activation patching (NaN where another part computes); None: the task is
    refused here (the driver's run refuses it too, and says why)."""
    _todo, tasks, _unit, n_items, study = patching_plan(model, roles, cfg, full=full)
    out = {}
    for t in tasks:
        try:
            task = load_task(model, t, n_items=n_items, seed=cfg.seed)
            out[t] = activation_deltas(model, task, study.patch, part)
        except (HeadscopeError, ValueError):
            out[t] = None
    return out


def merge_activation(parts: list[dict]) -> dict:
    """``{task: (effects, run metrics)}`` of the whole run from the parts' (in part order); a task
    any part refused is left out (the driver runs or refuses it whole)."""
    if not parts:
        raise ValueError("merge_activation needs at least one part; got none")
    out = {}
    for t in parts[0]:
        got = [p.get(t) for p in parts]
        if all(g is not None for g in got):
            out[t] = (merge_deltas([g[0] for g in got]), got[0][1])
    return out
