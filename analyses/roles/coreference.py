"""Coreference heads: does the pronoun attend most to its antecedent?

Definition (after Clark, Khandelwal, Levy & Manning 2019, "What Does BERT Look At?",
§5 "antecedent selection"): for each item (:class:`~headscope.probes.corpora.CorefItem`)
we read the pronoun word's word-level attention (:mod:`.wordlevel`) to the head word of
each candidate mention; the head predicts the candidate it attends to most, and scores a
hit when that is the gold antecedent. Score = accuracy over items. Clark et al. report
~65% for BERT-base's best head against 27% for the nearest-mention baseline on
CoNLL-2012; our items (Winograd-style pairs, gender and number agreement) are different,
so the figures are not comparable: we report what we measure.

Baselines (per-item hits, so the paired permutation test applies):

* ``nearest``: the candidate whose head is the closest *preceding* word to the pronoun
  (if no candidate precedes it, the closest overall, ties to the earlier one) — Clark
  et al.'s "nearest mention" rule;
* ``first``: the first candidate in the sentence (usually the subject / first mention).

The main row per head (``relation=""``) uses the *better* of the two baselines (the one
with the higher accuracy over the items, ties to ``nearest``); so a head must beat the
strongest simple rule. ``RoleOutput.extra["by_baseline"]`` holds full rows against each
baseline (``relation="vs-nearest"`` / ``"vs-first"``), ``extra["baseline_scores"]`` both
accuracies and which one was used, ``extra["by_kind"]`` per-head accuracy by item kind.

Skipped and counted: items longer than the context, untokenisable items, a pronoun
that owns no token (``"pronoun_unaligned"``), a candidate head that owns no token
(``"candidate_unaligned"``). (Items without candidates never reach here: the reader
skips them.)

Rows: :data:`~headscope.analyses.frames.ROLE_COLUMNS` with ``role="coreference"``.

>>> from headscope.probes.corpora import CorefItem
>>> it = CorefItem(words=("Mary", "met", "John", "and", "she", "smiled"), pronoun=4, candidates=((0, 1), (2, 3)), antecedent=0)
>>> nearest_candidate(it), first_candidate(it)
(1, 0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from headscope.analyses.frames import roles_frame
from headscope.analyses.roles.base import Role, register
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.wordlevel import pooling_matrices
from headscope.analyses.stats.verdicts import verdict_rows
from headscope.probes.capture import stream

ROLE = "coreference"
BASELINES = ("nearest", "first")

__all__ = ["ROLE", "BASELINES", "nearest_candidate", "first_candidate", "CorefHits", "CorefReducer", "finish", "run"]


def nearest_candidate(item) -> int:
    """Index of the candidate whose head is the closest word before the pronoun; if none
    precedes it, the closest overall (ties to the earlier candidate)."""
    before = [k for k, h in enumerate(item.heads) if h < item.pronoun]
    if before:
        return max(before, key=lambda k: (item.heads[k], -k))
    return min(range(len(item.heads)), key=lambda k: (abs(item.heads[k] - item.pronoun), k))


def first_candidate(item) -> int:
    """Index of the candidate that starts first in the sentence."""
    return min(range(len(item.candidates)), key=lambda k: (item.candidates[k][0], k))


@dataclass
class CorefHits:
    """Per-item results: ``item`` (index in the set), ``kind``; ``hits`` ``[n, n_layers*n_heads]``
    bool; ``predicted`` ``[n, n_layers*n_heads]`` candidate index; ``nearest``/``first``
    ``[n]`` bool baseline hits."""

    item: np.ndarray
    kind: np.ndarray
    hits: torch.Tensor
    predicted: torch.Tensor
    nearest: np.ndarray
    first: np.ndarray
    n_layers: int
    n_heads: int

    def __len__(self) -> int:
        return len(self.item)


@dataclass
class CorefReducer:
    """Streaming reducer over the word lists of ``items`` (``words=True``; item ``i`` is
    ``items[i]``). Needs the ``pattern`` of every layer."""

    items: Sequence
    n_layers: int
    n_heads: int
    skipped: Counter = field(default_factory=Counter)
    _parts: list = field(default_factory=list)

    def update(self, cap) -> None:
        if tuple(cap.layers) != tuple(range(self.n_layers)):
            raise ValueError(
                f"coreference analysis needs the pattern of every layer 0..{self.n_layers - 1}; got layers {list(cap.layers)}"
            )
        pool = pooling_matrices(cap.tokens)
        # only the pronoun's row of the word pattern is needed (Clark et al. pooling: mean
        # over the pronoun's pieces, sum over each key word's pieces)
        pron = torch.tensor([self.items[i].pronoun for i in cap.item_ids])
        q = pool.query_mean[torch.arange(len(pron)), pron]  # [batch, query_pos]
        rows = torch.einsum("bq,lbhqk->lbhk", q, cap.stack("pattern").float())
        wp = torch.einsum("lbhk,bwk->lbhw", rows, pool.key_sum)  # [layer, batch, head, word]
        for r, i in enumerate(cap.item_ids):
            it = self.items[i]
            if not bool(pool.aligned[r, it.pronoun]):
                self.skipped["pronoun_unaligned"] += 1
                continue
            if not bool(pool.aligned[r, list(it.heads)].all()):
                self.skipped["candidate_unaligned"] += 1
                continue
            att = wp[:, r, :, list(it.heads)]  # [layer, head, candidate]
            pred = att.argmax(-1).reshape(-1)
            self._parts.append(
                (
                    i,
                    it.kind or "",
                    pred == it.antecedent,
                    pred.to(torch.int16),
                    nearest_candidate(it) == it.antecedent,
                    first_candidate(it) == it.antecedent,
                )
            )

    def merge(self, other: CorefReducer) -> CorefReducer:
        self._parts.extend(other._parts)
        self.skipped.update(other.skipped)
        return self

    @property
    def n_used(self) -> int:
        return len(self._parts)

    def result(self) -> CorefHits:
        """All used items, in item order."""
        h = self.n_layers * self.n_heads
        parts = sorted(self._parts, key=lambda p: p[0])
        if not parts:
            return CorefHits(
                np.zeros(0, dtype=np.int64),
                np.zeros(0, dtype=object),
                torch.zeros(0, h, dtype=torch.bool),
                torch.zeros(0, h, dtype=torch.int16),
                np.zeros(0, dtype=bool),
                np.zeros(0, dtype=bool),
                self.n_layers,
                self.n_heads,
            )
        item, kind, hits, pred, near, first = zip(*parts)
        return CorefHits(
            np.array(item),
            np.array(kind, dtype=object),
            torch.stack(hits),
            torch.stack(pred),
            np.array(near),
            np.array(first),
            self.n_layers,
            self.n_heads,
        )


def _by_kind(res: CorefHits) -> pd.DataFrame:
    """Per-head accuracy by item kind, with both baselines: columns layer, head, kind, score, nearest, first, n."""
    rows = []
    hits = res.hits.float()
    for kind in sorted(set(res.kind.tolist())):
        sel = res.kind == kind
        acc = hits[torch.from_numpy(sel)].mean(0)
        for col, a in enumerate(acc.tolist()):
            rows.append(
                {
                    "layer": col // res.n_heads,
                    "head": col % res.n_heads,
                    "kind": kind,
                    "score": a,
                    "nearest": float(res.nearest[sel].mean()),
                    "first": float(res.first[sel].mean()),
                    "n": int(sel.sum()),
                }
            )
    return pd.DataFrame(rows, columns=["layer", "head", "kind", "score", "nearest", "first", "n"])


def finish(reducer: CorefReducer, report, cfg: RolesConfig) -> RoleOutput:
    """A filled reducer (and the stream's report) -> :class:`RoleOutput` (see module doc)."""
    res = reducer.result()
    skipped = Counter(report.skipped) if report is not None else Counter()
    skipped.update(reducer.skipped)
    kw = dict(n_layers=res.n_layers, n_heads=res.n_heads, role=ROLE, cfg=cfg, min_n=cfg.min_instances)
    if len(res) == 0:
        return RoleOutput(
            frame=roles_frame([]),
            skipped=skipped,
            n_items=0,
            extra={"by_baseline": roles_frame([]), "baseline_scores": {}, "by_kind": _by_kind(res), "hits": res},
        )
    values = res.hits.float()
    # per-item baselines expanded to [n, heads]: a 1-D baseline is ambiguous in verdict_rows when n == n_layers*n_heads
    base = {k: torch.from_numpy(getattr(res, k).astype(np.float32))[:, None].expand_as(values) for k in BASELINES}
    scores = {k: float(getattr(res, k).mean()) for k in BASELINES}
    chosen = "nearest" if scores["nearest"] >= scores["first"] else "first"
    rows = verdict_rows(values, base[chosen], **kw)
    by_baseline = []
    for k in BASELINES:
        by_baseline += verdict_rows(values, base[k], relation=f"vs-{k}", **kw)
    return RoleOutput(
        frame=roles_frame(rows),
        skipped=skipped,
        n_items=len(res),
        extra={
            "by_baseline": roles_frame(by_baseline),
            "baseline_scores": {**scores, "chosen": chosen},
            "by_kind": _by_kind(res),
            "hits": res,
        },
    )


def run(model, items, cfg: RolesConfig = RolesConfig(), *, progress=None) -> RoleOutput:
    """Coreference-head verdicts of ``model`` on ``items`` (a
    :class:`~headscope.probes.corpora.CorefSet` or a list of ``CorefItem``).

    >>> out = run(model, read_coref(path("coref/coref.jsonl")))  # doctest: +SKIP
    >>> out.extra["baseline_scores"]  # doctest: +SKIP
    """
    items = list(getattr(items, "items", items))
    reducer = CorefReducer(items, model.spec.n_layers, model.spec.n_heads)
    report = stream(
        model,
        [list(it.words) for it in items],
        [reducer],
        quantities=("pattern",),
        batch_size=cfg.batch_size,
        words=True,
        progress=progress,
    )
    return finish(reducer, report, cfg)


def _reducer(ctx) -> CorefReducer:
    return CorefReducer(ctx.items, ctx.model.spec.n_layers, ctx.model.spec.n_heads)


ROLE_DEF = register(
    Role(
        name="coreference",
        corpus="coref",
        score_kind="hit",
        reducer=_reducer,
        finish=lambda reducer, report, ctx: finish(reducer, report, ctx.cfg),
        description="the pronoun's most-attended candidate is its gold antecedent (Clark et al. 2019, §5)",
    )
)
