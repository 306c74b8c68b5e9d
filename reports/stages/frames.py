"""The run's analyses as tidy frames: skipped counts, example attention maps, the pruning study's tables.

Adapters from what :func:`~headscope.analyses.roles.pipeline.head_roles` and
:func:`~headscope.analyses.pruning.study.pruning_study` return to the frames
the report's stages hand to it (``tables/*.csv|parquet``).
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pandas as pd

from headscope.analyses.frames import EXAMPLE_COLUMNS

log = logging.getLogger(__name__)

__all__ = ["SKIPPED_COLUMNS", "WORD_MASS_MIN", "examples_frame", "prune_frames", "skipped_frame"]

SKIPPED_COLUMNS = ["analysis", "reason", "count"]


def skipped_frame(skipped) -> pd.DataFrame:
    """Skipped counts as a tidy frame (analysis, reason, count) from a ``Counter`` of
    reasons, a dict ``{analysis: Counter}``, or ``{(analysis, reason): n}``.

    >>> skipped_frame({"syntactic": Counter({"too long": 2}), "coref": Counter()}).to_dict("records")
    [{'analysis': 'syntactic', 'reason': 'too long', 'count': 2}]
    """
    rows = []
    if isinstance(skipped, pd.DataFrame):
        return skipped.reindex(columns=SKIPPED_COLUMNS)
    for key, val in (skipped or {}).items():
        if isinstance(val, (dict, Counter)):
            rows += [(str(key), str(r), int(n)) for r, n in val.items() if n]
        elif isinstance(key, tuple) and len(key) == 2:
            rows.append((str(key[0]), str(key[1]), int(val)))
        elif val:
            rows.append(("all", str(key), int(val)))
    df = pd.DataFrame(rows, columns=SKIPPED_COLUMNS)
    return df.sort_values(["analysis", "reason"], kind="stable").reset_index(drop=True)


def _as_array(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=float)


WORD_MASS_MIN = 0.5  # below this mean word-level row mass, an example is drawn at token level


def _mean_row_mass(pat) -> float:
    a = _as_array(pat)
    return float(a.sum(axis=-1).mean()) if a.ndim == 2 and a.size else 0.0


def examples_frame(examples) -> pd.DataFrame:
    """Example attention maps as EXAMPLE_COLUMNS rows.

    Accepts a frame with those columns, or :attr:`RolesResult.examples`: a mapping
    ``{example key: record}`` where a record carries ``layer``, ``head``, ``words``, a
    word-level ``word_pattern`` (or ``pattern``) [query word][key word], and optionally
    ``role``, ``relation``, ``direction``, ``sentence``, ``marks`` (gold (query, key)
    word pairs), ``tokens`` and ``token_pattern``. The token-level pattern is drawn instead
    when the record has no words or when its word-level rows hold less than
    :data:`WORD_MASS_MIN` of the attention on average (a head looking at [CLS]/[SEP]/BOS,
    which belong to no word). Records whose pattern does not match the words are left out.
    """
    if examples is None:
        return pd.DataFrame(columns=EXAMPLE_COLUMNS)
    if isinstance(examples, pd.DataFrame):
        missing = [c for c in EXAMPLE_COLUMNS if c not in examples]
        if missing:
            raise ValueError(f"examples frame lacks columns {missing}; expected {EXAMPLE_COLUMNS}")
        return examples[EXAMPLE_COLUMNS].reset_index(drop=True)
    if not isinstance(examples, dict):
        raise TypeError(f"examples must be a DataFrame or a dict of records; got {type(examples).__name__}")
    rows = []
    for key, r in examples.items():
        if not isinstance(r, dict) or "layer" not in r or "head" not in r:
            continue
        level, pat, words = "word", r.get("word_pattern", r.get("pattern")), list(r.get("words") or [])
        has_tokens = r.get("token_pattern") is not None and bool(r.get("tokens"))
        # token level where there are no words (induction sequences) or where the word-level map would hide
        # where the head looks: most of its attention on special tokens, which belong to no word
        if has_tokens and (pat is None or not len(words) or _mean_row_mass(pat) < WORD_MASS_MIN):
            level, pat, words = "token", r["token_pattern"], list(r["tokens"])
        if pat is None:
            continue
        pat = _as_array(pat)
        words = [str(w) for w in words]
        if pat.ndim != 2 or pat.shape != (len(words), len(words)):
            log.warning(
                "example %r: pattern shape %s does not match %d %ss; left out", key, pat.shape, len(words), level
            )
            continue
        gold = {(int(m[0]), int(m[1])) for m in (r.get("marks") or []) if len(m) == 2} if level == "word" else set()
        sentence = str(r.get("sentence") or r.get("text") or " ".join(words))
        role = str(r.get("role") or str(key).split(":")[0])
        for i in range(pat.shape[0]):
            for j in range(pat.shape[1]):
                rows.append(
                    (
                        str(key),
                        role,
                        str(r.get("relation") or ""),
                        str(r.get("direction") or ""),
                        int(r["layer"]),
                        int(r["head"]),
                        level,
                        sentence,
                        i,
                        j,
                        words[i],
                        words[j],
                        float(pat[i, j]),
                        (i, j) in gold,
                    )
                )
    return pd.DataFrame(rows, columns=EXAMPLE_COLUMNS)


def prune_frames(tables) -> dict[str, pd.DataFrame]:
    """A pruning study's :class:`~headscope.analyses.pruning.study.PruneTables` -> the
    report's tables: ``prune_<file name>`` for each study table (baseline, ablation,
    all_but_one, importance, curves, curve_summary, prunable) and ``roles_vs_importance``
    for the role ablation."""
    from headscope.analyses.pruning.study import TABLE_FILES

    out = {}
    for field_name, file_name in TABLE_FILES.items():
        df = getattr(tables, field_name)
        if df is None:
            continue
        name = "roles_vs_importance" if field_name == "role_ablation" else f"prune_{file_name}"
        out[name] = df.reset_index(drop=True)
    return out
