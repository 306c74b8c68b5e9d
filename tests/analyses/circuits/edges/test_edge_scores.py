"""EAP and EAP-IG scores on a small random model: EAP approximates the exact single-edge
effects it estimates, and EAP-IG's interpolation starts at the corrupted input as the
reference implementation's does (alpha = k / steps, k = 0 ... steps - 1)."""

from __future__ import annotations

import pytest
import torch

from headscope.analyses.circuits.edges.attribution import EdgeConfig, edge_scores
from headscope.analyses.circuits.edges.evaluate import PatchedBatches, edge_effects
from headscope.analyses.patching.items import PairItem, Task
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.transformer import Transformer
from tests.analyses.patching.patching_cases import gap_items


@pytest.fixture(scope="module")
def small():
    """A 2-layer GQA Llama with small random weights (std 0.1: the metric is near linear in
    each edge) and 6 random minimal pairs scored by logit difference."""
    cfg = ModelConfig(family="llama", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, vocab_size=50, max_positions=32)
    net = Transformer(cfg)
    net.init_weights(std=0.1, seed=1)
    model = InHouseModel(net)
    return model, Task(name="gap", items=gap_items(model, 8, 6, 0), metric="logit_diff")


def test_eap_approximates_exact_single_edge_effects(small):
    model, task = small
    graph, eap = edge_scores(model, task, EdgeConfig(method="eap"))
    edges = [tuple(e) for e in graph.valid.nonzero().tolist()]
    exact = edge_effects(PatchedBatches.of(model, task), graph, edges)
    est = torch.stack([eap[e] for e in edges])
    assert torch.corrcoef(torch.stack([est, exact]))[0, 1] > 0.9  # measured 0.95 on this model
    top = exact.abs().argmax()
    assert torch.sign(est[top]) == torch.sign(exact[top])


def test_one_step_of_eap_ig_is_eap_at_the_corrupted_input(small):
    """With one step EAP-IG's only point is alpha = 0 (the corrupted run), so its scores are
    ``(a(x) - a(c)) · ∇m(x)``: minus EAP's on the task with clean and corrupted swapped."""
    model, task = small
    swapped = Task(
        name="swapped",
        items=[PairItem(it.corrupted, it.clean, it.answer, it.wrong) for it in task.items],
        metric=task.metric,
    )
    _, ig1 = edge_scores(model, task, EdgeConfig(method="eap-ig", steps=1))
    _, eap_swapped = edge_scores(model, swapped, EdgeConfig(method="eap"))
    torch.testing.assert_close(ig1, -eap_swapped, rtol=1e-4, atol=1e-6)
    _, ig5 = edge_scores(model, task, EdgeConfig(method="eap-ig", steps=5))
    assert not torch.allclose(ig5, ig1)  # more steps move away from the endpoint


def test_bad_configs_and_models_are_refused(small):
    with pytest.raises(ValueError, match="method must be one of"):
        EdgeConfig(method="acdc")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        EdgeConfig(steps=0)
    model, task = small
    with pytest.raises(ValueError, match="no usable items"):
        edge_scores(model, Task(name="empty", items=[], metric="logit_diff"))

    class Other:
        backend = "hf"

    with pytest.raises(ModelIncompatibleError, match="in-house backend"):
        edge_scores(Other(), task)


def test_one_step_of_eap_ig_activations_freezes_one_node_at_its_clean_value_per_run(small):
    """With one step every run is the clean run with one node's output held constant (the input,
    a layer's attention, an MLP: 2 · 2 + 1 = 5 runs), so the logits' gradient is EAP's in each,
    and the last MLP's input loses its only path in exactly one run: 4/5 of EAP's."""
    model, task = small
    graph, eap = edge_scores(model, task, EdgeConfig(method="eap"))
    _, act = edge_scores(model, task, EdgeConfig(method="eap-ig-activations", steps=1))
    lay = graph.layout
    logits, mlp1 = lay.logits_receiver, lay.mlp_receiver(1)
    torch.testing.assert_close(act[:, logits], eap[:, logits], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(act[:, mlp1], eap[:, mlp1] * 4 / 5, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(act, eap, atol=1e-6)
