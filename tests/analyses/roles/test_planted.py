"""Planted ground truth: hand-built heads must get exactly their roles, random heads none."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.pipeline import head_roles, run_role
from headscope.probes.capture import capture
from headscope.probes.models.inhouse.planted import (
    RANDOM_HEADS,
    VOCAB,
    WORD_CLASSES,
    planted_model,
    planted_roles,
    planted_sentences,
)

CFG = RolesConfig(n_boot=200, n_perm=500)
TOKEN_ROLES = (
    "positional",
    "special",
    "sink",
    "punctuation",
    "induction",
    "duplicate-token",
    "previous-token",
    "next-token",
    "rare-word",
)


@pytest.fixture(scope="module")
def causal():
    return planted_model(causal=True)


@pytest.fixture(scope="module")
def bidi():
    return planted_model(causal=False)


@pytest.fixture(scope="module")
def texts():
    return planted_sentences(60, seed=0)


def verdicts(frame) -> set:
    v = frame[frame["verdict"]]
    return set(zip(v["layer"], v["head"], v["role"]))


GROUPS = ("positional", "special", "induction", "rare-word")


@pytest.fixture(scope="module")
def causal_result(causal, texts):
    return head_roles(causal, text=texts, roles=GROUPS, cfg=CFG, examples=False)


@pytest.fixture(scope="module")
def causal_roles(causal_result):
    return [causal_result.outputs[g].frame for g in GROUPS]


@pytest.fixture(scope="module")
def bidi_result(bidi, texts):
    return head_roles(bidi, text=texts, roles=("positional", "special", "induction"), cfg=CFG, examples=False)


def test_causal_model_roles_are_recovered_exactly(causal_roles):
    pos, spec, ind, rare = causal_roles
    assert verdicts(pos) == {(0, 0, "positional:previous"), (0, 1, "positional:first")}
    assert verdicts(spec) == {(0, 1, "sink:first-token"), (0, 1, "special"), (1, 2, "punctuation")}
    assert verdicts(ind) == {(0, 0, "previous-token"), (1, 1, "induction")}
    assert verdicts(rare) == set()
    # a causal model reports no "next" rows at all
    assert not pos["role"].isin(["positional:next", "positional:+2"]).any()
    assert not ind["role"].eq("next-token").any()


def test_single_path_keeps_each_groups_extras(causal_result, causal, texts):
    out = causal_result.outputs
    assert out["positional"].extra["notes"] == [
        "causal model: no query sees a later key, so positional:next and positional:+2 are impossible and not reported"
    ]
    assert set(out["positional"].extra["top_bucket"].columns) == {"layer", "head", "bucket", "share"}
    assert out["induction"].extra["notes"] == ["causal model: next-token is impossible and not reported"]
    assert out["induction"].n_items == CFG.induction_n_sequences
    assert out["rare-word"].extra["n_token_types"] > 0 and out["positional"].n_items == len(texts)
    # run_role is head_roles with one group: the same rows
    one = run_role("positional", causal, texts, CFG)
    assert one.extra["notes"] == out["positional"].extra["notes"]
    pd.testing.assert_frame_equal(one.frame, out["positional"].frame)


def test_planted_scores_match_their_construction(causal_roles):
    pos, spec, ind, _ = causal_roles

    def score(frame, layer, head, role):
        return float(frame.query("layer == @layer and head == @head and role == @role")["score"].iloc[0])

    assert score(pos, 0, 0, "positional:previous") == pytest.approx(1.0, abs=1e-9)
    assert score(pos, 0, 1, "positional:first") == pytest.approx(1.0, abs=1e-9)
    assert score(spec, 0, 1, "sink:first-token") == pytest.approx(1.0, abs=1e-6)
    assert score(spec, 1, 2, "punctuation") == pytest.approx(1.0, abs=1e-6)
    # [BOS] + R + R, 41 rows: only row 0 (BOS, no previous token) misses
    assert score(ind, 0, 0, "previous-token") == pytest.approx(40 / 41, abs=1e-6)
    # seq_len 20 from 32 words: the 20 second-copy rows plus repeats inside R (measured 0.6120)
    assert score(ind, 1, 1, "induction") == pytest.approx(0.612043, abs=1e-5)


def test_random_heads_get_no_role(causal_roles, bidi_result):
    for frame in causal_roles:
        v = frame[frame["verdict"]]
        assert not any((l, h) in RANDOM_HEADS for l, h in zip(v["layer"], v["head"]))
    frames = [bidi_result.outputs["positional"].frame, bidi_result.outputs["special"].frame]
    for frame in frames:
        v = frame[frame["verdict"]]
        assert not any((l, h) in RANDOM_HEADS for l, h in zip(v["layer"], v["head"]))
    assert set(planted_roles()) >= set(RANDOM_HEADS)


def test_bidirectional_model_has_next_token_head(bidi_result):
    pos = bidi_result.outputs["positional"].frame
    layer0 = {v for v in verdicts(pos) if v[0] == 0}
    assert layer0 == {(0, 0, "positional:previous"), (0, 1, "positional:first"), (0, 2, "positional:next")}
    ind = bidi_result.outputs["induction"].frame
    v = verdicts(ind)
    assert {(0, 0, "previous-token"), (0, 2, "next-token"), (1, 1, "induction")} <= v
    assert all(h not in RANDOM_HEADS for h in {(l, hh) for l, hh, _ in v})


def test_noun_attends_nearest_preceding_determiner(causal):
    cap = capture(causal, ["the big cat saw a small dog and this bird ran ."])
    toks = cap.tokens.tokens[0]
    pat = cap["pattern", 0][0, 2]
    nouns, dets = set(WORD_CLASSES["noun"]), set(WORD_CLASSES["det"])
    for q, t in enumerate(toks):
        if t in nouns:
            nearest = max(k for k in range(q) if toks[k] in dets)
            assert float(pat[q, nearest]) > 0.99, (q, t)


def test_ablating_planted_previous_head_breaks_induction(causal):
    seqs = run_role("induction", causal, cfg=RolesConfig(induction_n_sequences=8, n_boot=10, n_perm=10)).extra[
        "sequences"
    ]

    def ind_score():
        out = run_role("induction", causal, seqs, RolesConfig(n_boot=10, n_perm=10))
        f = out.frame
        return float(f.query("layer == 1 and head == 1 and role == 'induction'")["score"].iloc[0])

    before = ind_score()
    gate = causal.module.blocks[0].attn.gate
    try:
        with torch.no_grad():
            gate[3] = 0.0  # a random head: nothing changes
        assert ind_score() == pytest.approx(before, abs=1e-6)
        with torch.no_grad():
            gate[3] = 1.0
            gate[0] = 0.0  # the previous-token head feeding the induction head
        after = ind_score()
    finally:
        with torch.no_grad():
            gate.fill_(1.0)
    assert before > 0.55 and after < 0.1


def test_planted_tokenizer_marks_bos_special(causal):
    b = causal.encode(texts=["the cat sat .", "a dog ran"])
    assert b.special[0] == [True, False, False, False, False]
    assert b.input_ids[1, -1].item() == VOCAB.index("[PAD]") and b.attention_mask[1].tolist() == [1, 1, 1, 1, 0]
