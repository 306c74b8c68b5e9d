"""The item format of a patching task: a :class:`PairItem` is one tokenised minimal pair (a
clean and a corrupted input of equal token length, the answer and wrong ids read at the last
position), a :class:`Task` the usable items, the name of its metric (one of the one registry's
patching metrics, :func:`headscope.analyses.metrics.metrics_for`) and the unusable ones, each
with its kind (:data:`UNUSABLE_KINDS`) and reason.

>>> Task(name="t", items=[PairItem((1, 2), (1, 3), 2)], metric="logprob").summary()["n_items"]
1
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from headscope.analyses.metrics import get_metric

#: why an item is unusable (the ``kind`` of each :attr:`Task.unusable` entry)
UNUSABLE_KINDS = {
    "id_past_vocab": "a token id past the vocabulary",
    "longer_than_context": "longer than the model's context",
    "not_single_token": "answer or wrong is not a single token",
    "length_mismatch": "clean and corrupted tokenise to different lengths",
    "no_partner": "no minimal-pair partner",
    "same_antecedent": "the partner has the same antecedent",
    "not_two_candidates": "not two candidates",
}


def unusable_counts(unusable: list[dict]) -> dict[str, int]:
    """``{kind: count}`` of :attr:`Task.unusable` entries, kinds sorted.

    >>> unusable_counts([{"kind": "not_single_token"}, {"kind": "length_mismatch"}, {"kind": "not_single_token"}])
    {'length_mismatch': 1, 'not_single_token': 2}
    """
    return dict(sorted(Counter(u.get("kind", "other") for u in unusable).items()))


def counts_text(counts: dict[str, int]) -> str:
    """``{kind: count}`` in words: ``"length_mismatch 1, not_single_token 2"``."""
    return ", ".join(f"{k} {n}" for k, n in counts.items())


#: patching metrics that read a third argument per item (:attr:`PairItem.wrong`): ``logit_diff``
#: the wrong token's id, the greater-than metrics their candidate ids in numeric order
READS_WRONG = frozenset({"logit_diff", "greater_than", "greater_than_tens"})


@dataclass(frozen=True)
class PairItem:
    """One minimal pair, tokenised: ``clean`` and ``corrupted`` ids of equal length, the
    ``answer`` id (and ``wrong`` id for ``logit_diff``) read at the last position. For the
    greater-than metrics ``answer`` is the id of the clean year's own digits (the threshold)
    and ``wrong`` the tuple of candidate ids in numeric order (``"00"`` … ``"99"`` or ``"0"`` … ``"9"``)."""

    clean: tuple[int, ...]
    corrupted: tuple[int, ...]
    answer: int
    wrong: int | tuple[int, ...] | None = None

    def __post_init__(self):
        if len(self.clean) != len(self.corrupted) or not self.clean:
            raise ValueError(
                f"clean and corrupted must have the same, non-zero length; got {len(self.clean)} and "
                f"{len(self.corrupted)}"
            )


@dataclass
class Task:
    """A patching task: ``items`` (usable :class:`PairItem` s), ``metric`` (the name of a
    patching metric of :data:`headscope.analyses.metrics.METRICS`), and ``unusable``: ``[{"item": index, "line": line or None, "reason": ...}]``."""

    name: str
    items: list[PairItem]
    metric: str
    unusable: list[dict] = field(default_factory=list)
    source: str = ""

    def __post_init__(self):
        get_metric(self.metric, "patching")  # ValueError listing the patching metrics
        if self.metric in READS_WRONG and any(it.wrong is None for it in self.items):
            raise ValueError(f"task {self.name!r}: the {self.metric} metric needs a wrong token in every item")

    @property
    def n_unusable(self) -> int:
        return len(self.unusable)

    def unusable_counts(self) -> dict[str, int]:
        """``{kind: count}`` of the unusable items (:data:`UNUSABLE_KINDS`)."""
        return unusable_counts(self.unusable)

    def batches(self, batch_size: int):
        """Yield ``(clean [batch, pos], corrupted [batch, pos], answer [batch], wrong [batch] | None,
        item indices)`` (``wrong`` is ``[batch, n_cand]`` for the greater-than metrics) of items of equal length (no padding), at most ``batch_size`` per batch,
        in item order within each length."""
        by_len: dict[int, list[int]] = {}
        for i, it in enumerate(self.items):
            by_len.setdefault(len(it.clean), []).append(i)
        for length in sorted(by_len):
            idx = by_len[length]
            for s in range(0, len(idx), batch_size):
                rows = idx[s : s + batch_size]
                its = [self.items[i] for i in rows]
                clean = torch.tensor([it.clean for it in its], dtype=torch.long)
                corrupted = torch.tensor([it.corrupted for it in its], dtype=torch.long)
                answer = torch.tensor([it.answer for it in its], dtype=torch.long)
                wrong = torch.tensor([it.wrong for it in its], dtype=torch.long) if self.metric in READS_WRONG else None
                yield clean, corrupted, answer, wrong, rows

    def summary(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "metric": self.metric,
            "n_items": len(self.items),
            "n_unusable": self.n_unusable,
            "unusable_counts": self.unusable_counts(),
            "unusable": self.unusable[:20],
        }
