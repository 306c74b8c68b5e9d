"""Column names of the circuits frames, defined once.

``heads`` (:func:`~headscope.analyses.circuits.weights.ov_qk.head_circuits`): one row per
``(layer, head, statistic)``; ``composition``
(:func:`~headscope.analyses.circuits.weights.composition.composition_scores`): one row per
``(sender, receiver, mode, level)``.
"""

from __future__ import annotations

import pandas as pd

HEAD_COLUMNS = [
    "layer",
    "head",
    "kv_head",
    "statistic",
    "value",
    "method",
    "baseline_mean",
    "baseline_sd",
    "margin",
    "p_value",
    "p_adjusted",
    "n",
    "verdict",
    "note",
]
COMPOSITION_COLUMNS = [
    "sender_layer",
    "sender_head",
    "receiver_layer",
    "receiver_head",
    "receiver_kv_head",
    "mode",
    "level",
    "value",
    "baseline_mean",
    "baseline_sd",
    "margin",
    "p_value",
    "p_adjusted",
    "n",
    "verdict",
]
#: a pair or head whose statistic beats every-but-alpha of its Gaussian draws after BH
ABOVE, NOT_ABOVE, NO_CIRCUIT, OMITTED = "above baseline", "not above baseline", "no circuit", "omitted"


def tidy(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """``rows`` as a frame with exactly ``columns`` in order (categories for the string keys)."""
    df = pd.DataFrame(rows, columns=columns)
    for col in ("statistic", "method", "verdict", "mode", "level"):
        if col in df:
            df[col] = df[col].astype("category")
    return df
