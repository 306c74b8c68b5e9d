"""Tokenised batches with the metadata analyses need.

:func:`encode` turns texts (or pre-split words) into a :class:`TokenBatch`: ids, padding
mask, token strings, character offsets, word ids and special-token flags.

>>> from transformers import AutoTokenizer  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from headscope.probes.alignment import align_offsets, split_words, word_spans_of
from headscope.probes.corpora.text import is_blank


@dataclass
class TokenBatch:
    """A padded batch. ``input_ids``/``attention_mask``: ``[batch, pos]``; per item:
    ``tokens``, ``offsets`` (char spans in ``texts[i]``), ``word_ids`` (word index or None),
    ``special`` (True for [CLS]/[SEP]/BOS/EOS), ``words``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    texts: list[str]
    words: list[list[str]]
    tokens: list[list[str]]
    offsets: list[list[tuple[int, int]]]
    word_ids: list[list[int | None]]
    special: list[list[bool]]
    lengths: list[int] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)

    def special_mask(self) -> torch.Tensor:
        """``[batch, pos]`` bool: True on special tokens (padding excluded)."""
        m = torch.zeros(self.input_ids.shape, dtype=torch.bool)
        for i, flags in enumerate(self.special):
            m[i, : len(flags)] = torch.tensor(flags, dtype=torch.bool)
        return m

    def select(self, rows: list[int]) -> TokenBatch:
        n = max(self.lengths[r] for r in rows)
        return TokenBatch(
            input_ids=self.input_ids[rows, :n],
            attention_mask=self.attention_mask[rows, :n],
            **{
                k: [getattr(self, k)[r] for r in rows]
                for k in ("texts", "words", "tokens", "offsets", "word_ids", "special", "lengths")
            },
        )


def encode_plain(tokenizer, text, **kwargs):
    """``tokenizer(text, **kwargs)`` reading ``text`` (a string or a list of them) as plain
    text: a special token's string typed in it (``"[MASK]"``, ``"<s>"``,
    ``"<|im_start|>"``) becomes ordinary pieces, never the special id
    (``split_special_tokens=True``, which transformers passes on to the tokenizers
    library's ``encode_special_tokens``). The specials the tokenizer adds itself
    (``add_special_tokens=True``: [CLS]/[SEP], a BOS) are added as before.

    >>> from headscope.probes.models.inhouse.planted import planted_tokenizer
    >>> tok = planted_tokenizer()
    >>> tok.convert_ids_to_tokens(tok("the [BOS] cat")["input_ids"])  # the literal read as the special
    ['[BOS]', 'the', '[BOS]', 'cat']
    >>> tok.convert_ids_to_tokens(encode_plain(tok, "the [BOS] cat")["input_ids"])  # '[', 'BOS', ']': not in the vocabulary
    ['[BOS]', 'the', '[UNK]', '[UNK]', '[UNK]', 'cat']
    """
    return tokenizer(text, split_special_tokens=True, **kwargs)


def tokenize_one(tokenizer, text: str | None = None, words: list[str] | None = None, add_bos: bool = False):
    """Tokenise one item; return a dict of ids, tokens, offsets, word ids, special flags.

    The text is read as plain text (:func:`encode_plain`). ``ValueError`` ("empty text")
    for a text that shows nothing (:func:`~headscope.probes.corpora.text.is_blank`:
    whitespace, zero-width and other invisible characters) or that the tokenizer turns
    into its own specials alone."""
    if words is not None:
        if not words or any((not isinstance(w, str)) or (not w) or any(c.isspace() for c in w) for w in words):
            raise ValueError(f"words must be a non-empty list of non-empty strings without spaces; got {words!r:.120}")
        text = " ".join(words)
        spans = word_spans_of(words)
    else:
        if not isinstance(text, str):
            raise TypeError(f"texts must be strings; got {type(text).__name__}")
        spans = split_words(text)
        words = [text[a:b] for a, b in spans]
    if is_blank(text):
        raise ValueError("empty text: nothing to tokenise (blank or invisible characters only)")
    enc = encode_plain(tokenizer, text, return_offsets_mapping=True, add_special_tokens=True)
    ids = list(enc["input_ids"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    special_ids = set(tokenizer.all_special_ids)
    special = [i in special_ids and (b - a == 0) for i, (a, b) in zip(ids, offsets)]
    if all(special):
        raise ValueError(f"empty text: the tokenizer keeps no token of {text!r:.60}, only its own special tokens")
    if add_bos and tokenizer.bos_token_id is not None and (not ids or ids[0] != tokenizer.bos_token_id):
        ids = [tokenizer.bos_token_id] + ids
        offsets = [(0, 0)] + offsets
        special = [True] + special
    word_ids = align_offsets(text, spans, offsets, special)
    return {
        "ids": ids,
        "text": text,
        "words": words,
        "tokens": tokenizer.convert_ids_to_tokens(ids),
        "offsets": offsets,
        "word_ids": word_ids,
        "special": special,
    }


def pad_id(tokenizer) -> int:
    """The id padding positions get: the tokenizer's pad token, or 0 for a tokenizer
    without one (Llama's). Padded positions are masked out of every attention, so the
    choice changes no figure; it only has to be a valid embedding row.

    >>> from types import SimpleNamespace
    >>> pad_id(SimpleNamespace(pad_token_id=None)), pad_id(SimpleNamespace(pad_token_id=7))
    (0, 7)
    """
    pad = tokenizer.pad_token_id
    return pad if pad is not None else 0


def collate(items: list[dict], pad: int) -> TokenBatch:
    """Right-pad tokenised items with the id ``pad`` into a :class:`TokenBatch`."""
    n = max(len(it["ids"]) for it in items)
    ids = torch.full((len(items), n), pad, dtype=torch.long)
    mask = torch.zeros((len(items), n), dtype=torch.long)
    for r, it in enumerate(items):
        ids[r, : len(it["ids"])] = torch.tensor(it["ids"], dtype=torch.long)
        mask[r, : len(it["ids"])] = 1
    return TokenBatch(
        input_ids=ids,
        attention_mask=mask,
        texts=[it["text"] for it in items],
        words=[it["words"] for it in items],
        tokens=[it["tokens"] for it in items],
        offsets=[it["offsets"] for it in items],
        word_ids=[it["word_ids"] for it in items],
        special=[it["special"] for it in items],
        lengths=[len(it["ids"]) for it in items],
    )


def encode(
    tokenizer,
    texts=None,
    words=None,
    *,
    max_positions: int | None = None,
    add_bos: bool = False,
    vocab_size: int | None = None,
) -> TokenBatch:
    """Texts (``list[str]``) or pre-split words (``list[list[str]]``) -> :class:`TokenBatch`.

    Raises ``ValueError`` on empty input, on an item longer than ``max_positions``
    (naming the item, its length and the limit) and on a token id the model has no
    embedding for (``>= vocab_size``).
    """
    if (texts is None) == (words is None):
        raise TypeError("pass exactly one of texts= or words=")
    seq = texts if texts is not None else words
    if isinstance(seq, str):
        seq = [seq] if texts is not None else seq
    if not seq:
        raise ValueError("empty input: no texts to encode")
    items = tokenize_items(
        tokenizer, seq, words=texts is None, max_positions=max_positions, add_bos=add_bos, vocab_size=vocab_size
    )
    return collate(items, pad_id(tokenizer))


def tokenize_items(
    tokenizer,
    seq,
    *,
    words: bool = False,
    max_positions: int | None = None,
    add_bos: bool = False,
    vocab_size: int | None = None,
    what: str = "text",
) -> list[dict]:
    """:func:`tokenize_one` of every text (or word list, ``words=True``) of ``seq``, checked:
    ``ValueError`` naming the ``what`` and its index for one longer than ``max_positions``
    or with a token id ``>= vocab_size``."""
    items = []
    for i, x in enumerate(seq):
        it = (
            tokenize_one(tokenizer, words=list(x), add_bos=add_bos)
            if words
            else tokenize_one(tokenizer, text=x, add_bos=add_bos)
        )
        if max_positions is not None and len(it["ids"]) > max_positions:
            raise ValueError(
                f"{what} {i} has {len(it['ids'])} tokens; the model's context is {max_positions}. Shorten or split it."
            )
        if vocab_size is not None and it["ids"] and max(it["ids"]) >= vocab_size:
            j = max(range(len(it["ids"])), key=it["ids"].__getitem__)
            raise ValueError(
                f"{what} {i}: token {it['tokens'][j]!r} has id {it['ids'][j]}, past the model's vocabulary of "
                f"{vocab_size} (the tokenizer does not belong to this model); load the model's own tokenizer"
            )
        items.append(it)
    return items


def display_token(tokenizer, token: str) -> str:
    """A token as a person reads it: byte-level BPE markers decoded (``"Ġcat"`` ->
    ``"cat"``, ``"ĠcafÃ©"`` -> ``"café"``), surrounding spaces stripped. A token that is
    only part of a character's bytes (it would decode to U+FFFD) is kept as it is, and
    so is a WordPiece token (``"##ing"`` keeps its continuation mark).
    """
    try:
        text = tokenizer.convert_tokens_to_string([token])
    except Exception:  # a tokenizer without that method, or a token it cannot map
        return token
    if "\ufffd" in text or not text.strip():
        return token
    return text.strip() if not token.startswith("##") else token
