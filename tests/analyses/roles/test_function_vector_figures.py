"""SmolLM2's function-vector figures (data/figures/function_vectors_smollm2.json, ``make
function-vectors``): consistent with themselves, and quoted verbatim in docs/guide/roles.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headscope.analyses.roles.icl_tasks import TASKS
from headscope.reports.tools.experiments.function_vectors import (
    LAYERS,
    OUT,
    default_line,
    headline,
    markdown_table,
    role_line,
)

DOC = Path(__file__).resolve().parents[3] / "docs" / "guide" / "roles.md"


@pytest.fixture(scope="module")
def data():
    return json.loads(OUT.read_text())


def test_the_docs_quote_the_figures(data):
    text = DOC.read_text()
    assert markdown_table(data) in text
    flat = " ".join(text.split())
    assert headline(data) in flat and role_line(data) in flat and default_line(data) in flat


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


def test_the_default_run_finds_the_studys_head_at_fewer_prompts(data):
    """``headscope roles`` runs the role at ``RolesConfig().fv_prompts`` prompts per task: cheaper than the
    study's count, and the study's one verdict (SmolLM2's L20H5) is its verdict too."""
    from headscope.analyses.roles.config import RolesConfig

    d, study = data["default_run"], data["role"]
    assert d["n_prompts"] == RolesConfig().fv_prompts < data["settings"]["n_prompts"]
    assert d["n_items"] == d["n_prompts"] * len(TASKS) and d["cpu_seconds"] < study["cpu_seconds"]
    assert d["verdicts"] == [study["best"]["head"]] == [d["best"]["head"]] and study["verdicts"] == 1
