"""Syntactic heads: does a head's most-attended word find the dependency partner?

Definition (Clark, Khandelwal, Levy & Manning 2019, "What Does BERT Look At?", §4.2):
for each dependency relation and each direction, a head "predicts" the partner of a
word as the word it attends to most (word-level attention, :mod:`.wordlevel`; the word
itself is excluded); the head's score is the accuracy of that prediction over all
instances of the relation.

* ``dep->head``: the dependent word attends to its head word (Clark's main setting);
* ``head->dep``: the head word attends to the dependent.

Relation labels are the UD label before ``:`` (``nmod:poss`` -> ``nmod``) unless
``cfg.full_labels``. Root arcs have no partner and are skipped.

Baseline (Clark et al.'s "fixed offset" baseline): for each relation and direction, the
relative offset ``partner - word`` that is right most often over the instances
(e.g. ``+1`` for ``det`` dep->head in English). It is chosen on the same instances (as in
Clark et al.), so it is an optimistic baseline. Per-instance hits of the baseline are kept
so the paired permutation test compares head and baseline on the same instances.

Verdict (:func:`~headscope.analyses.stats.verdicts.verdict_rows`): margin over the baseline
>= ``cfg.margin`` (0.10, after Voita et al. 2019) and BH-adjusted one-sided p < ``cfg.alpha``;
relations with fewer than ``cfg.min_instances`` instances get ``verdict=False``.

Skipped and counted: sentences longer than the context (``"longer than context"``),
untokenisable ones, and sentences where a word owns no token (``"unaligned"``).

Rows: :data:`~headscope.analyses.frames.ROLE_COLUMNS` with ``role="syntactic"``,
``relation`` and ``direction`` set.

>>> best_offset([1, 1, 2, -1, 1])
(1, array([ True,  True, False, False,  True]))
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from headscope.analyses.frames import roles_frame
from headscope.analyses.roles.base import Role, RoleContext
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.wordlevel import WordRows, most_attended, pooling_matrices
from headscope.analyses.stats.verdicts import verdict_rows
from headscope.probes.capture import feed

log = logging.getLogger(__name__)

ROLE = "syntactic"
DIRECTIONS = ("dep->head", "head->dep")
OFFSET_COLUMNS = ["relation", "direction", "offset", "baseline", "n"]

__all__ = ["ROLE", "DIRECTIONS", "ArcHits", "SyntacticReducer", "best_offset", "syntactic_rows", "finish"]

#: what the per-item values are (:mod:`headscope.analyses.stats.verdicts` picks the interval and test)
SCORE_KIND = "hit"


def best_offset(offsets) -> tuple[int, np.ndarray]:
    """The most frequent relative offset and the per-instance hits it gives.

    Ties go to the smaller ``|offset|``, then to the negative one (deterministic).
    """
    off = np.asarray(offsets, dtype=np.int64)
    if off.size == 0:
        return 0, np.zeros(0, dtype=bool)
    values, counts = np.unique(off, return_counts=True)
    order = sorted(range(len(values)), key=lambda i: (-counts[i], abs(values[i]), values[i]))
    k = int(values[order[0]])
    return k, off == k


@dataclass
class ArcHits:
    """Per-instance results: one row per (arc, direction).

    ``sentence`` (index in the corpus), ``query`` (the word whose attention is read),
    ``partner`` (the gold word), ``relation``, ``direction`` are numpy arrays of length
    ``n``; ``hits`` is ``[n, n_layers*n_heads]`` bool (column ``layer*n_heads + head``);
    ``predicted`` is ``[n, n_layers*n_heads]`` int16, the most-attended word.
    """

    sentence: np.ndarray
    query: np.ndarray
    partner: np.ndarray
    relation: np.ndarray
    direction: np.ndarray
    hits: torch.Tensor
    predicted: torch.Tensor
    n_layers: int
    n_heads: int

    def __len__(self) -> int:
        return len(self.sentence)

    @property
    def offset(self) -> np.ndarray:
        return self.partner - self.query

    def frame(self) -> pd.DataFrame:
        """Instances as a frame (no per-head hits): sentence, query, partner, relation, direction, offset."""
        return pd.DataFrame(
            {
                "sentence": self.sentence,
                "query": self.query,
                "partner": self.partner,
                "relation": self.relation,
                "direction": self.direction,
                "offset": self.offset,
            }
        )


@dataclass
class SyntacticReducer:
    """Streaming reducer (see :func:`headscope.probes.capture.stream`) over word lists of
    ``sentences`` (items are word lists, ``words=True``; item ``i`` is ``sentences[i]``).
    Needs the ``pattern`` of every layer."""

    sentences: Sequence
    n_layers: int
    n_heads: int
    full_labels: bool = False  # False: keep the label before ':' even if the corpus was read with full labels
    skipped: Counter = field(default_factory=Counter)
    n_used: int = 0
    _parts: list = field(default_factory=list)

    def update(self, cap) -> None:
        feed(cap, [self])

    def begin(self, cap) -> None:
        if tuple(cap.layers) != tuple(range(self.n_layers)):
            raise ValueError(
                f"syntactic analysis needs the pattern of every layer 0..{self.n_layers - 1}; got layers {list(cap.layers)}"
            )
        self._pool = pooling_matrices(cap.tokens)
        self._rows = WordRows(self._pool)

    def piece(self, cap, piece) -> None:
        self._rows.add(piece)

    def end(self, cap) -> None:
        pool = self._pool
        pred = most_attended(self._rows.word_patterns(cap.layers), pool)  # [layer, batch, head, word]
        self._rows = None
        rows, sent, query, partner, rel, dirs = [], [], [], [], [], []
        for r, item in enumerate(cap.item_ids):
            s = self.sentences[item]
            if not pool.item_aligned(r):
                self.skipped["unaligned"] += 1
                continue
            self.n_used += 1
            for d, (h, label) in enumerate(zip(s.heads, s.relations)):
                if h < 0:
                    continue
                for q, p, direction in ((d, h, DIRECTIONS[0]), (h, d, DIRECTIONS[1])):
                    rows.append(r)
                    sent.append(item)
                    query.append(q)
                    partner.append(p)
                    rel.append(label if self.full_labels else label.split(":")[0])
                    dirs.append(direction)
        if not rows:
            return
        device = pred.device
        got = pred[:, torch.tensor(rows, device=device), :, torch.tensor(query, device=device)]  # [n, layer, head]
        got = got.reshape(len(rows), -1)
        hits = (got == torch.tensor(partner, device=device)[:, None]).cpu()  # per-instance hits: to the host
        got = got.cpu()
        self._parts.append(
            (
                np.array(sent),
                np.array(query),
                np.array(partner),
                np.array(rel, dtype=object),
                np.array(dirs, dtype=object),
                hits,
                got.to(torch.int16),
            )
        )

    def merge(self, other: SyntacticReducer) -> SyntacticReducer:
        self._parts.extend(other._parts)
        self.skipped.update(other.skipped)
        self.n_used += other.n_used
        return self

    def result(self) -> ArcHits:
        """All instances, sorted by (sentence, query, direction) so results do not depend on batching."""
        h = self.n_layers * self.n_heads
        if not self._parts:
            e = np.zeros(0, dtype=np.int64)
            return ArcHits(
                e,
                e,
                e,
                np.zeros(0, dtype=object),
                np.zeros(0, dtype=object),
                torch.zeros(0, h, dtype=torch.bool),
                torch.zeros(0, h, dtype=torch.int16),
                self.n_layers,
                self.n_heads,
            )
        cols = list(zip(*self._parts))
        sent, query, partner, rel, dirs = (np.concatenate(c) for c in cols[:5])
        hits, got = torch.cat(cols[5]), torch.cat(cols[6])
        order = np.lexsort((dirs.astype(str), query, sent))
        idx = torch.from_numpy(order)
        return ArcHits(
            sent[order],
            query[order],
            partner[order],
            rel[order],
            dirs[order],
            hits[idx],
            got[idx],
            self.n_layers,
            self.n_heads,
        )


def syntactic_rows(arcs: ArcHits, cfg: RolesConfig) -> tuple[list[dict], pd.DataFrame]:
    """ROLE_COLUMNS rows for every (relation, direction) and head, and the offset
    baselines (frame with :data:`OFFSET_COLUMNS`)."""
    rows, offsets = [], []
    if len(arcs) == 0:
        return rows, pd.DataFrame(columns=OFFSET_COLUMNS)
    keys = sorted(set(zip(arcs.relation.tolist(), arcs.direction.tolist())))
    all_off = arcs.offset
    for relation, direction in keys:
        sel = np.flatnonzero((arcs.relation == relation) & (arcs.direction == direction))
        k, base_hits = best_offset(all_off[sel])
        values = arcs.hits[torch.from_numpy(sel)].float()
        # full [n, heads] shape: a 1-D baseline is ambiguous in verdict_rows when n == n_layers*n_heads
        base = torch.from_numpy(base_hits.astype(np.float32))[:, None].expand_as(values)
        rows += verdict_rows(
            values,
            base,
            n_layers=arcs.n_layers,
            n_heads=arcs.n_heads,
            role=ROLE,
            score_kind=SCORE_KIND,
            cfg=cfg,
            relation=relation,
            direction=direction,
            min_n=cfg.min_instances,
        )
        offsets.append(
            {
                "relation": relation,
                "direction": direction,
                "offset": k,
                "baseline": float(base_hits.mean()),
                "n": int(len(sel)),
            }
        )
    return rows, pd.DataFrame(offsets, columns=OFFSET_COLUMNS)


def finish(reducer: SyntacticReducer, report, cfg: RolesConfig) -> RoleOutput:
    """Turn a filled reducer (and the stream's report) into a :class:`RoleOutput`.

    ``extra``: ``"offsets"`` (baseline offset per relation/direction), ``"arcs"``
    (the :class:`ArcHits`), ``"relations"`` (instances per relation and direction).
    """
    arcs = reducer.result()
    rows, offsets = syntactic_rows(arcs, cfg)
    skipped = Counter(report.skipped) if report is not None else Counter()
    skipped.update(reducer.skipped)
    return RoleOutput(
        frame=roles_frame(rows),
        stats=None,
        skipped=skipped,
        n_items=reducer.n_used,
        extra={"offsets": offsets, "arcs": arcs},
    )


def example(out: RoleOutput, row, inputs: dict) -> tuple[int | None, list, list | None]:
    """The report's example for the head of ``row``: the first sentence where it finds the
    row's relation (else the first with that relation), its gold arcs of that relation as
    (query, partner) word marks, and its words (:attr:`Role.example`)."""
    arcs = out.extra["arcs"]
    col = int(row["layer"]) * arcs.n_heads + int(row["head"])
    sel = (arcs.relation == row["relation"]) & (arcs.direction == row["direction"])
    hit = sel & arcs.hits[:, col].numpy()
    cand = hit if hit.any() else sel
    idx = [int(i) for i in cand.nonzero()[0]]
    if not idx:
        return None, [], None
    item = int(arcs.sentence[idx[0]])
    marks = [(int(arcs.query[i]), int(arcs.partner[i])) for i in sel.nonzero()[0] if int(arcs.sentence[i]) == item]
    return item, marks, list(inputs["conllu"][item].words)


def _reducer(ctx: RoleContext) -> SyntacticReducer:
    spec = ctx.model.spec
    return SyntacticReducer(ctx.items, spec.n_layers, spec.n_heads, full_labels=ctx.cfg.full_labels)


#: the group this module defines (registered in pipeline order by :mod:`.shipped`)
ROLE_DEF = Role(
    per_relation=True,
    name=ROLE,
    corpus="conllu",
    score_kind=SCORE_KIND,
    reducer=_reducer,
    finish=lambda reducer, report, ctx: finish(reducer, report, ctx.cfg),
    row_tasks={"syntactic:nsubj": "agreement"},
    example=example,
    description=(
        "syntactic/<relation>/<direction>: per dependency arc, whether the word's most-attended other word "
        "(word-level attention) is its gold partner; accuracy against the best fixed-offset baseline "
        "(Clark et al. 2019, §4.2)."
    ),
)
