"""The sentences the benches run on: a seeded word-list grammar, the shipped text, or a file.

:func:`generate_sentences` builds English-like sentences of ``min_words``..``max_words``
words (uniform length) from a fixed word list: clauses of ``det (adj) noun verb det (adj)
noun``, sometimes a prepositional phrase and an adverb, joined by conjunctions until the
sentence has its length. No trees, no gold labels: a corpus whose only job is to have
realistic token lengths for timing and memory runs (``headscope bench``, its ``--memory``
mode, the GPU bench). :func:`corpus_sentences` picks between it, the shipped
``data/text/sentences.txt`` and a text file.

>>> sents = generate_sentences(3, seed=0)
>>> [12 <= len(s.split()) <= 40 for s in sents], sents == generate_sentences(3, seed=0)
([True, True, True], True)
"""

from __future__ import annotations

import random
from pathlib import Path

__all__ = ["WORDS", "corpus_sentences", "generate_sentences"]

#: the word list, by part of speech
WORDS: dict[str, list[str]] = {
    "det": "the a this that every some one another".split(),
    "adj": (
        "old small quiet bright heavy careful narrow early green wooden tired curious distant busy "
        "sudden gentle broken famous local simple"
    ).split(),
    "noun": (
        "cat teacher river engineer garden letter window village doctor bridge student kitchen "
        "market painter forest train museum sister question island farmer lamp story judge "
        "harbour child table mountain song"
    ).split(),
    "verb": (
        "saw carried found painted opened followed watched repaired described visited admired "
        "moved called noticed wrote built crossed remembered"
    ).split(),
    "prep": "near behind under across beside after before without inside towards".split(),
    "conj": "because while although when and but so".split(),
    "adv": "slowly quickly quietly again yesterday carefully often finally".split(),
}


def _phrase(rng: random.Random) -> list[str]:
    out = [rng.choice(WORDS["det"])]
    if rng.random() < 0.6:
        out.append(rng.choice(WORDS["adj"]))
    out.append(rng.choice(WORDS["noun"]))
    return out


def _clause(rng: random.Random) -> list[str]:
    words = _phrase(rng) + [rng.choice(WORDS["verb"])] + _phrase(rng)
    if rng.random() < 0.5:
        words += [rng.choice(WORDS["prep"])] + _phrase(rng)
    if rng.random() < 0.3:
        words.append(rng.choice(WORDS["adv"]))
    return words


def generate_sentences(n: int, *, seed: int = 0, min_words: int = 12, max_words: int = 40) -> list[str]:
    """``n`` English-like sentences of ``min_words``..``max_words`` words (uniform length),
    built from :data:`WORDS` with ``random.Random(seed)``: same seed, same sentences.
    Raises ``ValueError`` for ``n < 1`` or ``not 1 <= min_words <= max_words``.

    >>> generate_sentences(1, seed=0, min_words=3, max_words=3)
    ['One broken train.']
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int; got {n!r}")
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words; got {min_words}, {max_words}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target = rng.randint(min_words, max_words)
        words = _clause(rng)
        while len(words) < target:
            words += [rng.choice(WORDS["conj"])] + _clause(rng)
        words = words[:target]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + ".")
    return out


def corpus_sentences(corpus: str, n: int, seed: int = 0) -> list[str]:
    """``n`` sentences of ``corpus``: ``"generated"``: :func:`generate_sentences`;
    ``"shipped"``: ``data/text/sentences.txt``; else a text file path. File lines are
    repeated in order until there are ``n``. Raises ``ValueError`` for a file with no
    non-blank line (and the text reader's :class:`~headscope.probes.errors.InputFileError`
    for a missing or unreadable one)."""
    if corpus == "generated":
        return generate_sentences(n, seed=seed)
    if corpus == "shipped":
        from headscope.data import path

        p = path("text/sentences.txt")
    else:
        p = Path(corpus)
    from headscope.probes.corpora.text import read_text

    lines = list(read_text(p).lines)
    if not lines:
        raise ValueError(f"{p}: no non-blank lines to benchmark on")
    return [lines[i % len(lines)] for i in range(n)]
