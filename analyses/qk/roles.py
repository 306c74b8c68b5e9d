"""What drives the attention of each role's top head: the exact QK attribution
(:func:`~headscope.analyses.qk.study.qk_study`) of the head with the highest-scoring verdict of each
role that has a task saying which key it attends, over up to :data:`N_ITEMS` items of that task.

Roles and their items (:data:`ROLE_ITEMS`): ``induction`` and ``copy-suppression`` on the induction
task (query: the second copy's token; key: the token after its first copy, the one induction
predicts); ``previous-token`` on the same sequences (key: the token before the query);
``duplicate-token`` on the duplicate-token task (key: the repeated token's first copy); IOI's
name movers and negative name movers on the IOI task (query: the last position; key: IO's mention).
Heads of roles sharing a task are attributed in one study: one forward per batch of items.

Frame (:data:`DRIVER_COLUMNS`): per role, the top :data:`TOP` components of each side (``query``,
``key``) with their share of the mean score difference (attended key minus the mean of the others).

>>> from headscope.probes.models.inhouse.planted import planted_model, writing_induction
>>> m = writing_induction(planted_model())
>>> roles = pd.DataFrame({"layer": [1], "head": [1], "role": ["induction"], "score": [0.9], "verdict": [True]})
>>> f, notes = role_drivers(m, roles, n_items=4)
>>> f[(f.side == "key") & (f["rank"] == 1)][["role", "layer", "head", "component"]].values.tolist()
[['induction', 1, 1, 'L0H0']]
"""

from __future__ import annotations

import pandas as pd

from headscope.analyses.qk.study import QKConfig, QKItem, duplicate_items, induction_items, qk_study

__all__ = [
    "DRIVER_COLUMNS",
    "N_ITEMS",
    "ROLE_ITEMS",
    "TOP",
    "driver_parts",
    "driver_sentences",
    "drivers_frame",
    "drivers_from_parts",
    "role_drivers",
]

#: items of a role's task attributed at most
N_ITEMS = 16
#: components kept per side
TOP = 3
DRIVER_COLUMNS = ["role", "layer", "head", "side", "rank", "component", "share", "n"]
_DTYPES = {"layer": "int64", "head": "int64", "rank": "int64", "share": "float64", "n": "int64"}


def drivers_frame(rows=()) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=DRIVER_COLUMNS).astype(_DTYPES)


def previous_items(task) -> list[QKItem]:
    """The induction task's clean items: query the last token, key the token before it."""
    return [QKItem(tuple(it.clean), len(it.clean) - 1, len(it.clean) - 2) for it in task.items]


def ioi_items(task) -> list[QKItem]:
    """The IOI task's clean items: query the last position, key IO's mention (the answer's token)."""
    return [QKItem(tuple(it.clean), len(it.clean) - 1, list(it.clean).index(it.answer)) for it in task.items]


def _generated(name):
    def make(model, n_items, seed):
        from headscope.analyses.patching.tasks import load_task

        return load_task(model, name, n_items=n_items, seed=seed)

    return make


#: role -> (task name, the task's items for that role)
ROLE_ITEMS = {
    "induction": ("induction", induction_items),
    "copy-suppression": ("induction", induction_items),
    "previous-token": ("induction", previous_items),
    "duplicate-token": ("duplicate_token", duplicate_items),
    "ioi:name-mover": ("ioi", ioi_items),
    "ioi:negative-name-mover": ("ioi", ioi_items),
}


def top_heads(roles: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """``{role: (layer, head)}``: the highest-scoring head with a verdict of each role of
    :data:`ROLE_ITEMS` present in ``roles`` (ROLE_COLUMNS)."""
    out = {}
    for role in ROLE_ITEMS:
        held = roles[(roles["role"] == role) & roles["verdict"].astype(bool)]
        if len(held):
            top = held.sort_values(["score", "layer", "head"], ascending=[False, True, True]).iloc[0]
            out[role] = (int(top["layer"]), int(top["head"]))
    return out


def role_drivers(model, roles: pd.DataFrame, *, n_items: int = N_ITEMS, seed: int = 0) -> tuple[pd.DataFrame, list]:
    """``(frame, notes)``: the :data:`DRIVER_COLUMNS` rows of each role's top head (module
    docstring) and one line per role or task that could not be attributed (why)."""
    return drivers_from_parts(driver_parts(model, roles, n_items=n_items, seed=seed))


def driver_parts(model, roles: pd.DataFrame, *, n_items: int = N_ITEMS, seed: int = 0, part=None) -> dict:
    """``{index: (rows, notes)}`` of each role attributed (``index``: its place in the order
    :func:`role_drivers` attributes them, by task; -1: the model's refusal). ``part`` ``(k, n)``:
    every ``n``-th role from the ``k``-th only (each role's study is its own: a sharded run's
    parts, joined by :func:`drivers_from_parts`, give one process's frame)."""
    from headscope.probes.capture import in_part
    from headscope.probes.qk_parts import qk_refusal

    heads = top_heads(roles)
    if not heads:
        return {}
    why = qk_refusal(model)
    if why is not None:
        return {-1: ([], [why])}
    by_task: dict[str, list[str]] = {}
    for role in heads:
        by_task.setdefault(ROLE_ITEMS[role][0], []).append(role)
    order = [(task_name, role) for task_name, task_roles in by_task.items() for role in task_roles]
    tasks: dict = {}
    out: dict = {}
    for i, (task_name, role) in enumerate(order):
        if not in_part(part, i):
            continue
        if task_name not in tasks:
            try:
                tasks[task_name] = _generated(task_name)(model, n_items, seed)
            except Exception as e:  # an encoder has no IOI task, a tokenizer too few names: said, not raised
                tasks[task_name] = e
        task = tasks[task_name]
        if isinstance(task, Exception):  # said once, at the task's first role
            first = role == by_task[task_name][0]
            why = f"{', '.join(by_task[task_name])}: no {task_name} items ({str(task).strip().splitlines()[0]})"
            out[i] = ([], [why] if first else [])
            continue
        out[i] = _role_rows(model, role, heads[role], ROLE_ITEMS[role][1](task)[:n_items])
    return out


def drivers_from_parts(parts: dict) -> tuple[pd.DataFrame, list]:
    """:func:`driver_parts` (of one process, or every part's merged) -> :func:`role_drivers`' ``(frame, notes)``."""
    rows, notes = [], []
    for i in sorted(parts):
        rows += parts[i][0]
        notes += parts[i][1]
    return drivers_frame(rows), notes


def _role_rows(model, role: str, head: tuple[int, int], items) -> tuple[list[dict], list[str]]:
    """The :data:`DRIVER_COLUMNS` rows of ``role``'s top ``head`` on ``items`` (or a note why none)."""
    layer, h = head
    f = qk_study(model, [(layer, h)], items, QKConfig(top_pairs=1)).frame
    if f.empty:
        return [], [f"{role}: L{layer}H{h}: no item attributed"]
    rows = []
    for side in ("query", "key"):
        part = f[(f.side == side) & (f["rank"] <= TOP)].sort_values("rank")
        for r in part.itertuples(index=False):
            component = r.query_component if side == "query" else r.key_component
            row = {"role": role, "layer": layer, "head": h, "side": side, "rank": int(r.rank)}
            rows.append({**row, "component": component, "share": float(r.share), "n": int(r.n)})
    return rows, []


def driver_sentences(frame: pd.DataFrame) -> list[str]:
    """One sentence per role of a :func:`role_drivers` frame: its top head's key-side and
    query-side drivers with their shares.

    >>> f = pd.DataFrame({"role": ["induction"] * 3, "layer": 18, "head": 6, "side": ["key", "key", "query"],
    ...                   "rank": [1, 2, 1], "component": ["L16H0", "L17H8", "embed"], "share": [0.81, 0.1, 0.6], "n": 16})
    >>> driver_sentences(f)
    ["induction: L18H6's keys are driven by L16H0 (81%), L17H8 (10%); its queries by embed (60%) (16 items)."]
    """
    out = []
    for role, g in frame.groupby("role", sort=False):
        layer, head = int(g["layer"].iloc[0]), int(g["head"].iloc[0])

        def side(s, g=g):
            part = g[g.side == s].sort_values("rank")
            return ", ".join(f"{c} ({v:.0%})" for c, v in zip(part.component, part.share))

        out.append(
            f"{role}: L{layer}H{head}'s keys are driven by {side('key')}; its queries by {side('query')} "
            f"({int(g['n'].iloc[0])} items)."
        )
    return out
