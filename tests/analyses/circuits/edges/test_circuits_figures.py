"""The committed SmolLM2 circuit study (``make circuits``, data/figures/circuits_smollm2.json): its
numbers hang together, and docs/guide/circuits.md quotes them as they are."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from headscope.analyses.circuits.edges.graph import MIB_BUDGETS, EdgeGraph, budget_edges
from headscope.probes.models.inhouse.edge_forward import EdgeLayout
from headscope.reports.tools.experiments.circuits_figures import HEADS, faithfulness_table

ROOT = Path(__file__).resolve().parents[4]
FIGURES = ROOT / "data" / "figures" / "circuits_smollm2.json"
DOC = ROOT / "docs" / "guide" / "circuits.md"


@pytest.fixture(scope="module")
def figures() -> dict:
    return json.loads(FIGURES.read_text())


def test_the_study_covers_smollm2s_whole_graph_at_mibs_budgets(figures):
    # SmolLM2-135M: 30 layers, 9 query heads, 3 KV heads
    assert figures["n_edges_total"] == EdgeGraph.of(EdgeLayout(n_layers=30, n_heads=9, n_kv_heads=3)).n_edges
    rows = figures["faithfulness"]
    assert [r["budget"] for r in rows] == list(MIB_BUDGETS)
    for r in rows:
        assert r["n_edges"] == budget_edges(r["budget"], figures["n_edges_total"])
        assert 0 <= r["n_edges_pruned"] <= r["n_edges"]
        assert r["random_min"] <= r["random_mean"] <= r["random_max"]
    full = rows[-1]
    assert full["faithfulness"] == pytest.approx(1.0, abs=1e-4) and full["random_mean"] == pytest.approx(1.0, abs=1e-4)
    assert figures["m_full"] > figures["m_empty"]  # the corruption costs the clean answer log-probability
    assert figures["task"]["n_items"] == 16 and figures["steps"] == 5 and figures["seeds"] == 5


def test_heads_and_the_key_edge_are_read_off_the_same_run(figures):
    assert set(figures["heads_in_circuit"]) == set(HEADS)
    for budgets in figures["heads_in_circuit"].values():
        assert set(budgets) <= set(MIB_BUDGETS)
    k = figures["k_edge"]
    assert k["edge"] == ["L16H0", "L18KV2", "k"] and 1 <= k["rank"] <= figures["n_edges_total"]
    assert math.isfinite(k["exact_effect"]) and math.isfinite(k["score"])


def test_the_guide_quotes_the_study(figures):
    text = DOC.read_text()
    assert faithfulness_table(figures) in text
    assert f"CPR {figures['cpr']:.3f}" in text and f"CMD {figures['cmd']:.3f}" in text
    assert f"random circuits' CPR {figures['random_cpr']:.3f}" in text
    k = figures["k_edge"]
    assert f"rank {k['rank']:,} of {figures['n_edges_total']:,}" in text
    assert f"EAP-IG score {k['score']:.2f} against an\nexact effect {k['exact_effect']:.2f}" in text
    assert f"`m(M)` {figures['m_full']:.2f}, `m(∅)` {figures['m_empty']:.2f}" in text
    secs = figures["seconds"]
    assert f"took {secs['scores']:.0f} s for the scores and {secs['faithfulness']:.0f} s" in text
    best = max(figures["faithfulness"][:-1], key=lambda r: r["faithfulness"])
    assert f"the best is\n{best['faithfulness']:.3f} at {best['budget']:g}" in text and best["faithfulness"] < 0.8
    first = {h: min(b) for h, b in figures["heads_in_circuit"].items()}
    assert first == {"L16H0": 0.001, "L18H6": 0.001, "L23H2": 0.001, "L23H7": 0.002, "L29H1": 0.002}
    assert all(b == sorted(b) and b[-1] == 1.0 for b in figures["heads_in_circuit"].values())


@pytest.mark.parametrize("task", ["ioi", "greater_than"])
def test_the_ioi_and_greater_than_studies_hang_together_and_the_guide_quotes_them(task):
    """``make circuits``' other two studies (``circuits_smollm2_<task>.json``): MIB's budgets, the
    whole graph at 1, the corruption costing the metric, and the guide's table and areas."""
    from headscope.reports.tools.experiments.circuits_figures import figures_name

    fig = json.loads((FIGURES.parent / figures_name(task)).read_text())
    assert fig["task"]["name"] == task and fig["steps"] == 5 and fig["seeds"] == 5
    assert "heads_in_circuit" not in fig and "k_edge" not in fig  # induction's own figures
    rows = fig["faithfulness"]
    assert [r["budget"] for r in rows] == list(MIB_BUDGETS)
    assert all(r["n_edges"] == budget_edges(r["budget"], fig["n_edges_total"]) for r in rows)
    assert rows[-1]["faithfulness"] == pytest.approx(1.0, abs=1e-4) and fig["m_full"] > fig["m_empty"]
    text = DOC.read_text()
    assert faithfulness_table(fig) in text
    assert f"CPR {fig['cpr']:.3f}, CMD {fig['cmd']:.3f}; the random circuits' CPR {fig['random_cpr']:.3f}" in text


def test_the_variants_reach_faithfulness_0_8_above_random_and_the_guide_quotes_them():
    """``make circuit-variants`` (circuits_smollm2_variants.json): on 8 induction items, EAP-IG with
    20 steps ranked by ``|score|`` reaches faithfulness 0.8 at budget 0.5 (5 steps: 0.829), far above
    random circuits of as many edges; the signed ranking does not; every variant's most faithful
    circuit holds the five patching heads."""
    from headscope.reports.tools.experiments.circuit_variants import variants_table

    doc = json.loads((FIGURES.parent / "circuits_smollm2_variants.json").read_text())
    assert doc["task"]["n_items"] == 8 and doc["seeds"] == 5 and doc["m_full"] > doc["m_empty"]
    budgets = [r["budget"] for r in doc["random"]]
    assert budgets == [0.02, 0.1, 0.2, 0.5]
    assert all([r["budget"] for r in rows] == budgets for rows in doc["variants"].values())
    at = {name: rows[-1]["faithfulness"] for name, rows in doc["variants"].items()}  # budget 0.5
    assert at["steps20"] >= 0.8 and at["abs"] >= 0.8 > at["signed"]
    assert at["abs"] > doc["random"][-1]["max"] + 0.5
    assert all(h["budget"] == 0.5 and h["heads"] == sorted(HEADS) for h in doc["heads_at_best"].values())
    text = DOC.read_text()
    assert variants_table(doc) in text
    flat = " ".join(text.split())
    assert f"reaches faithfulness {at['steps20']:.3f}" in flat and f"{at['abs']:.3f} with 5 steps" in flat
    assert f"took {doc['seconds']['scores']:.0f} s for the scores (5 and 20 steps)" in flat
