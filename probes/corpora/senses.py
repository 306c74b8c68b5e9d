"""Sense sets: JSONL lines ``{"sentence": ..., "word": ... or "span": [start, end], "sense": ...}``
(optional ``"lemma"`` groups inflected forms under one word; default: the word lower-cased).

A line whose target is not in its sentence, or a word with a sense of fewer than 2
sentences, is reported as one warning line (file and line number) and that word is skipped
and counted in :attr:`SenseSet.skipped`; the other words are kept.

>>> from headscope.data import path
>>> s = read_senses(path("senses/it_senses.jsonl"))
>>> sorted(s.words()), s.skipped
(['ape', 'freddo'], {})
"""

from __future__ import annotations

import json
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from headscope.probes.errors import InputFileError


@dataclass(frozen=True)
class SenseItem:
    sentence: str
    start: int  # character span of the target in the sentence
    end: int
    sense: str
    lemma: str
    line: int


@dataclass
class SenseSet:
    items: list[SenseItem]
    path: str
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> words skipped

    def words(self) -> list[str]:
        return sorted({it.lemma for it in self.items})

    def by_word(self) -> dict[str, list[SenseItem]]:
        out: dict[str, list[SenseItem]] = defaultdict(list)
        for it in self.items:
            out[it.lemma].append(it)
        return dict(out)


def _find_word(sentence: str, word: str) -> int:
    """Start of ``word`` as a whole word in ``sentence`` (case-insensitive), -1 if absent."""
    low, w = sentence.lower(), word.lower()
    start = low.find(w)
    while start >= 0:
        before = start == 0 or not low[start - 1].isalnum()
        after = start + len(w) >= len(low) or not low[start + len(w)].isalnum()
        if before and after:
            return start
        start = low.find(w, start + 1)
    return -1


def _parse(obj: dict, where: str, n: int) -> SenseItem | str:
    """A :class:`SenseItem`, or the problem as a string."""
    sentence, sense = obj.get("sentence"), obj.get("sense")
    if not isinstance(sentence, str) or not sentence.strip() or not isinstance(sense, str):
        return "needs a 'sentence' and a 'sense' (strings)"
    if "span" in obj:
        span = obj["span"]
        if not (isinstance(span, list) and len(span) == 2 and 0 <= span[0] < span[1] <= len(sentence)):
            return f"span {span!r} is not a [start, end] inside the sentence of {len(sentence)} characters"
        start, end = span
        word = sentence[start:end]
    else:
        word = obj.get("word")
        if not isinstance(word, str) or not word:
            return "needs a 'word' or a 'span'"
        start = _find_word(sentence, word)
        if start < 0:
            return f"target {word!r} is not in its sentence {sentence!r}"
        end = start + len(word)
    lemma = obj.get("lemma") or word.lower()
    return SenseItem(sentence, start, end, sense, str(lemma), n)


def read_senses(path: str | Path, *, min_per_sense: int = 2) -> SenseSet:
    """Read a sense set (see the module doc). :class:`InputFileError` for a missing or empty
    file or a line that is not JSON; bad targets and thin senses skip their word with a warning."""
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"{p}: no such sense file (JSONL: sentence, word or span, sense)")
    items, bad_words = [], {}
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputFileError(f"{p}:{n}: not a JSON object ({e.msg})") from None
        got = _parse(obj, str(p), n) if isinstance(obj, dict) else "not a JSON object"
        if isinstance(got, str):
            word = (obj.get("lemma") or obj.get("word") or "?") if isinstance(obj, dict) else "?"
            warnings.warn(f"{p}:{n}: {got}; word {str(word).lower()!r} skipped", stacklevel=2)
            bad_words.setdefault(str(word).lower(), "target not in sentence")
            continue
        items.append(got)
    if not items and not bad_words:
        raise InputFileError(f"{p}: empty sense file")
    counts = Counter((it.lemma, it.sense) for it in items)
    for (lemma, sense), c in sorted(counts.items()):
        if c < min_per_sense and lemma not in bad_words:
            first = next(it.line for it in items if it.lemma == lemma and it.sense == sense)
            warnings.warn(
                f"{p}:{first}: sense {sense!r} of {lemma!r} has {c} sentence(s), fewer than {min_per_sense}; "
                f"word {lemma!r} skipped",
                stacklevel=2,
            )
            bad_words[lemma] = f"sense with fewer than {min_per_sense} sentences"
    keep = [it for it in items if it.lemma not in bad_words]
    one_sense = {w for w in {it.lemma for it in keep} if len({it.sense for it in keep if it.lemma == w}) < 2}
    for w in sorted(one_sense):
        warnings.warn(f"{p}: word {w!r} has one sense only; skipped", stacklevel=2)
        bad_words[w] = "one sense only"
    keep = [it for it in keep if it.lemma not in one_sense]
    return SenseSet(items=keep, path=str(p), skipped=dict(Counter(bad_words.values())))
