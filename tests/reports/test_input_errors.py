"""Bad inputs found by fuzzing (issue #12): each is refused in one line that names the file
(and line or row) and what was expected, exit 2 and no traceback; items left out are
counted with their reason, never dropped silently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from cli_checks import cli_error

from headscope.analyses.frames import IMPACT_COLUMNS
from headscope.probes.corpora import (
    CorefItem,
    InputFileError,
    read_conllu,
    read_coref,
    read_text,
)
from headscope.reports.cli.app import build_parser, main


def flag_error(capsys, *argv) -> str:
    """Run the CLI on a bad flag value: exit 2 and one line (no usage block), before anything loads."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and re.match(r"headscope \w+: error: argument --[\w-]+: must be ", lines[0]), err
    return lines[0]


def conllu_line(i, form, head, rel="dep") -> str:
    return f"{i}\t{form}\t_\t_\t_\t_\t{head}\t{rel}\t_\t_"


GOOD_SENTENCE = "\n".join([conllu_line(1, "Dogs", 2, "nsubj"), conllu_line(2, "bark", 0, "root")]) + "\n\n"
ITEM = {
    "words": ["The", "big", "dog", "saw", "Mary", "and", "it", "ran"],
    "pronoun": 6,
    "candidates": [[0, 3], [4, 5]],
    "antecedent": 0,
}


@pytest.fixture
def shared_model(minilm, monkeypatch):
    """The CLI's load_model returns the session's MiniLM (loaded once for all tests)."""
    from headscope.probes.models import loading as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: minilm)
    return minilm


# --------------------------------------------- 1. overlapping coreference candidates


def test_overlapping_candidates_are_skipped_with_their_reason(tmp_path):
    p = tmp_path / "c.jsonl"
    overlap = dict(ITEM, candidates=[[0, 3], [2, 3]])  # one head word (dog) for both: every head scores 0 or 1
    nested = dict(ITEM, candidates=[[0, 5], [2, 3]], heads=[1, 2])
    p.write_text("\n".join(json.dumps(x) for x in (ITEM, overlap, nested)) + "\n")
    cs = read_coref(p)
    assert len(cs) == 1 and cs.skipped.entries == ((2, "overlapping_candidates"), (3, "overlapping_candidates"))
    with pytest.raises(
        InputFileError,
        match=re.escape(f"{p}:2:1: unusable item (overlapping_candidates): candidates 0 [0, 3) and 1 [2, 3) overlap"),
    ):
        read_coref(p, strict=True)


def test_coref_item_with_overlapping_candidates_is_refused():
    with pytest.raises(ValueError, match=r"overlapping_candidates.*candidates 0 \[0, 3\) and 2 \[1, 2\) overlap"):
        CorefItem(words=("a", "b", "c", "d", "it"), pronoun=4, candidates=((0, 3), (3, 4), (1, 2)), antecedent=0)
    CorefItem(words=("a", "b", "it"), pronoun=2, candidates=((0, 1), (1, 2)), antecedent=0)  # touching is fine


def test_only_overlapping_items_is_one_line_with_the_counts(tmp_path, capsys):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(dict(ITEM, candidates=[[0, 3], [2, 3]])) + "\n")
    line = cli_error(capsys, "roles", "--roles", "coreference", "--coref", p, "--out", tmp_path / "o")
    assert (
        f"{p}: no usable coreference items: 1 skipped (overlapping_candidates 1); first at line 1: "
        "candidates 0 [0, 3) and 1 [2, 3) overlap" in line
    )
    assert not (tmp_path / "o").exists()


def test_coref_words_with_spaces_or_empty_are_skipped(tmp_path):
    p = tmp_path / "c.jsonl"
    rows = [ITEM, dict(ITEM, words=["The", "big dog", *ITEM["words"][2:]]), dict(ITEM, words=["", *ITEM["words"][1:]])]
    p.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    assert read_coref(p).skipped.entries == ((2, "space_in_word"), (3, "empty_word"))


# --------------------------------------------------------- 2, 3. diff on bad tables


ROLES = pd.DataFrame(
    {
        "layer": [0, 0, 1],
        "head": [0, 1, 0],
        "role": ["r", "r", "r"],
        "relation": "",
        "direction": "",
        "score": [0.9, 0.5, 0.1],
        "verdict": [True, False, False],
        "n": 10,
    }
)


def _impact(value: float) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "study": "ablation:zero",
                "layer": 1,
                "head": 0,
                "step": None,
                "fraction_pruned": None,
                "metric": "delta_accuracy",
                "value": value,
                "spread": None,
                "seed": 0,
                "n": 8,
            }
        ],
        columns=IMPACT_COLUMNS,
    )


def _run(folder: Path, roles: pd.DataFrame | None = ROLES, impact: pd.DataFrame | None = None) -> Path:
    folder.mkdir(parents=True)
    if roles is not None:
        roles.to_csv(folder / "roles.csv", index=False)
    if impact is not None:
        impact.to_csv(folder / "ablation.csv", index=False)
    return folder


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: d.drop(columns="layer"),
            (
                r"roles\.csv: not a roles table \(missing column 'layer'\); expected CSV or "
                r"Parquet with columns layer, head, role, score, verdict"
            ),
        ),
        (
            lambda d: d.astype({"layer": object}).assign(layer=[0, "x", 1]),
            r"roles\.csv:row 2: layer must be an integer in \[0, 1023\]; got 'x'",
        ),
        (lambda d: d.assign(head=[0.0, None, 1.0]), r"roles\.csv:row 2: head must be an integer .*; got an empty cell"),
        (lambda d: d.assign(head=[0, 1.5, 1]), r"roles\.csv:row 2: head must be an integer .*; got 1\.5$"),
        (lambda d: d.assign(layer=[0, 0, -1]), r"roles\.csv:row 3: layer must be an integer in \[0, 1023\]; got -1$"),
        (lambda d: d.assign(layer=[0, 0, 10**30]), r"roles\.csv:row 3: layer must be an integer in \[0, 1023\]"),
        (
            lambda d: d.assign(score=[0.9, "high", 0.1]),
            r"roles\.csv:row 2: score must be a finite number \(or empty\); got 'high'",
        ),
        (lambda d: d.assign(score=[0.9, 0.5, float("inf")]), r"roles\.csv:row 3: score must be a finite number"),
        (
            lambda d: d.assign(verdict=[True, "maybe", False]),
            r"roles\.csv:row 2: verdict must be True or False; got 'maybe'",
        ),
        (lambda d: d.assign(role=["r", None, "r"]), r"roles\.csv:row 2: role must not be empty"),
        (lambda d: d.assign(n=[10, "many", 10]), r"roles\.csv:row 2: n must be a count"),
    ],
)
def test_diff_names_file_row_and_value_of_a_bad_roles_table(tmp_path, capsys, change, message):
    a = _run(tmp_path / "a", change(ROLES))
    b = _run(tmp_path / "b")
    line = cli_error(capsys, "diff", a, b, "--out", tmp_path / "d")
    assert re.search(message, line), line
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "name, data, message",
    [
        (
            "roles.csv",
            b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe",
            r"roles\.csv: not a roles table \(byte 0x89 at offset 0 is not UTF-8 text\)",
        ),
        (
            "roles.csv",
            "layer,head\n0,caf\xe9\n".encode("latin-1"),
            r"roles\.csv: not a roles table \(byte 0xe9 .*not UTF-8",
        ),
        ("roles.csv", b"\n", r"roles\.csv: not a roles table \(the file holds no header line\)"),
        (
            "roles.parquet",
            b"PAR1 not really parquet",
            r"roles\.parquet: not a roles table \(cannot be read as Parquet: ",
        ),
    ],
)
def test_diff_names_a_table_that_cannot_be_read(tmp_path, capsys, name, data, message):
    a = _run(tmp_path / "a", None)
    (a / name).write_bytes(data)
    b = _run(tmp_path / "b")
    assert re.search(message, cli_error(capsys, "diff", a, b, "--out", tmp_path / "d"))


def test_diff_names_bad_run_json_and_bad_importance_rows(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    (a / "run.json").write_text("{not json")
    assert re.search(r"a/run\.json: not valid JSON \(Expecting property name", cli_error(capsys, "diff", a, b))
    (a / "run.json").write_text(json.dumps({"architecture": {"layers": "six", "heads": 12}}))
    assert 'architecture.layers must be an integer in [1, 1024]; got "six"' in cli_error(capsys, "diff", a, b)
    (a / "run.json").write_text(json.dumps({"architecture": {"layers": 1, "heads": 12}}))
    assert "a table holds L1H0, outside the 1 × 12 heads" in cli_error(capsys, "diff", a, b)
    c = _run(tmp_path / "c", None, _impact(0.1).assign(head="x"))
    assert re.search(
        r"c/ablation\.csv:row 1: head must be an integer in \[0, 1023\]; got 'x'",
        cli_error(capsys, "diff", c, c, "--out", tmp_path / "d"),
    )


def test_diff_of_runs_with_no_role_in_common_is_refused(tmp_path, capsys):
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", ROLES.assign(role="q"))
    line = cli_error(capsys, "diff", a, b, "--out", tmp_path / "d")
    assert "nothing to compare between" in line and "no role in common (A: r; B: q)" in line
    assert not (tmp_path / "d").exists()
    # pruning tables from different studies: nothing in common either
    c = _run(tmp_path / "c", None, _impact(0.1))
    e = _run(tmp_path / "e", None, _impact(0.1).assign(study="importance"))
    assert "no per-head importance (study, layer, head, metric) in common" in cli_error(capsys, "diff", c, e)


def test_diff_says_what_it_could_not_compare(tmp_path, capsys):
    a = _run(tmp_path / "a", impact=_impact(0.1))
    b = _run(tmp_path / "b", ROLES.assign(role="q"), _impact(0.3))
    assert main(["diff", str(a), str(b), "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("note: no role in common (A: r; B: q)\n")
    assert "importance ablation:zero L1H0 delta_accuracy: 0.1 → 0.3 (+0.2)" in out
    both = pd.concat([ROLES, ROLES.assign(role="q")])
    c = _run(tmp_path / "c", both)
    assert main(["diff", str(a), str(c), "--out", str(tmp_path / "d2"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["notes"] == ["roles only in run B (gained/lost there mean measured in one run only): q"]


def test_diff_accepts_empty_optional_cells(tmp_path, capsys):
    roles = ROLES.assign(n=None, relation=None)  # no item counts, no relation: empty cells, not errors
    a, b = _run(tmp_path / "a", roles), _run(tmp_path / "b", roles.assign(score=[0.5, 0.9, 0.1]))
    assert main(["diff", str(a), str(b), "--out", str(tmp_path / "d")]) == 0
    assert "top-3 heads per role: the same heads in 1 of 1 roles (0 in the same order)" in capsys.readouterr().out


# ---------------------------------------------------------------- 4. prune --roles


@pytest.mark.parametrize(
    "name, data, message",
    [
        (
            "roles.bin",
            bytes(range(256)),
            (
                r"roles\.bin: not a roles table \(cannot be read as CSV: .*\); "
                r"expected CSV or Parquet with columns layer, head, role, score, verdict"
            ),
        ),
        ("roles.csv", "layer;head;r\xf4le\n".encode("latin-1"), r"roles\.csv: not a roles table \(byte 0xf4"),
        ("roles.csv", b"a,b\n1,2\n", r"roles\.csv: not a roles table \(missing column 'layer'\)"),
        ("roles.parquet", b"\x00" * 64, r"roles\.parquet: not a roles table \(cannot be read as Parquet"),
        (
            "roles.csv",
            b"layer,head,role,score,verdict\n0,0,r,0.5,yes please\n",
            r"roles\.csv:row 1: verdict must be True or False",
        ),
        ("nope.csv", None, r"nope\.csv: no such file; expected a roles table: CSV or Parquet"),
    ],
)
def test_prune_roles_file_that_is_not_a_roles_table(tmp_path, capsys, name, data, message):
    p = tmp_path / name
    if data is not None:
        p.write_bytes(data)
    line = cli_error(capsys, "prune", "minilm-l6", "--roles", p, "--out", tmp_path / "o")
    assert re.search(message, line) and str(p) in line, line
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------- 5. inputs with nothing usable


@pytest.mark.parametrize(
    "reader, name, text, message",
    [
        (
            read_conllu,
            "c.conllu",
            "# newdoc\n# only comments\n\n",
            "no usable sentences: the file holds only comment and blank lines; expected CoNLL-U sentences",
        ),
        (
            read_conllu,
            "c.conllu",
            "\n".join([conllu_line(1, "a", 2), conllu_line(2, "b", 1)]) + "\n\n" + conllu_line(1, "Hi", "_") + "\n",
            r"no usable sentences: all 2 sentences were skipped \(no_root 1, unannotated 1\); first at line 1: no_root",
        ),
        (read_text, "t.txt", "\n   \n\t\n", r"no sentences: every line is blank or skipped \(3 blank\)"),
        (
            read_text,
            "t.txt",
            "\n\x00\n",
            r"no sentences: every line is blank or skipped \(1 blank, 1 skipped \(nul_byte 1; first at line 2\)\)",
        ),
        (read_coref, "c.jsonl", "\n \n", "no usable coreference items: the file holds only blank lines"),
        (
            read_coref,
            "c.jsonl",
            json.dumps(dict(ITEM, pronoun=99)) + "\n",
            r"no usable coreference items: 1 skipped \(pronoun_out_of_range 1\); first at line 1: pronoun index 99",
        ),
    ],
)
def test_reader_refuses_a_file_with_nothing_usable(tmp_path, reader, name, text, message):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    with pytest.raises(InputFileError, match=f"^{re.escape(str(p))}: {message}"):
        reader(p)


@pytest.mark.parametrize(
    "flag, group, name, text",
    [
        ("--conllu", "syntactic", "c.conllu", "# only a comment\n"),
        ("--text", "positional", "t.txt", "\n\n"),
        ("--coref", "coreference", "c.jsonl", "\n"),
    ],
)
def test_roles_cli_refuses_an_input_with_nothing_usable(tmp_path, capsys, flag, group, name, text):
    p = tmp_path / name
    p.write_text(text)
    line = cli_error(capsys, "roles", "--roles", group, flag, p, "--out", tmp_path / "o")
    assert f"{p}: no " in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", [",", "", " , ,"])
def test_roles_flag_without_a_group(tmp_path, capsys, value):
    line = cli_error(capsys, "roles", "--roles", value, "--out", tmp_path / "o")
    assert line.startswith(f"headscope: error: --roles: no role group given (got {value!r}); choose from positional,")


# ----------------------------------- 6, 7. skip counts of same-named files; spaces in FORM


def test_conllu_word_with_a_space_is_skipped_as_such(tmp_path):
    p = tmp_path / "s.conllu"
    p.write_text(
        GOOD_SENTENCE
        + "# sent_id = ny\n"
        + "\n".join([conllu_line(1, "New York", 2, "nsubj"), conllu_line(2, "sleeps", 0, "root")])
        + "\n\n"
        + "\n".join([conllu_line(1, "a\u00a0b", 0, "root")])
        + "\n"
    )
    c = read_conllu(p)
    assert len(c) == 1 and c.skipped.entries == ((5, "space_in_word"), (8, "space_in_word"))
    with pytest.raises(
        InputFileError,
        match=re.escape(f"{p}:5:1: sentence is not usable (space_in_word): a word (FORM) contains a space"),
    ):
        read_conllu(p, strict=True)


def test_same_named_conllu_files_keep_their_own_skip_counts(tmp_path, capsys, shared_model):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = tmp_path / "a" / "x.conllu", tmp_path / "b" / "x.conllu"
    a.write_text(
        GOOD_SENTENCE + "\n".join([conllu_line(1, "New York", 2, "nsubj"), conllu_line(2, "sleeps", 0, "root")]) + "\n"
    )
    b.write_text(GOOD_SENTENCE + conllu_line(1, "Hi", "_") + "\n\n" + conllu_line(1, "Yo", "_") + "\n")
    rc = main(
        [
            "roles",
            "minilm-l6",
            "--roles",
            "syntactic",
            "--conllu",
            str(a),
            "--conllu",
            str(b),
            "--out",
            str(tmp_path / "o"),
            "--json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["skipped"] == {f"file:{a}": {"space_in_word": 1}, f"file:{b}": {"unannotated": 2}, "syntactic": {}}
    assert doc["n_items"] == {"syntactic": 2}
    assert json.loads((tmp_path / "o" / "skipped.json").read_text()) == doc["skipped"]


# ------------------------------------------------------------------ 8. numeric flags


@pytest.mark.parametrize(
    "argv, message",
    [
        (["card", "--context", "0"], "--context: must be an integer >= 1; got '0'"),
        (["card", "--context", "-5"], "--context: must be an integer >= 1; got '-5'"),
        (["card", "--context", "1e3"], "--context: must be an integer >= 1; got '1e3'"),
        (["roles", "--top", "0"], "--top: must be an integer >= 1; got '0'"),
        (["roles", "--top", "-1"], "--top: must be an integer >= 1; got '-1'"),
        (["roles", "--seed", "-1"], "--seed: must be an integer in [0, 2**32 - 1]; got '-1'"),
        (["roles", "--seed", str(2**63)], "--seed: must be an integer in [0, 2**32 - 1]; got '9223372036854775808'"),
        (["roles", "--seed", "9" * 5000], "--seed: must be an integer in [0, 2**32 - 1]; got '9999"),
        (["roles", "--batch-size", "0"], "--batch-size: must be an integer >= 1; got '0'"),
        (["roles", "--margin", "1.5"], "--margin: must be a number in [0, 1]; got '1.5'"),
        (["roles", "--margin", "nan"], "--margin: must be a number in [0, 1]; got 'nan'"),
        (["report", "--seed", "-3"], "--seed: must be an integer in [0, 2**32 - 1]; got '-3'"),
        (["diff", "a", "b", "--top", "0"], "--top: must be an integer >= 1; got '0'"),
        (["diff", "a", "b", "--top-heads", "-1"], "--top-heads: must be an integer >= 1; got '-1'"),
        (["prune", "--seeds", "0"], "--seeds: must be an integer >= 1; got '0'"),
        (["prune", "--seed", str(2**64)], "--seed: must be an integer in [0, 2**32 - 1]"),
        (["prune", "--n-items", "1"], "--n-items: must be an integer >= 2; got '1'"),
        (["prune", "--batch-size", "0"], "--batch-size: must be an integer >= 1; got '0'"),
        (["prune", "--max-fraction", "0"], "--max-fraction: must be a number in (0, 1]; got '0'"),
        (["prune", "--max-fraction", "inf"], "--max-fraction: must be a number in (0, 1]; got 'inf'"),
    ],
)
def test_bad_numeric_flag_is_refused_by_the_parser(capsys, argv, message):
    assert message in flag_error(capsys, *argv)


def test_prune_step_is_checked_before_the_model_loads(capsys):
    for step in ("0", "1.5", "nan"):
        assert "'step' parameter of PruneConfig must be in (0, 1]" in cli_error(capsys, "prune", "--step", step)


def test_boundary_flag_values_are_accepted():
    p = build_parser()
    assert p.parse_args(["card", "--context", "1"]).context == 1
    args = p.parse_args(["roles", "--seed", str(2**32 - 1), "--margin", "0", "--top", "1", "--batch-size", "1"])
    assert (args.seed, args.margin, args.top, args.batch_size) == (2**32 - 1, 0.0, 1, 1)
    args = p.parse_args(["prune", "--max-fraction", "1", "--n-items", "2", "--seeds", "1", "--seed", "0"])
    assert (args.max_fraction, args.n_items, args.seeds, args.seed) == (1.0, 2, 1, 0)


# ------------------------------------------------------------------------------- the Python API


def test_configs_refuse_seeds_past_the_generators_range():
    from headscope.analyses.pruning.study import PruneConfig
    from headscope.analyses.roles.config import RolesConfig

    for bad in (-1, 2**32, 2**63, 1.5, True):
        with pytest.raises(ValueError, match=r"'seed' parameter of RolesConfig must be an int in \[0, 2\*\*32 - 1\]"):
            RolesConfig(seed=bad)
        with pytest.raises(ValueError, match=r"'seed' parameter of PruneConfig must be an int in \[0, 2\*\*32 - 1\]"):
            PruneConfig(seed=bad)
    assert RolesConfig(seed=2**32 - 1).seed == PruneConfig(seed=2**32 - 1).seed == 2**32 - 1


def test_stream_counts_a_word_with_a_space_as_such_not_as_empty(minilm):
    from headscope.probes.capture import stream

    class Count:
        rows = 0

        def update(self, cap):
            self.rows += cap.batch_size if hasattr(cap, "batch_size") else len(cap.item_ids)

    report = stream(minilm, [["Dogs", "bark"], ["New York", "sleeps"], ["", "x"]], [Count()], words=True)
    assert dict(report.skipped) == {"space_in_word": 1, "empty": 1}
