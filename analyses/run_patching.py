"""The run's patching stage: causal evidence per role, on the patching task each role names.

A role group says which task tests its rows (:attr:`~headscope.analyses.roles.base.Role.task`,
``row_tasks``; collected by :func:`~headscope.analyses.roles.base.role_tasks`), so a new role
brings its task with it. :func:`run_patching` runs activation (denoising) and attribution
patching of every head on the task of each role of a roles frame that has one
(:class:`CausalConfig` sizes it); :func:`patching_blocker` says,
before the run spends any time, why the stage cannot run on a model.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass

import pandas as pd

from headscope.analyses.roles.base import role_tasks

log = logging.getLogger(__name__)

__all__ = ["CAUSAL_METHOD", "CausalConfig", "causal_roles", "patching_blocker", "run_patching", "task_for_role"]

#: the patching method the report ranks heads by (the other, attribution, is compared with it)
CAUSAL_METHOD = "activation_denoising"


@dataclass(frozen=True, kw_only=True)
class CausalConfig:
    """The report's patching stage: activation (denoising) and attribution patching of every
    head on each role's task (:attr:`~headscope.analyses.roles.base.Role.task`;
    :func:`run_patching`).

    ``unit``: ``"head"`` or ``"kv_group"`` (the query heads sharing a KV head patched
    together, each given the group's effect); None: ``"kv_group"`` in quick mode on a model
    with GQA groups (a third of the forwards on SmolLM2), ``"head"`` otherwise and in full mode.
    ``n_items``: items per task; None: quick mode takes ``row_budget // (units × tasks)``
    items per task, clipped to ``[min_items, max_items]`` (activation patching runs one
    sequence per unit and item, so the budget bounds the stage's cost on any model), full
    mode ``max_items``. ``batch_size``, ``n_boot``, ``n_perm``, ``alpha``, ``seed``: as
    :class:`~headscope.analyses.patching.activation.PatchConfig`; ``top_k``: the heads
    compared (largest effects, and the role's best by attention score)."""

    unit: str | None = None
    n_items: int | None = None
    row_budget: int = 1500
    min_items: int = 4
    max_items: int = 64
    batch_size: int = 16
    max_rows: int = 144  # sequences per forward (PatchConfig's default); lowered only to fit in memory
    top_k: int = 10
    n_boot: int = 500
    n_perm: int = 2000
    alpha: float = 0.05
    seed: int = 0

    def __post_init__(self):
        for k in ("row_budget", "min_items", "max_items", "batch_size", "max_rows", "top_k"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"The {k!r} parameter of CausalConfig must be a positive int; got {v!r}.")
        if self.n_items is not None and (
            isinstance(self.n_items, bool) or not isinstance(self.n_items, int) or self.n_items < 2
        ):
            raise ValueError(
                f"The 'n_items' parameter of CausalConfig must be None or an int >= 2; got {self.n_items!r}."
            )
        if self.unit not in (None, "head", "kv_group"):
            raise ValueError(
                f"The 'unit' parameter of CausalConfig must be None, 'head' or 'kv_group'; got {self.unit!r}."
            )
        if self.min_items > self.max_items:
            raise ValueError(f"min_items must be <= max_items; got {self.min_items} and {self.max_items}")

    def unit_for(self, spec, *, full: bool) -> str:
        """The patching unit on a model of ``spec`` (see the class docstring)."""
        if self.unit is not None:
            return self.unit
        gqa = 0 < int(getattr(spec, "n_kv_heads", 0) or 0) < spec.n_heads
        return "kv_group" if gqa and not full else "head"

    def items_per_task(self, *, n_heads: int, n_tasks: int, full: bool) -> int:
        """Items per task (see the class docstring).

        >>> CausalConfig().items_per_task(n_heads=90, n_tasks=4, full=False)
        4
        >>> CausalConfig().items_per_task(n_heads=72, n_tasks=4, full=False), CausalConfig().items_per_task(n_heads=72, n_tasks=4, full=True)
        (5, 64)
        """
        if self.n_items is not None:
            return self.n_items
        if full:
            return self.max_items
        return int(min(self.max_items, max(self.min_items, self.row_budget // max(1, n_heads * n_tasks))))


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


def run_patching(
    model,
    roles: pd.DataFrame,
    cfg: CausalConfig,
    *,
    full: bool,
    activation: dict | None = None,
    attribution: dict | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Activation (denoising) + attribution patching on the task of each role of ``roles``
    that has one -> ``(frame, summary)``: the frame is ``task`` + the patching frame's columns
    (:data:`~headscope.analyses.patching.frames.PATCH_COLUMNS`, ``p_raw``, ``unit``) of every
    task; the summary holds ``roles`` (:func:`causal_roles` records), ``tasks`` (each task's
    ``patching_study`` summary + ``warnings``), ``refused`` (task -> reason), ``n_items``,
    ``unit``, ``method``, ``top_k``, ``seconds``. A task the model refuses is recorded in
    ``refused``, never raised. ``activation``: ``{task: (frame, run metrics)}`` of activation
    patching computed already (a sharded run, :mod:`~headscope.analyses.patching.parts`);
    ``attribution``: ``{task: (estimates, run metrics)}`` of attribution patching likewise."""
    from headscope.analyses.patching.frames import PATCH_COLUMNS
    from headscope.analyses.patching.study import patching_study
    from headscope.analyses.patching.tasks import load_task
    from headscope.probes.errors import HeadscopeError

    todo, tasks, unit, n_items, study = patching_plan(model, roles, cfg, full=full)
    frames, summaries, refused, seconds = [], {}, {}, {}
    for t in tasks:
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:  # unusable items, a task without a gap
                warnings.simplefilter("always")
                task = load_task(model, t, n_items=n_items, seed=cfg.seed)
                res = patching_study(model, task, study, (activation or {}).get(t), (attribution or {}).get(t))
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


def patching_plan(model, roles: pd.DataFrame, cfg: CausalConfig, *, full: bool):
    """What :func:`run_patching` runs: ``(roles to test, tasks, unit, items per task, StudyConfig)``."""
    from headscope.analyses.patching.activation import PatchConfig
    from headscope.analyses.patching.study import StudyConfig

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
    return todo, tasks, unit, n_items, study
