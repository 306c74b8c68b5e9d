"""Physical pruning: the pruned model computes what the gated model computes."""

from __future__ import annotations

import json

import pytest
import torch

from headscope.probes.errors import CheckpointError
from headscope.probes.models.inhouse.physical import (
    count_params,
    gates_off,
    half_of_heads,
    heads_held,
    kv_heads_held,
    load_pruned,
    prune_heads,
    pruning_gain,
    save_pruned,
)

MINILM_HEADS = {0: [1, 5], 3: list(range(12))}


def _outputs(model, batch):
    with torch.inference_mode():
        return model.module(batch.input_ids, batch.attention_mask)


def _max_diff(a, b, batch):
    real = batch.attention_mask.bool()  # padded positions carry no output anyone reads
    return (a - b)[real].abs().max().item()


@pytest.fixture(scope="module")
def minilm_batch(minilm, sentences):
    return minilm.encode(texts=sentences)


@pytest.fixture(scope="module")
def minilm_pruned(minilm):
    return prune_heads(minilm, MINILM_HEADS)


def test_minilm_pruned_equals_gated(minilm, minilm_batch, minilm_pruned):
    with gates_off(minilm, MINILM_HEADS):
        gated = _outputs(minilm, minilm_batch)
    pruned = _outputs(minilm_pruned, minilm_batch)
    full = _outputs(minilm, minilm_batch)
    assert _max_diff(gated, pruned, minilm_batch) <= 1e-5  # measured 1.9e-6
    assert _max_diff(full, pruned, minilm_batch) > 0.5  # the heads did matter (measured 1.58)
    blocks = minilm_pruned.module.blocks
    assert heads_held(minilm_pruned)[0] == (0, 2, 3, 4, 6, 7, 8, 9, 10, 11)
    assert blocks[0].attn.q_proj.weight.shape == (320, 384) and blocks[0].attn.o_proj.weight.shape == (384, 320)
    assert blocks[3].attn.q_proj.weight.shape == (0, 384) and blocks[3].attn.o_proj.bias.shape == (384,)
    torch.testing.assert_close(blocks[3].attn.o_proj.bias, minilm.module.blocks[3].attn.o_proj.bias, rtol=0, atol=0)
    # the gates of the source model are back on, the source weights untouched
    assert all(bool((g == 1).all()) for g in minilm.module.gates)
    assert minilm.module.blocks[0].attn.q_proj.weight.shape == (384, 384)
    assert count_params(minilm.module, attention_only=True) - count_params(
        minilm_pruned.module, attention_only=True
    ) == (14 * (4 * 384 * 32 + 3 * 32))


def test_minilm_mean_ablation_is_folded_into_bias(minilm, minilm_batch):
    heads = {1: [2, 7]}
    attn = minilm.module.blocks[1].attn
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(2, 32, generator=gen)
    try:
        with torch.no_grad():
            attn.ablation_value[[2, 7]] = mean
            attn.gate[[2, 7]] = 0.0
        gated = _outputs(minilm, minilm_batch)
        pruned = prune_heads(minilm, heads)
    finally:
        with torch.no_grad():
            attn.ablation_value.zero_()
            attn.gate.fill_(1.0)
    assert _max_diff(gated, _outputs(pruned, minilm_batch), minilm_batch) <= 1e-5


def test_prune_composes_and_keeps_gates(minilm, minilm_batch, minilm_pruned):
    step = prune_heads(prune_heads(minilm, {0: [1]}), {0: [5], 3: list(range(12))})
    assert heads_held(step) == heads_held(minilm_pruned)
    assert _max_diff(_outputs(step, minilm_batch), _outputs(minilm_pruned, minilm_batch), minilm_batch) == 0.0
    with pytest.raises(ValueError, match="cannot prune head 5"):
        prune_heads(minilm_pruned, {0: [5]})
    with pytest.raises(ValueError, match="layers 0..5"):
        prune_heads(minilm, {6: [0]})
    with pytest.raises(TypeError, match="InHouseModel"):
        prune_heads("minilm", {0: [0]})


def test_gates_off_restores_on_exception(minilm):
    with pytest.raises(RuntimeError, match="boom"):
        with gates_off(minilm, {2: [4]}):
            assert minilm.module.blocks[2].attn.gate[4].item() == 0.0
            raise RuntimeError("boom")
    assert minilm.module.blocks[2].attn.gate[4].item() == 1.0


def test_smollm_pruned_equals_gated(smollm, sentences):
    # layer 2: the whole KV group 0 (query heads 0, 1, 2) goes; layer 5: heads 4 and 7 of
    # groups 1 and 2 go, both groups keep a reader, so all 3 KV heads stay.
    heads = {2: [0, 1, 2], 5: [4, 7]}
    batch = smollm.encode(texts=[sentences[0], sentences[1], sentences[3]])
    pruned = prune_heads(smollm, heads)
    held = kv_heads_held(pruned)
    assert held[2] == 2 and held[5] == 3 and held[0] == 3
    assert pruned.module.blocks[2].attn.k_proj.weight.shape == (128, 576)
    assert pruned.module.blocks[5].attn.kv_index.tolist() == [0, 0, 0, 1, 1, 2, 2]
    with gates_off(smollm, heads):
        gated = _outputs(smollm, batch)
    # float32: summation order in o_proj differs; logits of scale ~40 move by 4.5e-5 (measured)
    assert _max_diff(gated, _outputs(pruned, batch), batch) <= 2e-4
    # float64: the two models are the same function (measured 0.0)
    try:
        smollm.module.double()
        pruned.module.double()
        with gates_off(smollm, heads):
            gated64 = _outputs(smollm, batch)
        assert _max_diff(gated64, _outputs(pruned, batch), batch) <= 1e-5
    finally:
        smollm.module.float()  # float32 -> float64 -> float32 is exact: the fixture is unchanged


def test_save_load_round_trip(minilm_pruned, minilm_batch, tmp_path):
    out = save_pruned(minilm_pruned, tmp_path / "pruned")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pruned"]  # no temp dir left behind
    cfg = json.loads((out / "headscope_config.json").read_text())
    assert cfg["heads_kept"][3] == [] and cfg["heads_kept"][0] == [0, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    loaded = load_pruned(out)
    assert loaded.tokenizer is not None
    again = loaded.encode(texts=minilm_batch.texts)
    assert torch.equal(again.input_ids, minilm_batch.input_ids)
    assert torch.equal(_outputs(loaded, minilm_batch), _outputs(minilm_pruned, minilm_batch))
    with pytest.raises(ValueError, match="already exists"):
        save_pruned(minilm_pruned, out)
    save_pruned(minilm_pruned, out, overwrite=True)
    assert torch.equal(_outputs(load_pruned(out), minilm_batch), _outputs(minilm_pruned, minilm_batch))


def test_save_refuses_gated_model(minilm, tmp_path):
    with gates_off(minilm, {0: [3]}):
        with pytest.raises(ValueError, match=r"heads \[3\] are not 1"):
            save_pruned(minilm, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_mismatched_and_corrupt_checkpoints(minilm_pruned, tmp_path):
    from safetensors.torch import load_file, save_file

    out = save_pruned(minilm_pruned, tmp_path / "m")
    state = load_file(str(out / "model.safetensors"))
    state["blocks.4.attn.v_proj.weight"] = state["blocks.4.attn.v_proj.weight"][:352]
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'blocks.4.attn.v_proj.weight' has shape \(352, 384\)"):
        load_pruned(out)

    del state["blocks.4.attn.v_proj.weight"]
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match="'blocks.4.attn.v_proj.weight' missing"):
        load_pruned(out)

    out2 = save_pruned(minilm_pruned, tmp_path / "c")
    raw = (out2 / "model.safetensors").read_bytes()
    (out2 / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_pruned(out2)

    cfg = json.loads((out2 / "headscope_config.json").read_text())
    cfg["heads_kept"][3] = [0]  # config says layer 3 holds a head the weights lack
    (out2 / "headscope_config.json").write_text(json.dumps(cfg))
    (out2 / "model.safetensors").write_bytes(raw)
    with pytest.raises(CheckpointError, match=r"'blocks.3.attn.k_proj.bias' has shape \(0,\)"):
        load_pruned(out2)

    cfg["heads_kept"][3] = []
    cfg["heads_kept"][0] = [2, 0, 3, 4, 6, 7, 8, 9, 10, 11]  # unsorted: would mis-pair Q and KV heads
    (out2 / "headscope_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"heads_kept\[0\] must list distinct query heads"):
        load_pruned(out2)


def test_pruning_gain_counts(minilm, minilm_batch):
    heads = half_of_heads(minilm, seed=0)
    assert [len(v) for v in heads.values()] == [6] * 6
    gain = pruning_gain(minilm, heads, minilm_batch, repeats=1)
    assert gain.n_heads_pruned == 36
    assert gain.params_before == 22_565_376 and gain.attn_params_before == 3_548_160
    # 36 of 72 heads: each drops 4 * 384 * 32 weights and 3 * 32 biases (o_proj's bias stays)
    assert gain.params_before - gain.params_after == 36 * (4 * 384 * 32 + 3 * 32)
    assert gain.seconds_gated > 0 and gain.seconds_pruned > 0  # timings are reported, not asserted
