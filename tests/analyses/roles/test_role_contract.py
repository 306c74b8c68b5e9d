"""The role contract: checks every registered role group must pass, parametrised over the
registry as scikit-learn's common checks run over ``all_estimators()``.

For every group in :data:`~headscope.analyses.roles.base.REGISTRY` (a group registered
later, in a test or a plug-in, is picked up the same way):

* empty input gives a well-formed, empty result (ROLE_COLUMNS, no verdicts, ``n_items == 0``);
* streaming: the reducer filled with the captures of the first batches, merged with one
  filled with the rest, finishes to the frame of a single pass;
* planted truth: on the hand-built planted models (:mod:`headscope.probes.models.inhouse.planted`)
  the group labels the heads planted for it, and never a random-weight head;
* the frame has :data:`~headscope.analyses.frames.ROLE_COLUMNS`, and a ``"none"`` group
  (statistics only) emits no verdict rows.

The planted case of each group is in :data:`PLANTED` (``"none"`` groups need none); a
registered group without one fails :func:`test_planted_heads_are_found` with that message.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest

from headscope.analyses.frames import ROLE_COLUMNS
from headscope.analyses.patching.ioi import planted_ioi_task
from headscope.analyses.roles.base import REGISTRY, RoleContext
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.pipeline import run_role
from headscope.probes.capture import stream
from headscope.probes.corpora import CorefItem, DependencySentence
from headscope.probes.models.inhouse.planted import (
    FV_TEMPLATE,
    RANDOM_HEADS,
    VOCAB,
    WORD_CLASSES,
    planted_model,
    planted_sentences,
    writing_copy_suppression,
    writing_function_vector,
    writing_ioi,
    writing_successor,
)

CFG = RolesConfig(n_boot=200, n_perm=500, induction_n_sequences=24)
GROUPS = tuple(REGISTRY)  # every registered group, shipped or not, at collection time


@pytest.fixture(scope="module")
def causal():
    return planted_model(causal=True)


@pytest.fixture(scope="module")
def bidi():
    return planted_model(causal=False)


@pytest.fixture(scope="module")
def successor():
    """The causal planted model with (1, 2) made a successor head over the nouns in order."""
    return writing_successor(planted_model(causal=True), WORD_CLASSES["noun"])


@pytest.fixture(scope="module")
def copy_suppression():
    """The causal planted model with (1, 2) made a copy-suppression head."""
    return writing_copy_suppression(planted_model(causal=True))


#: the planted function-vector task: each noun to the next one (cyclic)
FV_PAIRS = list(zip(WORD_CLASSES["noun"], WORD_CLASSES["noun"][1:] + WORD_CLASSES["noun"][:1]))


@pytest.fixture(scope="module")
def function_vector():
    """The causal planted model with (1, 2) made a function-vector head for :data:`FV_PAIRS`."""
    return writing_function_vector(planted_model(causal=True), FV_PAIRS)


@pytest.fixture(scope="module")
def ioi():
    """The causal planted model with an IOI circuit: (0, 2) S-inhibition, (1, 2) a name mover."""
    return writing_ioi(planted_model(causal=True))


#: options a group needs on the planted vocabulary (successor: an ordinal chain of its words;
#: function-vector: a task over its words, in a template of its words, halves of 5 pairs; ioi: the
#: IOI task over the planted nouns as names, tokenised by the planted tokenizer every planted model shares)
PLANTED_OPTIONS = {
    "successor": {"sets": {"nouns": WORD_CLASSES["noun"]}},
    "function-vector": {"tasks": {"next-noun": FV_PAIRS}, "template": FV_TEMPLATE, "n_demos": 4, "n_prompts": 12},
    "ioi": {"items": planted_ioi_task(planted_model(), n_items=16).items},
}


# ---------------------------------------------------------------------------------- planted corpora
def _np(rng) -> list[str]:
    """det [adj] noun, over the planted vocabulary."""
    w = WORD_CLASSES
    return [rng.choice(w["det"])] + ([rng.choice(w["adj"])] if rng.random() < 0.5 else []) + [rng.choice(w["noun"])]


def planted_trees(n: int, seed: int = 0) -> list[DependencySentence]:
    """``det [adj] noun verb [on] det [adj] noun .`` with its UD tree: the planted head (0, 2) of
    the causal model (a noun attends its nearest preceding determiner) is a ``det`` head->dep head,
    which the best fixed offset (-1 or -2, as an adjective stands between or not) cannot match."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        subj, obj = _np(rng), _np(rng)
        on = rng.random() < 0.5
        words = subj + [rng.choice(WORD_CLASSES["verb"])] + (["on"] if on else []) + obj + ["."]
        verb, noun1 = len(subj), len(subj) - 1
        noun2 = len(words) - 2
        heads, rels = [], []
        for i, wd in enumerate(words):
            if i == verb:
                heads.append(-1), rels.append("root")
            elif i in (noun1, noun2):
                heads.append(verb), rels.append("nsubj" if i == noun1 else ("obl" if on else "obj"))
            elif wd == "on":
                heads.append(noun2), rels.append("case")
            elif wd == ".":
                heads.append(verb), rels.append("punct")
            else:  # det or adj of the noun phrase it stands in
                heads.append(noun1 if i < verb else noun2), rels.append("det" if wd in WORD_CLASSES["det"] else "amod")
        out.append(DependencySentence(words=tuple(words), heads=tuple(heads), relations=tuple(rels)))
    return out


def planted_coref(n: int, seed: int = 0) -> list[CorefItem]:
    """``[det adj noun verb] det_a noun_a verb det_c adj noun_c``, ``noun_c`` as the "pronoun"
    and its determiner ``det_c`` the gold candidate, with one other: the adjective after it
    (half the items: the gold one is the first candidate, not the nearest) or ``det_a`` before
    it (the other half: the nearest, not the first), so that both baselines and a head
    without a rule are right half the time; the causal model's head (0, 2), which attends a
    noun's nearest preceding determiner, is right on every item."""
    rng = random.Random(seed)
    w = WORD_CLASSES
    items = []
    for i in range(n):
        words = [rng.choice(w["det"]), rng.choice(w["adj"]), rng.choice(w["noun"]), rng.choice(w["verb"])]
        words = words[: rng.choice((0, 4))]  # an optional first clause moves every position
        a = len(words)
        words += [rng.choice(w["det"]), rng.choice(w["noun"]), rng.choice(w["verb"])]
        words += [rng.choice(w["det"]), rng.choice(w["adj"]), rng.choice(w["noun"])]
        det_c, adj, pronoun = a + 3, a + 4, a + 5
        if i % 2:
            cands, gold = ((det_c, det_c + 1), (adj, adj + 1)), 0
        else:
            cands, gold = ((a, a + 1), (det_c, det_c + 1)), 1
        items.append(CorefItem(words=tuple(words), pronoun=pronoun, candidates=cands, antecedent=gold, id=f"p{i}"))
    return items


def _one_clause(texts: list[str]) -> list[str]:
    """Sentences with a single punctuation token (the final one)."""
    punct = set(WORD_CLASSES["punct"])
    return [t for t in texts if sum(w in punct for w in t.split()) == 1]


@dataclass
class Case:
    """A planted case: the model (``"causal"``/``"bidi"``), the items, the options, and the
    verdicts expected at least: ``(layer, head, role[, relation, direction])``."""

    model: str
    items: object
    expected: set
    options: dict = field(default_factory=dict)


def _rare_counts() -> Counter:
    """Every planted token common but the sentence-final punctuation: the rarest token of a
    one-clause sentence is its last, which the punctuation head (1, 2) attends from every row
    of the bidirectional model."""
    return Counter({i: 1 if w in (".", "!", "?") else 100 for i, w in enumerate(VOCAB)})


#: each group's planted case (a new role adds its own)
PLANTED = {
    "positional": lambda: Case(
        "causal", planted_sentences(60), {(0, 0, "positional:previous"), (0, 1, "positional:first")}
    ),
    "special": lambda: Case(
        "causal", planted_sentences(60), {(0, 1, "sink:first-token"), (0, 1, "special"), (1, 2, "punctuation")}
    ),
    "rare-word": lambda: Case(
        "bidi", _one_clause(planted_sentences(200)), {(1, 2, "rare-word")}, {"frequencies": _rare_counts()}
    ),
    "induction": lambda: Case("causal", None, {(0, 0, "previous-token"), (1, 1, "induction")}),
    "syntactic": lambda: Case("causal", planted_trees(60), {(0, 2, "syntactic", "det", "head->dep")}),
    "coreference": lambda: Case("causal", planted_coref(40), {(0, 2, "coreference")}),
    "successor": lambda: Case("successor", None, {(1, 2, "successor")}, PLANTED_OPTIONS["successor"]),
    "copy-suppression": lambda: Case("copy_suppression", None, {(1, 2, "copy-suppression")}),
    "function-vector": lambda: Case(
        "function_vector", None, {(1, 2, "function-vector")}, PLANTED_OPTIONS["function-vector"]
    ),
    "ioi": lambda: Case("ioi", PLANTED_OPTIONS["ioi"]["items"], {(1, 2, "ioi:name-mover")}),
}


def _verdicts(frame: pd.DataFrame) -> set:
    v = frame[frame.verdict]
    return set(zip(v.layer, v["head"], v.role)) | set(zip(v.layer, v["head"], v.role, v.relation, v.direction))


@pytest.fixture(scope="module")
def planted_outputs(causal, bidi, successor, copy_suppression, function_vector, ioi):
    """``{group: (case, RoleOutput)}``, each group run once on its planted case."""
    cache = {}
    models = {
        "causal": causal,
        "bidi": bidi,
        "successor": successor,
        "copy_suppression": copy_suppression,
        "function_vector": function_vector,
        "ioi": ioi,
    }

    def get(group):
        if group not in cache:
            case = PLANTED[group]()
            model = models[case.model]
            cache[group] = case, run_role(group, model, case.items, CFG, **case.options)
        return cache[group]

    return get


def _needs_planted(group):
    if REGISTRY[group].score_kind == "none":
        pytest.skip(f"{group!r} gives statistics, no verdicts: nothing to plant")
    if group not in PLANTED:
        pytest.fail(f"role group {group!r} has no planted case: add one to PLANTED in {__file__}")


# ------------------------------------------------------------------------------------------ checks
@pytest.mark.parametrize("group", GROUPS)
def test_empty_input_gives_an_empty_well_formed_result(group, causal):
    """No item: an empty result (ROLE_COLUMNS, no verdict, no item used), or for a group that
    makes its own items, a one-line ``ValueError`` refusing an empty list given as its items."""
    role = REGISTRY[group]
    if role.corpus == "generated":
        with pytest.raises(ValueError) as e:
            run_role(group, causal, [], CFG)
        assert "\n" not in str(e.value) and str(e.value)
        return
    out = run_role(group, causal, [], CFG)
    assert list(out.frame.columns) == ROLE_COLUMNS
    assert out.n_items == 0 and not bool(out.frame.verdict.any())
    assert out.frame.empty or bool(out.frame.score.isna().all()), f"{group}: rows with a score from no item"
    assert not out.frame.n.any()


@pytest.mark.parametrize("group", GROUPS)
def test_frame_has_role_columns_and_none_groups_give_no_verdict_rows(group, planted_outputs, causal):
    role = REGISTRY[group]
    if role.score_kind == "none":
        out = run_role(group, causal, planted_sentences(20), CFG)
        assert list(out.frame.columns) == ROLE_COLUMNS and out.frame.empty
        assert out.stats is not None or out.extra, f"{group}: a 'none' group returns statistics"
        return
    _needs_planted(group)
    _, out = planted_outputs(group)
    assert list(out.frame.columns) == ROLE_COLUMNS and len(out.frame)
    f = out.frame
    assert f[["layer", "head"]].drop_duplicates().shape[0] == 2 * 4  # every head of the planted model, in range
    assert f.layer.between(0, 1).all() and f["head"].between(0, 3).all() and f.verdict.dtype == bool
    assert f.role.map(lambda r: isinstance(r, str) and r != "").all()
    if role.score_kind == "hit":  # per-item 0/1: a score is a share of hits over n items
        assert ((f.score * f.n).round(6) % 1 == 0).all()
    assert f.score.between(0, 1).all() and (f.p_value.isna() | f.p_value.between(0, 1)).all()


@pytest.mark.parametrize("group", GROUPS)
def test_planted_heads_are_found(group, planted_outputs):
    _needs_planted(group)
    case, out = planted_outputs(group)
    found = _verdicts(out.frame)
    assert case.expected <= found, f"{group}: planted {case.expected - found} not found; verdicts: {found}"


@pytest.mark.parametrize("group", GROUPS)
def test_random_weight_heads_are_not_labelled(group, planted_outputs):
    _needs_planted(group)
    _, out = planted_outputs(group)
    v = out.frame[out.frame.verdict]
    labelled = {(int(layer), int(head)) for layer, head in zip(v.layer, v["head"])}
    assert not labelled & set(RANDOM_HEADS), f"{group}: random heads labelled: {labelled & set(RANDOM_HEADS)}"


class _Keep:
    """Keeps every capture it is fed (to replay them into two reducers)."""

    def __init__(self):
        self.caps = []

    def update(self, cap) -> None:
        self.caps.append(cap)

    def merge(self, other):
        self.caps += other.caps
        return self


def _items_for(group, causal):
    role = REGISTRY[group]
    if role.corpus == "text":
        return planted_sentences(40)
    if role.corpus == "conllu":
        return planted_trees(40)
    if role.corpus == "coref":
        return planted_coref(40)
    return None


@pytest.mark.parametrize("group", GROUPS)
def test_merge_of_two_halves_equals_one_pass(group, causal):
    """One pass fills ``whole`` and keeps its captures; the first half of them fills ``a``, the
    rest ``b``; ``a.merge(b)`` finishes to ``whole``'s frame (and statistics)."""
    role = REGISTRY[group]
    cfg = RolesConfig(n_boot=50, n_perm=100, induction_n_sequences=12, batch_size=5)
    ctx = RoleContext(causal, cfg, _items_for(group, causal) or [], options=PLANTED_OPTIONS.get(group, {}))
    if role.corpus == "generated":
        ctx.items = role.items(ctx)
    whole, keep = role.reducer(ctx), _Keep()
    if role.corpus == "generated":
        report = role.feed(ctx, [whole, keep], None)
    else:
        words = role.corpus != "text"
        items = [list(it.words) for it in ctx.items] if words else ctx.items
        report = stream(causal, items, [whole, keep], batch_size=cfg.batch_size, words=True if words else None)
    assert len(keep.caps) >= 2, "the check needs at least two batches"
    a, b = role.reducer(ctx), role.reducer(ctx)
    half = len(keep.caps) // 2
    for i, cap in enumerate(keep.caps):
        (a if i < half else b).update(cap)
    merged = a.merge(b)
    merged = a if merged is None else merged
    one, two = role.finish(whole, report, ctx), role.finish(merged, report, ctx)
    _frames_equal(one.frame, two.frame)
    if one.stats is not None:
        _frames_equal(one.stats, two.stats)
    assert one.n_items == two.n_items


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Equal frames: numbers to 1e-6 (float32 sums in another order), the rest exactly."""
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for c in a.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if np.issubdtype(x.dtype, np.floating):
            np.testing.assert_allclose(x, y, atol=1e-6, rtol=0, equal_nan=True, err_msg=c)
        else:
            assert list(x) == list(y), c
