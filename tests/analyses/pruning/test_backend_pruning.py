"""Ablation and gradient importance on every backend: the HF backend (hooks on the HF
modules) and the transformer-lens bridge (``hook_z``) give the in-house backend's figures
on both shipped models — values within 1e-4, Spearman ≥ 0.99 across heads — through the
one head hook every study is built on (:meth:`Backend.head_hooks`)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import spearmanr

from headscope.analyses.pruning.gates import head_gates, replica_masks
from headscope.analyses.pruning.importance import head_importance
from headscope.analyses.pruning.masks import head_masks
from headscope.analyses.pruning.metrics import build_metric, default_metric
from headscope.analyses.pruning.scoring import evaluate


def _figures(model, n_items, layers):
    """Single-head zero ablation of every head of ``layers`` (delta of the metric) and the
    gradient importance of every head of the model."""
    metric = build_metric(default_metric(model.spec), model, n_items=n_items, batch_size=n_items)
    spec = model.spec
    heads = [(l, h) for l in layers for h in range(spec.n_heads)]
    masks = torch.cat(
        [
            torch.ones(1, spec.n_layers, spec.n_heads),
            head_masks(n_layers=spec.n_layers, n_heads=spec.n_heads, heads=heads),
        ]
    )
    values, weights = evaluate(model, metric, masks)
    agg = metric.aggregate(values, weights)
    delta = (agg[1:] - agg[0]).numpy()
    imp = head_importance(model, metric).flatten().numpy()
    return delta, imp


_INHOUSE: dict = {}


# MiniLM: every head; SmolLM2: the heads of 3 of its 30 layers (27 heads; all 270 cost about
# 45 s of CPU per backend, which the README's figures and the bench measure, not this test)
@pytest.mark.slow
@pytest.mark.parametrize("name, n_items, layers", [("minilm", 8, range(6)), ("smollm", 4, (0, 14, 29))])
@pytest.mark.parametrize("backend", ["hf", "bridge"])
def test_backends_agree_on_ablation_and_importance(name, n_items, layers, backend, request):
    ours = request.getfixturevalue(name)
    other = request.getfixturevalue(f"{name}_{backend}")
    if name not in _INHOUSE:  # the in-house figures once per model, for both other backends
        _INHOUSE[name] = _figures(ours, n_items, layers)
    d_ours, i_ours = _INHOUSE[name]
    d_other, i_other = _figures(other, n_items, layers)
    assert len(d_ours) == len(layers) * ours.spec.n_heads == len(d_other)
    assert len(i_ours) == ours.spec.n_layers * ours.spec.n_heads == len(i_other)
    assert abs(d_ours - d_other).max() <= 1e-4
    assert abs(i_ours - i_other).max() <= 1e-4
    assert spearmanr(d_ours, d_other).statistic >= 0.99
    assert spearmanr(i_ours, i_other).statistic >= 0.99
    assert (i_ours > 0).all()  # every head gets a gradient: the comparison orders real values


@pytest.mark.parametrize("backend", ["inhouse", "hf", "bridge"])
def test_head_hooks_gate_one_head_exactly(backend, request, sentences):
    """Gating a head off through the hooks equals zeroing its ``z`` by hand, on every
    backend; all-ones gates change nothing; the hooks are gone afterwards."""
    model = request.getfixturevalue("minilm" if backend == "inhouse" else f"minilm_{backend}")
    batch = model.encode(sentences[:3])
    spec = model.spec
    mask = torch.ones(spec.n_layers, spec.n_heads)
    mask[2, 5] = 0.0
    with torch.inference_mode():
        plain = model.forward(batch.input_ids, batch.attention_mask)
        with head_gates(model, torch.ones_like(mask)):
            same = model.forward(batch.input_ids, batch.attention_mask)
        with head_gates(model, mask):
            gated = model.forward(batch.input_ids, batch.attention_mask)

        def zero(z):
            z = z.clone()
            z[:, 5] = 0
            return z

        with model.head_hooks({2: zero}):
            by_hand = model.forward(batch.input_ids, batch.attention_mask)
        with replica_masks(model, mask[None]):
            replica = model.forward(batch.input_ids, batch.attention_mask)
        after = model.forward(batch.input_ids, batch.attention_mask)
    assert torch.equal(plain, same) and torch.equal(plain, after)
    assert torch.equal(gated, by_hand) and torch.equal(gated, replica)
    assert (gated - plain).abs().max() > 1e-3  # the head matters


def test_hf_backend_finds_every_family_s_heads():
    """The HF backend's module map (:mod:`headscope.probes.models.hf_layout`) on tiny random
    models of every family: one attention output projection per layer taking heads × d_head."""
    from tiny_models import FAMILIES, tiny_hf_model

    from headscope.probes.models.arch import arch_from_hf_config
    from headscope.probes.models.backends.protocol import spec_from_arch
    from headscope.probes.models.hf_layout import find_layout

    for family in FAMILIES:
        hf, _ = tiny_hf_model(family)
        spec = spec_from_arch(arch_from_hf_config(hf.config.to_dict(), family), family, "hf")
        layout = find_layout(hf, spec)
        assert len(layout.attn_out) == len(layout.blocks) == spec.n_layers, family
