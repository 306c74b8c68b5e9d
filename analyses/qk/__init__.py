"""Why a head attends where it does: exact QK attribution. A head's score difference (attended key
minus a baseline over the other keys) split over (query component, key component) pairs
(:mod:`.attribution`), its tidy tables (:mod:`.frames`), and the study over a task's items
(:mod:`.study`); the split of queries and keys into components is :mod:`headscope.probes.qk_parts`."""

from headscope.analyses.qk.attribution import BASELINES, Attribution, attribute, difference_pairs
from headscope.analyses.qk.frames import QK_COLUMNS, qk_frame, qk_summary
from headscope.analyses.qk.study import (
    TASK_ITEMS,
    QKConfig,
    QKItem,
    QKResult,
    duplicate_items,
    induction_items,
    qk_study,
    sentence_items,
    task_items,
)

__all__ = [
    "BASELINES",
    "QK_COLUMNS",
    "TASK_ITEMS",
    "Attribution",
    "QKConfig",
    "QKItem",
    "QKResult",
    "attribute",
    "difference_pairs",
    "duplicate_items",
    "induction_items",
    "qk_frame",
    "qk_study",
    "qk_summary",
    "sentence_items",
    "task_items",
]
