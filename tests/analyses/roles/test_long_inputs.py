"""``headscope roles --max-tokens N``: the text corpus joined into passages of at most N tokens
(a longer line cut), the text roles run on them in query chunks; run.json says what was done."""

from __future__ import annotations

import json

import pytest

from headscope.analyses.roles.inputs import default_text
from headscope.analyses.roles.long_inputs import LongInputError, passages
from headscope.probes.corpora import read_text
from headscope.probes.tokens import tokenize_one
from headscope.reports.cli.app import main

SHIPPED = read_text(default_text()).lines


def test_passages_keep_every_line_in_order_within_the_budget(minilm):
    lines = SHIPPED[:60]
    out, starts, cut = passages(minilm.tokenizer, lines, 120)
    assert cut == 0 and starts[0] == 0 and starts == sorted(starts) and len(out) < len(lines)
    assert " ".join(out) == " ".join(l.strip() for l in lines)  # nothing lost, nothing repeated
    sizes = [len(tokenize_one(minilm.tokenizer, text=p)["ids"]) for p in out]
    assert max(sizes) <= 120 and min(sizes[:-1]) > 60  # a passage closes only when the next line does not fit


def test_a_line_longer_than_the_budget_is_cut_and_counted(minilm):
    long_line = " ".join(["word"] * 200)
    out, starts, cut = passages(minilm.tokenizer, ["A cat sat.", long_line, "A dog ran."], 50)
    assert cut == 1 and starts == [0, 1, 2]
    assert len(tokenize_one(minilm.tokenizer, text=out[1])["ids"]) <= 50 and out[1].startswith("word word")
    with pytest.raises(LongInputError, match=">= 8"):
        passages(minilm.tokenizer, ["x"], 3)


def test_roles_on_passages_records_them_in_run_json(tmp_path, capsys):
    text = tmp_path / "long.txt"
    text.write_text("\n".join(SHIPPED[:40]) + "\n", encoding="utf-8")
    out = tmp_path / "r"
    argv = ["roles", "minilm-l6", "--roles", "summary,positional", "--text", str(text), "--max-tokens", "200"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    doc = json.loads((out / "run.json").read_text(encoding="utf-8"))
    rec = doc["long_text"]
    assert rec["max_tokens"] == 200 and rec["lines"] == 40 and rec["lines_cut"] == 0 and 1 < rec["passages"] < 40
    assert doc["n_items"]["summary"] == rec["passages"]
    assert doc["pattern_statistics"] == {"text": "chunked (query chunk 128)"}  # passages longer than a chunk
    assert rec["sliding_windows"] == []  # MiniLM has none


def test_max_tokens_past_the_context_is_refused_in_one_line(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("A cat sat.\n", encoding="utf-8")
    argv = ["roles", "minilm-l6", "--roles", "summary", "--text", str(text), "--max-tokens", "4096"]
    assert main([*argv, "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["headscope: error: --max-tokens 4096 is past the model's context of 512 positions"]


def test_sliding_windows_are_read_from_the_layers(minilm):
    from headscope.analyses.roles.long_inputs import sliding_windows
    from tests.chunk_cases import family_model

    assert sliding_windows(family_model("mistral")[0]) == [8] and sliding_windows(minilm) == []
    assert sliding_windows(family_model("gemma3_text")[0]) == [8]
