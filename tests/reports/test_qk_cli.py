"""``headscope qk``: tables and run.json for a head on MiniLM-L6 (induction items and a sentence),
and its bad input in one line with exit 2."""

from __future__ import annotations

import json

import pandas as pd

from headscope.analyses.qk.frames import QK_COLUMNS
from headscope.reports.cli.app import main
from headscope.reports.runs import load_run
from tests.cli_checks import cli_error


def test_qk_writes_tables_and_run_json(tmp_path, capsys):
    out = tmp_path / "qk"
    argv = ["qk", "minilm-l6", "--head", "2.0", "--n-items", "3", "--seq-len", "5", "--out", out, "--json"]
    assert main([str(a) for a in argv]) == 0
    summary = json.loads(capsys.readouterr().out)
    s = summary["heads"]["2.0"]
    assert summary["forwards"] == 1 and s["n_items"] == 3 and s["max_relative_error"] <= 1e-5
    frame = pd.read_csv(out / "qk.csv", keep_default_na=False)
    assert frame.columns.tolist() == QK_COLUMNS
    key = frame[frame.side == "key"]
    assert len(key) == 4 + 2 * 13 and abs(key.share.sum() - 1.0) < 1e-4  # embed pos type bias + 2 layers x 13
    top = key[key["rank"] == 1].iloc[0]
    assert (top.key_component, round(top.share, 6)) == (s["top_key"]["component"], round(s["top_key"]["share"], 6))
    assert (out / "figures" / "qk_L2H0.png").read_bytes()[:4] == b"\x89PNG"
    run = json.loads((out / "run.json").read_text())
    assert run["output"]["kind"] == "qk" and run["heads"]["2.0"]["frozen"].startswith("every norm")
    back = load_run(out)  # read back like every other output
    assert back.kind == "qk" and len(back.tables["qk"]) == len(frame)


def test_qk_on_a_sentence_names_query_and_key(capsys):
    argv = ["qk", "minilm-l6", "--head", "1.4", "--sentence", "the cat sat on the mat", "--query-token", "mat"]
    assert main([*argv, "--key-token", "cat", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["heads"]["1.4"]
    assert s["n_items"] == 1 and s["n_skipped"] == 0


def test_head_outside_the_model_names_its_size(capsys):
    err = cli_error(capsys, "qk", "minilm-l6", "--head", "99.0")
    assert "6 layers (0-5) x 12 heads (0-11)" in err and "99.0" in err


def test_a_token_not_in_the_sentence_is_one_line(capsys):
    err = cli_error(capsys, "qk", "minilm-l6", "--head", "1.4", "--sentence", "the cat", "--query-token", "dog")
    assert "'dog' is not a token" in err
