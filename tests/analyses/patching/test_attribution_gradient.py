"""Attribution patching takes the total derivative ∂m/∂z: through the residual stream, later
MLPs and later heads' Q, K and V inputs. The planted induction circuit needs the last of
these: (0, 0) writes previous tokens that (1, 1) reads through its keys, so a gradient that
skips later heads (the ``bypass_heads`` variant, the estimate before this) gives (0, 0)
exactly nothing where the total one gives 0.272 in denoising."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from headscope.analyses.patching import PatchConfig, attribution_patching
from headscope.analyses.patching.activation import readout
from headscope.analyses.patching.attribution import z_gradients
from headscope.probes.models.inhouse.planted import planted_model, writing_induction

CFG = PatchConfig(n_perm=200, n_boot=50)


def _logprob64(logits, answer, wrong=None):  # the task's metric, in float64 for a finite difference
    return torch.log_softmax(logits.double(), -1).gather(-1, answer[:, None])[:, 0]


@pytest.mark.parametrize("layer", [0, 1])
def test_total_gradient_matches_a_finite_difference_through_both_layers(induction, layer):
    """A random direction u in layer ``layer``'s z: (m(z + εu) − m(z − εu)) / 2ε = ∇m · u per
    item, on a float64 copy of the planted model (layer 0's change reaches the metric through
    (1, 1)'s keys and queries as well as the residual stream). The model keeps softmax and
    RMSNorm in float32 as HF does, which bounds the difference's precision: ε = 1e-4 leaves
    ≤ 7e-4 relative error on any CPU measured, so 2e-3 is asserted; the gradient that skips later
    heads is off by more than 10% at layer 0."""
    model = writing_induction(planted_model())
    model.module.double()
    _, corrupted, answer, wrong, _ = next(induction.batches(12))
    _, grads = z_gradients(model, corrupted, _logprob64, answer, wrong)
    _, bypass = z_gradients(model, corrupted, _logprob64, answer, wrong, "bypass_heads")
    u = torch.randn(grads[layer].shape, generator=torch.Generator().manual_seed(layer), dtype=torch.float64)
    eps = 1e-4

    def metric_at(e):
        with model.head_hooks({layer: lambda z: z + e * u}):
            return _logprob64(readout(model, corrupted), answer)

    finite = (metric_at(eps) - metric_at(-eps)) / (2 * eps)
    analytic = (grads[layer] * u).sum((1, 2, 3))
    assert analytic.abs().max() > 1.0  # the direction moves the metric: the comparison has something to compare
    torch.testing.assert_close(analytic, finite, rtol=2e-3, atol=2e-3)
    skipping = (bypass[layer] * u).sum((1, 2, 3))
    if layer == 0:
        assert ((skipping - finite).abs() / finite.abs()).max() > 0.1
    else:  # nothing after the last layer's heads but the residual stream: the two agree
        torch.testing.assert_close(skipping, analytic, rtol=1e-12, atol=1e-12)


def test_the_previous_token_head_gets_its_path_through_the_induction_keys(planted, induction):
    total, _ = attribution_patching(planted, induction, CFG)
    bypass, _ = attribution_patching(planted, induction, dataclasses.replace(CFG, gradient="bypass_heads"))
    t = total.set_index(["method", "layer", "head"])["effect"]
    b = bypass.set_index(["method", "layer", "head"])["effect"]
    assert t[("attribution_denoising", 0, 0)] == pytest.approx(0.272, abs=0.005)
    assert abs(b[("attribution_bypass_heads_denoising", 0, 0)]) < 1e-12  # its only path runs through (1, 1)
    # the last layer has no later head: both estimates are the same there
    for h in range(4):
        assert t[("attribution_denoising", 1, h)] == pytest.approx(b[("attribution_bypass_heads_denoising", 1, h)])


def test_an_unknown_gradient_is_refused():
    with pytest.raises(ValueError, match="gradient must be"):
        PatchConfig(gradient="direct")
