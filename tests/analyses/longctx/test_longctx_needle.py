"""The needle-in-a-haystack copy task and the planted long-context model: items built from
the project's text have the needle where they say, and the planted model copies it through
its copy head (masking that head, or the local head it reads, stops the copy; masking any
other head changes nothing)."""

from __future__ import annotations

import pytest
import torch

from headscope.analyses.longctx.needle import copy_accuracy, copy_hits, item_logits, needle_items
from headscope.analyses.roles.long_inputs import LongInputError
from headscope.probes.corpora.needle_words import PREFIX
from headscope.probes.models.inhouse.planted_long import (
    COPY_HEAD,
    LOCAL_HEAD,
    planted_long_model,
    planted_long_roles,
)


@pytest.fixture(scope="module")
def planted_long():
    return planted_long_model()


def test_items_hold_the_needle_twice_at_the_stated_positions(planted_long):
    tok = planted_long.tokenizer
    items = needle_items(tok, 300, 4, needle_len=6)
    prefix = tok(PREFIX, add_special_tokens=False)["input_ids"]
    for it in items:
        ids = it.input_ids
        assert len(ids) == 300 and ids[0] == tok.bos_token_id and ids[1] != tok.unk_token_id
        assert [ids[a] for a in it.answer] == [ids[n] for n in it.needle] and it.answer[-1] == 299
        assert len(set(ids[n] for n in it.needle)) == 6  # no needle word twice
        assert ids[it.needle[0] - len(prefix) : it.needle[0]] == prefix == [ids[c] for c in it.cue]
        assert it.cue[-1] + 1 == it.answer[0]
        assert all(ids.count(ids[n]) == 2 for n in it.needle)  # the needle's words nowhere else
    # spread over the haystack: (i + 0.5) / 4, moved to a sentence boundary (sentences of ~25 words)
    assert all(abs(it.depth - (i + 0.5) / 4) < 0.1 for i, it in enumerate(items))
    assert items[0].input_ids != items[1].input_ids and needle_items(tok, 300, 4, needle_len=6) == items


def test_bos_is_put_or_left_out_as_asked(planted_long):
    tok = planted_long.tokenizer
    none = needle_items(tok, 120, 1, bos=False)[0]
    assert tok.bos_token_id not in none.input_ids and len(none.input_ids) == 120
    with pytest.raises(LongInputError, match="leave no haystack"):
        needle_items(tok, 40, 1, needle_len=16)
    with pytest.raises(LongInputError, match="n_items must be an int >= 1"):
        needle_items(tok, 200, 0)


def test_planted_model_copies_through_its_copy_head_only(planted_long):
    items = needle_items(planted_long.tokenizer, 200, 2)
    assert copy_accuracy([item_logits(planted_long, it) for it in items], items) == 1.0
    spec = planted_long.spec
    for head, role in planted_long_roles().items():
        mask = torch.ones(spec.n_layers, spec.n_heads)
        mask[head] = 0.0
        with planted_long.gates_set(mask):
            acc = copy_accuracy([item_logits(planted_long, it) for it in items], items)
        assert acc == (0.0 if head in (COPY_HEAD, LOCAL_HEAD) else 1.0), (head, role)


def test_copy_hits_reads_full_or_answer_rows_and_refuses_other_shapes(planted_long):
    it = needle_items(planted_long.tokenizer, 100, 1)[0]
    ids = torch.tensor([it.input_ids])
    full = planted_long.forward(ids, torch.ones_like(ids)).detach()
    assert copy_hits(full, it).tolist() == copy_hits(item_logits(planted_long, it), it).tolist() == [True] * 8
    with pytest.raises(ValueError, match="logits must be"):
        copy_hits(full[0, :5], it)
