"""The run's patching stage: causal evidence per role, on the patching task each role names.

A role group says which task tests its rows (:attr:`~headscope.analyses.roles.base.Role.task`,
``row_tasks``; collected by :func:`~headscope.analyses.roles.base.role_tasks`), so a new role
brings its task with it. :func:`run_patching` runs activation (denoising) and attribution
patching of every head on the task of each role of a roles frame that has one
(:class:`~headscope.analyses.run.CausalConfig` sizes it); :func:`patching_blocker` says,
before the run spends any time, why the stage cannot run on a model.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import TYPE_CHECKING

import pandas as pd

from headscope.analyses.roles.base import role_tasks

if TYPE_CHECKING:
    from headscope.analyses.run import CausalConfig

log = logging.getLogger(__name__)

__all__ = ["CAUSAL_METHOD", "causal_roles", "patching_blocker", "run_patching", "task_for_role"]

#: the patching method the report ranks heads by (the other, attribution, is compared with it)
CAUSAL_METHOD = "activation_denoising"


def task_for_role(role: str, relation: str = "") -> str | None:
    """The registered patching task of ``role`` (and ``relation``), or None: the role
    registry's :func:`~headscope.analyses.roles.base.role_tasks` (a group's
    :attr:`~headscope.analyses.roles.base.Role.task` and ``row_tasks``), keeping only tasks
    registered in :data:`~headscope.analyses.patching.tasks.TASKS` (a role ``a:b`` falls back to ``a``).

    >>> task_for_role("syntactic", "nsubj"), task_for_role("syntactic", "det"), task_for_role("coreference:gender")
    ('agreement', None, 'coreference')
    """
    from headscope.analyses.patching.tasks import TASKS

    tasks = role_tasks()
    keys = [f"{role}:{relation}"] if relation else []
    keys += [role, str(role).split(":")[0]]
    for key in keys:
        if key in tasks:
            return tasks[key] if tasks[key] in TASKS else None
    return None


def causal_roles(roles: pd.DataFrame | None) -> pd.DataFrame:
    """The roles of a roles frame with a patching task: columns ``label`` (``role`` or
    ``role:relation``), ``role``, ``relation`` ("" for the whole role), ``task``; one row per
    label, in the frame's role order."""
    rows = []
    if roles is not None and not roles.empty:
        rel = roles["relation"].astype(str) if "relation" in roles else pd.Series("", index=roles.index)
        pairs = pd.DataFrame({"role": roles["role"].astype(str), "relation": rel}).drop_duplicates()
        for r in pairs.itertuples(index=False):
            whole = task_for_role(r.role)
            if whole is not None:
                rows.append((r.role, r.role, "", whole))
            elif r.relation and (t := task_for_role(r.role, r.relation)) is not None:
                rows.append((f"{r.role}:{r.relation}", r.role, r.relation, t))
    return pd.DataFrame(rows, columns=["label", "role", "relation", "task"]).drop_duplicates("label")


def patching_blocker(model) -> str | None:
    """Why the patching stage cannot run on ``model`` at all (no head hooks on its backend,
    or every role's task refused), or None — checked before the roles stage spends time."""
    from headscope.analyses.patching.tasks import TASKS, load_task
    from headscope.probes.errors import HeadscopeError
    from headscope.probes.models.backends.protocol import check_head_hooks

    try:
        check_head_hooks(model)
    except (HeadscopeError, ValueError) as e:
        return str(e)
    names = [t for t in dict.fromkeys(role_tasks().values()) if t in TASKS]
    if not names:
        return "no role task is registered (analyses.patching.tasks.TASKS)"
    why = {}
    for t in names:
        try:
            with warnings.catch_warnings():  # unusable items: the stage records them
                warnings.simplefilter("ignore")
                load_task(model, t, n_items=2)
        except (HeadscopeError, ValueError) as e:
            why[t] = str(e)
    if len(why) == len(names):
        return "; ".join(dict.fromkeys(why.values()))
    return None


def run_patching(model, roles: pd.DataFrame, cfg: CausalConfig, *, full: bool) -> tuple[pd.DataFrame, dict]:
    """Activation (denoising) + attribution patching on the task of each role of ``roles``
    that has one -> ``(frame, summary)``: the frame is ``task`` + the patching frame's columns
    (:data:`~headscope.analyses.patching.frames.PATCH_COLUMNS`, ``p_raw``, ``unit``) of every
    task; the summary holds ``roles`` (:func:`causal_roles` records), ``tasks`` (each task's
    ``patching_study`` summary + ``warnings``), ``refused`` (task -> reason), ``n_items``,
    ``unit``, ``method``, ``top_k``, ``seconds``. A task the model refuses is recorded in
    ``refused``, never raised."""
    from headscope.analyses.patching.activation import PatchConfig
    from headscope.analyses.patching.frames import PATCH_COLUMNS
    from headscope.analyses.patching.study import StudyConfig, patching_study
    from headscope.analyses.patching.tasks import load_task
    from headscope.probes.errors import HeadscopeError

    todo = causal_roles(roles)
    tasks = list(dict.fromkeys(todo["task"]))
    unit = cfg.unit_for(model.spec, full=full)
    per_layer = len(model.spec.kv_groups()) if unit == "kv_group" else model.spec.n_heads
    n_items = cfg.items_per_task(n_heads=model.spec.n_layers * per_layer, n_tasks=max(1, len(tasks)), full=full)
    study = StudyConfig(
        methods=("activation", "attribution"),
        patch=PatchConfig(
            directions=("denoising",),
            unit=unit,
            batch_size=cfg.batch_size,
            max_rows=cfg.max_rows,
            alpha=cfg.alpha,
            n_boot=cfg.n_boot,
            n_perm=cfg.n_perm,
            seed=cfg.seed,
        ),
        top_k=cfg.top_k,
    )
    frames, summaries, refused, seconds = [], {}, {}, {}
    for t in tasks:
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:  # unusable items, a task without a gap
                warnings.simplefilter("always")
                task = load_task(model, t, n_items=n_items, seed=cfg.seed)
                res = patching_study(model, task, study)
        except (HeadscopeError, ValueError) as e:
            refused[t] = str(e)
            log.warning("patching task %s refused: %s", t, e)
            continue
        seconds[t] = round(time.perf_counter() - t0, 3)
        f = res.frame.copy()
        f.insert(0, "task", t)
        frames.append(f)
        summaries[t] = {**res.summary, "warnings": sorted({str(w.message) for w in caught})}
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["task", *PATCH_COLUMNS])
    for c in ("task", "method"):
        frame[c] = frame[c].astype(str)
    summary = {
        "roles": todo.to_dict("records"),
        "tasks": summaries,
        "refused": refused,
        "n_items": n_items,
        "unit": unit,
        "method": CAUSAL_METHOD,
        "top_k": cfg.top_k,
        "seconds": seconds,
    }
    return frame, summary
