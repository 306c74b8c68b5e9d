"""Re-run only each row's last position of a forward, from a layer on, with the earlier positions'
keys and values kept: what patching a head's output at the last position costs when nothing before
it changes (a causal model: the earlier positions never see the last).

:func:`prefix_run` runs the in-house decoder once over a right-padded batch and keeps, per layer,
the keys and values its attention read ``[batch, kv_head, pos, d_head]`` (after QK-norm and RoPE),
the residual entering the layer at each row's last real position ``[batch, d_model]`` and the heads'
``z`` there ``[batch, head, d_head]``, with the last position's logits. :func:`last_position_logits`
then runs the rows of that batch (``replicas`` times over, one replica per change) from layer
``start`` on at their last position only, the query reading the kept keys and its own new key and
value, ``z_fn`` changing layer ``start``'s ``z``: the logits
the full forward with the same change would give (checked in tests to float32 rounding), at the
cost of one position. Pre-norm and sandwich-norm causal decoders; a post-norm model, a KV window
or an encoder is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.inhouse.attention import apply_rope, rope_cos_sin
from headscope.probes.models.inhouse.hooks import hooks
from headscope.probes.models.inhouse.transformer import Transformer, soft_capped


@dataclass
class PrefixRun:
    """One forward's state for re-running its rows' last positions (module docstring)."""

    keys: list[torch.Tensor]  # per layer [batch, kv_head, pos, d_head]
    values: list[torch.Tensor]  # per layer [batch, kv_head, pos, d_head]
    resid: list[torch.Tensor]  # per layer, entering it at the last position [batch, d_model]
    z_last: list[torch.Tensor]  # per layer [batch, head, d_head]
    logits: torch.Tensor  # [batch, vocab] at the last position
    last: torch.Tensor  # [batch] the last real position of each row
    attention_mask: torch.Tensor  # [batch, pos]


def check_network(network) -> Transformer:
    """``network`` if :func:`last_position_logits` can run it; ``ModelIncompatibleError`` (one line) otherwise."""
    if not isinstance(network, Transformer):
        raise ModelIncompatibleError("re-running the last position needs the in-house backend (--backend inhouse)")
    cfg = network.cfg
    if cfg.encoder or not cfg.causal or cfg.post_norm:
        raise ModelIncompatibleError("re-running the last position needs a pre-norm causal decoder")
    if any(b.attn.kv_window for b in network.blocks) or any(len(b.heads) != cfg.n_heads for b in network.blocks):
        raise ModelIncompatibleError("re-running the last position needs every head and no KV window")
    return network


def prefix_run(network: Transformer, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PrefixRun:
    """One forward of a right-padded batch, keeping what :func:`last_position_logits` reads (the
    unembedding computed at each row's last position only)."""
    check_network(network)
    n = len(network.blocks)
    rope = network.cfg.positional == "rope"
    last = attention_mask.sum(1) - 1
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    got: dict = {}

    def keep(key):
        return lambda t, name: got.__setitem__(key, t.detach())

    pairs = []
    for l, b in enumerate(network.blocks):
        pairs += [
            (b.hook_resid_pre, keep(("resid", l))),
            (b.attn.hook_k_rot if rope else b.attn.hook_k, keep(("k", l))),
            (b.attn.hook_v, keep(("v", l))),
            (b.attn.hook_z, keep(("z", l))),
        ]
    # the unembedding reads each row's last position only (the logits nobody reads are never computed)
    handle = network.unembed.register_forward_pre_hook(lambda mod, args: (args[0][rows, last],))
    try:
        with torch.inference_mode(), hooks(pairs):
            logits = network(input_ids, attention_mask)  # [batch, vocab]
    finally:
        handle.remove()
    return PrefixRun(
        keys=[got["k", l] for l in range(n)],
        values=[got["v", l] for l in range(n)],
        resid=[got["resid", l][rows, last] for l in range(n)],
        z_last=[got["z", l][rows, :, last] for l in range(n)],
        logits=logits.float(),
        last=last,
        attention_mask=attention_mask,
    )


def last_position_logits(
    network: Transformer,
    run: PrefixRun,
    start: int,
    z_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    replicas: int = 1,
) -> torch.Tensor:
    """Logits ``[replicas × batch, vocab]`` (float32) at the last position of every row of ``run``'s
    batch, ``replicas`` times over (row ``r × batch + i`` is replica ``r`` of row ``i``), run from
    layer ``start`` on; ``z_fn(z [replicas × batch, head, d_head]) -> z`` changes layer ``start``'s
    heads' output there (None: unchanged, the forward's own logits). The kept keys and values are
    read once for every replica (never copied per replica)."""
    check_network(network)
    cfg = network.cfg
    b = run.last.shape[0]
    x = run.resid[start].repeat(replicas, 1)  # [R, d_model]
    pos, rb = run.last, torch.arange(b, device=x.device)
    keys_at = torch.arange(run.attention_mask.shape[1], device=x.device)[None, :]
    real = run.attention_mask.bool() & (keys_at <= pos[:, None])  # [b, key]
    with torch.inference_mode():
        for l in range(start, len(network.blocks)):
            block = network.blocks[l]
            attn = block.attn
            h = block.ln1(x)[:, None]  # [R, 1, d_model]
            q = attn._split(attn.q_proj(h), attn.n_heads)  # [R, head, 1, d_head]
            k = attn._split(attn.k_proj(h), attn.n_kv_heads)  # [R, kv_head, 1, d_head]
            v = attn._split(attn.v_proj(h), attn.n_kv_heads)
            if attn.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            if cfg.positional == "rope":
                cos, sin = rope_cos_sin(pos.repeat(replicas)[:, None], cfg.d_head, block.rope_theta, block.rope_scaling)
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            kv = attn.kv_index.to(x.device)
            q = q[:, :, 0].view(replicas, b, attn.n_heads, -1)  # [rep, b, head, d_head]
            k_new = k[:, kv, 0].view(replicas, b, attn.n_heads, -1)
            v_new = v[:, kv, 0].view(replicas, b, attn.n_heads, -1)
            keys, values = run.keys[l][:, kv], run.values[l][:, kv]  # [b, head, key, d_head]
            scores = torch.einsum("rbhd,bhkd->rbhk", q, keys)
            own = (q * k_new).sum(-1, keepdim=True)  # [rep, b, head, 1]: the query's own new key
            at = pos[None, :, None, None].expand(replicas, b, attn.n_heads, 1)
            scores = scores.scatter(-1, at, own) * (q.shape[-1] ** -0.5 if attn.scale is None else attn.scale)
            if attn.softcap is not None:
                scores = torch.tanh(scores / attn.softcap) * attn.softcap
            allowed = real if block.window is None else real & (pos[:, None] - keys_at < block.window)
            mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
            mask = mask.masked_fill(~allowed, torch.finfo(q.dtype).min)[None, :, None, :]
            pattern = torch.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
            z = torch.einsum("rbhk,bhkd->rbhd", pattern, values)
            z = z + pattern.gather(-1, at) * (v_new - values[rb, :, pos][None])  # the own value, new
            z = z.reshape(replicas * b, attn.n_heads, -1)
            if l == start and z_fn is not None:
                z = z_fn(z)
            if not bool((attn.gate == 1).all()):
                gate = attn.gate.to(z.dtype)[None, :, None]
                z = gate * z + (1 - gate) * attn.ablation_value.to(z.dtype)[None]
            out = attn.o_proj(z.reshape(replicas * b, -1))
            if block.sandwich_norm:
                x = x + block.ln1_post(out)
                x = x + block.ln2_post(block.mlp(block.ln2(x)))
            else:
                x = x + out
                x = x + block.mlp(block.ln2(x))
        return soft_capped(network.unembed(network.ln_final(x)), cfg.final_softcap).float()
