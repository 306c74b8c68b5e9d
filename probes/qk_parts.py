"""One head's queries and keys split exactly into the parts each upstream component writes.

A head's score ``q_i · k_j × scale`` is bilinear in the residual stream once every norm on the
way is frozen at its clean scale: LayerNorm becomes ``(x - mean x) × w / σ + b`` and RMSNorm
``x × w / rms`` with ``σ`` and ``rms`` the values the clean forward computed at that position.
Rotary is a fixed rotation per position (linear), QK-norm is an RMSNorm over ``d_head`` (frozen
likewise). So the query (and the key) is a sum over components, and the score a sum over pairs.

Components (:attr:`QKParts.names`): ``embed`` (token embeddings, with Gemma's scale), ``pos``
(learned absolute positions), ``type`` (BERT's token types), ``L{layer}H{head}`` (every earlier
head's output ``z_h W_O[h]``, one per query head), ``MLP{layer}`` (every earlier MLP's output),
``bias`` (every constant: output-projection biases, LayerNorm shifts and the projection's own
bias). On a post-norm model (BERT) every earlier component passes each later norm, frozen; on a
sandwich-norm model (Gemma) a head's output passes the post-attention norm, frozen.

One forward (:func:`residual_run`) serves every head of every layer it reaches; :func:`head_parts`
splits one head. Only the in-house stack is split (:func:`qk_refusal` says why a model is not).

Shapes: :attr:`QKParts.q` ``[component, batch, pos, d_head]`` (query side), :attr:`QKParts.k`
``[component, batch, pos, d_head]`` (the KV head's key side; GQA: query head ``h`` reads KV head
``kv_index[h]``), :attr:`QKParts.scores` ``[batch, query_pos, key_pos]``.

>>> from headscope.probes.models.inhouse.planted import planted_model
>>> m = planted_model(); b = m.encode(texts=["the cat sat . the cat"])
>>> p = head_parts(residual_run(m, b.input_ids, b.attention_mask), 1, 1)
>>> p.names[:4], tuple(p.q.shape), p.relative_error() < 1e-5
(('embed', 'pos', 'bias', 'L0H0'), (8, 1, 7, 64), True)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.inhouse.attention import RMSNorm, allowed_rows, apply_rope, rope_cos_sin
from headscope.probes.models.inhouse.hooks import hooks

__all__ = ["FROZEN", "QKParts", "ResidualRun", "head_parts", "qk_refusal", "residual_run"]

#: what the split holds fixed, in words (written into every output)
FROZEN = (
    "every norm before the projections (and QK-norm) frozen at its clean per-position scale; "
    "rotary applied as a fixed rotation per position; scores before any soft cap"
)

#: why a family has no exact split, by a config key it is known by (a transformers config)
NOT_SPLIT = {
    "kv_lora_rank": "MLA: keys read from a shared low-rank latent through a norm, with a decoupled "
    "rotary key part shared by all heads; the per-head split is not exact",
    "pos_att_type": "DeBERTa: content-to-position and position-to-content terms are not split here",
    "alibi": "ALiBi: a position bias joins the scores outside q·k; not split here",
    "relative_attention_num_buckets": "T5: a learned relative position bias joins the scores; not split here",
}


def qk_refusal(model) -> str | None:
    """Why ``model``'s scores cannot be split exactly here (one line), or None."""
    cfg = getattr(model, "hf_config", None) or {}
    for key, why in NOT_SPLIT.items():
        if cfg.get(key) not in (None, False, 0, [], "") or (
            key == "alibi" and cfg.get("model_type") in ("bloom", "mpt")
        ):
            return f"QK attribution refused: {why}"
    network = getattr(model, "network", None)
    if getattr(model, "backend", None) != "inhouse" or network is None:
        return (
            f"QK attribution splits the in-house stack only; {getattr(model, 'backend', type(model).__name__)} "
            "backend given (load with --backend inhouse; families outside it are refused)"
        )
    if network.cfg.heads_kept is not None:
        return "QK attribution refused: a physically pruned model (heads_kept) is not split"
    if next(network.parameters()).dtype != torch.float32:
        return f"QK attribution needs float32 weights for an exact split; got {next(network.parameters()).dtype}"
    return None


@dataclass
class ResidualRun:
    """What one clean forward left: per layer the block input ``resid [batch, pos, d_model]``,
    ``z [batch, head, pos, d_head]``, the attention output ``out`` and the MLP output ``mlp``
    ``[batch, pos, d_model]``, the scores ``[batch, head, query_pos, key_pos]`` (after any soft
    cap, before the mask); ``positions [batch, pos]``."""

    model: object
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    positions: torch.Tensor
    acts: dict
    n_layers: int


def residual_run(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, layers=None) -> ResidualRun:
    """One forward of the in-house ``model`` over ``input_ids [batch, pos]`` keeping what
    :func:`head_parts` needs for the heads of ``layers`` (default all). Raises
    :class:`ModelIncompatibleError` with :func:`qk_refusal`'s reason."""
    why = qk_refusal(model)
    if why is not None:
        raise ModelIncompatibleError(why)
    net = model.network
    n = net.cfg.n_layers if layers is None else max(layers) + 1
    if not 1 <= n <= net.cfg.n_layers:
        raise ValueError(f"layers must lie in [0, {net.cfg.n_layers}); got {layers}")
    device = model.device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    acts: dict = {}

    def keep(key):
        def fn(t, name=None):
            acts[key] = t.detach().float()

        return fn

    pairs, handles = [], []
    for l in range(n):
        hp = net.hook_points
        for what, name in (
            ("resid", "hook_resid_pre"),
            ("mid", "hook_resid_mid"),
            ("z", "attn.hook_z"),
            ("out", "attn.hook_out"),
        ):
            pairs.append((hp[f"blocks.{l}.{name}"], keep((what, l))))
        pairs.append((hp[f"blocks.{l}.attn.hook_scores"], keep(("scores", l))))
        rot = "_rot" if net.cfg.positional == "rope" else ""
        pairs += [(hp[f"blocks.{l}.attn.hook_{x}{rot}"], keep((x, l))) for x in ("q", "k")]
        handles.append(net.blocks[l].mlp.register_forward_hook(lambda m, i, o, l=l: keep(("mlp", l))(o)))
    try:
        with torch.inference_mode(), hooks(pairs):
            net(input_ids, attention_mask, stop_at_layer=n if n < net.cfg.n_layers else None)
    finally:
        for h in handles:
            h.remove()
    return ResidualRun(model, input_ids, attention_mask, net.positions(input_ids), acts, n)


def _frozen(norm: nn.Module, x: torch.Tensor, parts: torch.Tensor, names: list[str]) -> torch.Tensor:
    """``parts [component, batch, pos, d]`` through ``norm`` frozen at its scale on the clean input
    ``x [batch, pos, d]``: the parts sum to ``norm(x)``; a LayerNorm's shift joins ``bias``."""
    if isinstance(norm, nn.LayerNorm):
        inv = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
        out = (parts - parts.mean(-1, keepdim=True)) * inv
        if norm.weight is not None:
            out = out * norm.weight.float()
        if norm.bias is not None:
            out[names.index("bias")] += norm.bias.float()
        return out
    if isinstance(norm, RMSNorm):
        inv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
        w = 1.0 + norm.weight.float() if norm.offset else norm.weight.float()
        return parts * inv * w
    raise ModelIncompatibleError(f"QK attribution: norm {type(norm).__name__} is not split")


def _embedding_parts(net, run: ResidualRun) -> tuple[list[str], torch.Tensor]:
    ids, cfg = run.input_ids, net.cfg
    tok = net.embed.weight.float()[ids]
    if cfg.embed_scale is not None:
        tok = tok * torch.tensor(cfg.embed_scale, dtype=torch.float32)
    names, parts = ["embed"], [tok]
    if cfg.positional == "learned":
        names.append("pos")
        parts.append(net.pos_embed.weight.float()[run.positions])
    if hasattr(net, "type_embed"):
        names.append("type")
        parts.append(net.type_embed.weight.float()[torch.zeros_like(ids)].clone())
    names.append("bias")
    parts.append(torch.zeros_like(tok))
    stacked = torch.stack(parts)
    if cfg.post_norm:
        stacked = _frozen(net.embed_ln, stacked.sum(0), stacked, names)
    return names, stacked


def _head_outputs(block, z: torch.Tensor, l: int) -> tuple[list[str], torch.Tensor]:
    """``z [batch, head, pos, d_head]`` -> each head's write ``[head, batch, pos, d_model]`` and names."""
    attn = block.attn
    w_o = attn.o_proj.weight.float().view(attn.o_proj.out_features, attn.n_heads, attn.d_head)
    writes = torch.einsum("bhpe,dhe->hbpd", z, w_o)
    return [f"L{l}H{h}" for h in block.heads], writes


def _add_block(block, run: ResidualRun, l: int, names: list[str], parts: torch.Tensor):
    """The components after block ``l`` (its heads and MLP added, its norms frozen)."""
    a = run.acts
    head_names, writes = _head_outputs(block, a["z", l], l)
    b_o = block.attn.o_proj.bias
    bias = b_o.float() if b_o is not None else None
    if block.sandwich_norm:
        writes = _frozen(block.ln1_post, a["out", l], writes, head_names)
        if bias is not None:  # the bias passes the post-attention norm like the heads
            bias = _frozen(block.ln1_post, a["out", l], bias.expand_as(a["out", l])[None], ["x"])[0]
    names = names + head_names
    parts = torch.cat([parts, writes])
    if bias is not None:
        parts[names.index("bias")] += bias
    if block.post_norm:
        parts = _frozen(block.ln1, a["resid", l] + a["out", l], parts, names)
    mlp = a["mlp", l]
    if block.sandwich_norm:
        mlp = block.ln2_post(mlp)
    names = names + [f"MLP{l}"]
    parts = torch.cat([parts, mlp.float()[None]])
    if block.post_norm:
        x = a["mid", l] + a["mlp", l]
        parts = _frozen(block.ln2, x, parts, names)
    return names, parts


def attention_input(run: ResidualRun, layer: int) -> tuple[list[str], torch.Tensor]:
    """``(names, parts [component, batch, pos, d_model])``: the input of layer ``layer``'s
    projections (after its frozen input norm; a post-norm block reads its residual as is),
    split into components; the parts sum to that input."""
    if not 0 <= layer < run.n_layers:
        raise ValueError(f"layer must lie in [0, {run.n_layers}) for this run; got {layer}")
    net = run.model.network
    with torch.inference_mode():
        names, parts = _embedding_parts(net, run)
        for l in range(layer):
            names, parts = _add_block(net.blocks[l], run, l, names, parts)
        block = net.blocks[layer]
        if not block.post_norm:
            parts = _frozen(block.ln1, run.acts["resid", layer], parts, names)
    return names, parts


@dataclass(frozen=True)
class QKParts:
    """One head's query and key parts (see the module doc); ``scores`` the model's own,
    ``pre_cap`` ``q · k × scale`` from the model's own q and k (``scores`` before the soft cap),
    ``allowed [batch, query_pos, key_pos]`` the keys the mask lets each query see."""

    names: tuple[str, ...]
    layer: int
    head: int
    kv_head: int
    q: torch.Tensor
    k: torch.Tensor
    scale: float
    softcap: float | None
    scores: torch.Tensor
    pre_cap: torch.Tensor
    allowed: torch.Tensor

    def pairs(self, batch: int, query: int) -> torch.Tensor:
        """``[q_component, k_component, key_pos]``: each pair's share of query ``query``'s scores."""
        return torch.einsum("ae,cje->acj", self.q[:, batch, query], self.k[:, batch]) * self.scale

    def total(self) -> torch.Tensor:
        """``[batch, query_pos, key_pos]``: the sum over all pairs (the pre-cap score)."""
        return torch.einsum("abie,cbje->bij", self.q, self.k) * self.scale

    def relative_error(self) -> float:
        """max |sum of pairs - the model's score| / max |score| over the allowed (query, key) cells:
        the model's own ``scores``, or where they are soft-capped its ``pre_cap`` scores."""
        ref = (self.scores if self.softcap is None else self.pre_cap)[self.allowed]
        diff = self.total()[self.allowed] - ref
        return float(diff.abs().max() / ref.abs().max().clamp_min(1e-30))


def _project(parts, names, weight, bias, h, d_head, norm, rope):
    """Parts of one head's q (or k) ``[component, batch, pos, d_head]``: projected, the projection's
    bias into ``bias``, QK-norm frozen at the clean total, rotated."""
    w = weight.float()[h * d_head : (h + 1) * d_head]  # [d_head, d_model]
    out = torch.einsum("cbpd,ed->cbpe", parts, w)
    if bias is not None:
        out[names.index("bias")] += bias.float()[h * d_head : (h + 1) * d_head]
    if norm is not None:
        out = _frozen(norm, out.sum(0), out, names)
    if rope is not None:
        cos, sin = rope  # [batch, 1, pos, d_head]
        out = apply_rope(out.transpose(0, 1), cos, sin).transpose(0, 1)
    return out


def head_parts(run: ResidualRun, layer: int, head: int) -> QKParts:
    """Head ``(layer, head)``'s :class:`QKParts` from one :func:`residual_run`. ``ValueError``
    for a head outside the model (naming its layers and heads)."""
    net = run.model.network
    cfg = net.cfg
    if not (0 <= layer < run.n_layers and 0 <= head < cfg.n_heads):
        raise ValueError(
            f"head must be LAYER.HEAD with LAYER in [0, {cfg.n_layers - 1}] and HEAD in [0, {cfg.n_heads - 1}] "
            f"({cfg.n_layers} layers x {cfg.n_heads} heads); got {layer}.{head}"
        )
    names, parts = attention_input(run, layer)
    block = net.blocks[layer]
    attn = block.attn
    kv = int(attn.kv_index[head])
    rope = None
    if cfg.positional == "rope":
        rope = rope_cos_sin(run.positions, cfg.d_head, block.rope_theta, block.rope_scaling)
    qn, kn = (attn.q_norm, attn.k_norm) if attn.qk_norm else (None, None)
    with torch.inference_mode():
        q = _project(parts, names, attn.q_proj.weight, attn.q_proj.bias, head, cfg.d_head, qn, rope)
        k = _project(parts, names, attn.k_proj.weight, attn.k_proj.bias, kv, cfg.d_head, kn, rope)
    n_pos = run.input_ids.shape[1]
    allowed = allowed_rows(run.attention_mask, cfg.causal, 0, n_pos, block.window)
    scale = attn.scale if attn.scale is not None else cfg.d_head**-0.5
    return QKParts(
        names=tuple(names),
        layer=layer,
        head=head,
        kv_head=kv,
        q=q,
        k=k,
        scale=float(scale),
        softcap=attn.softcap,
        scores=run.acts["scores", layer][:, head],
        pre_cap=(run.acts["q", layer][:, head] @ run.acts["k", layer][:, kv].transpose(-1, -2)) * scale,
        allowed=allowed,
    )
