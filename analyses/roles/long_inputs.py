"""Long inputs for the token roles: texts of a given number of tokens (1k to 8k) from the
project's own corpora, or a user's long text cut to ``max_tokens``.

:func:`long_text` joins the sentences of a corpus (the generated grammar of
:mod:`~headscope.probes.corpora.bench_sentences`, seeded; the shipped
``data/text/sentences.txt``; or the lines of a text file), repeated in order where the
corpus is shorter, until the text holds ``n_tokens`` tokens, and cuts it at a token boundary
(the end of token ``n_tokens``, special tokens counted), so it tokenises back to at most
``n_tokens`` tokens. :func:`token_limit` says how many tokens a model may take: its
``max_position_embeddings`` (the sliding windows limit only what a query sees, not the length).

>>> from transformers import AutoTokenizer  # doctest: +SKIP
>>> len(long_text(AutoTokenizer.from_pretrained("gpt2"), 1024, corpus="generated"))  # doctest: +SKIP
4817
"""

from __future__ import annotations

from pathlib import Path

from headscope.probes.errors import HeadscopeError

#: the shortest and longest texts :func:`long_text` builds, tokens
MIN_LONG_TOKENS, MAX_LONG_TOKENS = 8, 65536


class LongInputError(HeadscopeError, ValueError):
    """A long input that cannot be built: a length past the model's context, an empty corpus."""


def token_limit(model) -> int:
    """The most tokens one item of ``model`` may hold: its context (``spec.max_positions``)."""
    return int(model.spec.max_positions)


def sliding_windows(model) -> list[int]:
    """The sliding windows of ``model``'s layers, smallest first (in-house models; [] for a
    model without, or one whose backend does not say)."""
    from headscope.probes.chunked import sliding_windows as windows

    return windows(model)


def _count(tokenizer, text: str) -> tuple[int, list]:
    from headscope.probes.tokens import encode_plain

    enc = encode_plain(tokenizer, text, return_offsets_mapping=True, add_special_tokens=True)
    return len(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def corpus_lines(corpus: str | Path, seed: int = 0, n: int = 400) -> list[str]:
    """Sentences to build long texts from: ``"generated"`` (``n`` seeded sentences of the bench
    grammar), ``"shipped"`` (``data/text/sentences.txt``) or a text file's non-blank lines."""
    from headscope.probes.corpora.bench_sentences import corpus_sentences, generate_sentences

    if corpus == "generated":
        return generate_sentences(n, seed=seed)
    lines = corpus_sentences(str(corpus), n, seed=seed)
    if not lines:
        raise LongInputError(f"{corpus}: no non-blank line to build a long text from")
    return lines


def long_text(tokenizer, n_tokens: int, *, corpus: str | Path = "generated", seed: int = 0, lines=None) -> str:
    """A text of at most ``n_tokens`` tokens (special tokens counted), at least ``n_tokens - 1``
    where the corpus is long enough after repeating: the corpus's sentences (``lines`` when
    given) joined by spaces, repeated in order, cut after token ``n_tokens``'s last character.
    Raises :class:`LongInputError` for ``n_tokens`` outside :data:`MIN_LONG_TOKENS`..:data:`MAX_LONG_TOKENS`."""
    if (
        isinstance(n_tokens, bool)
        or not isinstance(n_tokens, int)
        or not MIN_LONG_TOKENS <= n_tokens <= MAX_LONG_TOKENS
    ):
        raise LongInputError(f"a long text needs {MIN_LONG_TOKENS} to {MAX_LONG_TOKENS} tokens; got {n_tokens!r}")
    lines = list(lines) if lines is not None else corpus_lines(corpus, seed)
    if not any(l.strip() for l in lines):
        raise LongInputError("no non-blank line to build a long text from")
    parts, text, i = [], "", 0
    n, offsets = 0, []
    while n <= n_tokens:  # one token past the cut, so the cut falls inside the text
        grow = max(1, (n_tokens - n) // 16)  # about 16 tokens a sentence: few re-tokenisations
        for _ in range(grow):
            parts.append(lines[i % len(lines)].strip())
            i += 1
        text = " ".join(p for p in parts if p)
        n, offsets = _count(tokenizer, text)
        if i > 64 * (n_tokens + len(lines)):
            raise LongInputError(f"the corpus's lines do not add up to {n_tokens} tokens")
    return cut_to_tokens(tokenizer, text, n_tokens, offsets)


def cut_to_tokens(tokenizer, text: str, max_tokens: int, offsets=None) -> str:
    """``text`` cut after the last character of its ``max_tokens``-th token (special tokens
    counted, a trailing special token such as ``[SEP]`` left room), as is when it is shorter;
    the cut text tokenises back to at most ``max_tokens`` tokens."""
    if offsets is None:
        n, offsets = _count(tokenizer, text)
        if n <= max_tokens:
            return text
    n = len(offsets)
    trailing = sum(1 for a, b in reversed(offsets) if a == b == 0 and n > 1) if offsets else 0
    keep = max(1, max_tokens - trailing)
    ends = [b for a, b in offsets[:keep] if b > a]
    cut = text[: ends[-1]] if ends else ""
    while _count(tokenizer, cut)[0] > max_tokens and " " in cut:  # merges across the cut: shorten by a word
        cut = cut.rsplit(" ", 1)[0]
    return cut


def passages(tokenizer, lines, max_tokens: int) -> tuple[list[str], list[int], int]:
    """Consecutive ``lines`` joined by spaces into passages of at most ``max_tokens`` tokens
    (special tokens counted): a passage closes before the line that would take it past
    ``max_tokens``; a line longer than that alone is cut at a token boundary
    (:func:`cut_to_tokens`). Returns ``(passages, first line index of each, lines cut)``:
    every line is in one passage, whole or cut (the count says how many were cut)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < MIN_LONG_TOKENS:
        raise LongInputError(f"--max-tokens must be an integer >= {MIN_LONG_TOKENS}; got {max_tokens!r}")
    out, starts, cut = [], [], 0
    cur, cur_start = "", 0
    for i, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        joined = f"{cur} {line}" if cur else line
        if _count(tokenizer, joined)[0] <= max_tokens:
            cur, cur_start = joined, (cur_start if cur else i)
            continue
        if cur:
            out.append(cur)
            starts.append(cur_start)
        if _count(tokenizer, line)[0] > max_tokens:
            line = cut_to_tokens(tokenizer, line, max_tokens)
            cut += 1
        cur, cur_start = line, i
    if cur:
        out.append(cur)
        starts.append(cur_start)
    return out, starts, cut
