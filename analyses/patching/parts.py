"""The report's patching in parts, for a sharded run (``--ray``): activation patching by heads,
attribution patching by items.

Each part ``(k, n)`` runs the report's tasks (:func:`~headscope.analyses.run_patching.patching_plan`:
the same tasks, items and settings as one process) and, of every batch, the patched forwards
``k, k+n, ...`` (:func:`~headscope.analyses.patching.activation.activation_deltas`): each forward
patches the units one process patches in it, so each unit's effect is the same float. Attribution
patching (one forward and backward per batch, for every head) runs the task's batches ``k, k+n, ...``
(:func:`~headscope.analyses.patching.attribution.attribution_deltas`): each item's estimates come
from the batch one process runs it in. :func:`merge_parts` joins the parts' effects and estimates
(each cell from the part that computed it); :func:`~headscope.analyses.run_patching.run_patching`
then makes the frames, bootstrap intervals, permutation p-values and the adjustment over all units
from them.

>>> parts = [patching_part(model, roles, cfg, full=False, part=(k, 2)) for k in range(2)]  # doctest: +SKIP
>>> merged = merge_parts(parts)  # doctest: +SKIP
>>> frame, summary = run_patching(model, roles, cfg, full=False, **merged)  # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd

from headscope.analyses.patching.activation import RunMetrics, activation_deltas, merge_deltas
from headscope.analyses.patching.attribution import attribution_deltas
from headscope.analyses.patching.tasks import load_task
from headscope.analyses.run_patching import CausalConfig, patching_plan
from headscope.probes.errors import HeadscopeError

__all__ = ["merge_parts", "patching_part"]


def patching_part(model, roles: pd.DataFrame, cfg: CausalConfig, *, full: bool, part: tuple[int, int]) -> dict:
    """``{"activation": {task: (effects, run metrics) or None}, "attribution": {task: (estimates,
    run metrics) or None}}`` of part ``part`` of every task (effects: ``{direction: [n_items,
    n_units]}``, NaN where another part computes; attribution's run metrics NaN likewise); None: the
    task is refused here (the driver's run refuses it too, and says why)."""
    _todo, tasks, _unit, n_items, study = patching_plan(model, roles, cfg, full=full)
    out: dict = {"activation": {}, "attribution": {}}
    for t in tasks:
        try:
            task = load_task(model, t, n_items=n_items, seed=cfg.seed)
            out["activation"][t] = activation_deltas(model, task, study.patch, part)
            out["attribution"][t] = attribution_deltas(model, task, study.patch, part)
        except (HeadscopeError, ValueError):
            out["activation"][t] = out["attribution"][t] = None
    return out


def merge_parts(parts: list[dict]) -> dict:
    """``{"activation": {task: (effects, run metrics)}, "attribution": {task: (estimates, run metrics)}}``
    of the whole run from the parts' (in part order): activation's run metrics are every part's
    (each runs every batch's clean and corrupted input), attribution's each item's from its part;
    a task any part refused is left out (the driver runs or refuses it whole)."""
    if not parts:
        raise ValueError("merge_parts needs at least one part; got none")
    out: dict = {"activation": {}, "attribution": {}}
    for t in parts[0]["activation"]:
        act = [p["activation"].get(t) for p in parts]
        att = [p["attribution"].get(t) for p in parts]
        if any(g is None for g in act + att):
            continue
        out["activation"][t] = (merge_deltas([g[0] for g in act]), act[0][1])
        runs = merge_deltas([{"clean": g[1].clean, "corrupted": g[1].corrupted} for g in att])
        out["attribution"][t] = (merge_deltas([g[0] for g in att]), RunMetrics(runs["clean"], runs["corrupted"]))
    return out
