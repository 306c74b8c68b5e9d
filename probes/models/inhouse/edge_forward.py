"""The in-house forward written as a graph of senders and receivers, for edge circuits
(:mod:`headscope.analyses.circuits.edges`).

On a pre-norm stack (Llama, GPT-2 style: ``x = x + attn(ln1(x)); x = x + mlp(ln2(x))``) the
residual stream entering any point is the sum of what every earlier *sender* wrote, plus
constant biases (``b_O``). Senders, in order (:class:`EdgeLayout`): the input embeddings
(token, learned positions), then per layer each query head's output ``W_O^h z_h`` and the
MLP. Receivers: per layer each query head's **q** input, each KV head's **k** and **v** inputs
(once per KV head: on GQA/MQA every query head of the group reads them, nothing is copied),
the MLP's input, and finally the logits' input (before the final norm).

:func:`graph_forward` computes every receiver's input on its own: with ``corrupted`` sender
outputs and ``keep [sender, receiver]``, receiver ``r`` reads ``Σ_s keep·out_s + (1 - keep)·
corrupted_s + biases``, where ``out_s`` is the sender's output in this very run (the exact edge
patching of Hanna et al.'s EAP-IG ``evaluate_graph``). With ``grad_probes`` each group of receiver
inputs (a layer's q, its k, its v, an MLP's input, the logits') is returned as a probe, so one
backward (``torch.autograd.grad`` with the probes as inputs) gives the gradient at every
receiver's input (one gradient per receiver, not per edge). Post-norm (BERT) and
sandwich-norm (Gemma) stacks do not decompose into sender sums: :func:`check_graph_model` refuses them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.inhouse.attention import (
    RMSNorm,
    additive_mask,
    apply_rope,
    attention_pattern,
    repeat_kv,
    rope_cos_sin,
)
from headscope.probes.models.inhouse.transformer import Transformer, soft_capped


@dataclass(frozen=True, kw_only=True)
class EdgeLayout:
    """Indices of senders and receivers of a model with ``n_layers`` layers of ``n_heads``
    query heads and ``n_kv_heads`` KV heads (module docstring for the order).

    >>> lay = EdgeLayout(n_layers=2, n_heads=4, n_kv_heads=2)
    >>> lay.n_senders, lay.n_receivers, lay.head_sender(1, 2), lay.receivers_of(1)
    (11, 19, 8, (9, 18))
    """

    n_layers: int = 1
    n_heads: int = 1
    n_kv_heads: int = 1

    def __post_init__(self):
        if min(self.n_layers, self.n_heads, self.n_kv_heads) < 1 or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"layout needs n_layers, n_heads, n_kv_heads >= 1 with n_kv_heads dividing n_heads; got "
                f"{self.n_layers}, {self.n_heads}, {self.n_kv_heads}"
            )

    @property
    def per_layer_senders(self) -> int:
        return self.n_heads + 1

    @property
    def per_layer_receivers(self) -> int:
        return self.n_heads + 2 * self.n_kv_heads + 1

    @property
    def n_senders(self) -> int:
        return 1 + self.n_layers * self.per_layer_senders

    @property
    def n_receivers(self) -> int:
        return self.n_layers * self.per_layer_receivers + 1

    def head_sender(self, layer: int, head: int) -> int:
        return 1 + layer * self.per_layer_senders + head

    def mlp_sender(self, layer: int) -> int:
        return 1 + layer * self.per_layer_senders + self.n_heads

    def receivers_of(self, layer: int) -> tuple[int, int]:
        """``(start, stop)`` of layer ``layer``'s receivers: q per head, k per KV head, v per KV head, MLP."""
        s = layer * self.per_layer_receivers
        return s, s + self.per_layer_receivers

    def q_receiver(self, layer: int, head: int) -> int:
        return self.receivers_of(layer)[0] + head

    def k_receiver(self, layer: int, kv_head: int) -> int:
        return self.receivers_of(layer)[0] + self.n_heads + kv_head

    def v_receiver(self, layer: int, kv_head: int) -> int:
        return self.receivers_of(layer)[0] + self.n_heads + self.n_kv_heads + kv_head

    def mlp_receiver(self, layer: int) -> int:
        return self.receivers_of(layer)[1] - 1

    @property
    def logits_receiver(self) -> int:
        return self.n_receivers - 1

    def upstream(self, receiver: int) -> int:
        """How many senders (the first ones) feed ``receiver``: attention receivers of layer l
        read everything below layer l; the MLP of layer l also reads layer l's heads."""
        if receiver == self.logits_receiver:
            return self.n_senders
        layer, offset = divmod(receiver, self.per_layer_receivers)
        return self.mlp_sender(layer) if offset == self.per_layer_receivers - 1 else self.head_sender(layer, 0)

    def valid(self) -> torch.Tensor:
        """``[sender, receiver]`` bool: the edges of the graph (sender upstream of receiver)."""
        out = torch.zeros(self.n_senders, self.n_receivers, dtype=torch.bool)
        for r in range(self.n_receivers):
            out[: self.upstream(r), r] = True
        return out


def check_graph_model(model) -> Transformer:
    """The in-house network of ``model`` when its forward decomposes into senders and receivers;
    :class:`ModelIncompatibleError` otherwise (another backend, post-norm or sandwich-norm, an
    encoder, pruned heads, gates or KV-cache windows set)."""
    net = getattr(model, "module", None)
    if getattr(model, "backend", None) != "inhouse" or not isinstance(net, Transformer):
        raise ModelIncompatibleError(
            f"edge circuits need the in-house backend; got backend {getattr(model, 'backend', '?')!r}: "
            "load with backend='inhouse' (--backend inhouse)"
        )
    cfg = net.cfg
    why = (
        "it is an encoder (no next-token logits)"
        if cfg.encoder
        else "it is post-norm: the residual is no sum of sender outputs"
        if cfg.post_norm
        else "its sandwich norms rescale each layer's summed output"
        if cfg.sandwich_norm
        else "its heads are pruned"
        if cfg.heads_kept is not None
        else "its head gates are set"
        if any(not bool((b.attn.gate == 1).all()) for b in net.blocks)
        else "a KV-cache window is set"
        if any(b.attn.kv_window for b in net.blocks)
        else None
    )
    if why:
        raise ModelIncompatibleError(f"edge circuits need a pre-norm decoder; {cfg.name!r}: {why}")
    return net


def _receiver_inputs(resid, diffs, n_up, rs, keep):
    """Inputs of receivers ``rs`` (a slice) ``[receiver, batch, pos, d_model]``: ``resid`` (the sum
    of this run's first ``n_up`` senders and biases) for each, minus ``(1 - keep)`` times each
    sender's ``this run - corrupted`` difference (``diffs``: a list, or a buffer filled so far)."""
    n_r = rs.stop - rs.start
    x = resid.unsqueeze(0)  # broadcast over the receivers
    if keep is not None:
        drop = 1.0 - keep[:n_up, rs].to(resid.dtype)  # [sender, receiver]
        used = drop.abs().sum(1) > 0
        if bool(used.all()) and torch.is_tensor(diffs):  # a dense drop: one product over the buffer
            x = x - torch.einsum("sr,sbpd->rbpd", drop, diffs[:n_up])
        elif bool(used.any()):
            idx = used.nonzero()[:, 0].tolist()
            diff = diffs[idx] if torch.is_tensor(diffs) else torch.stack([diffs[i] for i in idx])
            x = x - torch.einsum("sr,sbpd->rbpd", drop[used], diff)  # [sender, batch, pos, d_model]
    if keep is None:  # one tensor read by every receiver (:class:`_SharedInputProjections`), never copied
        return x.expand(n_r, *resid.shape)
    # contiguous: an expanded (stride-0) input would make the norms' outputs and every op after them strided
    return x.expand(n_r, *resid.shape).contiguous()


class _SharedInputProjections(torch.autograd.Function):
    """A layer's q, k, v when every receiver reads the same input (no patched edge): the norm
    once, one product per projection, as the model's own forward. Backward gives each receiver
    its own input gradient ``[receiver, batch, pos, d_model]``: its head's slice of the
    projection, then the norm's vector-Jacobian product batched over receivers. The inputs
    ``x_q, x_k, x_v`` are one tensor expanded (never copied); the weights get no gradient."""

    @staticmethod
    def forward(ctx, x_q, x_k, x_v, norm, lins, d_head):
        x = x_q[0]  # [batch, pos, d_model], what every receiver reads
        y = norm(x)
        ctx.save_for_backward(x)
        ctx.norm, ctx.lins, ctx.d_head = norm, lins, d_head
        b, p = x.shape[:2]
        return tuple(
            torch.nn.functional.linear(y, lin.weight, lin.bias).view(b, p, n, d_head).transpose(1, 2)
            for lin, n in zip(lins, (len(x_q), len(x_k), len(x_v)))
        )  # each [batch, n, pos, d_head]

    @staticmethod
    def backward(ctx, *grads):  # each [batch, n, pos, d_head] or None
        (x,) = ctx.saved_tensors
        folded = _norm_folding(ctx.norm, x)
        if folded is None:  # another norm: its vector-Jacobian product by autograd, batched over receivers
            g_y = [_head_slices(g, lin, ctx.d_head, x) for g, lin in zip(grads, ctx.lins)]
            with torch.enable_grad():
                leaf = x.detach().requires_grad_(True)
                (g_x,) = torch.autograd.grad(ctx.norm(leaf), leaf, torch.cat(g_y), is_grads_batched=True)
            return (*g_x.split([len(g) for g in g_y]), None, None, None)
        r, xh, w, centre = folded  # [batch, pos, 1], [batch, pos, d_model], [d_model], bool
        out = []
        for g, lin in zip(grads, ctx.lins):
            n = lin.weight.shape[0] // ctx.d_head
            m = lin.weight.view(n, ctx.d_head, -1).to(xh.dtype) * w  # [n, d_head, d_model]: W_n diag(w)
            if centre:  # LayerNorm: the mean over d_model taken out of the weights
                m = m - m.mean(-1, keepdim=True)
            if g is None:
                out.append(torch.zeros(n, *x.shape, dtype=x.dtype, device=x.device))
                continue
            g = g.to(xh.dtype)
            u = torch.einsum("bpd,ned->bnpe", xh, m)  # x̂ through the folded weights
            c = (g * u).sum(-1) / xh.shape[-1]  # [batch, n, pos]: mean(g_w x̂)
            g_x = torch.einsum("bnpe,ned->nbpd", g * r.unsqueeze(1), m)
            g_x.addcmul_(c.transpose(0, 1).unsqueeze(-1), r * xh, value=-1.0)  # - r x̂ mean(g_w x̂)
            out.append(g_x.to(x.dtype))
        return (*out, None, None, None)


def _head_slices(g, lin, d_head, x) -> torch.Tensor:
    """``g [batch, n, pos, d_head]`` (None: zeros) -> each head's ``[n, batch, pos, d_model]`` at the projection's input."""
    n = lin.weight.shape[0] // d_head
    if g is None:
        return torch.zeros(n, *x.shape, dtype=x.dtype, device=x.device)
    return torch.einsum("bnpe,ned->nbpd", g, lin.weight.view(n, d_head, -1))


def _norm_folding(norm, x: torch.Tensor):
    """``(r, x̂, w, centre)`` of RMSNorm or LayerNorm at ``x [batch, pos, d_model]``: the inverse
    scale ``r``, the normalised input ``x̂``, the effective weight ``w`` and whether the mean is
    taken out (LayerNorm). The gradient at the input is then ``r (g_w - x̂ mean(g_w x̂))`` with
    ``g_w = g · w`` centred over ``d_model`` for LayerNorm. None for any other norm."""
    if isinstance(norm, RMSNorm):
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)
        return r, xf * r, (1.0 + norm.weight.float()) if norm.offset else norm.weight.float(), False
    if isinstance(norm, torch.nn.LayerNorm) and len(norm.normalized_shape) == 1:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xc = xf - xf.mean(-1, keepdim=True)
        r = torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + norm.eps)
        w = torch.ones_like(xf[0, 0]) if norm.weight is None else norm.weight.to(xf.dtype)
        return r, xc * r, w, True
    return None


def _attention_senders(block, x_q, x_k, x_v, mask, rope, cfg, per_head=True, shared=False, record=None):
    """One layer's heads on their own receiver inputs -> ``[head, batch, pos, d_model]`` (``W_O^h z_h``),
    or without ``per_head`` their sum ``[batch, pos, d_model]`` (one product with ``W_O``: no
    per-head output is written). ``shared``: every receiver's input is the same tensor
    (:class:`_SharedInputProjections`). ``record``: a ``[head, batch, pos, d_model]`` buffer the
    heads' outputs are also written into, without autograd."""
    attn, dh = block.attn, cfg.d_head
    n_h, n_kv = attn.n_heads, attn.n_kv_heads

    def proj(x, lin, n):  # [n, batch, pos, d_model] -> [batch, n, pos, d_head]
        w = lin.weight.view(n, dh, -1)
        y = torch.einsum("nbpd,ned->bnpe", block.ln1(x), w)
        return y if lin.bias is None else y + lin.bias.view(1, n, 1, dh)

    if shared:
        lins = (attn.q_proj, attn.k_proj, attn.v_proj)
        q, k, v = _SharedInputProjections.apply(x_q, x_k, x_v, block.ln1, lins, dh)
    else:
        q, k, v = proj(x_q, attn.q_proj, n_h), proj(x_k, attn.k_proj, n_kv), proj(x_v, attn.v_proj, n_kv)
    if attn.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    pattern = attention_pattern(q, k, mask, attn.kv_index, scale=attn.scale, softcap=attn.softcap)
    z = torch.matmul(pattern, repeat_kv(v, attn.kv_index))  # [batch, head, pos, d_head]
    w_o = attn.o_proj.weight.view(-1, n_h, dh)  # [d_model, head, d_head]
    if record is not None:  # each head's output, off the autograd graph, into [head, batch, pos, d_model]
        with torch.no_grad():
            zh = z.detach().transpose(0, 1).flatten(1, 2)  # [head, batch * pos, d_head]
            torch.bmm(zh, w_o.permute(1, 2, 0), out=record.view(n_h, -1, record.shape[-1]))
    if not per_head:  # [batch, pos, head * d_head] @ W_O^T, heads in W_O's column order
        return torch.matmul(z.transpose(1, 2).flatten(2), attn.o_proj.weight.t())
    return torch.einsum("bhpe,dhe->hbpd", z, w_o)


class _Diffs:
    """Each sender's ``this run - corrupted`` output, computed once when the sender is: in a buffer
    ``[sender, batch, pos, d_model]`` without autograd (one product per receiver group reads
    it), in a list under autograd (no in-place writes into what a backward needs)."""

    def __init__(self, corrupted: torch.Tensor | None):
        self.corrupted = corrupted
        self.buffered = corrupted is not None and not torch.is_grad_enabled()
        self.now = torch.empty_like(corrupted) if self.buffered else []

    def add(self, outs: list[torch.Tensor], n: int) -> None:
        """Record the last ``n`` senders of ``outs``."""
        if self.corrupted is None:
            return
        start = len(outs) - n
        new = torch.stack(outs[start:]) - self.corrupted[start : len(outs)]
        if self.buffered:
            self.now[start : len(outs)] = new
        else:
            self.now.extend(new.unbind(0))


def _check_patch(lay: EdgeLayout, corrupted, keep, senders: bool) -> None:
    """``ValueError`` for patching arguments :func:`graph_forward` cannot take."""
    if (corrupted is None) != (keep is None):
        raise ValueError("corrupted and keep are given together or not at all")
    if keep is not None and tuple(keep.shape) != (lay.n_senders, lay.n_receivers):
        raise ValueError(f"keep must be [sender={lay.n_senders}, receiver={lay.n_receivers}]; got {tuple(keep.shape)}")
    if not senders and corrupted is not None:
        raise ValueError("patched edges (corrupted=) read every sender's output: senders=False needs corrupted=None")


class _LayerInputs:
    """Each layer's additive mask and RoPE ``(cos, sin)``, computed once per window and per RoPE
    setting (most stacks have one of each)."""

    def __init__(self, net: Transformer, ids: torch.Tensor, positions: torch.Tensor, dtype):
        self.cfg, self.ids, self.positions, self.dtype = net.cfg, ids, positions, dtype
        self.masks, self.ropes = {}, {}

    def of(self, block):
        cfg = self.cfg
        if block.window not in self.masks:
            ones = torch.ones_like(self.ids)
            self.masks[block.window] = additive_mask(ones, cfg.causal, dtype=self.dtype, window=block.window)
        if cfg.positional != "rope":
            return self.masks[block.window], None
        key = (block.rope_theta, repr(block.rope_scaling))
        if key not in self.ropes:
            self.ropes[key] = rope_cos_sin(self.positions, cfg.d_head, block.rope_theta, block.rope_scaling)
        return self.masks[block.window], self.ropes[key]


def graph_forward(
    net: Transformer,
    ids: torch.Tensor,
    *,
    embed: torch.Tensor | None = None,
    corrupted: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
    grad_probes: bool = False,
    senders: bool = True,
):
    """The forward of a pre-norm decoder through its senders and receivers.

    ``ids [batch, pos]`` (no padding); ``embed [batch, pos, d_model]`` replaces the input
    embeddings (EAP-IG's interpolation); ``corrupted [sender, batch, pos, d_model]`` with ``keep
    [sender, receiver]`` (1 = this run's value, 0 = corrupted; fractions interpolate) patches
    edges. Returns ``(logits, outs, probes)``: the last position's ``logits [batch, vocab]`` (what
    the patching metrics read), ``outs [sender, batch, pos, d_model]`` (without patching: a buffer
    with no autograd history) and ``probes``: a list of
    ``[receivers, batch, pos, d_model]`` tensors, one per group of receivers in receiver order
    (concatenated, one per receiver), or None; with ``grad_probes`` the probes are the
    receivers' inputs themselves (no copy: without patching each is ``resid`` expanded), whose
    gradients ``torch.autograd.grad`` takes (the q, k, v weights get none). Without ``senders`` (only
    without ``corrupted``) ``outs`` is None and no sender's output is kept: a layer's heads
    write their sum (EAP-IG's gradient runs, which read the probes alone).
    """
    cfg = net.cfg
    lay = EdgeLayout(n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads)
    _check_patch(lay, corrupted, keep, senders)
    x0, positions = net.embed_tokens(ids)
    if embed is not None:
        x0 = embed
    probes: list[torch.Tensor] | None = [] if grad_probes else None
    if grad_probes and not x0.requires_grad:  # the graph the probes' gradients run back through starts here
        x0 = x0.detach().requires_grad_(True)

    def inputs(rs: slice) -> torch.Tensor:  # receivers rs' inputs [receiver, batch, pos, d_model], kept as probes
        x = _receiver_inputs(resid, diffs.now, len(outs), rs, keep)
        if probes is not None:
            probes.append(x)
        return x

    outs, resid = [x0], x0
    diffs = _Diffs(corrupted)
    diffs.add(outs, 1)
    n_h, n_kv = cfg.n_heads, cfg.n_kv_heads
    shared = keep is None  # every receiver of a layer reads the residual: the norm once
    # without patching, the senders' outputs go straight into one buffer, off the autograd graph
    record = torch.empty(lay.n_senders, *x0.shape, dtype=x0.dtype, device=x0.device) if senders and shared else None
    if record is not None:
        record[0] = x0.detach()
    layer_inputs = _LayerInputs(net, ids, positions, x0.dtype)
    for layer, block in enumerate(net.blocks):
        mask, rope = layer_inputs.of(block)
        q = lay.q_receiver(layer, 0)  # q per head, k per KV head, v per KV head: a probe each (no slicing)
        x_q, x_k, x_v = (
            inputs(slice(q + a, q + b)) for a, b in ((0, n_h), (n_h, n_h + n_kv), (n_h + n_kv, n_h + 2 * n_kv))
        )
        h0 = lay.head_sender(layer, 0)
        rec = None if record is None else record[h0 : h0 + n_h]
        heads = _attention_senders(block, x_q, x_k, x_v, mask, rope, cfg, senders and rec is None, shared, rec)
        if senders and rec is None:
            outs.extend(heads.unbind(0))
            diffs.add(outs, n_h)
            heads = heads.sum(0)
        resid = resid + heads
        if block.attn.o_proj.bias is not None:
            resid = resid + block.attn.o_proj.bias
        m = lay.mlp_receiver(layer)
        mlp = block.mlp(block.ln2(inputs(slice(m, m + 1)).squeeze(0)))
        if record is not None:
            record[lay.mlp_sender(layer)] = mlp.detach()
        elif senders:
            outs.append(mlp)
            diffs.add(outs, 1)
        resid = resid + mlp
    r = lay.logits_receiver
    final = inputs(slice(r, r + 1)).squeeze(0)
    logits = soft_capped(net.unembed(net.ln_final(final[:, -1])), cfg.final_softcap)
    return logits, record if record is not None else torch.stack(outs) if senders else None, probes


__all__ = ["EdgeLayout", "check_graph_model", "graph_forward"]
