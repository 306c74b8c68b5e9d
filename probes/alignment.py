"""Tokens ↔ words: which subword pieces make up which word.

Alignment works through character offsets, so it is the same for WordPiece (BERT) and
byte-level BPE (Llama/SmolLM2) and needs no tokenizer-specific rules: a token belongs
to the word its non-space characters overlap most. Special tokens ([CLS], [SEP], BOS)
belong to no word; a whitespace-only token (byte-level BPE's lone ``Ġ``) joins the word
it precedes.

>>> spans = word_spans_of(["The", "cat", "sat", "."])
>>> spans
[(0, 3), (4, 7), (8, 11), (12, 13)]
>>> align_offsets("The cat sat .", spans, [(0, 0), (0, 3), (3, 7), (7, 11), (11, 13), (0, 0)], [True, False, False, False, False, True])
[None, 0, 1, 2, 3, None]
"""

from __future__ import annotations

import re

import torch

WORD_RE = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]", re.UNICODE)


def split_words(text: str) -> list[tuple[int, int]]:
    """Character spans of the words of a plain ``text`` (runs of word characters, or single punctuation)."""
    return [m.span() for m in WORD_RE.finditer(text)]


def word_spans_of(words: list[str]) -> list[tuple[int, int]]:
    """Spans of ``words`` in ``" ".join(words)``."""
    spans, pos = [], 0
    for w in words:
        spans.append((pos, pos + len(w)))
        pos += len(w) + 1
    return spans


def align_offsets(
    text: str,
    spans: list[tuple[int, int]],
    offsets: list[tuple[int, int]],
    special: list[bool],
) -> list[int | None]:
    """Word index of each token (``None`` for special or whitespace-only tokens)."""
    word_ids: list[int | None] = []
    starts = [s for s, _ in spans]
    import bisect

    for (a, b), is_special in zip(offsets, special):
        if is_special or b <= a:
            word_ids.append(None)
            continue
        a0 = a
        # strip whitespace a BPE token carries (" cat" has offsets covering the space)
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if b <= a:
            # a whitespace-only token (BPE's lone "Ġ" before digits) joins the word it precedes
            j = bisect.bisect_left(starts, a0)
            word_ids.append(j if j < len(spans) else (len(spans) - 1 if spans else None))
            continue
        i = bisect.bisect_right(starts, a) - 1
        best, best_overlap = None, 0
        for j in range(max(i, 0), len(spans)):
            s, e = spans[j]
            if s >= b:
                break
            overlap = min(b, e) - max(a, s)
            if overlap > best_overlap:
                best, best_overlap = j, overlap
        word_ids.append(best)
    return word_ids


def word_matrices(word_ids: list[int | None], n_words: int, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooling matrices for word-level attention (Clark et al. 2019):

    * ``key_sum [n_words, n_pos]``: 1 where a token belongs to the word — attention *to*
      a word is the sum over its pieces;
    * ``query_mean [n_words, n_pos]``: 1/len(word) — attention *from* a word is the mean
      over its pieces.

    ``word_pattern = query_mean @ pattern @ key_sum.T`` is ``[..., n_words, n_words]``.
    """
    key_sum = torch.zeros(n_words, n_pos)
    for pos, w in enumerate(word_ids[:n_pos]):
        if w is not None:
            key_sum[w, pos] = 1.0
    counts = key_sum.sum(1, keepdim=True).clamp_min(1.0)
    return key_sum / counts, key_sum


def unaligned_words(word_ids: list[int | None], n_words: int) -> list[int]:
    """Words no token belongs to (e.g. made only of characters the tokenizer drops, such
    as a lone zero-width joiner). Analyses skip such items and count them."""
    seen = {w for w in word_ids if w is not None}
    return [w for w in range(n_words) if w not in seen]
