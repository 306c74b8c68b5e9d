"""The in-house attention's sink + window KV cache (:attr:`Attention.kv_window`) against a
brute-force masked attention written out position by position."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.hooks import hooks
from headscope.probes.models.inhouse.transformer import Transformer

POS, SINK, WINDOW = 40, 2, 6
LAYER_WINDOWS = (None, 11)  # layer 1 slides: the restriction composes with its window


def _model(n_kv: int) -> Transformer:
    cfg = ModelConfig(
        family="llama", n_layers=2, d_model=32, n_heads=4, n_kv_heads=n_kv, vocab_size=40, sliding_window=LAYER_WINDOWS
    )
    model = Transformer(cfg)
    model.init_weights(std=0.3, seed=1)
    return model.double().eval()  # float64: the comparison sees the masking, not float32 rounding


def _brute_z(q, k, v, pad, layer_window, restricted_heads):
    """``z [batch, head, pos, d_head]`` summed key by key: causal, padding, the layer's sliding
    window and, for ``restricted_heads``, only keys ``j < SINK`` or ``i - j < WINDOW``."""
    batch, n_heads, n, d = q.shape
    group = n_heads // k.shape[1]
    z = torch.zeros(batch, n_heads, n, d, dtype=torch.float64)
    for b in range(batch):
        for h in range(n_heads):
            for i in range(n):
                keys = [
                    j
                    for j in range(i + 1)
                    if pad[b, j]
                    and (layer_window is None or i - j < layer_window)
                    and (h not in restricted_heads or j < SINK or i - j < WINDOW)
                ]
                if not keys:  # a padded query row sees nothing: the model's row is uniform over its keys
                    continue
                s = torch.stack([q[b, h, i].double() @ k[b, h // group, j].double() / math.sqrt(d) for j in keys])
                w = torch.softmax(s, 0)
                z[b, h, i] = sum(w[t] * v[b, h // group, j].double() for t, j in enumerate(keys))
    return z


@pytest.mark.parametrize("path", ["fused", "pattern", "chunked"])
@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_restricted_group_equals_brute_force(path, n_kv):
    model = _model(n_kv)
    ids = torch.randint(0, 40, (2, POS), generator=torch.Generator().manual_seed(n_kv))
    pad = torch.ones(2, POS, dtype=torch.long)
    pad[1, POS - 5 :] = 0
    group = n_kv - 1  # the last KV head: all query heads reading it share the restriction
    heads = {h for h in range(4) if model.cfg.kv_head_of(h) == group}
    for layer in (0, 1):
        seen = {}
        names = [f"blocks.{layer}.attn.hook_{n}" for n in ("q_rot", "k_rot", "v", "z")]
        pairs = [
            (model.hook_points[n], lambda t, name, seen=seen: seen.__setitem__(name.split("hook_")[-1], t))
            for n in names
        ]
        if path == "chunked":
            model.blocks[layer].attn.query_chunk = 16
        try:
            with torch.no_grad(), hooks(pairs), model.kv_windows_set({(layer, group): (SINK, WINDOW)}):
                model(ids, pad, need_pattern=path == "pattern")
        finally:
            model.blocks[layer].attn.query_chunk = None
        want = _brute_z(seen["q_rot"], seen["k_rot"], seen["v"], pad, LAYER_WINDOWS[layer], heads)
        got = seen["z"]
        real = pad.bool()[:, None, :, None].expand_as(got)  # padded query rows: no key to compare
        assert (got.double() - want).abs()[real].max().item() <= 1e-6


def test_no_restriction_is_bit_equal_and_cleared_on_exit():
    model = _model(2)
    ids = torch.randint(0, 40, (1, POS), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids)
        with model.kv_windows_set({(1, 0): (SINK, WINDOW)}):
            during = model(ids)
        after = model(ids)
        with pytest.raises(RuntimeError), model.kv_windows_set({(0, 1): (SINK, WINDOW)}):
            raise RuntimeError("inside")
        again = model(ids)
    assert torch.equal(before, after) and torch.equal(before, again)
    assert not torch.equal(before[:, SINK + WINDOW :], during[:, SINK + WINDOW :])
    # a query within sink + window of the start keeps every key: nothing changes there
    assert torch.equal(before[:, : SINK + WINDOW], during[:, : SINK + WINDOW])
    assert all(b.attn.kv_window is None for b in model.blocks)


@pytest.mark.parametrize(
    ("windows", "match"),
    [({(2, 0): (4, 8)}, "layer must be in"), ({(0, 2): (4, 8)}, "holds KV heads"), ({(0, 0): (4, 0)}, "window >= 1")],
)
def test_bad_restrictions_are_refused(windows, match):
    model = _model(2)
    with pytest.raises(ValueError, match=match), model.kv_windows_set(windows):
        pass
