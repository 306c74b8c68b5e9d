"""Successor heads (headscope.analyses.roles.successor): the planted successor head is found and
nothing else is; an encoder gives no rows and says why; the streaming merge equals one pass."""

from __future__ import annotations

import pytest

from headscope.analyses.roles.base import REGISTRY, RoleContext, register
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.pipeline import run_role
from headscope.analyses.roles.successor import ROLE_DEF, OrdinalItem, probe_items
from headscope.probes.models.inhouse.planted import RANDOM_HEADS, WORD_CLASSES, planted_model, writing_successor

NOUNS = WORD_CLASSES["noun"]
CFG = RolesConfig(n_boot=200, n_perm=500, induction_n_sequences=16, batch_size=6)


@pytest.fixture(scope="module", autouse=True)
def registered():
    if "successor" not in REGISTRY:
        register(ROLE_DEF)
    yield


@pytest.fixture(scope="module")
def successor_model():
    return writing_successor(planted_model(), NOUNS)


def test_the_planted_successor_head_is_found(successor_model):
    out = run_role("successor", successor_model, None, CFG, sets={"nouns": NOUNS})
    assert set(out.frame.role) == {"successor", "successor:ov"}  # the weights' rows: test_successor_ov.py
    f = out.frame[out.frame.role == "successor"].set_index(["layer", "head"])
    assert set(f.index[f.verdict]) == {(1, 2)}
    assert f.score[(1, 2)] == 1.0 and f.baseline[(1, 2)] == pytest.approx(1 / len(NOUNS))
    assert not any(f.verdict[h] for h in RANDOM_HEADS) and out.n_items == 16


def test_items_are_shuffled_members_scored_where_a_successor_exists(successor_model):
    ctx = RoleContext(successor_model, CFG, options={"sets": {"nouns": NOUNS}})
    items = probe_items(ctx)
    assert len(items) == 16 and all(it.ids[0] == successor_model.tokenizer.bos_token_id for it in items)
    last = successor_model.tokenizer.convert_tokens_to_ids(NOUNS[-1])
    for it in items:
        assert last not in [it.ids[p] for p in it.positions] and it.positions
    assert any(it.ids[p + 1] != t for it in items for p, t in zip(it.positions, it.targets) if p + 1 < len(it.ids))


def test_an_encoder_gives_no_rows_and_says_why(minilm):
    out = run_role("successor", minilm, None, RolesConfig(n_boot=10, n_perm=10))
    assert out.frame.empty and "no unembedding" in out.extra["notes"][0]


def test_empty_or_unreadable_items_are_refused(successor_model):
    with pytest.raises(ValueError, match="non-empty list of OrdinalItem"):
        run_role("successor", successor_model, [], CFG)
    with pytest.raises(ValueError, match="no ordinal set"):
        run_role("successor", successor_model, None, CFG, sets={"x": ["cat", "zebra"]})
    assert OrdinalItem((1,), (True,), (1,), (), ()).positions == ()


def test_merge_of_two_halves_equals_one_pass(successor_model):
    ctx = RoleContext(successor_model, CFG, options={"sets": {"nouns": NOUNS}})
    ctx.items = probe_items(ctx)
    whole = ROLE_DEF.reducer(ctx)
    caps = []

    class Keep:
        def update(self, cap):
            caps.append(cap)

    report = ROLE_DEF.feed(ctx, [whole, Keep()], None)
    a, b = ROLE_DEF.reducer(ctx), ROLE_DEF.reducer(ctx)
    for i, cap in enumerate(caps):
        (a if i < len(caps) // 2 else b).update(cap)
    one, two = ROLE_DEF.finish(whole, report, ctx).frame, ROLE_DEF.finish(a.merge(b), report, ctx).frame
    assert len(caps) == 3 and one.equals(two)
