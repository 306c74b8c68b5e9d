"""The graph forward of edge circuits: it is the model's forward, its receivers are where the
gradients are, GQA's k/v receivers are one per KV head, and pruning drops dangling edges."""

from __future__ import annotations

import copy

import pytest
import torch

from headscope.analyses.circuits.edges.graph import EdgeGraph, budget_edges, top_circuit
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.edge_forward import EdgeLayout, check_graph_model, graph_forward
from headscope.probes.models.inhouse.transformer import Transformer


def _tiny(family: str, **kw) -> InHouseModel:
    cfg = ModelConfig(family=family, n_layers=2, d_model=32, n_heads=4, vocab_size=50, max_positions=32, **kw)
    net = Transformer(cfg)
    net.init_weights(std=0.3, seed=1)  # large enough that every path moves the logits
    return InHouseModel(net)


@pytest.fixture(scope="module")
def gqa():
    return _tiny("llama", n_kv_heads=2)


@pytest.mark.parametrize("family,kw", [("llama", {"n_kv_heads": 2}), ("llama", {"n_kv_heads": 1}), ("gpt2", {})])
def test_graph_forward_is_the_models_forward(family, kw):
    model = _tiny(family, **kw)
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model.module(ids)[:, -1]
        got, outs, _ = graph_forward(model.module, ids)
    lay = EdgeLayout(n_layers=2, n_heads=4, n_kv_heads=kw.get("n_kv_heads", 4))
    assert outs.shape == (lay.n_senders, 3, 7, 32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_keep_all_is_the_clean_run_and_keep_none_the_corrupted_run(gqa):
    gen = torch.Generator().manual_seed(1)
    clean, corrupted = torch.randint(0, 50, (2, 6), generator=gen), torch.randint(0, 50, (2, 6), generator=gen)
    net = gqa.module
    with torch.no_grad():
        _, outs_x, _ = graph_forward(net, corrupted)
        lay = EdgeLayout(n_layers=2, n_heads=4, n_kv_heads=2)
        ones = torch.ones(lay.n_senders, lay.n_receivers)
        full, _, _ = graph_forward(net, clean, corrupted=outs_x, keep=ones)
        empty, _, _ = graph_forward(net, clean, corrupted=outs_x, keep=torch.zeros_like(ones))
        torch.testing.assert_close(full, net(clean)[:, -1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(empty, net(corrupted)[:, -1], rtol=1e-4, atol=1e-4)


def test_gqa_receivers_are_one_k_and_one_v_per_kv_head(gqa):
    g = EdgeGraph.of(EdgeLayout(n_layers=2, n_heads=4, n_kv_heads=2))
    layer1 = [r for r in g.receivers if r[0].startswith("L1")]
    assert layer1 == [(f"L1H{h}", "q") for h in range(4)] + [
        ("L1KV0", "k"),
        ("L1KV1", "k"),
        ("L1KV0", "v"),
        ("L1KV1", "v"),
    ]
    # edges: 12 attention receivers of layer 0 read the input; the MLP0 reads input + 4 heads;
    # layer 1's 8 attention receivers read 6 senders, MLP1 10, logits 11
    assert g.n_edges == 8 + 5 + 8 * 6 + 10 + 11


def test_each_receivers_gradient_is_the_first_order_change(gqa):
    """One gradient per receiver: moving only one receiver's input (a query head's q; KV head 1's
    k and v, read by query heads 2 and 3) a small step along its gradient changes the output by
    the first-order amount ``step · |gradient|``."""
    net = copy.deepcopy(gqa.module).double()  # float64 (the softmax stays float32, as in the model)
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(3))
    lay = EdgeLayout(n_layers=2, n_heads=4, n_kv_heads=2)
    with torch.enable_grad():
        logits, outs, probes = graph_forward(net, ids, grad_probes=True)
        grad = torch.cat(torch.autograd.grad(logits[0, 7], probes))  # [receiver, batch, pos, d_model]
    step = 1e-2
    for r in (lay.q_receiver(1, 0), lay.k_receiver(1, 1), lay.v_receiver(1, 1), lay.mlp_receiver(0)):
        keep = torch.ones(lay.n_senders, lay.n_receivers, dtype=torch.float64)
        keep[0, r] = 0.0  # the input's edge into receiver r alone reads the moved value
        moved_input = outs.detach().clone()
        moved_input[0] -= step * grad[r, 0] / grad[r, 0].norm()
        with torch.no_grad():
            moved, _, _ = graph_forward(net, ids, corrupted=moved_input, keep=keep)
        change = float(moved[0, 7] - logits[0, 7].detach())
        assert change == pytest.approx(-step * float(grad[r, 0].norm()), rel=1e-2), r


def test_prune_drops_dangling_edges():
    g = EdgeGraph.of(EdgeLayout(n_layers=2, n_heads=2, n_kv_heads=2))
    c = g.circuit_of(
        [
            ("input", "L0H0", "q"),  # L0H0 reached ...
            ("L0H0", "logits", "logits"),  # ... and read: kept
            ("L0H1", "L1H0", "q"),  # L0H1 has no input: dangling
            ("L1H0", "logits", "logits"),  # L1H0 is fed only by a dangling head: dropped too
            ("input", "L1H1", "q"),  # L1H1 reached but writes nowhere: dropped
        ]
    )
    kept = g.prune(c)
    assert (
        kept.sum() == 2 and kept[g.edge_index("input", "L0H0", "q")] and kept[g.edge_index("L0H0", "logits", "logits")]
    )


def test_budgets_and_top_edges():
    g = EdgeGraph.of(EdgeLayout(n_layers=1, n_heads=2, n_kv_heads=1))
    assert [budget_edges(b, g.n_edges) for b in (0.0, 0.01, 0.1, 0.5, 1.0)] == [0, 1, 1, 6, 11]
    with pytest.raises(ValueError, match="budget"):
        budget_edges(1.5, 11)
    scores = torch.zeros(g.valid.shape)
    scores[g.edge_index("L0H1", "logits", "logits")] = -3.0  # |score| ranks, sign aside
    scores[g.edge_index("input", "L0H0", "q")] = 2.0
    top = top_circuit(g, scores, 1)
    assert top.sum() == 1 and top[g.edge_index("L0H1", "logits", "logits")]


def test_refuses_what_the_graph_forward_would_not_reproduce(gqa):
    with pytest.raises(ModelIncompatibleError, match="pre-norm decoder.*encoder"):
        check_graph_model(_tiny("bert"))
    with gqa.module.kv_windows_set({(1, 0): (1, 2)}):
        with pytest.raises(ModelIncompatibleError, match="KV-cache window"):
            check_graph_model(gqa)
    mask = torch.ones(2, 4)
    mask[1, 2] = 0.0
    with gqa.module.gates_set(mask):
        with pytest.raises(ModelIncompatibleError, match="gates"):
            check_graph_model(gqa)
    assert check_graph_model(gqa) is gqa.module  # both undone on exit
