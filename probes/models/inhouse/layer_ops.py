"""One layer of the in-house transformer run on its own, for analyses that need more than hooks
(AtP*'s corrections, :mod:`headscope.analyses.patching.atp_star`): a layer's pattern recomputed on a
given residual, a layer's residual contribution dropped from the gradient, a head's write into the
residual. Analyses reach the network's blocks only through these (the import-graph test keeps
``.blocks`` to probes)."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from headscope.probes.models.inhouse.attention import additive_mask, rope_cos_sin
from headscope.probes.models.inhouse.hooks import hooks
from headscope.probes.models.inhouse.transformer import Transformer


@contextmanager
def dropped_layer(network: Transformer, layer: int | None):
    """Layer ``layer``'s attention and MLP outputs detached for the ``with`` body (values kept,
    no gradient through them); ``None``: nothing dropped."""
    if layer is None:
        yield
        return
    block = network.blocks[layer]
    handle = block.mlp.register_forward_hook(lambda mod, inp, out: out.detach())
    try:
        with hooks([(block.attn.hook_out, lambda t, name: t.detach())]):
            yield
    finally:
        handle.remove()


def layer_pattern(network: Transformer, layer: int, resid: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Layer ``layer``'s attention pattern ``[batch, head, query, key]`` on the residual
    ``resid [batch, pos, d_model]`` entering it (pre-norm: through ``ln1``), as the forward computes it."""
    block, cfg = network.blocks[layer], network.cfg
    mask = additive_mask(torch.ones_like(ids), cfg.causal, dtype=resid.dtype, window=block.window)
    rope = None
    if cfg.positional == "rope":
        rope = rope_cos_sin(network.positions(ids), cfg.d_head, block.rope_theta, block.rope_scaling)
    got: dict = {}
    with hooks([(block.attn.hook_pattern, lambda t, name: got.__setitem__("a", t))]):
        block.attn(block.ln1(resid), mask, rope=rope, need_pattern=True)
    return got["a"]


def head_write(network: Transformer, layer: int, z: torch.Tensor) -> torch.Tensor:
    """What heads' ``z [batch, head, pos, d_head]`` of layer ``layer`` write into the residual,
    ``[batch, pos, d_model]`` (``W_O z``, no bias): zero a head's ``z`` to leave it out."""
    b, n, t, dh = z.shape
    return torch.nn.functional.linear(z.transpose(1, 2).reshape(b, t, n * dh), network.blocks[layer].attn.o_proj.weight)
