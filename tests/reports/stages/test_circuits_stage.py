"""The report's "Circuits" stage: on the planted induction model its section draws the planted
edges at the smallest faithful budget, beside the random baseline; encoders and other backends are
blocked in one line; the figure is SVG drawn in Python, inline in the HTML and a file beside the
Markdown."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from headscope.analyses.circuits.edges.study import CircuitsConfig, run_circuits
from headscope.reports.document import Document, Figure, Table
from headscope.reports.html import render_html
from headscope.reports.markdown import render_markdown
from headscope.reports.stages.base import RunContext
from headscope.reports.stages.registry import STAGES

PLANTED = [
    "input -&gt; L0KV0 via v",
    "L0H0 -&gt; L1KV1 via k",
    "input -&gt; L1KV1 via v",
    "L1H1 -&gt; logits via logits",
]


@pytest.fixture(scope="module")
def planted_run(planted):
    cfg = CircuitsConfig(n_items=12, seq_len=8, steps=5, seeds=3, budgets=(0.01, 0.05, 0.2, 1.0))
    return run_circuits(planted, cfg)


def test_the_section_draws_the_planted_circuit_beside_the_random_baseline(planted_run):
    frames, summary = planted_run
    faith = frames["circuit_faithfulness"].set_index("budget")
    # 110 edges: budget 0.05 keeps 6 (none dangles), the 4 planted ones first, and is faithful; random ones are not
    assert summary["n_edges_total"] == 110 and faith.loc[0.05, "n_edges_pruned"] == 6
    assert faith.loc[0.05, "faithfulness"] == pytest.approx(1.0, abs=1e-3)
    assert faith.loc[0.05, "random_max"] < 0.5 and faith.loc[0.01, "faithfulness"] < 0.8
    assert summary["figure_budget"] == 0.05
    edges = frames["circuit_edges"]
    assert sorted(edges.loc[edges["kept_at"] <= 0.05, "rank"]) == [1, 2, 3, 4, 5, 6]
    top4 = edges.head(4).apply(lambda e: f"{e.sender} -&gt; {e.receiver} via {e.via}", axis=1)
    assert sorted(top4) == sorted(PLANTED)
    meta = {"circuits_summary": summary, "stages": {"circuits": {"status": "ran"}}, "absent": {}}
    (section,) = STAGES["circuits"].section(frames, meta)
    fig = next(b for b in section.blocks if isinstance(b, Figure))
    table = next(b for b in section.blocks if isinstance(b, Table))
    assert table.frame["budget"].tolist() == [0.01, 0.05, 0.2, 1.0]
    svg = ET.fromstring(fig.svg)  # well-formed XML
    assert svg.tag.endswith("svg") and len([e for e in svg.iter() if e.tag.endswith("line")]) == 6 + 5  # + legend
    assert all(e in fig.svg for e in PLANTED) and "faithfulness 1.000" in fig.svg and fig.png == b""
    html = render_html(Document(title="t", sections=[section]))
    assert '<figure id="fig-circuit"><svg' in html
    md, files = render_markdown(Document(title="t", sections=[section]))
    assert "![" in md and "(figures/circuit.svg)" in md and files["figures/circuit.svg"].startswith(b"<svg")


def test_a_turned_off_stage_has_no_section_and_a_blocked_one_says_why(planted_run):
    frames, _ = planted_run
    stage = STAGES["circuits"]
    off = {"stages": {"circuits": {"status": "off"}}, "absent": {"circuits": "off by default (--circuits ...)"}}
    assert stage.section({}, off) == []
    why = "edge circuits need next-token logits; minilm-l6 is an encoder"
    blocked = {"stages": {"circuits": {"status": "blocked"}}, "absent": {"circuits": why}}
    (section,) = stage.section({}, blocked)
    assert section.blocks[0].text == f"No edge circuit: {why}."
    assert stage.default_on is False and stage.by_design(why, "inhouse")


def test_encoders_and_other_backends_are_blocked_in_one_line(minilm, tiny_hf_llama):
    stage, cfg = STAGES["circuits"], CircuitsConfig()
    assert stage.blocker(RunContext(name="m", model=minilm), cfg) == (
        "edge circuits need next-token logits; minilm-l6 is an encoder"
    )
    why = stage.blocker(RunContext(name="t", model=tiny_hf_llama), cfg)
    assert why.startswith("edge circuits need the in-house backend; got backend 'hf'") and "\n" not in why


@pytest.fixture(scope="module")
def tiny_hf_llama(tmp_path_factory):
    from tiny_models import tiny_model_dir

    from headscope.probes.models.loading import load_model

    return load_model(str(tiny_model_dir(tmp_path_factory.mktemp("tiny"), "llama")), "hf")


def test_the_plan_sizes_one_gradient_per_receiver_input():
    from headscope.probes.budget import Shape
    from headscope.reports.stages.plans import EDGE_PER_RECEIVER, EDGE_PER_SENDER, circuit_stages

    s = Shape(n_layers=30, n_heads=9, n_kv_heads=3, d_model=576, d_head=64, d_mlp=1536, vocab_size=49152, causal=True)
    scores, evaluation = circuit_stages(s, batch_size=8, longest=19, n_items=8)
    per_item = (EDGE_PER_SENDER * 301 + EDGE_PER_RECEIVER * 481) * 19 * 576 * 4  # SmolLM2: 301 senders, 481 receivers
    assert scores.cache_per_row == per_item and scores.grad
    assert evaluation.cache_per_row == (2 * 301 + 9 + 6 + 1) * 19 * 576 * 4 and not evaluation.grad
    # the default batch (16) over 8 items: a batch holds the 8 there are (issue #38: the plan of 16 rows
    # was +84% on SmolLM2-135M's induction circuit, 5.28 GiB planned for a 2.87 GiB peak)
    assert circuit_stages(s, batch_size=16, longest=19, n_items=8) == [scores, evaluation]
    cfg = CircuitsConfig()
    assert (cfg.batch_size, cfg.n_items) == (16, 8)
    assert STAGES["circuits"].fitted(cfg, {"circuit scores": 8, "circuit evaluation": 8}) is cfg
    assert STAGES["circuits"].fitted(cfg, {"circuit scores": 3, "circuit evaluation": 8}).batch_size == 3


def test_quick_settings_say_what_full_adds():
    from headscope.analyses.circuits.edges.graph import MIB_BUDGETS

    stage = STAGES["circuits"]
    quick = stage.config(RunContext(name="m", seed=3))
    assert quick == CircuitsConfig(seed=3) and len(quick.budgets) == 6 and quick.n_items == 8
    assert stage.leaves_out(RunContext(name="m", seed=3), quick) == [
        "circuits: 8 items, 6 of MIB's 10 budgets, 3 random circuits each "
        "(--full: 16 items, all 10 budgets, 5 random circuits)"
    ]
    full = stage.config(RunContext(name="m", full=True))
    assert full.budgets == MIB_BUDGETS and full.n_items == 16 and full.seeds == 5
    assert stage.leaves_out(RunContext(name="m", full=True), full) == []
    with pytest.raises(ValueError, match="budget"):
        CircuitsConfig(budgets=(0.1, 1.5))
