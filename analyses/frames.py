"""Column names of headscope's tidy frames, defined once.

Every analysis returns one long-form ``pandas.DataFrame``, one observation per row.

* :data:`ROLE_COLUMNS` — role verdicts: a row per (layer, head, role[, relation, direction]).
* :data:`STAT_COLUMNS` — per-head statistics: a row per (layer, head, metric).
* :data:`IMPACT_COLUMNS` — pruning studies: a row per (study, layer, head or step, metric).

>>> empty_roles().columns.tolist()[:4]
['layer', 'head', 'role', 'relation']
"""

from __future__ import annotations

import pandas as pd

ROLE_COLUMNS = [
    "layer",  # int, 0-based
    "head",  # int, 0-based query head
    "role",  # e.g. "positional:previous", "syntactic", "coreference", "punctuation", "induction"
    "relation",  # dependency relation for syntactic rows, else ""
    "direction",  # "dep->head" / "head->dep" for syntactic rows, else ""
    "score",  # the head's score for the role (accuracy or attention mass, in [0, 1])
    "baseline",  # the baseline's score on the same items
    "margin",  # score - baseline
    "ci_low",  # bootstrap confidence interval of score (over items, seeded)
    "ci_high",
    "p_value",  # one-sided, score > baseline (paired sign-flip permutation or binomial)
    "n",  # items the score is computed over
    "verdict",  # bool: the head holds the role
]

STAT_COLUMNS = ["layer", "head", "metric", "value", "n"]

IMPACT_COLUMNS = ["study", "layer", "head", "step", "fraction_pruned", "metric", "value", "spread", "seed", "n"]


def empty_roles() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(ROLE_COLUMNS, _ROLE_DTYPES)})


_ROLE_DTYPES = ["int64", "int64", "object", "object", "object"] + ["float64"] * 6 + ["int64", "bool"]


def roles_frame(rows: list[dict]) -> pd.DataFrame:
    """Build a role frame from row dicts, with columns in the canonical order and dtypes;
    missing ``relation``/``direction`` become ``""``."""
    if not rows:
        return empty_roles()
    df = pd.DataFrame(rows)
    for c in ("relation", "direction"):
        if c not in df:
            df[c] = ""
        df[c] = df[c].fillna("")
    missing = [c for c in ROLE_COLUMNS if c not in df]
    if missing:
        raise ValueError(f"role rows lack columns {missing}; expected {ROLE_COLUMNS}")
    df = df[ROLE_COLUMNS].astype(dict(zip(ROLE_COLUMNS, _ROLE_DTYPES)))
    return df.sort_values(["role", "relation", "direction", "layer", "head"], kind="stable").reset_index(drop=True)
