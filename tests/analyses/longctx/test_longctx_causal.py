"""The causal check: on the planted long model, masking the top retrieval head (the copy head)
destroys copying; a random head does so only when it is the local head the copy head reads.
And the reducers on hand-built patterns (closed form)."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.analyses.longctx.causal import CAUSAL_COLUMNS, causal_check, n_masked
from headscope.analyses.longctx.config import LongContextConfig
from headscope.analyses.longctx.needle import NeedleItem
from headscope.analyses.longctx.reducers import RetrievalReducer, SinkReducer
from headscope.probes.chunked import PatternPiece
from headscope.probes.models.inhouse.planted_long import COPY_HEAD, LOCAL_HEAD, planted_long_model


@pytest.fixture(scope="module")
def planted_long():
    return planted_long_model()


def test_masking_the_copy_head_destroys_copying_random_heads_do_not(planted_long):
    cfg = LongContextConfig(n_tokens=200, n_items=16, windows=(8,), causal_items=3, causal_draws=5)
    frame, s = causal_check(planted_long, cfg)
    assert list(frame.columns) == CAUSAL_COLUMNS and len(frame) == 3 * 7
    assert s["k"] == 1 and s["top_heads"] == [list(COPY_HEAD)] and s["n_heads"] == 8
    assert s["accuracy_unmasked"] == 1.0 and s["accuracy_top"] == 0.0 and s["damage_top"] == 1.0
    rand = frame[frame["condition"] == "random"]
    assert not rand["heads"].str.contains("L1H1").any() and set(rand["n_masked"]) == {1}  # drawn outside the top
    for _, g in rand.groupby("draw"):
        local = f"L{LOCAL_HEAD[0]}H{LOCAL_HEAD[1]}" in g["heads"].iloc[0]
        assert set(g["damage"]) == {1.0 if local else 0.0}  # only the head the copy head reads hurts
    mean = sum(s["damage_random_per_draw"]) / 5
    assert s["damage_random_mean"] == pytest.approx(mean)
    assert s["ratio"] == (math.inf if mean == 0 else pytest.approx(1.0 / mean))
    assert len(s["ratio_per_draw"]) == 5 and len(s["ratio_ci"]) == 2


def test_the_masked_share_rounds_half_up_with_at_least_one():
    assert [n_masked(n, 0.05) for n in (8, 20, 30, 270)] == [1, 1, 2, 14]


def test_retrieval_hits_need_the_copy_and_the_top_key_on_the_needle():
    item = NeedleItem(input_ids=[5, 7, 8, 9, 1, 7, 8], needle=[1, 2], answer=[5, 6], depth=0.2)
    pat = torch.zeros(1, 2, 7, 7)
    pat[0, 0, 4, 1], pat[0, 0, 5, 2] = 1.0, 1.0  # head 0: top-1 on the needle token at both steps
    pat[0, 1, 4, 1], pat[0, 1, 5, 4] = 1.0, 1.0  # head 1: on the needle at the first step only
    r = RetrievalReducer(1, 2)
    r.begin(item, torch.tensor([True, False]))  # the model copies the first answer token only
    r.piece(PatternPiece(0, 0, 4, pat[:, :, :4]))
    r.piece(PatternPiece(0, 4, 7, pat[:, :, 4:]))
    r.end()
    assert r.values[0].tolist() == [[0.5, 0.5]] and r.baselines[0] == pytest.approx(1 / 5 / 2)


def test_sink_mass_and_top_key_at_long_range():
    pat = torch.zeros(1, 1, 10, 10)
    pat[0, 0, :, 0] = 0.75  # 3/4 of every row on key 0, the rest on the query itself
    pat[0, 0, torch.arange(1, 10), torch.arange(1, 10)] = 0.25
    pat[0, 0, 0, 0] = 1.0
    r = SinkReducer(1, 1, sink=1, long_range=0.5)
    r.begin(10)
    r.piece(PatternPiece(0, 0, 10, pat))
    r.end()
    assert float(r.values[0][0, 0]) == pytest.approx(0.75)
    assert r.baselines[0] == pytest.approx(sum(1 / (i + 1) for i in range(5, 10)) / 5)
    assert int(r.profiles[0][0, 0].argmax()) == 0 and float(r.profiles[0][0, 0, 7]) == pytest.approx(0.05)
