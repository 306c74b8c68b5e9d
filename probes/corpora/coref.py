"""Coreference probe items in JSONL: which candidate does the pronoun refer to?

One JSON object per line::

    {"words": ["Mary", "met", "John", "and", "she", "smiled", "."], "pronoun": 4,
     "candidates": [[0, 1], [2, 3]], "antecedent": 0, "id": "g1", "pair": "g2", "kind": "gender"}

Spans are ``[start, end)`` word indices. A candidate's head word is its last word
unless ``"heads"`` gives one absolute word index per candidate. ``"id"``, ``"pair"``
(the id of a minimal-pair partner) and ``"kind"`` are optional strings.

Errors against the format raise; items that are well-typed but unusable are skipped
and recorded by line and reason (``strict=True`` raises on the first instead):

=====================  ===================================================================
raised                 undecodable bytes, invalid JSON (line and column of the JSON
                       error), a line that is not an object, a missing key, a value of
                       the wrong type (column of the key)
skipped (reason key)   ``no_words``, ``empty_word``, ``space_in_word`` (words are aligned to
                       tokens at spaces), ``pronoun_out_of_range``, ``no_candidates``,
                       ``empty_span``, ``span_out_of_range``, ``span_overlaps_pronoun``,
                       ``overlapping_candidates`` (two candidates sharing a word, hence
                       possibly a head word, cannot be told apart),
                       ``antecedent_out_of_range``, ``heads_length``, ``head_outside_span``
=====================  ===================================================================

Blank lines are ignored. A file that yields no usable item raises, with the skip counts
and the first skipped line's reason.

>>> import json, pathlib, tempfile
>>> p = pathlib.Path(tempfile.mkdtemp()) / "c.jsonl"
>>> good = {"words": ["Mary", "met", "John", "and", "she", "smiled", "."], "pronoun": 4,
...         "candidates": [[0, 1], [2, 3]], "antecedent": 0}
>>> bad = dict(good, pronoun=9)
>>> _ = p.write_text(json.dumps(good) + "\\n" + json.dumps(bad) + "\\n")
>>> cs = read_coref(p)
>>> cs.items[0].heads, cs.items[0].antecedent_head, cs.skipped.entries
((0, 2), 0, ((2, 'pronoun_out_of_range'),))
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from headscope.probes.corpora.text import SkipRecord, check_input_path, iter_lines
from headscope.probes.errors import InputFileError

__all__ = ["CorefItem", "CorefSet", "read_coref", "item_problem", "baseline_choice"]

_MAX_LINE_CHARS = 1_000_000


def item_problem(words, pronoun: int, candidates, antecedent: int, heads=None) -> tuple[str, str] | None:
    """``(reason, explanation)`` if the item is unusable, else None (see module doc for reasons).

    >>> item_problem(["a", "b", "it"], 2, [(0, 1), (1, 3)], 0)
    ('span_overlaps_pronoun', 'candidate 1 span [1, 3) contains the pronoun (word 2)')
    """
    n = len(words)
    if n == 0:
        return "no_words", "words is empty"
    for i, w in enumerate(words):
        if not w:
            return "empty_word", f"word {i} is an empty string; drop it or give it a form"
        if any(c.isspace() for c in w):
            return "space_in_word", (
                f"word {i} {w[:40]!r} contains a space; words are aligned to tokens at spaces, "
                "so give it as separate words"
            )
    if not 0 <= pronoun < n:
        return "pronoun_out_of_range", f"pronoun index {pronoun} is outside the {n} words"
    if not candidates:
        return "no_candidates", "candidates is empty"
    for k, (start, end) in enumerate(candidates):
        if end <= start:
            return "empty_span", f"candidate {k} span [{start}, {end}) is empty"
        if start < 0 or end > n:
            return "span_out_of_range", f"candidate {k} span [{start}, {end}) is outside the {n} words"
        if start <= pronoun < end:
            return "span_overlaps_pronoun", f"candidate {k} span [{start}, {end}) contains the pronoun (word {pronoun})"
    overlap = _overlapping_pair(candidates)
    if overlap is not None:
        j, k = overlap
        return "overlapping_candidates", (
            f"candidates {j} [{candidates[j][0]}, {candidates[j][1]}) and {k} [{candidates[k][0]}, {candidates[k][1]}) "
            "overlap; candidate spans must not share words (two candidates with one head word cannot be told apart)"
        )
    if not 0 <= antecedent < len(candidates):
        return "antecedent_out_of_range", f"antecedent {antecedent} is not one of the {len(candidates)} candidates"
    if heads is not None:
        if len(heads) != len(candidates):
            return "heads_length", f"{len(heads)} heads given for {len(candidates)} candidates"
        for k, ((start, end), h) in enumerate(zip(candidates, heads)):
            if not start <= h < end:
                return "head_outside_span", f"head {h} of candidate {k} is outside its span [{start}, {end})"
    return None


def _overlapping_pair(candidates) -> tuple[int, int] | None:
    """Indices ``(j, k)``, ``j < k``, of two candidate spans that share a word, or None.

    Linear after sorting, so a line with many candidates stays cheap.

    >>> _overlapping_pair([(0, 3), (4, 5), (2, 3)]), _overlapping_pair([(0, 1), (1, 2)])
    ((0, 2), None)
    """
    order = sorted(range(len(candidates)), key=lambda k: (candidates[k][0], candidates[k][1], k))
    widest = None  # the span seen so far that reaches furthest right
    for k in order:
        if widest is not None and candidates[k][0] < candidates[widest][1]:
            return min(widest, k), max(widest, k)
        if widest is None or candidates[k][1] > candidates[widest][1]:
            widest = k
    return None


@dataclass(frozen=True, kw_only=True)
class CorefItem:
    """One pronoun, its candidate antecedents, and the gold one.

    ``candidates`` are ``(start, end)`` end-exclusive word spans; ``heads`` holds the
    resolved head word of each candidate (its last word unless given); ``antecedent``
    indexes ``candidates``. Construction raises ``ValueError`` for an unusable item.
    """

    words: tuple[str, ...] = ()
    pronoun: int = 0
    candidates: tuple[tuple[int, int], ...] = ()
    antecedent: int = 0
    heads: tuple[int, ...] = ()
    id: str | None = None
    pair: str | None = None
    kind: str | None = None
    source_line: int = 0

    def __post_init__(self) -> None:
        heads = self.heads or tuple(end - 1 for _, end in self.candidates)
        object.__setattr__(self, "heads", heads)
        problem = item_problem(self.words, self.pronoun, self.candidates, self.antecedent, heads)
        if problem is not None:
            raise ValueError(f"CorefItem {self.id or ''} is unusable ({problem[0]}): {problem[1]}")

    @property
    def antecedent_span(self) -> tuple[int, int]:
        """``(start, end)`` of the gold antecedent."""
        return self.candidates[self.antecedent]

    @property
    def antecedent_head(self) -> int:
        """Word index of the gold antecedent's head."""
        return self.heads[self.antecedent]


@dataclass(frozen=True, kw_only=True)
class CorefSet:
    """Items read from a coreference JSONL file, and the lines skipped."""

    items: tuple[CorefItem, ...] = ()
    skipped: SkipRecord = SkipRecord()
    path: str | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[CorefItem]:
        return iter(self.items)


def baseline_choice(item: CorefItem, rule: str) -> int:
    """Candidate index a heuristic picks: ``"first"`` or ``"nearest"`` (head closest to
    the pronoun; ties go to the earlier candidate).

    >>> it = CorefItem(words=("Mary", "met", "John", "and", "she", "smiled"), pronoun=4,
    ...                candidates=((0, 1), (2, 3)), antecedent=0)
    >>> baseline_choice(it, "first"), baseline_choice(it, "nearest")
    (0, 1)
    """
    if rule == "first":
        return 0
    if rule == "nearest":
        return min(range(len(item.heads)), key=lambda k: (abs(item.heads[k] - item.pronoun), k))
    raise ValueError(f"rule must be one of 'first', 'nearest'; got {rule!r}")


def _type_error(p: Path, line_no: int, text: str, key: str, rule: str, value) -> InputFileError:
    col = text.find(f'"{key}"') + 1 or 1
    return InputFileError(p, line_no, col, f"{key!r} must be {rule}; got {json.dumps(value)[:60]}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_line(p: Path, line_no: int, text: str) -> dict:
    """Decode and type-check one JSONL line; returns the fields for :class:`CorefItem`."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputFileError(
            p, line_no, err.colno, f"invalid JSON ({err.msg}); each line must be one JSON object"
        ) from None
    except ValueError as err:  # e.g. an integer literal too long to convert
        raise InputFileError(p, line_no, 1, f"invalid JSON value ({err}); each line must be one JSON object") from None
    except RecursionError:
        raise InputFileError(p, line_no, 1, "JSON nested too deeply; each line must be one flat JSON object") from None
    if not isinstance(obj, dict):
        raise InputFileError(p, line_no, 1, f"each line must be a JSON object; got a {type(obj).__name__}")
    for key in ("words", "pronoun", "candidates", "antecedent"):
        if key not in obj:
            raise InputFileError(
                p, line_no, 1, f"missing key {key!r}; an item needs words, pronoun, candidates, antecedent"
            )
    words, candidates, heads = obj["words"], obj["candidates"], obj.get("heads")
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise _type_error(p, line_no, text, "words", "a list of strings", words)
    for key in ("pronoun", "antecedent"):
        if not _is_int(obj[key]):
            raise _type_error(p, line_no, text, key, "an integer", obj[key])
    if not isinstance(candidates, list) or not all(
        isinstance(c, list) and len(c) == 2 and all(map(_is_int, c)) for c in candidates
    ):
        raise _type_error(p, line_no, text, "candidates", "a list of [start, end] integer pairs", candidates)
    if heads is not None and (not isinstance(heads, list) or not all(map(_is_int, heads))):
        raise _type_error(p, line_no, text, "heads", "a list of integers (one word index per candidate)", heads)
    for key in ("id", "pair", "kind"):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise _type_error(p, line_no, text, key, "a string", obj[key])
    return dict(
        words=tuple(words),
        pronoun=obj["pronoun"],
        candidates=tuple(tuple(c) for c in candidates),
        antecedent=obj["antecedent"],
        heads=None if heads is None else tuple(heads),
        id=obj.get("id"),
        pair=obj.get("pair"),
        kind=obj.get("kind"),
        source_line=line_no,
    )


def read_coref(path: str | Path, *, strict: bool = False) -> CorefSet:
    """Read a coreference JSONL file into a :class:`CorefSet`.

    Raises :class:`InputFileError` for format errors (see module doc), a missing path,
    a directory, an empty file or a file with no usable item (blank lines only, or every
    item skipped: the message gives the counts and the first skip's reason); with
    ``strict=True`` also for the first unusable item.
    """
    p = check_input_path(path, expected="one coreference item (JSON object) per line")
    items: list[CorefItem] = []
    skips: list[tuple[int, str]] = []
    first_problem = None
    for line_no, text in iter_lines(p, max_line_chars=_MAX_LINE_CHARS):
        if text is None:
            raise InputFileError(
                p, line_no, 1, f"line is longer than {_MAX_LINE_CHARS} characters; is this the right file?"
            )
        if not text.strip():
            continue
        fields = _parse_line(p, line_no, text)
        problem = item_problem(
            fields["words"], fields["pronoun"], fields["candidates"], fields["antecedent"], fields["heads"]
        )
        if problem is not None:
            if strict:
                raise InputFileError(
                    p,
                    line_no,
                    1,
                    f"unusable item ({problem[0]}): {problem[1]}; fix it or read with strict=False to skip it",
                )
            skips.append((line_no, problem[0]))
            first_problem = first_problem or (line_no, problem[1])
            continue
        fields["heads"] = fields["heads"] or ()
        items.append(CorefItem(**fields))
    if not items:
        skipped = SkipRecord(entries=tuple(skips))
        detail = (
            f"{skipped.total} skipped ({skipped.summary()}); first at line {first_problem[0]}: {first_problem[1]}"
            if skips
            else "the file holds only blank lines"
        )
        raise InputFileError(
            p,
            None,
            None,
            f"no usable coreference items: {detail}; "
            "expected one JSON object per line (words, pronoun, candidates, antecedent)",
        )
    return CorefSet(items=tuple(items), skipped=SkipRecord(entries=tuple(skips)), path=str(p))
