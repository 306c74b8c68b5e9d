"""Dependency treebanks in CoNLL-U: read, validate, write, and tabulate arcs.

Lines are pre-scanned here so that a malformed line is reported as
``file:line:column: what was expected``; the ``conllu`` package then parses each
well-formed sentence. Format errors raise :class:`InputFileError`; sentences that are
well-formed but unusable as trees are skipped and recorded:

========================  ==============================================================
raised (format)           wrong column count; empty column; bad ID or HEAD; word IDs
                          not 1, 2, 3, … in order; HEAD or range beyond the sentence;
                          comment after a token line; undecodable bytes; NUL characters
skipped (reason key)      ``empty_node`` (each ``8.1`` line; the sentence is kept);
                          ``unannotated`` (a word with HEAD or DEPREL ``_``; recorded at
                          that word's line); ``space_in_word`` (a FORM with a space,
                          which UD v2 allows but headscope cannot align: words are
                          matched to tokens at spaces; recorded at that word's line);
                          ``no_root``, ``multiple_roots``, ``cycle`` (not a tree;
                          recorded at the sentence's first line)
========================  ==============================================================

A file that yields no usable sentence (comments only, or every sentence skipped)
raises, with the skip counts and the first skipped line.

>>> import pathlib, tempfile
>>> p = pathlib.Path(tempfile.mkdtemp()) / "t.conllu"
>>> _ = p.write_text("# sent_id = s1\\n1\\tIt\\t_\\tPRON\\t_\\t_\\t2\\tnsubj\\t_\\t_\\n"
...                  "2\\truns\\t_\\tVERB\\t_\\t_\\t0\\troot\\t_\\t_\\n")
>>> s = read_conllu(p).sentences[0]
>>> s.words, s.heads, s.relations, s.sent_id
(('It', 'runs'), (1, -1), ('nsubj', 'root'), 's1')
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import conllu
import pandas as pd

from headscope.probes.corpora.text import SkipRecord, check_input_path, iter_lines
from headscope.probes.errors import InputFileError

__all__ = [
    "DependencySentence",
    "DependencyCorpus",
    "read_conllu",
    "arcs_frame",
    "format_conllu",
    "write_conllu",
    "tree_problem",
]

COLUMNS = ("ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS", "MISC")
_WORD_ID = re.compile(r"[1-9][0-9]*\Z")
_RANGE_ID = re.compile(r"([1-9][0-9]*)-([1-9][0-9]*)\Z")
_EMPTY_ID = re.compile(r"(?:0|[1-9][0-9]*)\.[1-9][0-9]*\Z")
_HEAD = re.compile(r"(?:0|[1-9][0-9]*)\Z")
_MAX_LINE_CHARS = 1_000_000
# Why a skipped sentence is unusable, for error messages (strict mode, nothing usable).
_REASONS = {
    "unannotated": "a word has HEAD or DEPREL _; annotate it",
    "space_in_word": "a word (FORM) contains a space; headscope aligns words to tokens at spaces, so split it "
    "into words or write it without the space",
    "no_root": "no word has HEAD 0; give the sentence one root",
    "multiple_roots": "more than one word has HEAD 0; give the sentence one root",
    "cycle": "the HEADs form a cycle; every word must reach the root",
}
# conllu reads FEATS/DEPS/MISC into dicts; we keep them raw so odd values never trip it.
_RAW = {name: (lambda fields, i: fields[i]) for name in ("feats", "deps", "misc")}


def tree_problem(heads: Iterable[int]) -> str | None:
    """Why ``heads`` (0-based head index per word, -1 for the root) is not a tree, or None.

    Returns one of ``"empty"``, ``"head_out_of_range"``, ``"no_root"``,
    ``"multiple_roots"``, ``"cycle"``.

    >>> tree_problem([1, -1, 1]), tree_problem([1, 0, -1]), tree_problem([-1, -1])
    (None, 'cycle', 'multiple_roots')
    """
    heads = list(heads)
    n = len(heads)
    if n == 0:
        return "empty"
    if any(not -1 <= h < n for h in heads):
        return "head_out_of_range"
    roots = heads.count(-1)
    if roots != 1:
        return "no_root" if roots == 0 else "multiple_roots"
    for start in range(n):
        node, steps = start, 0
        while node != -1:
            node, steps = heads[node], steps + 1
            if steps > n:
                return "cycle"
    return None


@dataclass(frozen=True, kw_only=True)
class DependencySentence:
    """One dependency tree over syntactic words.

    ``heads[i]`` is the 0-based index of word ``i``'s head, -1 for the root;
    ``relations[i]`` its UD label; ``upos`` is empty or one tag per word (``_`` where
    unset); ``multiword`` lists ``(start, end, surface)`` multiword tokens as 0-based,
    end-exclusive word spans (``don't`` over ``do n't``); ``source_line`` is the file
    line where the sentence starts. Construction raises ``ValueError`` unless the heads
    form a tree (one root, no cycle, heads in range).
    """

    words: tuple[str, ...] = ()
    heads: tuple[int, ...] = ()
    relations: tuple[str, ...] = ()
    upos: tuple[str, ...] = ()
    multiword: tuple[tuple[int, int, str], ...] = ()
    sent_id: str | None = None
    source_line: int = 0

    def __post_init__(self) -> None:
        n = len(self.words)
        if len(self.heads) != n or len(self.relations) != n or len(self.upos) not in (0, n):
            raise ValueError(
                f"words, heads, relations (and upos if given) must have equal lengths; got "
                f"{n}, {len(self.heads)}, {len(self.relations)}, {len(self.upos)}"
            )
        problem = tree_problem(self.heads)
        if problem is not None:
            raise ValueError(
                f"heads must form a tree (one root -1, no cycle, heads in range); got {problem} in heads={self.heads}"
            )
        previous_end = 0
        for start, end, _ in self.multiword:
            if not previous_end <= start < end <= n:
                raise ValueError(
                    f"multiword spans must be ordered, non-overlapping and satisfy "
                    f"0 <= start < end <= {n}; got {self.multiword}"
                )
            previous_end = end

    def __len__(self) -> int:
        return len(self.words)

    @property
    def root(self) -> int:
        """Index of the root word."""
        return self.heads.index(-1)

    @property
    def is_projective(self) -> bool:
        """True when no two arcs cross (the root arc spans the whole sentence).

        >>> DependencySentence(words=("a", "b", "c", "d"), heads=(2, -1, 1, 1),
        ...                    relations=("x", "root", "y", "z")).is_projective
        False
        """
        arcs = [(min(d, h), max(d, h)) for d, h in enumerate(self.heads) if h >= 0]
        arcs.append((-1, len(self.words)))
        return not any(a < c < b < d for a, b in arcs for c, d in arcs)


@dataclass(frozen=True, kw_only=True)
class DependencyCorpus:
    """Sentences read from a CoNLL-U file, and what was skipped (see module doc)."""

    sentences: tuple[DependencySentence, ...] = ()
    skipped: SkipRecord = SkipRecord()
    path: str | None = None

    def __len__(self) -> int:
        return len(self.sentences)

    def __iter__(self) -> Iterator[DependencySentence]:
        return iter(self.sentences)

    def relation_counts(self) -> dict[str, int]:
        """Number of words per relation label (``root`` included), most frequent first."""
        return dict(Counter(r for s in self.sentences for r in s.relations).most_common())


def read_conllu(path: str | Path, *, full_labels: bool = False, strict: bool = False) -> DependencyCorpus:
    """Read a CoNLL-U file into a :class:`DependencyCorpus`.

    Relations keep the UD label before ``:`` (``nmod:poss`` -> ``nmod``) unless
    ``full_labels=True``. Multiword-token ranges keep their syntactic words and record
    the surface form; empty nodes are left out and counted. Comments, ``_`` fields,
    CRLF or mixed line ends, a UTF-8 byte-order mark and a last sentence without a
    trailing blank line are all accepted. ``strict=True`` raises on the first skipped
    sentence instead of recording it (empty nodes are still only counted).

    Raises :class:`InputFileError` (``file:line:column: message``) for format errors,
    a missing path, a directory, an empty file, or a file with no usable sentence
    (``file: no usable sentences: ...`` with the skip counts).
    """
    p = check_input_path(path, expected="CoNLL-U sentences")
    sentences: list[DependencySentence] = []
    skips: list[tuple[int, str]] = []
    for block in _blocks(p):
        sentence = _read_block(p, block, full_labels, skips)
        if isinstance(sentence, DependencySentence):
            sentences.append(sentence)
        elif sentence is not None:
            line, reason = sentence
            if strict:
                why = f": {_REASONS[reason]}" if reason in _REASONS else ""
                raise InputFileError(
                    p, line, 1, f"sentence is not usable ({reason}){why}; fix it or read with strict=False"
                )
            skips.append(sentence)
    if not sentences:
        dropped = sorted(e for e in skips if e[1] != "empty_node")  # empty nodes never drop a sentence
        if dropped:
            line, reason = dropped[0]
            why = f" ({_REASONS[reason]})" if reason in _REASONS else ""
            detail = (
                f"all {len(dropped)} sentences were skipped ({SkipRecord(entries=tuple(dropped)).summary()}); "
                f"first at line {line}: {reason}{why}"
            )
        else:
            detail = "the file holds only comment and blank lines"
        raise InputFileError(
            p,
            None,
            None,
            f"no usable sentences: {detail}; expected CoNLL-U sentences "
            f"(word lines of 10 tab-separated columns: {' '.join(COLUMNS)})",
        )
    return DependencyCorpus(sentences=tuple(sentences), skipped=SkipRecord(entries=tuple(sorted(skips))), path=str(p))


def _blocks(p: Path) -> Iterator[list[tuple[int, str]]]:
    block: list[tuple[int, str]] = []
    for line_no, text in iter_lines(p, max_line_chars=_MAX_LINE_CHARS):
        if text is None:
            raise InputFileError(
                p,
                line_no,
                1,
                f"line is longer than {_MAX_LINE_CHARS} characters; "
                "CoNLL-U lines are one token each — is this the right file?",
            )
        if "\x00" in text:
            raise InputFileError(p, line_no, text.index("\x00") + 1, "NUL character in a CoNLL-U line; remove it")
        if text.strip():
            block.append((line_no, text))
        elif block:
            yield block
            block = []
    if block:
        yield block


def _column(fields: list[str], k: int) -> int:
    """1-based character column where field ``k`` starts."""
    return sum(len(f) + 1 for f in fields[:k]) + 1


def _read_block(
    p: Path, block: list[tuple[int, str]], full_labels: bool, skips: list[tuple[int, str]]
) -> DependencySentence | tuple[int, str] | None:
    """Validate one sentence's lines and parse them; a sentence, a (line, reason) skip, or None."""
    scan = _scan_block(p, block, skips)
    if scan is None:
        return None  # comment-only block (e.g. '# newdoc' on its own)
    _check_references(p, block, scan)
    if scan.unannotated is not None:
        return scan.unannotated, "unannotated"
    if scan.spaced is not None:
        return scan.spaced, "space_in_word"
    return _parse_block(p, block, full_labels)


@dataclass
class _BlockScan:
    """What one pass over a sentence's lines found: its word count, its multiword ranges
    (line, last word), and the first line of a word without HEAD/DEPREL or with a space."""

    n_words: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)
    unannotated: int | None = None
    spaced: int | None = None


def _scan_block(p: Path, block: list[tuple[int, str]], skips: list[tuple[int, str]]) -> _BlockScan | None:
    """Check each line of a sentence in order (comments first, 10 columns, IDs in order);
    None for a block of comments only. Empty nodes are recorded in ``skips``."""
    scan, token_seen = _BlockScan(), False
    for line_no, text in block:
        if text.startswith("#"):
            if token_seen:
                raise InputFileError(
                    p,
                    line_no,
                    1,
                    "comment line after a token line; comments must "
                    "come before the token lines of a sentence (or add a blank line)",
                )
            continue
        token_seen = True
        fields = _token_fields(p, line_no, text)
        ident, head, deprel = fields[0], fields[6], fields[7]
        if head != "_" and not _HEAD.match(head):
            raise InputFileError(
                p, line_no, _column(fields, 6), f"HEAD must be a word ID (0 for the root) or _; got {head!r}"
            )
        if _WORD_ID.match(ident):
            if int(ident) != scan.n_words + 1:
                raise InputFileError(
                    p, line_no, 1, f"word IDs must run 1, 2, 3, ... in order; expected {scan.n_words + 1}, got {ident}"
                )
            scan.n_words += 1
            if (head == "_" or deprel == "_") and scan.unannotated is None:
                scan.unannotated = line_no
            if scan.spaced is None and any(c.isspace() for c in fields[1]):
                scan.spaced = line_no
        elif m := _RANGE_ID.match(ident):
            start, end = int(m[1]), int(m[2])
            if start != scan.n_words + 1 or end <= start or (scan.ranges and scan.ranges[-1][1] >= start):
                raise InputFileError(
                    p,
                    line_no,
                    1,
                    f"a multiword range must start at the next word ID "
                    f"({scan.n_words + 1}), end after it and not overlap another range; got {ident}",
                )
            scan.ranges.append((line_no, end))
        elif _EMPTY_ID.match(ident):
            skips.append((line_no, "empty_node"))
        else:
            raise InputFileError(
                p, line_no, 1, f"ID must be a word ID (1, 2, ...), a range (3-4) or an empty node (8.1); got {ident!r}"
            )
    return scan if token_seen else None


def _token_fields(p: Path, line_no: int, text: str) -> list[str]:
    """The 10 columns of a token line: none empty, none holding two spaces in a row."""
    fields = text.split("\t")
    if len(fields) != 10:
        col = len(text) + 1 if len(fields) < 10 else _column(fields, 10)
        raise InputFileError(
            p,
            line_no,
            col,
            f"expected 10 tab-separated columns ({' '.join(COLUMNS)}), "
            f"got {len(fields)}; separate columns with single tabs",
        )
    for k, value in enumerate(fields):
        if value.strip() == "":
            raise InputFileError(
                p,
                line_no,
                _column(fields, k),
                f"column {k + 1} ({COLUMNS[k]}) is empty or blank; write _ for an unset value",
            )
        if "  " in value:
            raise InputFileError(
                p,
                line_no,
                _column(fields, k) + value.index("  "),
                f"column {k + 1} ({COLUMNS[k]}) holds two spaces in a row, which CoNLL-U "
                "parsers read as a column break; use a single space",
            )
    return fields


def _check_references(p: Path, block: list[tuple[int, str]], scan: _BlockScan) -> None:
    """Every word ID a line points at exists: at least one word, ranges and HEADs within them."""
    n_words = scan.n_words
    if n_words == 0:
        raise InputFileError(p, block[0][0], 1, "sentence has no word lines (only ranges or empty nodes)")
    for line_no, end in scan.ranges:
        if end > n_words:
            raise InputFileError(
                p, line_no, 1, f"multiword range ends at word {end} but the sentence has {n_words} words"
            )
    for line_no, text in block:
        fields = text.split("\t")
        if not text.startswith("#") and _HEAD.match(fields[6]) and int(fields[6]) > n_words:
            raise InputFileError(
                p,
                line_no,
                _column(fields, 6),
                f"HEAD {fields[6]} is out of range: the "
                f"sentence has {n_words} words (0 = root); point HEAD at one of them",
            )


def _parse_block(p: Path, block: list[tuple[int, str]], full_labels: bool) -> DependencySentence | tuple[int, str]:
    """The sentence of lines that passed the checks (conllu parses them), or a (line, reason)
    skip when its heads do not form a tree."""
    try:
        tokens = conllu.parse("\n".join(t for _, t in block) + "\n", field_parsers=_RAW)[0]
    except Exception as err:  # the lines passed our checks; report anything conllu still rejects in place
        raise InputFileError(p, block[0][0], 1, f"the conllu parser rejected this sentence: {err}") from None
    words, heads, relations, upos, multiword = [], [], [], [], []
    for tok in tokens:
        ident = tok["id"]
        if isinstance(ident, int):
            words.append(tok["form"])
            heads.append(tok["head"] - 1)
            rel = tok["deprel"]
            relations.append(rel if full_labels else rel.split(":")[0])
            upos.append(tok["upos"] or "_")
        elif ident[1] == "-":
            multiword.append((ident[0] - 1, ident[2], tok["form"]))
    problem = tree_problem(heads)
    if problem is not None:
        return block[0][0], problem
    return DependencySentence(
        words=tuple(words),
        heads=tuple(heads),
        relations=tuple(relations),
        upos=tuple(upos),
        multiword=tuple(multiword),
        sent_id=tokens.metadata.get("sent_id"),
        source_line=block[0][0],
    )


def arcs_frame(corpus: DependencyCorpus | Iterable[DependencySentence]) -> pd.DataFrame:
    """Tidy table of arcs: one row per non-root word.

    Columns: ``sentence`` (index in the corpus), ``dependent`` and ``head`` (0-based
    word indices), ``relation`` (category), ``offset`` (``head - dependent``).

    >>> s = DependencySentence(words=("Cats", "sleep", "."), heads=(1, -1, 1), relations=("nsubj", "root", "punct"))
    >>> arcs_frame([s]).to_dict("list")
    {'sentence': [0, 0], 'dependent': [0, 2], 'head': [1, 1], 'relation': ['nsubj', 'punct'], 'offset': [1, -1]}
    """
    rows = [(k, d, h, r) for k, s in enumerate(corpus) for d, (h, r) in enumerate(zip(s.heads, s.relations)) if h >= 0]
    frame = pd.DataFrame(rows, columns=["sentence", "dependent", "head", "relation"])
    frame = frame.astype({"sentence": "int64", "dependent": "int64", "head": "int64", "relation": "category"})
    frame["offset"] = frame["head"] - frame["dependent"]
    return frame


def format_conllu(sentences: Iterable[DependencySentence]) -> str:
    """CoNLL-U text for ``sentences`` (``# sent_id``, ``# text``, ranges, 10 columns).

    Raises ``ValueError`` for a word, tag or label that CoNLL-U cannot hold
    (empty, or with a tab, a line break or two spaces in a row).

    >>> s = DependencySentence(words=("do", "n't"), heads=(-1, 0), relations=("root", "advmod"),
    ...                        multiword=((0, 2, "don't"),))
    >>> print(format_conllu([s]).replace("\\t", " "), end="")
    # text = don't
    1-2 don't _ _ _ _ _ _ _ _
    1 do _ _ _ _ 0 root _ _
    2 n't _ _ _ _ 1 advmod _ _
    <BLANKLINE>
    """
    out: list[str] = []
    for s in sentences:
        for value in (*s.words, *s.relations, *s.upos, *(m[2] for m in s.multiword), s.sent_id or "_"):
            if not value.strip() or any(c in value for c in "\t\n\r") or "  " in value:
                raise ValueError(
                    f"CoNLL-U fields must be non-blank, without tabs, line breaks or double "
                    f"spaces; got {value!r} in sentence {s.sent_id or s.words}"
                )
        if s.sent_id is not None:
            out.append(f"# sent_id = {s.sent_id}")
        starts = {m[0]: m for m in s.multiword}
        surface, i = [], 0
        while i < len(s.words):
            if i in starts:
                surface.append(starts[i][2])
                i = starts[i][1]
            else:
                surface.append(s.words[i])
                i += 1
        out.append("# text = " + " ".join(surface))
        for i, word in enumerate(s.words):
            if i in starts:
                start, end, form = starts[i]
                out.append(f"{start + 1}-{end}\t{form}\t_\t_\t_\t_\t_\t_\t_\t_")
            tag = s.upos[i] if s.upos else "_"
            out.append(f"{i + 1}\t{word}\t_\t{tag}\t_\t_\t{s.heads[i] + 1}\t{s.relations[i]}\t_\t_")
        out.append("")
    return "\n".join(out) + "\n"


def write_conllu(path: str | Path, sentences: Iterable[DependencySentence]) -> Path:
    """Write ``sentences`` to ``path`` as UTF-8 CoNLL-U (LF line ends); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(format_conllu(sentences), encoding="utf-8", newline="\n")
    return p
