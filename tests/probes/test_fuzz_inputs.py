"""Property tests on hostile inputs (issue #12): mutated CoNLL-U, coreference JSONL and
text files, and random flag values. A reader returns usable items or raises
InputFileError (a ValueError / HeadscopeError) with one line naming the file; the CLI
exits 0 or 2 with one error line and never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from headscope.probes.corpora import (
    InputFileError,
    item_problem,
    read_conllu,
    read_coref,
    read_text,
    tree_problem,
)
from headscope.probes.corpora.text import BLANK, is_blank
from headscope.probes.errors import HeadscopeError
from headscope.reports.cli.app import build_parser, main
from headscope.reports.cli.argtypes import MAX_SEED

FIX = Path(__file__).parents[1] / "fixtures"
READERS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLI_RUNS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Values that broke or nearly broke a reader: bad IDs and heads, huge integers, spaces
# of every kind, NUL, control and format characters, emoji, a BOM, JSON punctuation.
TOKENS = [
    "0",
    "-1",
    "1.0",
    "1-1",
    "2-1",
    "1-3",
    "1.1",
    "3",
    "99999999999999999999999",
    str(2**64),
    "1e309",
    "\u0663",
    "_",
    "",
    " ",
    "  ",
    "\x00",
    "\x0b",
    "\x85",
    "\u00a0",
    "\u2028",
    "\u3000",
    "New York",
    "\u200b",
    "\U0001f600",
    "e\u0301",
    "\ufeff",
    "\t",
    "#",
    "# c",
    "{",
    "[",
    "]",
    '"',
    "null",
    "true",
    "\ud7ff",
    "root",
    "nsubj",
]
LINE_OPS = [
    "truncate",
    "drop_field",
    "add_field",
    "set_field",
    "insert_text",
    "delete_line",
    "duplicate_line",
    "insert_line",
]
LINE_EDITS = st.lists(
    st.tuples(st.integers(0, 10**6), st.sampled_from(LINE_OPS), st.sampled_from(TOKENS), st.integers(0, 200)),
    max_size=6,
)
BYTE_EDITS = st.just([]) | st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4)


def edit_lines(lines: list[str], edits) -> list[str]:
    lines = list(lines) or [""]
    for where, op, token, k in edits:
        i = where % len(lines)
        fields = lines[i].split("\t")
        if op == "truncate":
            lines[i] = lines[i][:k]
        elif op == "drop_field" and len(fields) > 1:
            del fields[k % len(fields)]
            lines[i] = "\t".join(fields)
        elif op == "add_field":
            fields.insert(k % (len(fields) + 1), token)
            lines[i] = "\t".join(fields)
        elif op == "set_field":
            fields[k % len(fields)] = token
            lines[i] = "\t".join(fields)
        elif op == "insert_text":
            lines[i] = lines[i][: k % (len(lines[i]) + 1)] + token + lines[i][k % (len(lines[i]) + 1) :]
        elif op == "delete_line" and len(lines) > 1:
            del lines[i]
        elif op == "duplicate_line":
            lines.insert(i, lines[i])
        elif op == "insert_line":
            lines.insert(i, token)
    return lines


def encode(lines: list[str], byte_edits, cut: int | None) -> bytes:
    data = bytearray("\n".join(lines).encode("utf-8", "surrogatepass"))
    for pos, byte in byte_edits:
        data.insert(pos % (len(data) + 1), byte)
    return bytes(data[:cut] if cut is not None else data)


def read_or_error(reader, data: bytes, suffix: str):
    """The reader's result, or None after checking its error is one line naming the file."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"in{suffix}"
        p.write_bytes(data)
        try:
            result = reader(p)
        except InputFileError as err:  # a ValueError and a HeadscopeError; anything else fails the test
            assert isinstance(err, ValueError) and isinstance(err, HeadscopeError)
            msg = str(err)
            assert msg.startswith(str(p)) and len(msg.splitlines()) == 1, msg
            event("refused")
            return None
        event("read")
        return result


def no_space(words) -> bool:
    return all(w and not any(c.isspace() for c in w) for w in words)


CONLLU_LINES = (FIX / "ud_sample.conllu").read_text(encoding="utf-8").splitlines()
COREF_LINES = (FIX / "coref_planted.jsonl").read_text(encoding="utf-8").splitlines()
TEXT_LINES = ["The cat sat on the mat .", "", "It purred \u00e9 \U0001f600 .", "   ", "\u200b\u2060", "caf\u00e9 ok"]


@READERS
@given(edits=LINE_EDITS, byte_edits=BYTE_EDITS, cut=st.none() | st.integers(0, 3000))
def test_conllu_reader_returns_trees_or_one_line_error(edits, byte_edits, cut):
    corpus = read_or_error(read_conllu, encode(edit_lines(CONLLU_LINES, edits), byte_edits, cut), ".conllu")
    if corpus is not None:
        assert len(corpus) >= 1
        for s in corpus:
            assert tree_problem(s.heads) is None and no_space(s.words)
        assert all(line >= 1 and reason for line, reason in corpus.skipped.entries)


JSON_VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from(TOKENS),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
    st.lists(st.integers(-3, 12), max_size=3),
    st.lists(st.lists(st.integers(-2, 12), min_size=2, max_size=2), max_size=4),
    st.lists(st.sampled_from(TOKENS), max_size=4),
)
ITEM_EDITS = st.lists(
    st.tuples(
        st.integers(0, 100),
        st.sampled_from(["words", "pronoun", "candidates", "antecedent", "heads", "id", "kind", "extra"]),
        st.booleans(),
        JSON_VALUES,
    ),
    max_size=4,
)


@READERS
@given(item_edits=ITEM_EDITS, edits=LINE_EDITS, byte_edits=BYTE_EDITS, ascii_only=st.booleans())
def test_coref_reader_returns_usable_items_or_one_line_error(item_edits, edits, byte_edits, ascii_only):
    rows = [json.loads(line) if line.strip() else None for line in COREF_LINES]
    for where, key, delete, value in item_edits:
        row = rows[where % len(rows)]
        if row is not None:
            row.pop(key, None) if delete else row.__setitem__(key, value)
    lines = ["" if r is None else json.dumps(r, ensure_ascii=ascii_only) for r in rows]
    cs = read_or_error(read_coref, encode(edit_lines(lines, edits), byte_edits, None), ".jsonl")
    if cs is not None:
        assert len(cs) >= 1
        for it in cs:
            assert item_problem(it.words, it.pronoun, it.candidates, it.antecedent, it.heads) is None
            assert no_space(it.words)
            spans = sorted(it.candidates)
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # never overlapping


@READERS
@given(edits=LINE_EDITS, byte_edits=BYTE_EDITS, raw=st.none() | st.binary(max_size=200), max_chars=st.integers(1, 40))
def test_text_reader_returns_lines_or_one_line_error(edits, byte_edits, raw, max_chars):
    data = raw if raw is not None else encode(edit_lines(TEXT_LINES, edits), byte_edits, None)
    ts = read_or_error(lambda p: read_text(p, max_line_chars=max_chars), data, ".txt")
    if ts is not None:
        assert len(ts) >= 1
        assert all(not is_blank(line) and "\x00" not in line and len(line) <= max_chars for line in ts.lines)
        # every line is either kept or skipped with its reason: nothing is lost
        numbers = sorted(ts.line_numbers + tuple(n for n, _ in ts.skipped.entries))
        assert numbers == list(range(1, len(numbers) + 1))
        assert ts.blank == ts.skipped.counts.get(BLANK, 0)


# ------------------------------------------------------------------------------- the CLI

TINY_CONLLU = [
    "# sent_id = a",
    "1\tDogs\t_\tNOUN\t_\t_\t2\tnsubj\t_\t_",
    "2\tbark\t_\tVERB\t_\t_\t0\troot\t_\t_",
    "3\t.\t_\tPUNCT\t_\t_\t2\tpunct\t_\t_",
    "",
    "# sent_id = b",
    "1\tCats\t_\tNOUN\t_\t_\t2\tnsubj\t_\t_",
    "2\tsleep\t_\tVERB\t_\t_\t0\troot\t_\t_",
    "",
]


def run_cli(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse
            rc = exc.code
    return rc, err.getvalue()


@CLI_RUNS
@given(edits=LINE_EDITS, byte_edits=BYTE_EDITS)
def test_roles_cli_on_mutated_treebanks_exits_0_or_2_in_one_line(minilm, edits, byte_edits):
    from headscope.probes.models import loading as models

    with tempfile.TemporaryDirectory() as d, mock.patch.object(models, "load_model", lambda *a, **k: minilm):
        p = Path(d) / "t.conllu"
        p.write_bytes(encode(edit_lines(TINY_CONLLU, edits), byte_edits, None))
        rc, err = run_cli(
            ["roles", "minilm-l6", "--roles", "syntactic", "--conllu", p, "--out", Path(d) / "o", "--quiet"]
        )
        assert "Traceback" not in err and rc in (0, 2), err
        event(f"exit {rc}")
        errors = [line for line in err.splitlines() if line.startswith("headscope")]
        if rc == 2:
            assert len(errors) == 1 and errors[0].startswith(f"headscope: error: {p}"), err
        else:
            assert not errors and (Path(d) / "o" / "roles.csv").exists()


FLAGS = [
    ("card", "--context"),
    ("roles", "--top"),
    ("roles", "--seed"),
    ("roles", "--batch-size"),
    ("roles", "--margin"),
    ("report", "--seed"),
    ("prune", "--seeds"),
    ("prune", "--seed"),
    ("prune", "--n-items"),
    ("prune", "--batch-size"),
    ("prune", "--max-fraction"),
]
VALUES = st.one_of(
    st.integers(-(2**70), 2**70).map(str), st.floats().map(str), st.sampled_from(TOKENS), st.text(max_size=8)
)


@settings(max_examples=150, deadline=None)
@given(flag=st.sampled_from(FLAGS), value=VALUES)
def test_numeric_flags_parse_or_give_one_clear_line(flag, value):
    command, name = flag
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = build_parser().parse_args([command, *(["a", "b"] if command == "diff" else []), f"{name}={value}"])
        except SystemExit as exc:
            assert exc.code == 2
            lines = err.getvalue().strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"headscope {command}: error: argument {name}: "), lines
            return
    got = getattr(args, name.lstrip("-").replace("-", "_"))
    rules = {
        "--context": lambda v: v >= 1,
        "--top": lambda v: v >= 1,
        "--batch-size": lambda v: v >= 1,
        "--seeds": lambda v: v >= 1,
        "--n-items": lambda v: v >= 2,
        "--seed": lambda v: 0 <= v <= MAX_SEED,
        "--margin": lambda v: 0 <= v <= 1,
        "--max-fraction": lambda v: 0 < v <= 1,
    }
    assert rules[name](got), (flag, value, got)


def test_argument_types_raise_argparse_errors_only():
    from headscope.reports.cli import argtypes

    for parse in (argtypes.positive_int, argtypes.seed, argtypes.fraction, argtypes.unit_interval):
        for value in ("", "x", "nan", "-inf", "1" * 5000, "\x00"):
            with pytest.raises(argparse.ArgumentTypeError, match=r"^must be "):
                parse(value)
