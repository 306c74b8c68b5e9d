"""The IOI and greater-than tasks (analyses/patching/ioi.py, greater_than.py): well-formed
items on SmolLM2's tokenizer, unequal lengths skipped and counted, encoders refused, and on
SmolLM2 itself the metrics' signs (clean IOI logit difference positive, the ABC corruption's
near zero; greater-than's clean probability difference above the 01-corrupted one)."""

from __future__ import annotations

import pytest
import torch

from headscope.analyses.patching.activation import readout
from headscope.analyses.patching.greater_than import digit_mode, greater_than_rows
from headscope.analyses.patching.ioi import NAMES, ORDERS, TEMPLATES, ioi_rows, tokenize_ioi
from headscope.analyses.patching.tasks import load_task, metric_fn
from headscope.probes.errors import ModelIncompatibleError


def _metric_values(model, task) -> tuple[torch.Tensor, torch.Tensor]:
    """The task's metric per item on the clean and on the corrupted inputs (the clean answer)."""
    metric, clean_v, corrupted_v = metric_fn(task.metric), [], []
    with torch.inference_mode():
        for clean, corrupted, answer, wrong, _ in task.batches(16):
            clean_v.append(metric(readout(model, clean), answer, wrong))
            corrupted_v.append(metric(readout(model, corrupted), answer, wrong))
    return torch.cat(clean_v), torch.cat(corrupted_v)


@pytest.fixture(scope="module")
def ioi_smollm(smollm):
    return load_task(smollm, "ioi", n_items=2 * len(TEMPLATES), seed=0)


def test_ioi_items_are_well_formed_on_smollm2(smollm, ioi_smollm):
    tok, task = smollm.tokenizer, ioi_smollm
    assert task.metric == "logit_diff" and task.n_unusable == 0 and len(task.items) == 2 * len(TEMPLATES)
    for it in task.items:
        io, s = tok.convert_ids_to_tokens([it.answer, it.wrong])
        assert io.startswith("Ġ") and s.startswith("Ġ") and io[1:] in NAMES and s[1:] in NAMES and io != s
        assert len(it.clean) == len(it.corrupted)
        assert it.clean.count(it.answer) == 1 and it.clean.count(it.wrong) == 2  # IO once, S twice
        assert it.answer not in it.corrupted and it.wrong not in it.corrupted
        changed = [tok.convert_ids_to_tokens(c)[1:] for c, x in zip(it.clean, it.corrupted, strict=True) if c != x]
        assert len(changed) == 3 and all(n in NAMES for n in changed)  # only the three name slots differ
        assert it.clean[-1] == tok(" to")["input_ids"][0]


def test_ioi_rows_cover_every_template_in_both_orders():
    rows = ioi_rows(NAMES[:10], ["store"], ["drink"], n_items=2 * len(TEMPLATES), seed=1)
    assert {(r["template"], r["order"]) for _, r in rows} == {(t, o) for t in range(len(TEMPLATES)) for o in ORDERS}
    for _, r in rows:
        io, s = r["answer"][1:], r["wrong"][1:]
        first = r["clean"].index(f" {io} ") < r["clean"].index(f" {s} ")
        assert first == (r["order"] == "ABBA")


def test_unequal_lengths_are_skipped_and_counted(smollm):
    """A two-token name among six: items where it is IO or S have an answer that is not one
    token, items where it fills a corrupted slot tokenise longer; each is counted, none dropped."""
    assert len(smollm.tokenizer(" Xylophonia")["input_ids"]) > 1
    rows = ioi_rows(["Mary", "John", "Anna", "Paul", "Kate", "Xylophonia"], ["store"], ["drink"], n_items=12)
    with pytest.warns(UserWarning, match="task ioi: .* items unusable"):
        task = tokenize_ioi(smollm, rows)
    assert len(task.items) + task.n_unusable == 12
    counts = task.unusable_counts()
    assert counts.get("length_mismatch", 0) >= 1 and set(counts) <= {"length_mismatch", "not_single_token"}
    for u in task.unusable:
        r = rows[u["item"]][1]
        assert "Xylophonia" in r["clean"] + r["corrupted"]
        if u["kind"] == "length_mismatch":
            assert "Xylophonia" in r["corrupted"] and "clean has" in u["reason"] and "corrupted" in u["reason"]
    for it in task.items:
        assert len(it.clean) == len(it.corrupted)


@pytest.mark.parametrize("name", ["ioi", "greater_than"])
def test_an_encoder_is_refused(minilm, name):
    with pytest.raises(ModelIncompatibleError, match="next-token log-probs"):
        load_task(minilm, name, n_items=2)


def test_greater_than_on_smollm2_reads_the_tens_digit(smollm):
    metric, cands = digit_mode(smollm.tokenizer)
    assert metric == "greater_than_tens"
    assert smollm.tokenizer.convert_ids_to_tokens(cands) == [str(d) for d in range(10)]
    task = load_task(smollm, "greater_than", n_items=8)
    assert task.metric == "greater_than_tens" and "tens digit" in task.source and task.n_unusable == 0
    rows = greater_than_rows(n_items=8)
    for it, r in zip(task.items, rows, strict=True):
        assert it.answer == cands[r["yy"] // 10] and it.wrong == tuple(cands)
        assert len(it.clean) == len(it.corrupted) and it.clean[-2:] == tuple(cands[i] for i in (1, 7))


def test_a_tokenizer_without_digit_tokens_is_refused():
    from headscope.probes.models.inhouse.planted import planted_tokenizer

    with pytest.raises(ValueError, match="task greater_than: the tokenizer writes '...year 1732' as"):
        digit_mode(planted_tokenizer())


def test_ioi_logit_difference_on_smollm2(smollm, ioi_smollm):
    """Measured (24 items, seed 0): clean mean 4.76 (23 of 24 items positive), ABC-corrupted
    mean -0.53 (sd 1.80). Asserted: clean mean above 2 with at least 80% of items positive;
    the corrupted mean within 1.0 of zero and under a quarter of the clean mean in size."""
    clean, corrupted = _metric_values(smollm, ioi_smollm)
    assert clean.mean() > 2.0 and (clean > 0).float().mean() >= 0.8
    assert abs(corrupted.mean()) < 1.0 and abs(corrupted.mean()) < 0.25 * clean.mean()


def test_greater_than_sign_on_smollm2(smollm):
    """Measured (24 items, seed 0): clean mean 0.40 (20 of 24 items positive), 01-corrupted
    mean -0.71. Asserted: clean mean above 0.2, the corrupted mean below it by at least 0.5."""
    clean, corrupted = _metric_values(smollm, load_task(smollm, "greater_than", n_items=24))
    assert clean.mean() > 0.2 and clean.mean() - corrupted.mean() > 0.5


def _two_digit_tokenizer():
    """A word-level tokenizer that writes ``1732`` as ``17``, ``32`` (as GPT-2's BPE does)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from headscope.analyses.patching.greater_than import NOUNS

    words = ["[UNK]", "The", "lasted", "from", "the", "year", "to", *NOUNS, *(f"{d:02d}" for d in range(100))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(dict.fromkeys(words))}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"\d\d"), behavior="isolated")]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_a_two_digit_tokenizer_gets_the_papers_metric():
    tok = _two_digit_tokenizer()
    assert tok.convert_ids_to_tokens(tok("year 1732")["input_ids"]) == ["year", "17", "32"]
    metric, cands = digit_mode(tok)
    assert metric == "greater_than" and tok.convert_ids_to_tokens(cands) == [f"{d:02d}" for d in range(100)]
