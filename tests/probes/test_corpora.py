"""Readers and shipped probe data: planted values, exact error locations, fuzzing, round trips."""

from __future__ import annotations

import json
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headscope.data import path as data_path
from headscope.probes.corpora import (
    CorefItem,
    DependencySentence,
    InputFileError,
    arcs_frame,
    baseline_choice,
    format_conllu,
    read_conllu,
    read_coref,
    read_text,
    write_conllu,
)
from headscope.probes.corpora.coref_templates import build_items
from headscope.probes.corpora.grammar import detokenize, generate
from headscope.probes.corpora.text import is_blank

FIX = Path(__file__).parents[1] / "fixtures"
UD = FIX / "ud_sample.conllu"
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_well_formed(s: DependencySentence) -> None:
    """Single root, every head in range, no cycle (checked independently of the library)."""
    n = len(s.words)
    assert n == len(s.heads) == len(s.relations)
    assert all(-1 <= h < n and h != i for i, h in enumerate(s.heads))
    assert s.heads.count(-1) == 1
    assert s.relations[s.heads.index(-1)] == "root"
    for i in range(n):
        seen = set()
        while i != -1:
            assert i not in seen, f"cycle through word {i} in {s.sent_id}"
            seen.add(i)
            i = s.heads[i]


# ---------------------------------------------------------------- shipped data


@pytest.fixture(scope="module")
def generated():
    return read_conllu(data_path("syntax/generated.conllu"), full_labels=True)


@pytest.fixture(scope="module")
def handwritten():
    return read_conllu(data_path("syntax/handwritten.conllu"), full_labels=True)


def test_shipped_syntax_has_ten_relations_with_fifty_instances(generated, handwritten):
    counts = Counter(r.split(":")[0] for c in (generated, handwritten) for s in c for r in s.relations)
    frequent = {r for r, k in counts.items() if k >= 50 and r != "root"}
    assert len(frequent) >= 10
    assert {
        "det",
        "nsubj",
        "obj",
        "amod",
        "case",
        "nmod",
        "advmod",
        "aux",
        "cop",
        "mark",
        "cc",
        "conj",
        "compound",
        "punct",
        "obl",
        "advcl",
        "nummod",
        "acl",
        "xcomp",
        "iobj",
        "ccomp",
    } <= frequent
    full = Counter(r for c in (generated, handwritten) for s in c for r in s.relations)
    assert full["nmod:poss"] >= 50 and full["acl:relcl"] >= 50 and full["nsubj:pass"] >= 20


def test_shipped_trees_are_well_formed(generated, handwritten):
    assert len(generated) == 800 and len(handwritten) == 49
    assert generated.skipped.total == 0 and handwritten.skipped.total == 0
    for s in (*generated, *handwritten):
        assert_well_formed(s)
    lengths = [len(s) for s in generated]
    assert min(lengths) >= 5 and max(lengths) <= 30
    assert min(lengths) <= 6 and max(lengths) >= 28
    assert len({s.words for s in generated}) == 800


def test_generated_file_is_reproducible_from_its_seed():
    assert format_conllu(generate(800, seed=0)) == data_path("syntax/generated.conllu").read_text(encoding="utf-8")
    assert generate(5, seed=1) != generate(5, seed=2)


def test_generated_arcs_agree_with_tags_by_construction(generated):
    frame = arcs_frame(generated)
    upos = {(k, i): t for k, s in enumerate(generated) for i, t in enumerate(s.upos)}
    dep_tag = [upos[k, d] for k, d in zip(frame["sentence"], frame["dependent"])]
    head_tag = [upos[k, h] for k, h in zip(frame["sentence"], frame["head"])]
    frame = frame.assign(dep_tag=dep_tag, head_tag=head_tag)
    expect = {
        "det": {"DET"},
        "amod": {"ADJ"},
        "nummod": {"NUM"},
        "punct": {"PUNCT"},
        "cc": {"CCONJ"},
        "case": {"ADP", "PART"},
        "mark": {"SCONJ", "PART"},
        "compound": {"NOUN"},
        "aux": {"AUX"},
        "cop": {"AUX"},
        "iobj": {"NOUN", "PROPN", "PRON"},
    }
    for rel, tags in expect.items():
        assert set(frame.loc[frame["relation"] == rel, "dep_tag"]) <= tags, rel
    assert (frame.loc[frame["relation"].isin(["det", "amod", "compound", "nummod"]), "offset"] > 0).all()
    assert set(frame.loc[frame["relation"] == "det", "head_tag"]) <= {"NOUN"}
    assert (frame.loc[frame["relation"] == "punct", "offset"] != 0).all()


def test_handwritten_planted_sentences(handwritten):
    first = handwritten.sentences[0]
    assert " ".join(first.words) == "The cat did n't climb on the table because it was too tired ."
    assert first.heads == (1, 4, 4, 4, -1, 7, 7, 4, 12, 12, 12, 12, 4, 4)
    assert first.relations[12] == "advcl" and handwritten.sentences[1].words[12] == "tall"
    non_projective = [s.sent_id for s in handwritten if not s.is_projective]
    assert non_projective == ["hw-04", "hw-05", "hw-30", "hw-47"]
    assert [s.multiword for s in handwritten if s.multiword] == [((1, 3, "don't"),), ((1, 3, "won't"),)]


def test_shipped_coref_items_and_baselines():
    cs = read_coref(data_path("coref/coref.jsonl"))
    assert len(cs) == 220 and cs.skipped.total == 0
    assert Counter(i.kind for i in cs) == {"winograd": 100, "gender": 100, "number": 20}
    by_id = {i.id: i for i in cs}
    for item in cs:
        partner = by_id[item.pair]
        assert partner.pair == item.id and partner.kind == item.kind
        assert partner.candidates == item.candidates and partner.pronoun == item.pronoun
        assert partner.antecedent != item.antecedent
        assert sum(a != b for a, b in zip(item.words, partner.words)) in (1, 2)
    cat = [i for i in cs if i.words[:5] == ("The", "cat", "did", "n't", "climb")]
    assert [(i.words[12], i.antecedent) for i in cat] == [("tired", 0), ("tall", 1)]
    first = sum(baseline_choice(i, "first") == i.antecedent for i in cs) / len(cs)
    nearest = sum(baseline_choice(i, "nearest") == i.antecedent for i in cs) / len(cs)
    assert first == pytest.approx(0.5) and nearest == pytest.approx(100 / 220)
    assert [json.loads(line) for line in data_path("coref/coref.jsonl").read_text().splitlines()] == build_items(0)
    assert by_id["gender-041a"].heads == (1, 7) and by_id["gender-041a"].candidates == ((0, 6), (7, 8))


def test_shipped_text():
    ts = read_text(data_path("text/sentences.txt"))
    assert len(ts) == 319 and ts.skipped.total == 0 and ts.blank == 0 and ts.encoding == "utf-8"
    assert ts.lines[0] == "The cat didn't climb on the table because it was too tired."
    assert any("\u200d" in line for line in ts.lines) and any("\u05e9" in line for line in ts.lines)
    assert sum(any(c.isdigit() for c in line) for line in ts.lines) >= 30
    assert list(ts.lines[119:]) == [detokenize(s.words) for s in generate(200, seed=1)]


# ---------------------------------------------------------------- CoNLL-U reader


def test_ud_fixture_reads_exactly():
    c = read_conllu(UD)
    s1, s2, s3 = c.sentences
    assert s1.words == ("Frankly", "I", "do", "n't", "eat", "fish", "and", "Anna", "meat", ".")
    assert s1.heads == (4, 4, 4, 4, -1, 4, 7, 4, 7, 4)
    assert s1.relations == ("advmod", "nsubj", "aux", "advmod", "root", "obj", "cc", "conj", "orphan", "punct")
    assert s1.multiword == ((2, 4, "don't"),) and s1.sent_id == "fx-1" and s1.source_line == 1
    assert c.skipped.entries == ((13, "empty_node"),) and c.skipped.counts == {"empty_node": 1}
    assert s2.heads == (1, 2, -1, 2, 7, 7, 7, 1, 2) and not s2.is_projective and s1.is_projective
    assert s2.relations[3] == "obl" and s2.source_line == 17
    assert s3.relations == ("nmod", "case", "nsubj", "root", "punct") and s3.source_line == 30
    full = read_conllu(UD, full_labels=True)
    assert full.sentences[1].relations[3] == "obl:tmod" and full.sentences[2].relations[0] == "nmod:poss"


def test_arcs_frame_on_fixture():
    frame = arcs_frame(read_conllu(UD))
    got = frame[frame["sentence"] == 2].reset_index(drop=True)
    want = pd.DataFrame(
        {
            "sentence": [2, 2, 2, 2],
            "dependent": [0, 1, 2, 4],
            "head": [2, 0, 3, 3],
            "relation": ["nmod", "case", "nsubj", "punct"],
            "offset": [2, -1, 1, -1],
        }
    )
    want["relation"] = want["relation"].astype(pd.CategoricalDtype(frame["relation"].cat.categories))
    pd.testing.assert_frame_equal(got, want)
    assert len(frame) == 10 + 9 + 5 - 3


@pytest.mark.parametrize(
    "transform",
    [
        lambda b: b.replace(b"\n", b"\r\n"),
        lambda b: b"\xef\xbb\xbf" + b,
        lambda b: b.rstrip(b"\n"),
        lambda b: b"".join(line + (b"\r\n" if k % 2 else b"\n") for k, line in enumerate(b.split(b"\n"))),
        lambda b: b.replace(b"\n", b"\r"),
        lambda b: b"".join(line + (b"\r\n", b"\n", b"\r")[k % 3] for k, line in enumerate(b.split(b"\n"))),
        lambda b: b.decode("utf-8").encode("utf-16-le"),
        lambda b: b.decode("utf-8").encode("utf-32"),
    ],
    ids=["crlf", "bom", "no-final-blank-line", "mixed", "lone-cr", "mixed-three", "utf16-no-bom", "utf32-bom"],
)
def test_line_endings_bom_and_missing_final_newline(tmp_path, transform):
    p = tmp_path / "x.conllu"
    p.write_bytes(transform(UD.read_bytes()))
    assert read_conllu(p).sentences == read_conllu(UD).sentences


def _conllu_line(i, form, head, rel="dep"):
    return f"{i}\t{form}\t_\t_\t_\t_\t{head}\t{rel}\t_\t_"


@pytest.mark.parametrize(
    "lines, where, message",
    [
        ([_conllu_line(1, "a", 0, "root"), "2\tb\t_\t_\t_\t_\t1\tdep\t_"], "2:20", "expected 10 tab-separated columns"),
        ([_conllu_line(1, "a", 0, "root"), _conllu_line(1, "b", 1) + "\textra"], "2:23", "got 11"),
        ([_conllu_line(1, "a", 0, "root"), _conllu_line("x", "b", 1)], "2:1", "ID must be a word ID"),
        ([_conllu_line(1, "a", 0, "root"), _conllu_line(3, "b", 1)], "2:1", "expected 2, got 3"),
        ([_conllu_line(1, "a", 0, "root"), _conllu_line(2, "b", "-1")], "2:13", "HEAD must be a word ID"),
        ([_conllu_line(1, "a", 0, "root"), _conllu_line(2, "b", 7)], "2:13", "HEAD 7 is out of range"),
        ([_conllu_line(1, "a", 0, "root"), "2\t\t_\t_\t_\t_\t1\tdep\t_\t_"], "2:3", r"column 2 \(FORM\) is empty"),
        ([_conllu_line(1, "a  b", 0, "root")], "1:4", "two spaces in a row"),
        ([_conllu_line(1, "a", 0, "root"), "# late comment"], "2:1", "comment line after a token line"),
        (
            ["1-3\tab\t_\t_\t_\t_\t_\t_\t_\t_", _conllu_line(1, "a", 0, "root"), _conllu_line(2, "b", 1)],
            "1:1",
            "multiword range ends at word 3",
        ),
        (["2.1\tx\t_\t_\t_\t_\t_\t_\t_\t_"], "1:1", "sentence has no word lines"),
    ],
)
def test_malformed_conllu_names_file_line_column(tmp_path, lines, where, message):
    p = tmp_path / "bad.conllu"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=f"^{p}:{where}: .*{message}"):
        read_conllu(p)


def test_malformed_conllu_fixtures():
    with pytest.raises(InputFileError, match=r"bad_columns\.conllu:3:27: expected 10 tab-separated columns .* got 9"):
        read_conllu(FIX / "bad_columns.conllu")
    with pytest.raises(
        InputFileError,
        match=r"bad_head\.conllu:5:19: HEAD must be a word ID \(0 for the root\) "
        r"or _; got 'two'",
    ):
        read_conllu(FIX / "bad_head.conllu")


def test_undecodable_byte_and_nul_are_located(tmp_path):
    p = tmp_path / "latin1.conllu"
    p.write_bytes(_conllu_line(1, "caf\xe9", 0, "root").encode("latin-1") + b"\n")
    with pytest.raises(InputFileError, match=f"^{p}:1:6: byte 0xe9 cannot be decoded as utf-8"):
        read_conllu(p)
    p.write_bytes(_conllu_line(1, "a\x00", 0, "root").encode() + b"\n")
    with pytest.raises(InputFileError, match=f"^{p}:1:4: NUL character"):
        read_conllu(p)


def test_unusable_trees_are_skipped_and_counted(tmp_path):
    good = [_conllu_line(1, "a", 0, "root"), _conllu_line(2, "b", 1)]
    cycle = [_conllu_line(1, "a", 0, "root"), _conllu_line(2, "b", 3), _conllu_line(3, "c", 2)]
    no_root = [_conllu_line(1, "a", 2), _conllu_line(2, "b", 1)]
    two_roots = [_conllu_line(1, "a", 0, "root"), _conllu_line(2, "b", 0, "root")]
    unannotated = [_conllu_line(1, "a", 0, "root"), _conllu_line(2, "b", "_")]
    blocks = [good, cycle, two_roots, unannotated, no_root, good]
    p = tmp_path / "skips.conllu"
    p.write_text("\n\n".join("\n".join(b) for b in blocks) + "\n", encoding="utf-8")
    c = read_conllu(p)
    assert len(c) == 2
    assert c.skipped.entries == ((4, "cycle"), (8, "multiple_roots"), (12, "unannotated"), (14, "no_root"))
    assert c.skipped.counts == {"cycle": 1, "multiple_roots": 1, "no_root": 1, "unannotated": 1}
    assert [s.source_line for s in c] == [1, 17]
    with pytest.raises(InputFileError, match=f"^{p}:4:1: sentence is not usable \\(cycle\\)"):
        read_conllu(p, strict=True)


@pytest.mark.parametrize("reader", [read_conllu, read_coref, read_text])
def test_missing_directory_and_empty_inputs(tmp_path, reader):
    with pytest.raises(InputFileError, match=r": no such file; check the path"):
        reader(tmp_path / "nope")
    with pytest.raises(InputFileError, match=r": is a directory; pass a file inside it"):
        reader(tmp_path)
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(InputFileError, match=r"empty: file is empty; expected "):
        reader(tmp_path / "empty")
    (tmp_path / "bom").write_bytes(b"\xef\xbb\xbf")
    with pytest.raises(InputFileError, match=r"bom: file is empty"):
        reader(tmp_path / "bom")
    for err in (InputFileError, ValueError):
        with pytest.raises(err):
            reader(tmp_path / "nope")


# ---------------------------------------------------------------- coreference reader


def test_coref_planted_skips():
    cs = read_coref(FIX / "coref_planted.jsonl")
    assert [i.id for i in cs] == ["ok-1", "ok-heads", "ok-3"]
    assert cs.skipped.entries == (
        (2, "pronoun_out_of_range"),
        (4, "no_candidates"),
        (5, "antecedent_out_of_range"),
        (6, "span_overlaps_pronoun"),
        (7, "empty_span"),
        (8, "span_out_of_range"),
        (10, "heads_length"),
        (11, "head_outside_span"),
    )
    assert cs.skipped.total == 8
    ok1, ok_heads, ok3 = cs.items
    assert ok1.heads == (0, 2) and ok1.antecedent_head == 0 and ok1.source_line == 1
    assert ok_heads.heads == (1, 6) and ok_heads.antecedent_span == (0, 5) and ok_heads.pair == "x"
    assert ok3.kind == "number" and ok3.heads == (1, 4)
    with pytest.raises(
        InputFileError,
        match=r"coref_planted\.jsonl:2:1: unusable item \(pronoun_out_of_range\): "
        r"pronoun index 7 is outside the 4 words",
    ):
        read_coref(FIX / "coref_planted.jsonl", strict=True)


def test_coref_format_errors_name_line_and_column(tmp_path):
    with pytest.raises(InputFileError, match=r"coref_bad_json\.jsonl:2:61: invalid JSON \(Expecting ',' delimiter\)"):
        read_coref(FIX / "coref_bad_json.jsonl")
    with pytest.raises(InputFileError, match=r"coref_bad_type\.jsonl:2:24: 'pronoun' must be an integer; got \"1\""):
        read_coref(FIX / "coref_bad_type.jsonl")
    p = tmp_path / "c.jsonl"
    for text, message in [
        ("[1, 2]", "1:1: each line must be a JSON object; got a list"),
        ('{"words": []}', "1:1: missing key 'pronoun'"),
        (
            '{"words": ["a", 3], "pronoun": 0, "candidates": [], "antecedent": 0}',
            "1:2: 'words' must be a list of strings",
        ),
        (
            '{"words": ["a"], "pronoun": 0, "candidates": [[0, true]], "antecedent": 0}',
            "1:32: 'candidates' must be a list of \\[start, end\\] integer pairs",
        ),
        (
            '{"words": ["a"], "pronoun": 0, "candidates": [], "antecedent": 0, "kind": 5}',
            "1:67: 'kind' must be a string",
        ),
    ]:
        p.write_text(text + "\n")
        with pytest.raises(InputFileError, match=f"^{p}:{message}"):
            read_coref(p)


def test_coref_item_validates_on_construction():
    with pytest.raises(ValueError, match="span_overlaps_pronoun"):
        CorefItem(words=("a", "it"), pronoun=1, candidates=((0, 2),), antecedent=0)
    with pytest.raises(ValueError, match="rule must be one of 'first', 'nearest'; got 'last'"):
        baseline_choice(CorefItem(words=("a", "it"), pronoun=1, candidates=((0, 1),)), "last")


# ---------------------------------------------------------------- text reader


def test_text_encodings_blank_lines_and_nul(tmp_path):
    body = "one\r\ntwo\n\n   \nth\x00ree\nfour"
    p = tmp_path / "t.txt"
    for encoding, name in [
        ("utf-8", "utf-8"),
        ("utf-8-sig", "utf-8-sig"),
        ("utf-16", "utf-16-le"),
        ("utf-16-be", "utf-16-be"),
    ]:
        raw = body.encode(encoding)
        p.write_bytes(b"\xfe\xff" + raw if encoding == "utf-16-be" else raw)
        ts = read_text(p)
        assert ts.lines == ("one", "two", "four") and ts.line_numbers == (1, 2, 6), encoding
        assert ts.blank == 2 and ts.encoding == name
        assert ts.skipped.entries == ((3, "blank or invisible-only"), (4, "blank or invisible-only"), (5, "nul_byte"))


@pytest.mark.parametrize(
    "encoding, name",
    [
        ("utf-16-le", "utf-16-le (no BOM)"),
        ("utf-16-be", "utf-16-be (no BOM)"),
        ("utf-32-le", "utf-32-le (no BOM)"),
        ("utf-32-be", "utf-32-be (no BOM)"),
        ("utf-32", "utf-32-le"),
        ("utf-8", "utf-8"),
    ],
)
def test_text_utf16_utf32_are_recognised_with_or_without_bom(tmp_path, encoding, name):
    body = "The cat sat \u00e9 \u2603 .\r\nIt purred .\rcafe\u0301\n\n\U0001f468\u200d\U0001f469 ok\n"
    p = tmp_path / "t.txt"
    p.write_bytes(body.encode(encoding))
    ts = read_text(p)
    assert ts.encoding == name
    assert ts.lines == ("The cat sat \u00e9 \u2603 .", "It purred .", "cafe\u0301", "\U0001f468\u200d\U0001f469 ok")
    assert ts.line_numbers == (1, 2, 3, 5) and ts.blank == 1 and ts.skipped.entries == ((4, "blank or invisible-only"),)


def test_sniffing_leaves_utf8_with_a_few_nul_bytes_alone(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(b"a\x00b\nplain line\n\x00\x00\nanother plain line of text\n")
    ts = read_text(p)
    assert ts.encoding == "utf-8" and ts.lines == ("plain line", "another plain line of text")
    assert ts.skipped.entries == ((1, "nul_byte"), (3, "nul_byte"))


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 7, 64])
@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32-be"])
def test_line_ends_split_across_read_chunks(tmp_path, monkeypatch, chunk, encoding):
    """A CRLF cut between two reads is one line end, a CR at a read's end is not yet one."""
    import headscope.probes.corpora.text as text_reader

    monkeypatch.setattr(text_reader, "_CHUNK_BYTES", chunk * (4 if encoding == "utf-32-be" else 1))
    body = "ab\r\ncd\ref\n\r\ngh\r\r\n\u00e9\u2603\r"
    p = tmp_path / "t.txt"
    p.write_bytes(body.encode(encoding))
    got = list(text_reader.iter_lines(p, max_line_chars=None))
    assert got == [(1, "ab"), (2, "cd"), (3, "ef"), (4, ""), (5, "gh"), (6, ""), (7, "\u00e9\u2603")]


def test_text_unicode_is_kept_unless_nfc(tmp_path):
    lines = [
        "family \U0001f468\u200d\U0001f469\u200d\U0001f467 emoji",
        "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",
        "cafe\u0301 with a combining accent",
        "flag \U0001f1ee\U0001f1f9 and \u2067isolate\u2069",
    ]
    p = tmp_path / "u.txt"
    p.write_text("\n".join(lines), encoding="utf-8")
    assert read_text(p).lines == tuple(lines)
    assert read_text(p, nfc=True).lines[2] == "caf\u00e9 with a combining accent"


def test_text_bad_byte_is_located(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(b"fine\nab\xc3\xa9c\xffd\n")
    with pytest.raises(InputFileError, match=f"^{p}:2:5: byte 0xff cannot be decoded as utf-8"):
        read_text(p)
    p.write_bytes(b"\xff\xfe" + "ok\n".encode("utf-16-le") + b"\x00\xd8x\x00")  # lone high surrogate
    with pytest.raises(InputFileError, match=f"^{p}:2:1: byte 0x00 cannot be decoded as utf-16-le"):
        read_text(p)


def test_text_over_long_line_is_skipped_without_loading_it(tmp_path):
    p = tmp_path / "long.txt"
    long_line = b"x" * (6 << 20)
    p.write_bytes(b"short one\n" + long_line + b"\r\nshort two\n" + long_line)
    tracemalloc.start()
    try:
        ts = read_text(p, max_line_chars=1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ts.lines == ("short one", "short two")
    assert ts.skipped.entries == ((2, "too_long"), (4, "too_long"))
    assert peak < 4 << 20  # a 6 MiB line never sat in memory whole
    p.write_text("a" * 10 + "\n" + "b" * 11 + "\n")
    assert read_text(p, max_line_chars=10).skipped.entries == ((2, "too_long"),)
    with pytest.raises(ValueError, match="max_line_chars must be a positive int; got 0"):
        read_text(p, max_line_chars=0)


# ---------------------------------------------------------------- property tests


def _read_bytes(reader, data: bytes, suffix: str):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"f{suffix}"
        p.write_bytes(data)
        try:
            return reader(p)
        except InputFileError:
            return None


def _mutate(base: bytes, edits) -> bytes:
    data = bytearray(base)
    for pos, op, byte in edits:
        pos %= len(data) + 1
        if op == 0:
            data.insert(pos, byte)
        elif op == 1 and pos < len(data):
            del data[pos]
        elif pos < len(data):
            data[pos] = byte
    return bytes(data)


EDITS = st.lists(
    st.tuples(
        st.integers(0, 10_000),
        st.integers(0, 2),
        st.sampled_from([0, 9, 10, 13, 32, 35, 45, 46, 48, 49, 51, 95, 0xC3, 0xFF, 0x22, 0x5B, 0x5D, 0x7B, 0x2C]),
    ),
    max_size=8,
)
CONLLU_BASE = UD.read_bytes()
COREF_BASE = (FIX / "coref_planted.jsonl").read_bytes()


@FUZZ
@given(data=st.binary(max_size=400), edits=EDITS)
def test_conllu_reader_fuzz_only_raises_input_file_error(data, edits):
    _read_bytes(read_conllu, data, ".conllu")
    _read_bytes(read_conllu, _mutate(CONLLU_BASE, edits), ".conllu")


@FUZZ
@given(data=st.binary(max_size=400), edits=EDITS)
def test_coref_reader_fuzz_only_raises_input_file_error(data, edits):
    _read_bytes(read_coref, data, ".jsonl")
    _read_bytes(read_coref, _mutate(COREF_BASE, edits), ".jsonl")


@FUZZ
@given(data=st.binary(max_size=400), max_chars=st.integers(1, 50))
def test_text_reader_fuzz_only_raises_input_file_error(data, max_chars):
    ts = _read_bytes(lambda p: read_text(p, max_line_chars=max_chars), data, ".txt")
    if ts is not None:
        assert all(len(line) <= max_chars and "\x00" not in line and not is_blank(line) for line in ts.lines)
        numbers = sorted(ts.line_numbers + tuple(n for n, _ in ts.skipped.entries))
        assert numbers == list(range(1, len(numbers) + 1))  # every line kept or skipped with its reason


WORD = st.text(st.sampled_from("abcdefgXYZ.,'-é\u05d0\U0001f600_#"), min_size=1, max_size=6)
RELATION = st.sampled_from(["nsubj", "obj", "nmod:poss", "obl:tmod", "det", "punct", "acl:relcl", "dep"])


@st.composite
def trees(draw):
    n = draw(st.integers(1, 12))
    order = draw(st.permutations(range(n)))
    heads = [0] * n
    heads[order[0]] = -1
    for k in range(1, n):
        heads[order[k]] = order[draw(st.integers(0, k - 1))]
    relations = [("root" if h == -1 else draw(RELATION)) for h in heads]
    multiword, i = [], 0
    while i < n - 1:
        if draw(st.booleans()) and draw(st.booleans()):
            end = draw(st.integers(i + 2, min(n, i + 3)))
            multiword.append((i, end, draw(WORD)))
            i = end
        else:
            i += 1
    return DependencySentence(
        words=tuple(draw(WORD) for _ in range(n)),
        heads=tuple(heads),
        relations=tuple(relations),
        upos=tuple(draw(st.sampled_from(["NOUN", "VERB", "_"])) for _ in range(n)),
        multiword=tuple(multiword),
        sent_id=draw(st.none() | st.text("abc019", min_size=1, max_size=5).map("s-".__add__)),
    )


@FUZZ
@given(sentences=st.lists(trees(), min_size=1, max_size=5))
def test_random_trees_round_trip_exactly(sentences):
    with tempfile.TemporaryDirectory() as d:
        p = write_conllu(Path(d) / "rt.conllu", sentences)
        back = read_conllu(p, full_labels=True)
    assert back.skipped.total == 0
    strip = [(s.words, s.heads, s.relations, s.upos, s.multiword, s.sent_id) for s in back]
    assert strip == [(s.words, s.heads, s.relations, s.upos, s.multiword, s.sent_id) for s in sentences]
    for s in back:
        assert_well_formed(s)


def test_grammar_validates_arguments():
    with pytest.raises(ValueError, match="need n >= 0 and 3 <= min_words <= max_words"):
        generate(3, min_words=10, max_words=5)
