"""Each head's direct effect on a logit difference at the last position of an in-house decoder:
what its output there adds to ``logit(a) - logit(b)`` through the unembedding alone (its write
``z_h W_O[h]``, through a sandwich norm's post-attention norm frozen, then the final norm frozen at
the run's own scale at that position, read by ``W_U[a] - W_U[b]``; a final soft cap is not
additive: the effect is on the logits before it). The IOI roles
(:mod:`headscope.analyses.roles.ioi`) read name movers from it.
"""

from __future__ import annotations

import torch

__all__ = ["direct_effects"]


def _frozen_final(net, resid: torch.Tensor, writes: torch.Tensor) -> torch.Tensor:
    """``writes [component, batch, d_model]`` through the final norm frozen at its scale on
    ``resid [batch, d_model]`` (the residual it normalises): the components' share of its output."""
    from headscope.probes.qk_parts import _frozen

    parts = torch.cat([writes, torch.zeros_like(writes[:1])])[:, :, None]  # [component + bias, batch, 1, d]
    out = _frozen(net.ln_final, resid[:, None], parts, [*([""] * len(writes)), "bias"])
    return out[:-1, :, 0]


def direct_effects(model, ids: torch.Tensor, io: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of ``ids [batch, pos]`` (no padding) -> ``(effect [batch, layer, head], logit
    difference [batch])``: each head's direct effect on ``logit(io) - logit(s)`` at the last
    position (module docstring), and the model's own difference there."""
    from headscope.probes.models.inhouse.hooks import hooks

    net = model.network
    n_layers = net.cfg.n_layers
    points = net.hook_points
    kept: dict = {}

    def keep(key):
        def fn(t, name=None):
            kept[key] = t.detach()[..., -1, :].float() if key[0] != "z" else t.detach()[:, :, -1].float()

        return fn

    pairs = [(points[f"blocks.{l}.attn.hook_z"], keep(("z", l))) for l in range(n_layers)]
    pairs += [(points[f"blocks.{l}.attn.hook_out"], keep(("out", l))) for l in range(n_layers)]
    pairs.append((points[f"blocks.{n_layers - 1}.hook_resid_post"], keep(("final", 0))))
    ids = ids.to(model.device)
    keep_last = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    keep_last[:, -1] = True  # the unembedding reads the last position only
    with torch.inference_mode(), hooks(pairs), model.unembed_at(keep_last):
        logits = model.forward(ids, torch.ones_like(ids)).float()  # [batch, vocab]
    io, s = io.to(logits.device), s.to(logits.device)
    rows = torch.arange(len(ids), device=logits.device)
    logit_diff = logits[rows, io] - logits[rows, s]
    w_u = net.unembed.weight.float()  # [vocab, d_model]
    direction = w_u[io] - w_u[s]  # [batch, d_model]
    effects = []
    with torch.inference_mode():
        for l, block in enumerate(net.blocks):
            attn = block.attn
            w_o = attn.o_proj.weight.float().view(attn.o_proj.out_features, attn.n_heads, attn.d_head)
            writes = torch.einsum("bhe,dhe->hbd", kept["z", l], w_o)  # [head, batch, d_model]
            if block.sandwich_norm:
                from headscope.probes.qk_parts import _frozen

                writes = _frozen(block.ln1_post, kept["out", l][:, None], writes[:, :, None], ["x"] * len(writes))[
                    :, :, 0
                ]
            normed = _frozen_final(net, kept["final", 0], writes)  # [head, batch, d_model]
            effects.append(torch.einsum("hbd,bd->bh", normed, direction))
    return torch.stack(effects, 1).cpu(), logit_diff.cpu()
