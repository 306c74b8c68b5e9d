"""``headscope roles``: files written, figures in them, skipped counts, and input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from headscope.data import path
from headscope.probes.corpora import DependencySentence, read_conllu, write_conllu
from headscope.reports.cli.app import main
from headscope.reports.cli.roles import default_out

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture(scope="module")
def small_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("roles_in")
    sents = list(read_conllu(path("syntax/handwritten.conllu")).sentences[:15])
    # a word the WordPiece normaliser deletes (zero-width space): the sentence cannot align
    sents.append(
        DependencySentence(words=("Dogs", "\u200b", "bark"), heads=(2, 2, -1), relations=("nsubj", "dep", "root"))
    )
    conllu = write_conllu(d / "small.conllu", sents)
    # an unannotated sentence (HEAD "_"): the reader skips it and says so
    with open(conllu, "a", encoding="utf-8") as f:
        f.write("# sent_id = unannotated\n1\tHi\t_\t_\t_\t_\t_\t_\t_\t_\n\n")
    coref = d / "small.jsonl"
    coref.write_text(
        "".join(path("coref/coref.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:20]), encoding="utf-8"
    )
    text = d / "small.txt"
    text.write_text(
        "".join(path("text/sentences.txt").read_text(encoding="utf-8").splitlines(keepends=True)[:20]), encoding="utf-8"
    )
    return {"conllu": conllu, "coref": coref, "text": text}


@pytest.fixture(scope="module")
def cli_run(small_inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("roles_out")
    argv = [
        "roles",
        "minilm-l6",
        "--conllu",
        str(small_inputs["conllu"]),
        "--coref",
        str(small_inputs["coref"]),
        "--text",
        str(small_inputs["text"]),
        "--roles",
        "positional,special,summary,syntactic,coreference",
        "--out",
        str(out),
        "--seed",
        "3",
        "--json",
    ]
    return main(argv), out


def test_cli_writes_every_file(cli_run, capsys):
    rc, out = cli_run
    assert rc == 0
    for stem in ("roles", "head_stats", "clusters", "roles_by_head"):
        assert (out / f"{stem}.csv").exists() and (out / f"{stem}.parquet").exists()
    for name in ("skipped.json", "examples.json", "run.json"):
        assert (out / name).exists()
    csv = pd.read_csv(out / "roles.csv", keep_default_na=False)
    pq = pd.read_parquet(out / "roles.parquet")
    assert list(csv.columns) == list(pq.columns) and len(csv) == len(pq)
    pd.testing.assert_series_equal(csv.score, pq.score, check_exact=False, atol=1e-9)
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["seed"] == 3 and run["config"]["margin"] == 0.1
    assert run["n_items"] == {"positional": 20, "special": 20, "summary": 20, "syntactic": 15, "coreference": 20}


def test_cli_figures_in_the_files(cli_run):
    _, out = cli_run
    roles = pd.read_parquet(out / "roles.parquet")
    prev = roles[(roles.role == "positional:previous") & (roles.layer == 0) & (roles["head"] == 2)].iloc[0]
    assert prev.score == pytest.approx(1.0) and bool(prev.verdict)  # MiniLM L0H2: exact previous-token head
    assert set(roles.role) >= {"positional:previous", "special", "punctuation", "syntactic", "coreference:winograd"}
    assert (roles.role == "coreference:winograd").sum() == 72  # the file's first 20 lines: 10 Winograd pairs
    stats = pd.read_parquet(out / "head_stats.parquet")
    ent = stats[(stats.metric == "entropy") & (stats.layer == 0) & (stats["head"] == 2)].iloc[0]
    assert ent.value < 0.05 and ent.n == 20  # the previous-token head is nearly one-hot
    by_head = pd.read_parquet(out / "roles_by_head.parquet").set_index(["layer", "head"])
    assert "positional:previous" in by_head.loc[(0, 2), "roles"]
    ex = json.loads((out / "examples.json").read_text())
    assert ex["positional:previous"]["layer"] == 0 and ex["positional:previous"]["head"] == 2


def test_cli_skipped_counts(cli_run, small_inputs):
    _, out = cli_run
    skipped = json.loads((out / "skipped.json").read_text())
    assert skipped["syntactic"] == {"unaligned": 1}
    assert skipped["file:small.conllu"] == {"unannotated": 1}
    assert skipped["coreference"] == {}


def test_cli_json_summary(small_inputs, tmp_path, capsys):
    rc = main(
        [
            "roles",
            "minilm-l6",
            "--text",
            str(small_inputs["text"]),
            "--roles",
            "positional",
            "--out",
            str(tmp_path),
            "--json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    prev = [r for r in doc["top"] if r["role"] == "positional:previous"]
    assert [(r["layer"], r["head"], r["rank"]) for r in prev][0] == (0, 2, 1)
    assert prev[0]["score"] == pytest.approx(1.0) and doc["n_items"] == {"positional": 20}


@pytest.mark.parametrize(
    "flag,fixture,where",
    [
        ("--conllu", "bad_columns.conllu", "bad_columns.conllu:3:27: expected 10 tab-separated columns"),
        ("--coref", "coref_bad_json.jsonl", "coref_bad_json.jsonl:2:61: invalid JSON"),
    ],
)
def test_cli_malformed_input_exits_2_with_file_line_col(flag, fixture, where, tmp_path, capsys):
    rc = main(["roles", "minilm-l6", flag, str(FIXTURES / fixture), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("headscope: error: ") and where in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()  # failed before anything was written


def test_cli_unknown_role_group(capsys):
    assert main(["roles", "--roles", "syntax"]) == 2
    assert "unknown role group 'syntax'" in capsys.readouterr().err


def test_fv_prompts_flag_reaches_the_config_and_values_outside_2_to_10_are_refused(capsys):
    from headscope.reports.cli.app import build_parser
    from headscope.reports.cli.roles import _config

    assert _config(build_parser().parse_args(["roles", "smollm2-135m", "--fv-prompts", "8"])).fv_prompts == 8
    assert _config(build_parser().parse_args(["roles", "smollm2-135m"])).fv_prompts == 5
    for value, says in (("1", "must be an integer >= 2; got '1'"), ("11", "must be an integer <= 10")):
        assert main(["roles", "smollm2-135m", "--fv-prompts", value]) == 2
        assert says in capsys.readouterr().err


def test_default_out_dir():
    assert default_out("minilm-l6") == Path("runs/roles-minilm-l6")
    assert default_out("/models/SmolLM2 135M.gguf") == Path("runs/roles-SmolLM2_135M")


def test_help_lists_the_registered_role_groups(capsys, monkeypatch):
    """The roles help (the command's line in ``headscope --help`` and ``--roles``) is built from
    the role registry: a group registered at run time appears in both, and leaves with it."""
    from headscope.analyses.roles import REGISTRY, Role, register, unregister

    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at the terminal's width, inside long words too

    def finish(*a):
        raise AssertionError("the help never runs a role")

    def help_of(*argv) -> str:
        assert main([*argv, "--help"]) == 0
        return capsys.readouterr().out

    assert "positional,special,rare-word" in help_of("roles")
    from headscope.analyses.roles.pipeline import check_roles

    assert not [name for name, role in REGISTRY.items() if not role.default]  # every shipped group runs by default
    assert "function-vector" in check_roles(None) and "(default: all): " in help_of("roles")
    try:
        register(Role("toy-verdict", "text", "share", finish, finish))
        register(Role("toy-stats", "text", "none", finish, finish))
        register(Role("toy-costly", "text", "share", finish, finish, default=False))  # minutes of CPU: only when named
        assert "toy-costly" not in check_roles(None) and check_roles(["toy-costly"]) == ("toy-costly",)
        roles_help = help_of("roles")
        assert f"(default: all but toy-costly, which run only when named): {','.join(REGISTRY)}" in roles_help
        assert ",toy-verdict,toy-stats" in roles_help
        top = help_of()
        verdicts = [name for name, role in REGISTRY.items() if role.score_kind != "none"]
        assert f"classify every head: {', '.join(verdicts)}" in top and verdicts[-1] == "toy-costly"
        assert "toy-stats" not in top  # a group without verdicts classifies nothing
    finally:
        unregister("toy-verdict")
        unregister("toy-stats")
        unregister("toy-costly")
    assert "toy-verdict" not in help_of("roles")
