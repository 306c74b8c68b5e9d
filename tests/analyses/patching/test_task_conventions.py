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


def test_the_report_says_the_convention_and_what_an_encoder_task_measures(tokenizers):
    """The report's task paragraph: a generated task's source (its BOS convention), the attention
    score vs causal effect explanation beside induction, and on an encoder that ``agreement`` is
    measured by embedding_cosine, not by whether the verb agrees."""
    from headscope.analyses.roles.induction import ATTENTION_VS_EFFECT
    from headscope.reports.sections.causal import _task_paragraph

    task = induction_task(tokenizers["smollm2-135m"], n_items=3, seq_len=8, seed=0)
    s = {
        "task": task.summary(),
        "measures": "log p(answer)",
        "gap": 1.0,
        "metric_clean": -1.0,
        "metric_corrupted": -2.0,
    }
    text = _task_paragraph("induction", s)
    assert "no BOS: the tokenizer adds none to a text" in text and ATTENTION_VS_EFFECT in text
    enc = {"task": {"metric": "embedding_cosine", "n_items": 4, "source": "/x/agreement.jsonl"}, "gap": 0.1}
    text = _task_paragraph("agreement", {**enc, "measures": "cosine ...", "metric_clean": 1.0, "metric_corrupted": 0.9})
    assert "measured by embedding_cosine: how far the pooled embedding moves" in text and "/x/" not in text
    assert ATTENTION_VS_EFFECT not in text
