"""QK attribution on the planted induction circuit (probes/models/inhouse/planted.py): the
induction head (1, 1) attends to the token after the earlier copy because its key reads what the
planted previous-token head (0, 0) wrote, and its query reads the token itself."""

from __future__ import annotations

import pytest
import torch

from headscope.analyses.qk import QKConfig, QKItem, difference_pairs, induction_items, qk_study, sentence_items


def test_induction_head_keys_are_driven_by_the_previous_token_head(planted, induction):
    r = qk_study(planted, [(1, 1), (1, 0)], induction_items(induction))
    s = r.summary["1.1"]
    assert r.forwards == 1  # 12 items of one length, both heads: one forward
    assert s["n_items"] == 12 and s["n_skipped"] == 0 and s["max_relative_error"] <= 1e-5
    assert s["top_key"]["component"] == "L0H0" and s["top_key"]["share"] > 0.9
    assert s["top_query"]["component"] == "embed" and s["top_query"]["share"] > 0.9
    assert s["top_pair"]["component"] == "embed x L0H0"
    f = r.frame
    keys = f[(f["head"] == 1) & (f.layer == 1) & (f.side == "key")].set_index("key_component")
    assert keys.share.sum() == pytest.approx(1.0, abs=1e-4)
    for other in ("L0H1", "L0H2", "L0H3"):  # heads that write nothing: no share
        assert abs(keys.share[other]) < 1e-6
    assert r.summary["1.0"]["top_key"]["component"] != "L0H0" or r.summary["1.0"]["top_key"]["share"] < 0.9


def test_runner_up_baseline_also_names_the_previous_token_head(planted, induction):
    r = qk_study(planted, [(1, 1)], induction_items(induction), QKConfig(baseline="runner_up"))
    assert r.summary["1.1"]["top_key"]["component"] == "L0H0"


def test_a_query_with_no_other_key_is_skipped_and_counted(planted):
    items, tokens = sentence_items(planted, "the cat sat . the cat")
    r = qk_study(planted, [(1, 1)], items)
    assert r.summary["1.1"]["n_skipped"] == 1  # the first position sees only itself
    assert r.summary["1.1"]["n_items"] == len(tokens) - 1


def test_sentence_tokens_name_their_positions(planted):
    items, tokens = sentence_items(planted, "the cat sat . the cat", "cat", "sat")
    assert items == [QKItem(items[0].ids, 6, 3)] and tokens[6] == "cat"
    with pytest.raises(ValueError, match="not a token"):
        sentence_items(planted, "the cat sat", "dog")


def test_difference_of_a_single_key_pair():
    q = torch.tensor([[1.0, 2.0]])
    k = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]]])
    d = difference_pairs(q, k, torch.tensor([True, True, False]), 0, 0.5)
    assert d.tolist() == [[0.5 * (1.0 - 2.0)]]
    assert difference_pairs(q, k, torch.tensor([True, False, False]), 0, 1.0) is None
    with pytest.raises(ValueError, match="baseline"):
        difference_pairs(q, k, torch.tensor([True, True, True]), 0, 1.0, "median")


def test_duplicate_token_items_point_at_the_earlier_copy(planted):
    from headscope.analyses.patching.generated import duplicate_token_task
    from headscope.analyses.qk import duplicate_items

    items = duplicate_items(duplicate_token_task(planted.tokenizer, n_items=5, seq_len=8, first_at=3))
    assert [(it.query, it.key) for it in items] == [(9, 3)] * 5  # [BOS] + 8 + the repeat; the copy at 3
    assert all(it.ids[it.key] == it.ids[it.query] for it in items)


def test_task_items_by_name(planted):
    from headscope.analyses.qk import task_items

    items = task_items("duplicate_token", planted.tokenizer, n_items=2, seq_len=6, seed=1)
    assert len(items) == 2 and all(it.ids[it.key] == it.ids[it.query] for it in items)
    with pytest.raises(ValueError, match="task must be one of"):
        task_items("ioi", planted.tokenizer, n_items=2, seq_len=6, seed=1)
