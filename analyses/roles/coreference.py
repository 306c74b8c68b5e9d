"""Coreference heads: does the pronoun attend most to its antecedent? Verdicts per item kind.

Definition (after Clark, Khandelwal, Levy & Manning 2019, "What Does BERT Look At?",
§5 "antecedent selection"): for each item (:class:`~headscope.probes.corpora.CorefItem`)
we read the pronoun word's word-level attention (:mod:`.wordlevel`) to the head word of
each candidate mention; the head predicts the candidate it attends to most, and scores a
hit when that is the gold antecedent. Score = accuracy over items. Clark et al. report
~65% for BERT-base's best head against 27% for the nearest-mention baseline on
CoNLL-2012; our items (Winograd-style pairs, gender and number agreement) are different,
so the figures are not comparable: we report what we measure.

**One role per item kind.** Items with a ``kind`` are scored under role
``coreference:<kind>`` (the shipped data: ``coreference:gender``, ``coreference:number``,
``coreference:winograd``); items without one under plain ``coreference``. Each role has
its own baseline (below) and its own correction family (one :func:`verdict_rows` call,
BH over its heads). There is **no pooled all-kinds row** when kinds are given: the kinds
test different things — gender/number agreement is solved by matching a surface feature
of the pronoun to one candidate, a Winograd item only by the meaning of the deciding
word — and pooling let heads that only match agreement features pass as "coreference
heads" (MiniLM: L1H3 0.90 on gender and number, chance on Winograd, pooled 0.72 with a
verdict). A corpus without kinds gets plain ``coreference``, as before. A kind with fewer
than ``cfg.min_instances`` items gets rows but no verdict.

Baselines (per-item hits, so the paired permutation test applies), per role:

* ``nearest``: the candidate whose head is the closest *preceding* word to the pronoun
  (if no candidate precedes it, the closest overall, ties to the earlier one) — Clark
  et al.'s "nearest mention" rule;
* ``first``: the first candidate in the sentence (usually the subject / first mention).

The main row per head and role (``relation=""``) uses the *better* of the two on that
role's items (higher accuracy, ties to ``nearest``); so a head must beat the strongest
simple rule on the same items. Rows are ``score_kind="hit"`` (Wilson interval, exact
sign test on the items where head and rule disagree; see
:mod:`~headscope.analyses.stats.verdicts`). ``RoleOutput.extra``:

* ``"by_baseline"``: full rows against each baseline, per role (``relation="vs-nearest"`` /
  ``"vs-first"``);
* ``"baseline_scores"``: ``{role: {"nearest": acc, "first": acc, "chosen": name, "n": items,
  "nearest_pair_accuracy": .., "first_pair_accuracy": ..}}`` (pair figures NaN without pairs);
* ``"by_kind"``: per-head accuracy by kind with both baselines (columns layer, head, kind,
  score, nearest, first, n; kind ``""`` = no kind);
* ``"pairs"``: pair consistency (:func:`pair_table`; columns :data:`PAIR_COLUMNS`);
* ``"hits"``: :class:`CorefHits`, every used item (all kinds), in item order.

**Pair consistency** on minimal pairs (items ``a``/``b`` with ``a.pair == b.id``): per head
and kind, over the pairs both of whose items were used, how many the head gets both /
one / neither right; ``pair_accuracy = both_right / n_pairs``. In the shipped pairs the
antecedent flips between the two items while the candidates stay put, so a head whose
choice ignores the deciding word (the pronoun's gender or number, the Winograd
adjective) gets exactly one of each pair right: pair accuracy 0, item accuracy 0.5 — so
do both baselines. A head guessing independently per item gets ~0.25. The pair figure
is reported, not given verdict rows: the item-level row already compares the head with
the better rule on the same items by a paired test (a pair-blind head scores exactly the
rule's 0.5 there), and a pair-level verdict has no sound baseline — the rules score 0 by
construction, which any head with a few consistent pairs would "beat" — while adding a
second correction family per kind. Read ``pair_accuracy`` of a head next to its row.

Causal models: the score reads the attention *of the pronoun*. Where the deciding word
follows the pronoun (the shipped Winograd items: "... because it was too tired / tall")
and the two items of a pair agree up to the pronoun, a causal model's pronoun row is the
same in both, so every head is pair-blind by construction (SmolLM2-135M: all 270 heads
50/100, pair accuracy 0). That is a limit of the probe position, not a finding about
the heads; gender and number pairs differ at or before the pronoun and are measurable.

Skipped and counted (``RoleOutput.skipped``): items longer than the context,
untokenisable items, a pronoun that owns no token (``"pronoun_unaligned"``), a candidate
head that owns no token (``"candidate_unaligned"``). (Items without candidates never
reach here: the reader skips them.) Items that are *scored* but left out of the pair
table only, counted per item: ``"pair_partner_missing"`` (no item has the partner id),
``"pair_partner_skipped"`` (the partner was skipped, above), ``"pair_not_mutual"``
(the partner names a third item as its pair), ``"pair_ambiguous"`` (several items carry
the id), ``"pair_kind_mismatch"`` (the partner has another kind).

Rows: :data:`~headscope.analyses.frames.ROLE_COLUMNS` with ``role="coreference:<kind>"``
(or ``"coreference"``).

>>> from headscope.probes.corpora import CorefItem
>>> it = CorefItem(words=("Mary", "met", "John", "and", "she", "smiled"), pronoun=4, candidates=((0, 1), (2, 3)), antecedent=0)
>>> nearest_candidate(it), first_candidate(it)
(1, 0)
>>> role_name("gender"), role_name(None), role_kind("coreference:gender"), role_kind("coreference")
('coreference:gender', 'coreference', 'gender', '')
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from headscope.analyses.frames import roles_frame
from headscope.analyses.roles.base import Role
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.wordlevel import pooling_matrices
from headscope.analyses.stats.verdicts import verdict_rows
from headscope.probes.capture import feed

ROLE = "coreference"
BASELINES = ("nearest", "first")
SCORE_KIND = "hit"  # 0/1 per item: Wilson interval, exact sign test against the 0/1 rule hits
#: columns of ``extra["pairs"]`` (:func:`pair_table`)
PAIR_COLUMNS = ["layer", "head", "kind", "n_pairs", "both_right", "one_right", "none_right", "pair_accuracy"]
BY_KIND_COLUMNS = ["layer", "head", "kind", "score", "nearest", "first", "n"]

__all__ = [
    "ROLE",
    "BASELINES",
    "SCORE_KIND",
    "PAIR_COLUMNS",
    "role_name",
    "role_kind",
    "is_coref_role",
    "nearest_candidate",
    "first_candidate",
    "CorefHits",
    "CorefReducer",
    "pair_index",
    "pair_table",
    "example_item",
    "finish",
]


def role_name(kind: str | None) -> str:
    """Role of the rows for items of ``kind``: ``"coreference:<kind>"``, or ``"coreference"``
    for items without a kind (None or ``""``)."""
    return f"{ROLE}:{kind}" if kind else ROLE


def is_coref_role(role: str) -> bool:
    """True for ``"coreference"`` and ``"coreference:<kind>"``."""
    return role == ROLE or role.startswith(ROLE + ":")


def role_kind(role: str) -> str:
    """The item kind a coreference role covers (``""`` for plain ``"coreference"``)."""
    if not is_coref_role(role):
        raise ValueError(f"{role!r} is not a coreference role (coreference or coreference:<kind>)")
    return role[len(ROLE) + 1 :]


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
        feed(cap, [self])

    def begin(self, cap) -> None:
        if tuple(cap.layers) != tuple(range(self.n_layers)):
            raise ValueError(
                f"coreference analysis needs the pattern of every layer 0..{self.n_layers - 1}; got layers {list(cap.layers)}"
            )
        self._pool = pool = pooling_matrices(cap.tokens)
        # only the pronoun's row of the word pattern is needed (Clark et al. pooling: mean
        # over the pronoun's pieces, sum over each key word's pieces)
        device = pool.query_mean.device
        pron = torch.tensor([self.items[i].pronoun for i in cap.item_ids], device=device)
        self._q = pool.query_mean[torch.arange(len(pron), device=device), pron]  # [batch, query_pos]
        self._rows = {}

    def piece(self, cap, piece) -> None:
        part = torch.einsum("bq,bhqk->bhk", self._q[:, piece.rows], piece.pattern.float())
        old = self._rows.get(piece.layer)
        self._rows[piece.layer] = part if old is None else old + part

    def end(self, cap) -> None:
        pool = self._pool
        rows = torch.stack([self._rows[l] for l in cap.layers])  # [layer, batch, head, key]
        self._rows = {}
        wp = torch.einsum("lbhk,bwk->lbhw", rows, pool.key_sum).cpu()  # [layer, batch, head, word], small: to the host
        aligned = pool.aligned.cpu()
        for r, i in enumerate(cap.item_ids):
            it = self.items[i]
            if not bool(aligned[r, it.pronoun]):
                self.skipped["pronoun_unaligned"] += 1
                continue
            if not bool(aligned[r, list(it.heads)].all()):
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


def _kinds(res: CorefHits) -> list[str]:
    """The kinds present, ``""`` (no kind) first, then sorted."""
    return sorted(set(res.kind.tolist()), key=lambda k: (k != "", k))


def _by_kind(res: CorefHits) -> pd.DataFrame:
    """Per-head accuracy by item kind, with both baselines: columns :data:`BY_KIND_COLUMNS`."""
    rows = []
    hits = res.hits.float()
    for kind in _kinds(res):
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
    return pd.DataFrame(rows, columns=BY_KIND_COLUMNS)


def pair_index(res: CorefHits, items: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counter]:
    """The minimal pairs among the used items of ``res``: ``(a, b, kind, skipped)`` with
    ``a``/``b`` row indices into ``res`` (each pair once, ``a`` the earlier item), ``kind``
    the pair's kind, and ``skipped`` the used items with a ``pair`` that form no pair, by
    reason (see the module doc). ``items``: the whole corpus ``res.item`` indexes (each
    with ``id``, ``pair``, ``kind``). Item ``x`` pairs with the one item whose ``id`` is
    ``x.pair`` if that item's own ``pair`` is ``x.id`` or None.

    >>> from headscope.probes.corpora import CorefItem
    >>> w = dict(words=("A", "met", "B", "and", "she", "left"), pronoun=4, candidates=((0, 1), (2, 3)))
    >>> items = [CorefItem(**w, antecedent=0, id="1a", pair="1b"), CorefItem(**w, antecedent=1, id="1b", pair="1a"),
    ...          CorefItem(**w, antecedent=0, id="2a", pair="2b")]
    >>> res = CorefHits(np.arange(3), np.array([""] * 3, dtype=object), torch.ones(3, 1, dtype=torch.bool),
    ...                 torch.zeros(3, 1, dtype=torch.int16), np.ones(3, bool), np.ones(3, bool), 1, 1)
    >>> a, b, kind, skipped = pair_index(res, items)
    >>> a.tolist(), b.tolist(), dict(skipped)
    ([0], [1], {'pair_partner_missing': 1})
    """
    row_of = {int(i): r for r, i in enumerate(res.item.tolist())}
    by_id: dict[str, list[int]] = {}
    for j, it in enumerate(items):
        if it.id is not None:
            by_id.setdefault(it.id, []).append(j)
    skipped: Counter = Counter()
    seen: set = set()
    a, b, kinds = [], [], []
    for r, i in enumerate(res.item.tolist()):
        it = items[i]
        if it.pair is None:
            continue
        partners = by_id.get(it.pair, [])
        if not partners:
            reason = "pair_partner_missing"
        elif len(partners) > 1 or (it.id is not None and len(by_id[it.id]) > 1):
            reason = "pair_ambiguous"
        elif partners[0] == i or items[partners[0]].pair not in (None, it.id):
            reason = "pair_not_mutual"
        elif partners[0] not in row_of:
            reason = "pair_partner_skipped"
        elif res.kind[row_of[partners[0]]] != res.kind[r]:
            reason = "pair_kind_mismatch"
        else:
            key = (min(i, partners[0]), max(i, partners[0]))
            if key not in seen:
                seen.add(key)
                a.append(row_of[key[0]])
                b.append(row_of[key[1]])
                kinds.append(res.kind[r])
            continue
        skipped[reason] += 1
    return np.array(a, dtype=np.int64), np.array(b, dtype=np.int64), np.array(kinds, dtype=object), skipped


def _pair_counts(ha: torch.Tensor, hb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hits ``[n_pairs, k]`` of the two items of each pair -> both / one / none right, each ``[k]``."""
    both = (ha & hb).sum(0)
    none = (~ha & ~hb).sum(0)
    return both, ha.shape[0] - both - none, none


def pair_table(res: CorefHits, items: Sequence) -> tuple[pd.DataFrame, Counter]:
    """Pair consistency per head and kind (pure): ``(frame, skipped)`` with frame columns
    :data:`PAIR_COLUMNS` (kinds without pairs have no rows) and ``skipped`` from
    :func:`pair_index`. ``pair_accuracy = both_right / n_pairs``."""
    a, b, kinds, skipped = pair_index(res, items)
    rows = []
    for kind in sorted(set(kinds.tolist()), key=lambda k: (k != "", k)):
        sel = kinds == kind
        n = int(sel.sum())
        both, one, none = _pair_counts(res.hits[a[sel]], res.hits[b[sel]])
        for col in range(res.hits.shape[1]):
            rows.append(
                {
                    "layer": col // res.n_heads,
                    "head": col % res.n_heads,
                    "kind": kind,
                    "n_pairs": n,
                    "both_right": int(both[col]),
                    "one_right": int(one[col]),
                    "none_right": int(none[col]),
                    "pair_accuracy": int(both[col]) / n,
                }
            )
    return pd.DataFrame(rows, columns=PAIR_COLUMNS), skipped


def _rule_pair_accuracy(res: CorefHits, items: Sequence) -> dict[str, dict[str, float]]:
    """``{kind: {"nearest": pair accuracy, "first": ..}}`` of the two baseline rules."""
    a, b, kinds, _ = pair_index(res, items)
    out: dict[str, dict[str, float]] = {}
    for kind in set(kinds.tolist()):
        sel = kinds == kind
        out[kind] = {k: float((getattr(res, k)[a[sel]] & getattr(res, k)[b[sel]]).mean()) for k in BASELINES}
    return out


def example_item(res: CorefHits, layer: int, head: int, role: str = ROLE) -> int | None:
    """Corpus index of an item to show for head ``(layer, head)`` in ``role``: the first item
    of the role's kind the head gets right, else the first of that kind; None if the role
    has no used item. (For the pipeline's example picker.)"""
    sel = res.kind == role_kind(role)
    if not sel.any():
        return None
    col = int(layer) * res.n_heads + int(head)
    hit = sel & res.hits[:, col].numpy()
    k = int((hit if hit.any() else sel).nonzero()[0][0])
    return int(res.item[k])


def finish(reducer: CorefReducer, report, cfg: RolesConfig) -> RoleOutput:
    """A filled reducer (and the stream's report) -> :class:`RoleOutput` (see module doc)."""
    res = reducer.result()
    skipped = Counter(report.skipped) if report is not None else Counter()
    skipped.update(reducer.skipped)
    pairs, pair_skips = pair_table(res, reducer.items)
    skipped.update(pair_skips)
    rule_pairs = _rule_pair_accuracy(res, reducer.items)
    kw = dict(n_layers=res.n_layers, n_heads=res.n_heads, cfg=cfg, min_n=cfg.min_instances, score_kind=SCORE_KIND)
    rows, by_baseline, scores = [], [], {}
    hits = res.hits.float()
    for kind in _kinds(res):
        role = role_name(kind)
        sel = res.kind == kind
        values = hits[torch.from_numpy(sel)]
        # per-item baselines expanded to [n, heads]: a 1-D baseline is ambiguous in verdict_rows when n == n_layers*n_heads
        base = {
            k: torch.from_numpy(getattr(res, k)[sel].astype(np.float32))[:, None].expand_as(values) for k in BASELINES
        }
        acc = {k: float(getattr(res, k)[sel].mean()) for k in BASELINES}
        chosen = "nearest" if acc["nearest"] >= acc["first"] else "first"
        rows += verdict_rows(values, base[chosen], role=role, **kw)
        for k in BASELINES:
            by_baseline += verdict_rows(values, base[k], role=role, relation=f"vs-{k}", **kw)
        rp = rule_pairs.get(kind, {})
        scores[role] = {
            **acc,
            "chosen": chosen,
            "n": int(sel.sum()),
            **{f"{k}_pair_accuracy": rp.get(k, float("nan")) for k in BASELINES},
        }
    return RoleOutput(
        frame=roles_frame(rows),
        skipped=skipped,
        n_items=len(res),
        extra={
            "by_baseline": roles_frame(by_baseline),
            "baseline_scores": scores,
            "by_kind": _by_kind(res),
            "pairs": pairs,
            "hits": res,
        },
    )


def example(out: RoleOutput, row, inputs: dict) -> tuple[int | None, list, list | None]:
    """The report's example for the head of ``row``: the first item of the row's kind it
    gets right (else the first of that kind), the (pronoun, antecedent) word mark, and the
    item's words (:attr:`Role.example`)."""
    res = out.extra["hits"]
    if len(res) == 0:
        return None, [], None
    col = int(row["layer"]) * res.n_heads + int(row["head"])
    # the row's own items: role "coreference:<kind>" -> that kind ("coreference": items without one)
    own = res.kind == row["role"].partition(":")[2]
    own = own if own.any() else np.ones(len(res), dtype=bool)
    hit = res.hits[:, col].numpy() & own
    k = int(hit.nonzero()[0][0]) if hit.any() else int(own.nonzero()[0][0])
    item = int(res.item[k])
    it = inputs["coref"][item]
    return item, [(it.pronoun, it.antecedent_head)], list(it.words)


def _reducer(ctx) -> CorefReducer:
    return CorefReducer(ctx.items, ctx.model.spec.n_layers, ctx.model.spec.n_heads)


#: the group this module defines (registered in pipeline order by :mod:`.shipped`)
ROLE_DEF = Role(
    name="coreference",
    corpus="coref",
    score_kind=SCORE_KIND,
    reducer=_reducer,
    finish=lambda reducer, report, ctx: finish(reducer, report, ctx.cfg),
    task="coreference",
    example=example,
    description="the pronoun's most-attended candidate is its gold antecedent (Clark et al. 2019, §5)",
)
