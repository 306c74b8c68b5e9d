"""Word alignment: subword tokens ↔ words, for WordPiece (MiniLM) and byte-level BPE
(SmolLM2), by character offsets; property-tested on random text."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headscope.probes.alignment import split_words, unaligned_words, word_matrices
from headscope.probes.models.checkpoints import hf_dir, load_tokenizer, resolve
from headscope.probes.tokens import display_token, encode, tokenize_one


@pytest.fixture(scope="module")
def tokenizers():
    return {
        "wordpiece": load_tokenizer(hf_dir(resolve("minilm-l6"))),
        "bpe": load_tokenizer(hf_dir(resolve("smollm2-135m"))),
    }


def test_wordpiece_pieces_belong_to_their_word(tokenizers):
    it = tokenize_one(tokenizers["wordpiece"], words=["Unbelievably", ",", "transformers", "prune", "heads", "."])
    assert it["tokens"][0] == "[CLS]" and it["tokens"][-1] == "[SEP]"
    assert it["word_ids"][0] is None and it["word_ids"][-1] is None
    pieces = [t for t, w in zip(it["tokens"], it["word_ids"]) if w == 0]
    assert len(pieces) >= 2 and "".join(p.removeprefix("##") for p in pieces) == "unbelievably"


def test_bpe_leading_space_goes_to_the_word(tokenizers):
    it = tokenize_one(tokenizers["bpe"], words=["The", "cat", "sat", "."])
    assert it["tokens"] == ["The", "Ġcat", "Ġsat", "Ġ."]
    assert it["word_ids"] == [0, 1, 2, 3]
    assert not any(it["special"])


def test_plain_text_words_follow_punctuation():
    text = "Heads, in short, can go."
    assert [text[a:b] for a, b in split_words(text)] == ["Heads", ",", "in", "short", ",", "can", "go", "."]


def test_word_matrices_sum_keys_and_average_queries():
    import torch

    query_mean, key_sum = word_matrices([None, 0, 0, 1, None], n_words=2, n_pos=5)
    assert key_sum.tolist() == [[0, 1, 1, 0, 0], [0, 0, 0, 1, 0]]
    assert query_mean.tolist() == [[0, 0.5, 0.5, 0, 0], [0, 0, 0, 1, 0]]
    pattern = torch.full((5, 5), 0.2)
    word = query_mean @ pattern @ key_sum.T
    assert torch.allclose(word, torch.tensor([[0.4, 0.2], [0.4, 0.2]]))


words_st = st.lists(
    st.text(
        alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S"), exclude_characters="\x00"),
        min_size=1,
        max_size=12,
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_alignment_round_trips_on_random_words(tokenizers, kind):
    tok = tokenizers[kind]

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(words_st)
    def check(words):
        it = tokenize_one(tok, words=words)
        missing = unaligned_words(it["word_ids"], len(words))
        # every word maps to >= 1 token (letters, digits, punctuation and symbols are never dropped)
        assert missing == [], (words, it["tokens"])
        # every non-special token maps to exactly one word, in order
        ids = [w for w, s in zip(it["word_ids"], it["special"]) if not s]
        assert all(w is not None for w in ids)
        assert ids == sorted(ids)

    check()


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_alignment_on_random_text_never_crashes(tokenizers, kind):
    tok = tokenizers[kind]

    @settings(max_examples=150, deadline=None)
    @given(st.text(min_size=1, max_size=80).filter(lambda s: s.strip()))
    def check(text):
        try:
            it = tokenize_one(tok, text=text)
        except ValueError as e:  # documented: empty after splitting
            assert "empty" in str(e)
            return
        n = len(it["words"])
        for w in it["word_ids"]:
            assert w is None or 0 <= w < n
        # words a tokenizer drops entirely (e.g. only combining marks / zero-width chars) are reported
        for w in unaligned_words(it["word_ids"], n):
            assert it["words"][w]

    check()


def test_encode_refuses_text_past_the_context(tokenizers):
    with pytest.raises(ValueError, match=r"text 0 has \d+ tokens; the model's context is 16"):
        encode(tokenizers["wordpiece"], ["word " * 40], max_positions=16)
    with pytest.raises(ValueError, match="empty input"):
        encode(tokenizers["wordpiece"], [])


def test_display_tokens_read_as_text(tokenizers):
    bpe, wp = tokenizers["bpe"], tokenizers["wordpiece"]
    toks = bpe.convert_ids_to_tokens(bpe("The cat's caf\u00e9 \u2603")["input_ids"])
    assert toks == ["The", "\u0120cat", "'s", "\u0120caf\u00c3\u00a9", "\u0120\u00e2", "\u013a", "\u0125"]
    # byte-level markers decoded; the three pieces of the snowman's bytes stay raw (they are not text alone)
    assert [display_token(bpe, t) for t in toks] == [
        "The",
        "cat",
        "'s",
        "caf\u00e9",
        "\u0120\u00e2",
        "\u013a",
        "\u0125",
    ]
    assert [display_token(wp, t) for t in ["[CLS]", "un", "##bel", "cafe"]] == ["[CLS]", "un", "##bel", "cafe"]
