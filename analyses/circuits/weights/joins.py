"""What the weights say next to what the model does: three joins of the circuits frames with
the roles and patching frames of the same model (issue #28 part 3).

* :func:`k_composition_join`: do the heads that K-compose most into each induction head
  include the previous-token heads that the roles find? Per induction head (a head whose
  ``induction`` role has a verdict), every head of an earlier layer is ranked by its
  K-composition into it; the row says how many previous-token heads (``previous-token``
  verdicts) there are, how many of them rank in the top ``k``, the best one's rank, and a
  one-sided Mann–Whitney p (previous-token heads score higher than the others) with the
  rank-biserial effect size. On GQA/MQA the receiver's key input is its KV group's, so a
  ``kv_group`` row is added per induction head's group.
* :func:`path_composition_join`: does path patching through K into a receiver agree with
  the K-composition into it? Spearman over the senders and the top-``k`` overlap of the two
  rankings, per receiver of a path-patching frame (``method`` ``path_k_*``).
* :func:`copying_patching_join`: are the copying heads (OV copying score) the heads that
  carry the induction and duplicate-token tasks in patching? Spearman of copying score with
  patching effect over all heads, the top-``k`` overlap and which top copying heads have a
  significant effect, per task.

Each is a pure function of tidy frames and returns a tidy frame (one row per receiver or
task); an empty input gives an empty frame with the same columns, and a join that has nothing
to compare (no induction head, no previous-token head in earlier layers) says so in ``note``.

>>> import pandas as pd
>>> roles = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "role": ["previous-token", "previous-token",
...     "induction"], "verdict": [True, False, True]})
>>> comp = pd.DataFrame({"sender_layer": [0, 0], "sender_head": [0, 1], "receiver_layer": [1, 1],
...     "receiver_head": [0, 0], "receiver_kv_head": [0, 0], "mode": ["K", "K"], "level": ["head", "head"],
...     "value": [0.9, 0.2]})
>>> j = k_composition_join(comp, roles, k=1)
>>> j[["receiver", "top_senders", "n_role_senders", "role_in_top_k", "best_role_rank"]].values.tolist()
[['L1H0', 'L0H0', 1, 1, 1]]
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

K_JOIN_COLUMNS = [
    "receiver",
    "receiver_basis",
    "receiver_layer",
    "receiver_head",
    "receiver_kv_head",
    "level",
    "n_senders",
    "n_role_senders",
    "role_senders",
    "top_senders",
    "k",
    "role_in_top_k",
    "expected_in_top_k",
    "best_role_rank",
    "rank_biserial",
    "p_value",
    "note",
]
PATH_JOIN_COLUMNS = [
    "receiver",
    "method",
    "receiver_reads",
    "level",
    "n_senders",
    "spearman",
    "spearman_p",
    "k",
    "top_k_overlap",
    "top_by_path",
    "top_by_composition",
    "note",
]
COPY_JOIN_COLUMNS = [
    "task",
    "method",
    "n_heads",
    "spearman",
    "spearman_p",
    "k",
    "top_k_overlap",
    "top_copying",
    "top_by_patching",
    "copying_heads_significant",
    "note",
]


def _name(layer, head) -> str:
    return f"L{int(layer)}H{int(head)}"


def _held(roles: pd.DataFrame, role: str) -> set[tuple[int, int]]:
    """The ``(layer, head)`` holding ``role`` (a verdict on any of its rows)."""
    if roles is None or roles.empty:
        return set()
    d = roles[(roles["role"].astype(str) == role) & roles["verdict"].astype(bool)]
    return {(int(l), int(h)) for l, h in zip(d["layer"], d["head"])}


def _mann_whitney(inside: np.ndarray, outside: np.ndarray) -> tuple[float, float]:
    """``(rank-biserial r, one-sided p)`` that ``inside`` scores higher than ``outside``; NaN
    when either side is empty or every value ties."""
    if len(inside) == 0 or len(outside) == 0:
        return math.nan, math.nan
    u, p = stats.mannwhitneyu(inside, outside, alternative="greater")
    return float(2 * u / (len(inside) * len(outside)) - 1), float(p)


def _receivers(roles: pd.DataFrame, role: str, n: int) -> tuple[list[tuple[int, int]], str]:
    """The heads holding ``role``, or (none holding it) the ``n`` with its highest score, and which basis."""
    held = sorted(_held(roles, role))
    if held or roles is None or roles.empty:
        return held, "verdict"
    d = roles[(roles["role"].astype(str) == role) & (roles["layer"] > 0)]  # layer 0 has no earlier heads
    d = d.sort_values(["score", "layer", "head"], ascending=[False, True, True])
    d = d.drop_duplicates(["layer", "head"]).head(n)
    return [(int(l), int(h)) for l, h in zip(d["layer"], d["head"])], f"top {n} {role} score (no verdict)"


def _k_row(d: pd.DataFrame, held: set, receiver, kv, level: str, k: int) -> dict:
    """One :data:`K_JOIN_COLUMNS` row from the K-composition rows ``d`` into one receiver."""
    d = d.dropna(subset=["value"])  # a sender with no OV circuit (W_O = 0) has no score to rank
    d = d.sort_values(["value", "sender_layer", "sender_head"], ascending=[False, True, True])
    senders = list(zip(d["sender_layer"].astype(int), d["sender_head"].astype(int)))
    is_role = np.array([s in held for s in senders], dtype=bool)
    values = d["value"].to_numpy(float)
    ranks = np.flatnonzero(is_role) + 1
    r, p = _mann_whitney(values[is_role], values[~is_role])
    layer, head = receiver
    note = ""
    if not len(senders):
        note = "no head of an earlier layer with a K-composition score"
    elif not is_role.any():
        note = "no previous-token head in an earlier layer"
    return {
        "receiver": _name(layer, head) if head is not None else f"L{layer} kv{kv}",
        "receiver_layer": int(layer),
        "receiver_head": head,
        "receiver_kv_head": kv,
        "level": level,
        "n_senders": len(senders),
        "n_role_senders": int(is_role.sum()),
        "role_senders": ", ".join(_name(*s) for s, x in zip(senders, is_role) if x),
        "top_senders": ", ".join(_name(*s) for s in senders[:k]),
        "k": k,
        "role_in_top_k": int(is_role[:k].sum()),
        "expected_in_top_k": float(min(k, len(senders)) * is_role.sum() / len(senders)) if senders else math.nan,
        "best_role_rank": int(ranks[0]) if len(ranks) else None,
        "rank_biserial": r,
        "p_value": p,
        "note": note,
    }


def k_composition_join(
    composition: pd.DataFrame,
    roles: pd.DataFrame,
    *,
    receiver_role: str = "induction",
    sender_role: str = "previous-token",
    k: int = 5,
    fallback: int = 3,
) -> pd.DataFrame:
    """Per ``receiver_role`` head, the K-composition ranking of every earlier head into it
    against the ``sender_role`` heads (module docstring); when no head holds ``receiver_role``,
    the ``fallback`` heads with its highest score are the receivers (``receiver_basis`` says
    which); :data:`K_JOIN_COLUMNS`."""
    rows = []
    comp = composition[composition["mode"].astype(str) == "K"] if len(composition) else composition
    held = _held(roles, sender_role)
    receivers, basis = _receivers(roles, receiver_role, fallback)
    for layer, head in receivers:
        d = comp[(comp["level"].astype(str) == "head") & (comp["receiver_layer"] == layer)]
        d = d[d["receiver_head"] == head]
        kv = int(d["receiver_kv_head"].iloc[0]) if len(d) else None
        rows.append({**_k_row(d, held, (layer, head), kv, "head", k), "receiver_basis": basis})
        g = comp[(comp["level"].astype(str) == "kv_group") & (comp["receiver_layer"] == layer)]
        g = g[g["receiver_kv_head"] == kv] if kv is not None else g.iloc[:0]
        shared = comp[(comp["level"].astype(str) == "head") & (comp["receiver_layer"] == layer)]
        if len(g) and shared.loc[shared["receiver_kv_head"] == kv, "receiver_head"].nunique() > 1:  # GQA/MQA only
            rows.append({**_k_row(g, held, (layer, None), kv, "kv_group", k), "receiver_basis": basis})
    df = pd.DataFrame(rows, columns=K_JOIN_COLUMNS)
    for col in ("receiver_head", "receiver_kv_head", "best_role_rank"):
        df[col] = df[col].astype("Int64")
    return df.drop_duplicates(["receiver", "level"]).reset_index(drop=True)


def _spearman(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    if len(a) < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return math.nan, math.nan
    rho, p = stats.spearmanr(a, b)
    return float(rho), float(p)


def _top(names: list[str], values: np.ndarray, k: int) -> list[str]:
    order = np.argsort(-values, kind="stable")
    return [names[i] for i in order[:k]]


def path_composition_join(composition: pd.DataFrame, path: pd.DataFrame, *, k: int = 10) -> pd.DataFrame:
    """Per receiver and method of the path-patching frame ``path`` (rows of ``method``
    ``path_k_*``, one per sender), its effects against the K-composition of the same senders
    into the receiver (``level`` ``head`` for a receiver's own read, ``kv_group`` for its
    group's); :data:`PATH_JOIN_COLUMNS`."""
    rows = []
    if path is None or path.empty or composition is None or composition.empty:
        return pd.DataFrame(rows, columns=PATH_JOIN_COLUMNS)
    path = path[path["method"].astype(str).str.startswith("path_k_")]
    if path.empty:  # a patching frame of other methods (the report's) has no receiver column
        return pd.DataFrame(rows, columns=PATH_JOIN_COLUMNS)
    comp = composition[composition["mode"].astype(str) == "K"]
    for (receiver, method), d in path.groupby([path["receiver"].astype(str), path["method"].astype(str)], sort=True):
        reads = str(d["receiver_reads"].iloc[0]) if "receiver_reads" in d else "head"
        rl, rh = (int(x) for x in receiver.split("."))
        c = comp[(comp["receiver_layer"] == rl) & (comp["level"].astype(str) == reads)]
        if reads == "head":
            c = c[c["receiver_head"] == rh]
        else:
            kv = comp[(comp["receiver_layer"] == rl) & (comp["receiver_head"] == rh)]["receiver_kv_head"]
            c = c[c["receiver_kv_head"] == (int(kv.iloc[0]) if len(kv) else -1)]
        m = d.merge(
            c[["sender_layer", "sender_head", "value"]],
            left_on=["layer", "head"],
            right_on=["sender_layer", "sender_head"],
        ).dropna(subset=["effect", "value"])
        names = [_name(l, h) for l, h in zip(m["layer"], m["head"])]
        eff, val = m["effect"].to_numpy(float), m["value"].to_numpy(float)
        rho, p = _spearman(eff, val)
        kk = min(k, len(names))
        by_path, by_comp = _top(names, eff, kk), _top(names, val, kk)
        rows.append(
            {
                "receiver": _name(rl, rh),
                "method": method,
                "receiver_reads": reads,
                "level": reads,
                "n_senders": len(names),
                "spearman": rho,
                "spearman_p": p,
                "k": kk,
                "top_k_overlap": len(set(by_path) & set(by_comp)) / kk if kk else math.nan,
                "top_by_path": ", ".join(by_path),
                "top_by_composition": ", ".join(by_comp),
                "note": "" if len(names) else "no sender of the path frame has a K-composition score",
            }
        )
    return pd.DataFrame(rows, columns=PATH_JOIN_COLUMNS)


def copying_patching_join(
    heads: pd.DataFrame,
    patching: pd.DataFrame,
    *,
    tasks: tuple[str, ...] = ("induction", "duplicate_token"),
    method: str = "activation_denoising",
    k: int = 10,
) -> pd.DataFrame:
    """Per task of ``tasks`` present in ``patching``, the heads' OV copying score (``heads``
    rows of statistic ``ov_copying``) against their patching ``effect`` under ``method``;
    :data:`COPY_JOIN_COLUMNS`."""
    rows = []
    if heads is None or heads.empty or patching is None or patching.empty:
        return pd.DataFrame(rows, columns=COPY_JOIN_COLUMNS)
    cop = heads[heads["statistic"].astype(str) == "ov_copying"][["layer", "head", "value"]]
    pat = patching[patching["method"].astype(str) == method]
    if "position" in pat:
        pat = pat[pat["position"].isna()]
    for task in tasks:
        d = pat[pat["task"].astype(str) == task]
        if d.empty:
            continue
        m = d.merge(cop, on=["layer", "head"]).dropna(subset=["effect", "value"])
        names = [_name(l, h) for l, h in zip(m["layer"], m["head"])]
        eff, val = m["effect"].to_numpy(float), m["value"].to_numpy(float)
        rho, p = _spearman(val, eff)
        kk = min(k, len(names))
        by_copy, by_patch = _top(names, val, kk), _top(names, eff, kk)
        sig = set(n for n, s in zip(names, m["significant"].astype(bool)) if s)
        rows.append(
            {
                "task": task,
                "method": method,
                "n_heads": len(names),
                "spearman": rho,
                "spearman_p": p,
                "k": kk,
                "top_k_overlap": len(set(by_copy) & set(by_patch)) / kk if kk else math.nan,
                "top_copying": ", ".join(by_copy),
                "top_by_patching": ", ".join(by_patch),
                "copying_heads_significant": ", ".join(n for n in by_copy if n in sig),
                "note": "",
            }
        )
    return pd.DataFrame(rows, columns=COPY_JOIN_COLUMNS)
