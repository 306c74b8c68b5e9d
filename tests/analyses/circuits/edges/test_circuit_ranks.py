"""The committed rank study (``make circuit-ranks``, data/figures/circuits_smollm2_ranks.json):
EAP-IG's scores of SmolLM2's top induction edges against their exact single-edge effects. Its
numbers hang together (the correlations recomputed from its own edges), and docs/guide/circuits.md
quotes them as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy.stats import pearsonr, spearmanr

ROOT = Path(__file__).resolve().parents[4]
FIGURES = ROOT / "data" / "figures" / "circuits_smollm2_ranks.json"
DOC = ROOT / "docs" / "guide" / "circuits.md"


@pytest.fixture(scope="module")
def ranks() -> dict:
    return json.loads(FIGURES.read_text())


def test_the_correlations_are_those_of_the_edges_written(ranks):
    edges = ranks["edges"]
    assert len(edges) == ranks["top"] == 200 and ranks["steps"] == 5 and ranks["task"]["name"] == "induction"
    scores = [e["score"] for e in edges]
    exact = [e["exact_effect"] for e in edges]
    assert [abs(s) for s in scores] == sorted((abs(s) for s in scores), reverse=True)  # the top 200 by |score|
    assert ranks["spearman"] == pytest.approx(spearmanr(scores, exact).statistic, abs=1e-12)
    assert ranks["spearman_abs"] == pytest.approx(
        spearmanr([abs(s) for s in scores], [abs(x) for x in exact]).statistic
    )
    assert ranks["pearson"] == pytest.approx(pearsonr(scores, exact).statistic, abs=1e-12)
    assert ranks["same_sign"] == sum((s > 0) == (x > 0) for s, x in zip(scores, exact))
    k = ranks["k_edge"]
    assert k["edge"] == ["L16H0", "L18KV2", "k"] and 1 <= k["rank"] <= ranks["n_edges_total"]
    if k["rank"] <= 200:
        row = edges[k["rank"] - 1]
        assert (row["sender"], row["receiver"], row["via"]) == ("L16H0", "L18KV2", "k")
        assert row["exact_effect"] == k["exact_effect"] and row["score"] == k["score"]


def test_the_guide_quotes_the_rank_study(ranks):
    text = DOC.read_text()
    k = ranks["k_edge"]
    assert f"Spearman {ranks['spearman']:.3f} between the EAP-IG scores and the exact effects" in text
    assert f"of their magnitudes {ranks['spearman_abs']:.3f}" in text and f"Pearson {ranks['pearson']:.3f}" in text
    assert f"{ranks['same_sign']} of the 200 share their sign" in text
    assert f"rank {k['rank']} (score {k['score']:.3f}, exact effect {k['exact_effect']:.3f})" in text
