"""Copy-suppression heads (headscope.analyses.roles.copy_suppression): the planted copy-suppression
head is found and nothing else is, on the planted model and on a random-weight one; the statistics
say what the head does; an encoder gives no rows and says why; bad items are refused."""

from __future__ import annotations

import pytest

from headscope.analyses.roles.base import REGISTRY, register
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.copy_suppression import ROLE_DEF, scored_positions
from headscope.analyses.roles.pipeline import run_role
from headscope.probes.models.inhouse.planted import RANDOM_HEADS, planted_model, writing_copy_suppression

CFG = RolesConfig(n_boot=200, n_perm=500, induction_n_sequences=24, batch_size=8)
ROLE = "copy-suppression"


@pytest.fixture(scope="module", autouse=True)
def registered():
    if ROLE not in REGISTRY:
        register(ROLE_DEF)
    yield


@pytest.fixture(scope="module")
def planted_out():
    return run_role(ROLE, writing_copy_suppression(planted_model()), None, CFG)


def _stat(out, metric, head):
    s = out.stats[out.stats.metric == f"{ROLE}:{metric}"].set_index(["layer", "head"])
    return float(s.value[head])


def test_the_planted_copy_suppression_head_is_found(planted_out):
    f = planted_out.frame.set_index(["layer", "head"])
    assert set(f.index[f.verdict]) == {(1, 2)} and len(f) == 8
    assert f.score[(1, 2)] == 1.0 and f.baseline[(1, 2)] < 0.15
    assert not any(f.verdict[h] for h in RANDOM_HEADS) and planted_out.n_items == 24


def test_statistics_say_it_attends_the_predicted_token_and_lowers_it(planted_out):
    assert _stat(planted_out, "attention_to_predicted", (1, 2)) > 0.99
    assert _stat(planted_out, "direct_logit", (1, 2)) < -3.0  # -4 on the token, ~-4/20 on the mean
    assert _stat(planted_out, "ov_negative_copying", (1, 2)) == 1.0
    # the induction head attends the same keys but writes nothing: attention alone is no hit
    assert _stat(planted_out, "attention_to_predicted", (1, 1)) > 0.99
    assert planted_out.frame.set_index(["layer", "head"]).score[(1, 1)] == 0.0
    assert _stat(planted_out, "ov_negative_copying", (1, 1)) == 0.0


def test_no_head_of_a_random_weight_model_is_labelled():
    model = planted_model()
    model.module.init_weights(std=0.3, seed=3)
    out = run_role(ROLE, model, None, CFG)
    assert len(out.frame) == 8 and not out.frame.verdict.any()
    assert out.frame.score.max() < 0.3


def test_an_encoder_gives_no_rows_and_says_why(minilm):
    out = run_role(ROLE, minilm, None, RolesConfig(n_boot=10, n_perm=10))
    assert out.frame.empty and "no unembedding" in out.extra["notes"][0]


def test_scored_positions_follow_the_induction_prediction():
    assert scored_positions([9, 3, 4, 3, 4], [True, False, False, False, False]) == ((3, 4), (4, 3))
    # a token repeated at once has no token between its copies: nothing to predict before the query
    assert scored_positions([9, 3, 3], [True, False, False]) == ((), ())


def test_empty_or_unreadable_items_are_refused():
    model = planted_model()
    with pytest.raises(ValueError, match="non-empty list of token-id sequences"):
        run_role(ROLE, model, [], CFG)
    with pytest.raises(ValueError, match="item 0 has no position"):
        run_role(ROLE, model, [[1, 5, 6, 7]], CFG)
    with pytest.raises(ValueError, match="ordinary token ids"):
        run_role(ROLE, model, None, RolesConfig(induction_seq_len=40))
