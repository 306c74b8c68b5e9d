"""The in-house stack reproduces HF transformers (eager attention) in fp32, and the
transformer-lens bridge agrees with it, on real sentences of varied length in one
padded batch. Figures asserted: patterns ≤ 1e-5, final hidden states / logits ≤ 1e-4."""

from __future__ import annotations

import pytest

from headscope.probes.capture import capture


def _max_pattern_diff(a, b, n_layers, mask):
    # compare real query rows only (padded rows are never analysed)
    worst = 0.0
    for layer in range(n_layers):
        d = (a["pattern", layer] - b["pattern", layer]).abs().amax(dim=(1, 3))  # [batch, query_pos]
        worst = max(worst, d[mask].max().item())
    return worst


@pytest.mark.parametrize("name", ["minilm", "smollm"])
def test_inhouse_matches_hf_eager(name, request, sentences):
    ours = request.getfixturevalue(name)
    ref = request.getfixturevalue(f"{name}_hf")
    batch = ours.encode(sentences)
    assert batch.attention_mask.sum(1).tolist() != [batch.shape[1]] * len(sentences)  # really padded
    a = ours.run(batch, ["pattern"])
    b = ref.run(batch, ["pattern"])
    mask = batch.attention_mask.bool()
    assert _max_pattern_diff(a, b, ours.spec.n_layers, mask) <= 1e-5
    out_diff = (a["output", None] - b["output", None])[mask].abs().max().item()
    assert out_diff <= 1e-4


@pytest.mark.parametrize("name", ["minilm", "smollm"])
def test_bridge_matches_inhouse(name, request, sentences):
    ours = request.getfixturevalue(name)
    bridge = request.getfixturevalue(f"{name}_bridge")
    batch = ours.encode(sentences)
    a = ours.run(batch, ["pattern"])
    b = bridge.run(batch, ["pattern"])
    assert _max_pattern_diff(a, b, ours.spec.n_layers, batch.attention_mask.bool()) <= 1e-5


def test_bridge_keeps_kv_unexpanded_like_inhouse(smollm, smollm_bridge, sentences):
    batch = smollm.encode(sentences[:2])
    a = smollm.run(batch, ["k", "v"], layers=[3])
    b = smollm_bridge.run(batch, ["k", "v"], layers=[3])
    assert a["k", 3].shape == (2, 3, batch.shape[1], 64)
    assert b["k", 3].shape == a["k", 3].shape
    # the bridge's k is pre-RoPE like our hook_k
    assert (a["k", 3] - b["k", 3]).abs().max().item() <= 1e-4


def test_padding_does_not_change_a_sentence(minilm, smollm, sentences):
    for model in (minilm, smollm):
        alone = capture(model, sentences[1:2])
        padded = capture(model, sentences)
        n = alone.tokens.lengths[0]
        for layer in (0, model.spec.n_layers - 1):
            d = (alone["pattern", layer][0] - padded["pattern", layer][1, :, :n, :n]).abs().max().item()
            assert d <= 1e-5
            assert padded["pattern", layer][1, :, :n, n:].abs().max().item() == 0.0  # padding gets exactly 0


def test_smollm_predicts_text(smollm):
    """The dequantised checkpoint is a working language model, not random weights."""
    batch = smollm.encode(["The capital of France is Paris. The capital of Italy is Rome. The capital of Germany is"])
    logits = smollm.run(batch, [], layers=[])["output", None]
    top = smollm.tokenizer.decode([int(logits[0, -1].argmax())]).strip()
    assert top == "Berlin"
