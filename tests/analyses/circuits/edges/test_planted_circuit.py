"""The planted induction circuit found by edge attribution and evaluated by exact edge patching.

On the planted model (``writing_induction(planted_model())``, the conftest's ``planted``) the
induction behaviour runs through four edges: the input's token into the previous-token head's
value (``input -> L0KV0 v``), the previous-token head into the induction head's keys (``L0H0 ->
L1KV1 k``), the input's token into the induction head's value (``input -> L1KV1 v``) and the
induction head into the logits (``L1H1 -> logits``). Every other head writes nothing or reads
nothing that the corruption changes, and the MLPs are zero.
"""

from __future__ import annotations

import pytest
import torch

from headscope.analyses.circuits.edges.attribution import EdgeConfig, edge_scores
from headscope.analyses.circuits.edges.evaluate import (
    PatchedBatches,
    edge_effects,
    faithfulness,
    faithfulness_frame,
)
from headscope.analyses.circuits.edges.graph import top_circuit
from headscope.analyses.patching.activation import PatchConfig, activation_patching
from headscope.analyses.patching.path import path_patching
from headscope.analyses.patching.tasks import metric_fn

PLANTED = [
    ("input", "L0KV0", "v"),
    ("L0H0", "L1KV1", "k"),
    ("input", "L1KV1", "v"),
    ("L1H1", "logits", "logits"),
]
#: how far a circuit of exactly the planted edges may be from faithfulness 1 (float32 rounding)
FAITHFUL_TOL = 1e-3


@pytest.fixture(scope="module")
def scored(planted, induction):
    graph, ig = edge_scores(planted, induction, EdgeConfig(method="eap-ig", steps=5))
    _, eap = edge_scores(planted, induction, EdgeConfig(method="eap"))
    patched = PatchedBatches.of(planted, induction)
    edges = [tuple(e) for e in graph.valid.nonzero().tolist()]
    exact = torch.zeros(graph.valid.shape)
    exact[tuple(zip(*edges))] = edge_effects(patched, graph, edges)
    return graph, ig, eap, patched, exact


def _top(graph, scores, n):
    c = top_circuit(graph, scores, n)
    return {(graph.senders[s], *graph.receivers[r]) for s, r in c.nonzero().tolist()}


def test_eap_ig_ranks_the_planted_edges_first_and_their_circuit_is_faithful(scored):
    graph, ig, _, patched, _ = scored
    assert _top(graph, ig, len(PLANTED)) == set(PLANTED)
    circuit = graph.circuit_of(PLANTED)
    assert torch.equal(graph.prune(circuit), circuit)  # nothing planted dangles
    m_full, m_empty = patched.metric_of(graph.valid), patched.metric_of(torch.zeros_like(graph.valid))
    assert m_full - m_empty > 5.0  # the corruption breaks the induction (log-prob of the answer)
    assert faithfulness(patched.metric_of(circuit), m_full, m_empty) == pytest.approx(1.0, abs=FAITHFUL_TOL)


def test_the_smallest_budget_holding_the_planted_edges_is_faithful_beside_a_random_baseline(scored):
    graph, ig, _, patched, _ = scored
    frame, summary = faithfulness_frame(patched, graph, ig, [0.001, 0.05, 1.0], seeds=3)
    row = frame.set_index("budget").loc[0.05]  # 110 edges: 6 kept, the 4 planted ones survive pruning
    assert graph.n_edges == 110 and row["n_edges"] == 6
    assert row["faithfulness"] == pytest.approx(1.0, abs=FAITHFUL_TOL)
    assert row["random_max"] < 0.5  # chance circuits of the same size do not carry the behaviour
    assert frame.set_index("budget").loc[1.0, "faithfulness"] == pytest.approx(1.0, abs=1e-6)
    assert summary["cpr"] > summary["random_cpr"] + 0.3


def test_exact_patching_of_the_full_and_empty_circuits_is_the_clean_and_corrupted_runs(planted, induction, scored):
    graph, _, _, patched, _ = scored
    metric = metric_fn(induction.metric)
    clean = torch.tensor([it.clean for it in induction.items])
    corrupted = torch.tensor([it.corrupted for it in induction.items])
    answer = torch.tensor([it.answer for it in induction.items])
    with torch.no_grad():
        m_clean = float(metric(planted.module(clean)[:, -1], answer).mean())
        m_corrupted = float(metric(planted.module(corrupted)[:, -1], answer).mean())
    assert patched.metric_of(graph.valid) == pytest.approx(m_clean, abs=1e-4)
    assert patched.metric_of(torch.zeros_like(graph.valid)) == pytest.approx(m_corrupted, abs=1e-4)


def test_single_edge_effects_equal_path_and_activation_patching(planted, induction, scored):
    """Two independent computations of exact single-edge effects: path patching of (0, 0) into
    (1, 1) via k (noising) is the edge ``L0H0 -> L1KV1 k``; on this model (zero MLPs, head
    (1, 1) in the last layer) noising head (1, 1) alone is the edge ``L1H1 -> logits``."""
    graph, _, _, _, exact = scored
    cfg = PatchConfig(directions=("noising",), n_perm=10, n_boot=10)
    path, run = path_patching(planted, induction, receiver=(1, 1), via="k", senders=[(0, 0)], cfg=cfg)
    gap = float((run.clean - run.corrupted).mean())
    want_k = -float(path["effect"].iloc[0]) * gap  # frames hold (m_clean - m_patched) / mean gap
    assert float(exact[graph.edge_index("L0H0", "L1KV1", "k")]) == pytest.approx(want_k, rel=1e-4)
    act, _ = activation_patching(planted, induction, cfg)
    row = act[(act["layer"] == 1) & (act["head"] == 1)]
    want_logits = -float(row["effect"].iloc[0]) * gap
    assert float(exact[graph.edge_index("L1H1", "logits", "logits")]) == pytest.approx(want_logits, rel=1e-4)


def test_exact_effects_vanish_off_the_planted_edges(scored):
    graph, _, _, _, exact = scored
    planted_mask = graph.circuit_of(PLANTED)
    assert (exact[planted_mask] < -1.0).all()  # each planted edge alone costs over a nat of log-prob
    assert exact[~planted_mask].abs().max() < 1e-4


def test_eap_misses_the_saturated_key_edge_that_eap_ig_recovers(scored):
    """The induction head's softmax is saturated on the clean run (a logit gap of 30), so EAP's
    one gradient at the clean input sees nothing through its keys; EAP-IG's gradients along the
    path from the corrupted input do, with the sign of every planted edge's exact effect."""
    graph, ig, eap, _, exact = scored
    k_edge = graph.edge_index("L0H0", "L1KV1", "k")
    assert abs(float(eap[k_edge])) < 1e-6 * float(eap.abs().max())
    assert abs(float(ig[k_edge])) > 0.01 * float(ig.abs().max())
    for e in PLANTED:
        assert torch.sign(ig[graph.edge_index(*e)]) == torch.sign(exact[graph.edge_index(*e)])


def test_eap_ig_activations_also_ranks_the_planted_edges_first(planted, induction):
    graph, act = edge_scores(planted, induction, EdgeConfig(method="eap-ig-activations", steps=5))
    assert _top(graph, act, len(PLANTED)) == set(PLANTED)
