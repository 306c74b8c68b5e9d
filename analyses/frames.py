"""Column names of headscope's tidy frames, defined once.

Every analysis returns one long-form ``pandas.DataFrame``, one observation per row.

* :data:`ROLE_COLUMNS` — role verdicts: a row per (layer, head, role[, relation, direction]).
* :data:`STAT_COLUMNS` — per-head statistics: a row per (layer, head, metric).
* :data:`IMPACT_COLUMNS` — pruning studies: a row per (study, layer, head or step, metric).
* :data:`EXAMPLE_COLUMNS` — the report's example attention maps: a row per (example, query word, key word).

>>> empty_roles().columns.tolist()[:4], empty_roles().columns.tolist()[-5:]
(['layer', 'head', 'role', 'relation'], ['p_raw', 'test', 'interval', 'family', 'meets_threshold'])
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
    "ci_low",  # confidence interval of score at RolesConfig.ci_level (kind in `interval`)
    "ci_high",
    "p_value",  # one-sided p that score > baseline (test in `test`), ADJUSTED over the family in `family`
    "n",  # items the score is computed over
    "verdict",  # bool: the head holds the role (meets_threshold and p_value < alpha)
    # --- how the uncertainty was computed (analyses.stats.verdicts) ---
    "p_raw",  # the unadjusted p of `test`
    "test",  # "sign-flip permutation (2000)", "sign-flip permutation (7200, refined)",
    #          "sign-flip permutation (200000) + normal tail", "exact sign test", "exact binomial"; "" when n = 0
    "interval",  # "bootstrap percentile" (continuous scores) or "Wilson" (0/1 hits); "" when n = 0
    "family",  # the p_value's correction family: "role" (the heads of one role/relation/direction),
    #            "global" (every row of the run), "none" (uncorrected: p_value = p_raw)
    "meets_threshold",  # bool: the role's threshold criterion holds and n >= its minimum (all but the p of a verdict)
]

STAT_COLUMNS = ["layer", "head", "metric", "value", "n"]

#: the pruning studies' columns and their dtypes (nullable ints: layer/head/seed are absent on some rows)
IMPACT_DTYPES = {
    "study": "str",
    "layer": "Int64",
    "head": "Int64",
    "step": "int64",
    "fraction_pruned": "float64",
    "metric": "str",
    "value": "float64",
    "spread": "float64",
    "seed": "Int64",
    "n": "int64",
}
IMPACT_COLUMNS = list(IMPACT_DTYPES)

EXAMPLE_COLUMNS = [
    "example",
    "role",
    "relation",
    "direction",
    "layer",
    "head",
    "level",
    "sentence",
    "query_index",
    "key_index",
    "query_word",
    "key_word",
    "weight",
    "gold",
]
"""Columns of the example-attention frame: one row per (example, query word, key word);
``example`` names the example (e.g. ``"syntactic:nsubj:dep->head"``), ``gold`` marks the
pairs the role expects the head to link (where the role defines them); ``level`` is
``"word"`` (Clark et al. word-level pattern) or ``"token"`` (sub-word tokens, for items
that have no words, such as random induction sequences)."""


def empty_roles() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(ROLE_COLUMNS, _ROLE_DTYPES)})


_ROLE_DTYPES = ["int64", "int64", "object", "object", "object"] + ["float64"] * 6 + ["int64", "bool"]
_ROLE_DTYPES += ["float64", "object", "object", "object", "bool"]


def roles_frame(rows: list[dict]) -> pd.DataFrame:
    """Build a role frame from row dicts, with columns in the canonical order and dtypes;
    missing ``relation``/``direction`` become ``""``. Rows built by hand (before the
    uncertainty columns existed) may lack those: ``p_raw`` then copies ``p_value``,
    ``test``/``interval`` are ``""``, ``family`` is ``"role"`` and ``meets_threshold``
    copies ``verdict`` (a lower bound)."""
    if not rows:
        return empty_roles()
    df = pd.DataFrame(rows)
    for c in ("relation", "direction"):
        if c not in df:
            df[c] = ""
        df[c] = df[c].fillna("")
    defaults = {"p_raw": "p_value", "meets_threshold": "verdict"}
    for c, src in defaults.items():
        if c not in df and src in df:
            df[c] = df[src]
    for c, v in (("test", ""), ("interval", ""), ("family", "role")):
        if c not in df:
            df[c] = v
    missing = [c for c in ROLE_COLUMNS if c not in df]
    if missing:
        raise ValueError(f"role rows lack columns {missing}; expected {ROLE_COLUMNS}")
    df = df[ROLE_COLUMNS].astype(dict(zip(ROLE_COLUMNS, _ROLE_DTYPES)))
    return df.sort_values(["role", "relation", "direction", "layer", "head"], kind="stable").reset_index(drop=True)
