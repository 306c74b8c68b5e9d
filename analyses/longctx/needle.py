"""A needle-in-a-haystack copy task built from the project's own text (no external data).

An item is one teacher-forced token sequence::

    [BOS] haystack[:d] <prefix> needle <suffix> haystack[d:] <prefix> answer

The haystack is the sentences of a project corpus (:func:`~headscope.analyses.roles.long_inputs.corpus_lines`:
the seeded bench grammar, the shipped text or a user's file), each encoded on its own and
joined, cut to the length the item needs. The needle is ``needle_len`` tokens of words
that the bench grammar never uses (:data:`NEEDLE_WORDS`, drawn without repeating a word),
planted after the sentence boundary nearest ``depth`` and introduced by :data:`PREFIX`
(``" The secret words are"``). At the end the same prefix is the cue and the needle comes
again as the answer: ``answer[i]`` holds the token of ``needle[i]``. A model copies at
answer token ``i`` when its argmax at ``answer[i] - 1`` is that token (:func:`copy_hits`);
Wu et al.'s retrieval head is one whose top-1 key at query ``answer[i] - 1`` is
``needle[i]`` there.

Everything is built from token ids, so nothing depends on how the pieces re-tokenise when
joined; the item has exactly ``n_tokens`` tokens.

>>> from headscope.probes.models.inhouse.planted_long import planted_long_model
>>> m = planted_long_model()
>>> item = needle_items(m.tokenizer, 200, 1, needle_len=4)[0]
>>> len(item.input_ids), [item.input_ids[a] == item.input_ids[n] for a, n in zip(item.answer, item.needle)]
(200, [True, True, True, True])
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from headscope.analyses.roles.long_inputs import MAX_LONG_TOKENS, LongInputError, corpus_lines
from headscope.probes.corpora.needle_words import NEEDLE_WORDS, PREFIX, SUFFIX

__all__ = [
    "NEEDLE_WORDS",
    "PREFIX",
    "NeedleItem",
    "copy_accuracy",
    "copy_hits",
    "item_logits",
    "needle_items",
]


@dataclass(frozen=True)
class NeedleItem:
    """One teacher-forced copy item (positions index ``input_ids``)."""

    input_ids: list[int]  # haystack with the needle inside, then a cue, then the needle again (the answer)
    needle: list[int]  # positions of the needle's tokens inside the haystack
    answer: list[int]  # positions of the answer tokens; answer[i] holds the same token as needle[i]
    depth: float  # where the needle sits, 0..1 of the haystack
    cue: list[int] | None = None  # positions of the cue (the prefix before the answer)


def _ids(tokenizer, text: str) -> list[int]:
    from headscope.probes.tokens import encode_plain

    return list(encode_plain(tokenizer, text, add_special_tokens=False)["input_ids"])


def _leading_specials(tokenizer, bos: bool | None) -> list[int]:
    """The ids in front of every item: the tokenizer's own leading specials (``bos=None``:
    what ``add_special_tokens=True`` puts before the text), its BOS (``True``) or none."""
    if bos is False:
        return []
    if bos is True:
        if tokenizer.bos_token_id is None:
            raise LongInputError("bos=True: the tokenizer has no BOS token")
        return [int(tokenizer.bos_token_id)]
    from headscope.probes.tokens import encode_plain

    plain = _ids(tokenizer, PREFIX)
    ids = list(encode_plain(tokenizer, PREFIX, add_special_tokens=True)["input_ids"])
    for i in range(len(ids) - len(plain) + 1):
        if ids[i : i + len(plain)] == plain:
            return [int(t) for t in ids[:i]]
    return []


def _needle_ids(tokenizer, rng: random.Random, needle_len: int) -> list[int]:
    """``needle_len`` ids of words from :data:`NEEDLE_WORDS` (no word twice, the
    tokenizer's unknown token never), the last word cut where it runs past."""
    unk = getattr(tokenizer, "unk_token_id", None)
    words = list(NEEDLE_WORDS)
    rng.shuffle(words)
    out: list[int] = []
    for w in words:
        ids = _ids(tokenizer, " " + w)
        if not ids or (unk is not None and unk in ids):
            continue
        out += ids
        if len(out) >= needle_len:
            return out[:needle_len]
    raise LongInputError(f"the needle words give {len(out)} tokens; needle_len {needle_len} needs more")


def _haystack(tokenizer, lines: list[str], n: int, cache: dict) -> tuple[list[int], list[int]]:
    """``n`` ids of ``lines`` (each encoded with a leading space, repeated in order), and the
    sentence boundaries (positions where a sentence starts, 0 and ``n`` included)."""
    ids, bounds, i = [], [0], 0
    while len(ids) < n:
        line = lines[i % len(lines)].strip()
        i += 1
        if not line:
            continue
        if line not in cache:
            cache[line] = _ids(tokenizer, " " + line)
        ids += cache[line]
        bounds.append(min(len(ids), n))
    return ids[:n], sorted(set(bounds))


def needle_items(
    tokenizer,
    n_tokens: int,
    n_items: int,
    *,
    seed: int = 0,
    needle_len: int = 8,
    corpus: str | Path = "generated",
    bos: bool | None = None,
) -> list[NeedleItem]:
    """``n_items`` items of exactly ``n_tokens`` tokens, needles at depths spread evenly
    ((i + 0.5) / n_items, moved to the nearest sentence boundary), haystacks of ``corpus``
    seeded by ``seed`` (``"generated"``: a different set of sentences per item). ``bos``:
    None puts the tokenizer's own leading specials first, True its BOS, False nothing (the
    sink study's case). Raises :class:`LongInputError` for lengths that leave no haystack
    or go past ``MAX_LONG_TOKENS``, ``n_items < 1``, ``needle_len < 1``."""
    for name, v, lo in (("n_tokens", n_tokens, 8), ("n_items", n_items, 1), ("needle_len", needle_len, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise LongInputError(f"needle_items: {name} must be an int >= {lo}; got {v!r}")
    if n_tokens > MAX_LONG_TOKENS:
        raise LongInputError(f"needle_items: n_tokens must be <= {MAX_LONG_TOKENS}; got {n_tokens}")
    rng = random.Random(seed)
    head = _leading_specials(tokenizer, bos)
    prefix, suffix = _ids(tokenizer, PREFIX), _ids(tokenizer, SUFFIX)
    fixed = len(head) + 2 * len(prefix) + len(suffix) + 2 * needle_len
    hay_len = n_tokens - fixed
    if hay_len < 4:
        raise LongInputError(f"needle_items: {n_tokens} tokens leave no haystack (the needle and cue take {fixed})")
    cache: dict = {}
    shipped_lines = None if corpus == "generated" else corpus_lines(corpus, seed)
    items = []
    for i in range(n_items):
        lines = shipped_lines if shipped_lines is not None else corpus_lines("generated", seed * 1000 + i)
        hay, bounds = _haystack(tokenizer, lines, hay_len, cache)
        target = (i + 0.5) / n_items * hay_len
        at = min(bounds, key=lambda b: (abs(b - target), b))
        needle = _needle_ids(tokenizer, rng, needle_len)
        before = head + hay[:at] + prefix
        ids = before + needle + suffix + hay[at:]
        cue_at = len(ids)
        ids += prefix
        ans_at = len(ids)
        ids += needle
        items.append(
            NeedleItem(
                input_ids=ids,
                needle=list(range(len(before), len(before) + needle_len)),
                answer=list(range(ans_at, ans_at + needle_len)),
                depth=at / hay_len,
                cue=list(range(cue_at, ans_at)),
            )
        )
    return items


def copy_hits(logits: torch.Tensor, item: NeedleItem) -> torch.Tensor:
    """``bool [len(answer)]``: the argmax at ``answer[i] - 1`` is ``input_ids[answer[i]]``.
    ``logits``: ``[pos, vocab]`` of the whole item (a leading batch of 1 allowed), or only
    the rows ``answer[i] - 1`` (``[len(answer), vocab]``, as :func:`item_logits` returns).
    Raises ``ValueError`` for any other shape."""
    if logits.dim() == 3 and logits.shape[0] == 1:
        logits = logits[0]
    n, k = len(item.input_ids), len(item.answer)
    if logits.dim() != 2 or logits.shape[0] not in (n, k):
        raise ValueError(f"logits must be [pos={n} or answers={k}, vocab]; got shape {tuple(logits.shape)}")
    rows = logits if logits.shape[0] == k else logits[[a - 1 for a in item.answer]]
    target = torch.tensor([item.input_ids[a] for a in item.answer], device=rows.device)
    return rows.argmax(-1) == target


def copy_accuracy(logits_list, items) -> float:
    """The share of answer tokens copied over all ``items`` (pooled, every item's answer
    tokens counted alike). Raises ``ValueError`` for lists of different lengths or no item."""
    logits_list, items = list(logits_list), list(items)
    if len(logits_list) != len(items) or not items:
        raise ValueError(f"need one logits per item, at least one; got {len(logits_list)} and {len(items)}")
    hits = torch.cat([copy_hits(lg, it).cpu() for lg, it in zip(logits_list, items)])
    return float(hits.float().mean())


def item_logits(model, item: NeedleItem) -> torch.Tensor:
    """The logits ``[len(answer), vocab]`` at rows ``answer[i] - 1`` of one forward of
    ``item`` (batch 1, no padding; only those rows unembedded where the backend allows).
    Inside a caller's gates or head hooks, so a masked model is measured the same way."""
    from headscope.probes.models.backends.protocol import rows_unembedded

    ids = torch.tensor([item.input_ids], dtype=torch.long)
    mask = torch.ones_like(ids)
    rows = [a - 1 for a in item.answer]
    with torch.inference_mode():
        if rows_unembedded(model):
            keep = torch.zeros_like(ids, dtype=torch.bool)
            keep[0, rows] = True
            with model.unembed_at(keep):
                return model.forward(ids, mask).float()
        return model.forward(ids, mask)[0, rows].float()
