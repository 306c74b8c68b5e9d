"""The in-house attention: MHA/GQA/MQA, masks, RoPE, gates and hooks."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.attention import additive_mask, apply_rope, attention_pattern, rope_cos_sin
from headscope.probes.models.inhouse.hooks import hooks
from headscope.probes.models.inhouse.transformer import Transformer


def tiny(family="llama", **kw):
    cfg = ModelConfig(family=family, n_layers=2, d_model=32, n_heads=4, vocab_size=40, **kw)
    model = Transformer(cfg)
    model.init_weights(std=0.2, seed=0)
    return model.eval()


@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_gqa_equals_mha_with_shared_kv(n_kv):
    """A GQA/MQA model computes exactly what an MHA model computes when its K/V heads
    are copies within each group (HF repeat_kv: query head h reads KV head h // group)."""
    gqa = tiny(n_kv_heads=n_kv)
    mha = tiny(n_kv_heads=4)
    state = gqa.state_dict()
    group = 4 // n_kv
    for name, t in list(state.items()):
        if name.endswith(("attn.k_proj.weight", "attn.v_proj.weight")):
            state[name] = t.view(n_kv, 8, 32).repeat_interleave(group, 0).reshape(32, 32)
    mha.load_state_dict(state)
    ids = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(n_kv))
    # The same arithmetic up to float32 rounding: the K/V projections are matmuls of other shapes (8·n_kv vs 32
    # output rows), which BLAS sums in another order; measured up to 3.8e-6 on logits of |x| <= 3.7 (a few ulps),
    # varying with the CPU's kernels and the ids. 1e-5 relative + 1e-5 absolute holds on any of them.
    torch.testing.assert_close(gqa(ids), mha(ids), rtol=1e-5, atol=1e-5)
    assert gqa.cfg.attention_kind == {4: "MHA", 2: "GQA", 1: "MQA"}[n_kv]


def test_causal_pattern_is_lower_triangular_and_rows_sum_to_one():
    model = tiny()
    seen = {}
    ids = torch.randint(0, 40, (3, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    with hooks([(model.hook_points["blocks.1.attn.hook_pattern"], lambda t, n: seen.setdefault("p", t))]):
        model(ids, mask)
    p = seen["p"]  # [batch, head, query_pos, key_pos]
    assert p.triu(1).abs().max().item() == 0.0
    assert p[1, :, :, 4:].abs().max().item() == 0.0  # padded keys get exactly 0
    rows = p.sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)


def test_bidirectional_attends_both_ways():
    model = tiny(family="bert")
    seen = {}
    with hooks([(model.hook_points["blocks.0.attn.hook_pattern"], lambda t, n: seen.setdefault("p", t))]):
        model(torch.randint(0, 40, (1, 5)))
    upper = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert seen["p"][..., upper].min().item() > 0.0  # every query sees later keys too


def test_fused_path_equals_eager_path():
    """When nobody listens to the pattern the attention uses SDPA; same numbers."""
    model = tiny(n_kv_heads=2)
    ids = torch.randint(0, 40, (2, 9))
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    fast = model(ids, mask)
    slow = model(ids, mask, need_pattern=True)
    assert (fast - slow)[mask.bool()].abs().max().item() < 1e-5


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i, j):
        cq, sq = rope_cos_sin(torch.tensor([[i]]), 8, 10_000.0)
        ck, sk = rope_cos_sin(torch.tensor([[j]]), 8, 10_000.0)
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum().item()

    assert math.isclose(score(5, 2), score(105, 102), rel_tol=1e-4)
    assert not math.isclose(score(5, 2), score(5, 4), rel_tol=1e-3)


def test_gate_zero_equals_removing_the_heads_output_columns():
    model = tiny()
    ids = torch.randint(0, 40, (2, 6))
    model.blocks[1].attn.gate.data[2] = 0.0
    gated = model(ids)
    model.blocks[1].attn.gate.data[2] = 1.0
    with torch.no_grad():
        model.blocks[1].attn.o_proj.weight[:, 16:24] = 0.0
    removed = model(ids)
    assert torch.allclose(gated, removed, atol=1e-6)


def test_mean_ablation_substitutes_the_given_value():
    model = tiny()
    ids = torch.randint(0, 40, (1, 5))
    attn = model.blocks[0].attn
    seen = {}
    value = torch.randn(8)
    attn.gate.data[1] = 0.0
    attn.ablation_value[1] = value
    with hooks([(model.hook_points["blocks.0.attn.hook_out"], lambda t, n: seen.setdefault("out", t))]):
        model(ids)
    attn.gate.data[1] = 1.0
    attn.ablation_value.zero_()
    # head 1's contribution is W_O[:, 8:16] @ value at every position
    with hooks(
        [
            (
                model.hook_points["blocks.0.attn.hook_z"],
                lambda t, n: t.index_copy(1, torch.tensor([1]), value.expand(1, 1, 5, 8).clone()),
            )
        ]
    ):
        expected = {}
        with hooks([(model.hook_points["blocks.0.attn.hook_out"], lambda t, n: expected.setdefault("out", t))]):
            model(ids)
    assert torch.allclose(seen["out"], expected["out"], atol=1e-6)


def test_no_hook_survives_an_exception():
    model = tiny()

    def boom(t, name):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with hooks([(hp, boom) for hp in model.hook_points.values()]):
            model(torch.randint(0, 40, (1, 4)))
    assert not any(hp.active for hp in model.hook_points.values())


def test_additive_mask_values():
    m = additive_mask(torch.tensor([[1, 1, 0]]), causal=True)
    allowed = (m == 0)[0, 0]
    assert allowed.tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert m.min().item() == torch.finfo(torch.float32).min


def test_attention_pattern_expands_kv_by_groups():
    q = torch.randn(1, 4, 3, 8)
    k = torch.randn(1, 2, 3, 8)
    p = attention_pattern(q, k, None)
    expected = torch.softmax(q[:, 3] @ k[:, 1].transpose(-1, -2) / math.sqrt(8), -1)  # head 3 reads KV head 1
    assert torch.allclose(p[:, 3], expected, atol=1e-6)


def test_pruned_layer_pattern_is_attention_pattern_with_its_kv_index():
    """A physically pruned GQA layer (query heads 0, 2, 3 of 4; KV heads 0, 1): the pattern the
    model hooks is the pure function's, given the layer's own query-to-KV map."""
    from headscope.probes.models.inhouse.physical import prune_heads

    model = prune_heads(tiny(n_kv_heads=2), {0: [1]}).module
    attn = model.blocks[0].attn
    assert attn.kv_index.tolist() == [0, 1, 1]
    seen = {}
    names = ("q_rot", "k_rot", "pattern")
    with hooks([(getattr(attn, f"hook_{n}"), lambda t, _n, n=n: seen.setdefault(n, t)) for n in names]):
        model(torch.randint(0, 40, (2, 6)), torch.tensor([[1] * 6, [1] * 4 + [0] * 2]))
    mask = additive_mask(torch.tensor([[1] * 6, [1] * 4 + [0] * 2]), causal=True)
    expected = attention_pattern(seen["q_rot"], seen["k_rot"], mask, attn.kv_index)
    assert torch.equal(seen["pattern"], expected)


def test_config_errors_state_the_rule():
    with pytest.raises(ValueError, match="n_kv_heads must divide n_heads"):
        ModelConfig(n_heads=6, n_kv_heads=4, d_model=48)
    with pytest.raises(ValueError, match="'family' parameter"):
        ModelConfig(family="opt")
