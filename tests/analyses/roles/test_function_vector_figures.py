"""SmolLM2's function-vector figures (data/figures/function_vectors_smollm2.json, ``make
function-vectors``): consistent with themselves, and quoted verbatim in docs/guide/roles.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headscope.analyses.roles.icl_tasks import TASKS
from headscope.reports.tools.experiments.function_vectors import LAYERS, OUT, headline, markdown_table

DOC = Path(__file__).resolve().parents[3] / "docs" / "guide" / "roles.md"


@pytest.fixture(scope="module")
def data():
    return json.loads(OUT.read_text())


def test_the_docs_quote_the_figures(data):
    text = DOC.read_text()
    assert markdown_table(data) in text
    assert headline(data) in " ".join(text.split())


def test_the_figures_hold_together(data):
    assert set(data["tasks"]) == set(TASKS) and data["settings"]["top_k"] == len(data["top_heads"])
    for t in data["tasks"].values():
        assert t["gain"] == pytest.approx(t["with_fv"] - t["zero_shot"])
        assert t["layer"] in LAYERS and t["validation"][str(t["layer"])] == max(t["validation"].values())
        for k in ("zero_shot", "with_fv", "with_random_heads"):  # shares of the held-out pairs
            assert t[k] * t["held_out"] == pytest.approx(round(t[k] * t["held_out"]), abs=1e-6)
        assert t["held_out"] == t["pairs"] - t["pairs"] // 2
    assert data["best_gain"] == max(t["gain"] for t in data["tasks"].values())
    cie = [h["cie"] for h in data["top_heads"]]
    assert cie == sorted(cie, reverse=True)
