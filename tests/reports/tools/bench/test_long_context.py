"""``headscope bench --long-context``: one long text through the text roles, patterns in query
chunks against stored ones, each measured in its own process; and the long texts it builds."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from headscope.analyses.roles.long_inputs import LongInputError, cut_to_tokens, long_text
from headscope.probes.tokens import tokenize_one
from headscope.reports.cli.app import main
from headscope.reports.tools.bench.long_context import (
    LONG_COLUMNS,
    fit_exponent,
    long_context_child,
    long_context_summary,
    parse_lengths,
)


@pytest.mark.parametrize("n", [8, 37, 300, 511])
def test_long_text_has_at_most_and_about_the_tokens_asked(minilm, n):
    text = long_text(minilm.tokenizer, n, seed=1)
    got = len(tokenize_one(minilm.tokenizer, text=text)["ids"])
    assert n - 2 <= got <= n, (n, got)
    assert long_text(minilm.tokenizer, n, seed=1) == text  # seeded


def test_long_text_from_a_short_file_repeats_its_lines(minilm, tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("A cat sat.\n\n", encoding="utf-8")
    text = long_text(minilm.tokenizer, 120, corpus=str(f))
    assert text.startswith("A cat sat. A cat sat.") and 115 <= len(tokenize_one(minilm.tokenizer, text=text)["ids"])
    short = "A cat sat."
    assert cut_to_tokens(minilm.tokenizer, short, 100) == short


@pytest.mark.parametrize("bad", [7, 0, 10**6, True])
def test_long_text_refuses_a_length_it_cannot_build(minilm, bad):
    with pytest.raises(LongInputError, match="tokens"):
        long_text(minilm.tokenizer, bad)


def test_one_measured_run_per_path_says_which_path_ran(tmp_path):
    from tests.tiny_models import tiny_model_dir

    tiny = str(tiny_model_dir(tmp_path, "bert"))  # 2 layers x 4 heads, 128 positions: the plumbing
    rows = {p: long_context_child(tiny, 120, p) for p in ("chunked", "stored")}
    assert rows["chunked"]["pattern_statistics"] == "chunked (query chunk 128)"
    assert rows["stored"]["pattern_statistics"] == "materialised (query chunks off)"
    for r in rows.values():
        assert list(r) == LONG_COLUMNS and r["status"] == "ok" and r["seconds"] > 0 and r["growth_mb"] >= 0
        assert r["stored_patterns_mb"] == pytest.approx(2 * 4 * 120 * 120 * 4 / 2**20)


def test_summary_relates_the_paths_at_the_target_length():
    frame = pd.DataFrame(
        [
            {"tokens": n, "path": p, "status": "ok", "growth_mb": g, "seconds": s}
            for n, p, g, s in [
                (1024, "chunked", 50.0, 1.0),
                (2048, "chunked", 100.0, 2.2),
                (1024, "stored", 400.0, 1.0),
                (2048, "stored", 1600.0, 2.0),
            ]
        ]
    )
    s = long_context_summary(frame)
    assert s["memory_ratio"] == pytest.approx(100 / 1600) and s["memory_met"] is True
    assert s["time_ratio"] == pytest.approx(1.1) and s["time_met"] is True
    assert s["exponents"]["chunked"] == pytest.approx(1.0) and s["exponents"]["stored"] == pytest.approx(2.0)
    missing = long_context_summary(frame[frame.path == "chunked"])
    assert math.isnan(missing["memory_ratio"]) and missing["memory_met"] is None and missing["exponent_met"] is True
    assert math.isnan(fit_exponent([512], [3.0]))


@pytest.mark.parametrize("bad", ["", "1", "512,x", "512,70000"])
def test_bad_lengths_are_refused_in_one_line(bad, capsys):
    with pytest.raises(ValueError):
        parse_lengths(bad)
    assert main(["bench", "--long-context", "--long-lengths", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("headscope: error: --long-lengths")
