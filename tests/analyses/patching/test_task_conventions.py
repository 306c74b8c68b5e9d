"""Generated patching tasks start as the model's own tokenizer starts a text: with [CLS] on
MiniLM, with nothing on SmolLM2 (whose ``bos_token`` ``<|im_start|>`` is a chat marker its
tokenizer never puts in front of a text), with [BOS] on the planted model. The task's source
says which."""

from __future__ import annotations

import pytest

from headscope.analyses.patching.generated import duplicate_token_task, induction_task, leading_specials
from headscope.probes.models.checkpoints import hf_dir, load_tokenizer, resolve
from headscope.probes.models.inhouse.planted import planted_tokenizer


@pytest.fixture(scope="module")
def tokenizers():
    return {
        "minilm-l6": load_tokenizer(hf_dir(resolve("minilm-l6"))),
        "smollm2-135m": load_tokenizer(hf_dir(resolve("smollm2-135m"))),
        "planted": planted_tokenizer(),
    }


@pytest.mark.parametrize(
    "name, first, says",
    [
        ("minilm-l6", ["[CLS]"], "starts with [CLS]"),
        ("smollm2-135m", [], "no BOS: the tokenizer adds none"),
        ("planted", ["[BOS]"], "starts with [BOS]"),
    ],
)
def test_items_start_as_the_tokenizers_own_texts(tokenizers, name, first, says):
    tok = tokenizers[name]
    assert tok.convert_ids_to_tokens(leading_specials(tok)) == first
    own = tok("the cat sat")["input_ids"]
    assert own[: len(first)] == leading_specials(tok)
    task = induction_task(tok, n_items=3, seq_len=10, seed=0)
    assert says in task.source
    for it in task.items:
        assert len(it.clean) == len(first) + 2 * 10 - 1  # [first] + S + S[:-1]
        assert list(it.clean[: len(first)]) == leading_specials(tok)
    dup = duplicate_token_task(tok, n_items=2, seq_len=8, seed=0)
    assert says in dup.source and all(list(it.clean[: len(first)]) == leading_specials(tok) for it in dup.items)


def test_smollm2s_bos_token_is_not_what_its_tokenizer_adds(tokenizers):
    """Why the convention is read off an encoded text and not off ``bos_token_id``."""
    tok = tokenizers["smollm2-135m"]
    assert tok.bos_token == "<|im_start|>" and tok.bos_token_id not in tok("the cat sat")["input_ids"]
