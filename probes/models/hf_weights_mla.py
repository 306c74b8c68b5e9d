"""Per-head weights of multi-head latent attention (MLA: DeepSeek-V2/V3, MiniCPM3, Kimi-Linear, GLM-4-MoE-Lite,
LongCat-Flash, …), read from its low-rank projections and checked against its forward.

In MLA every head's key and value are read up from one shared latent ``c = x W_DKV (+ b)`` of width
``kv_lora_rank`` through an RMSNorm (weight ``g``) and ``kv_b_proj`` (per head ``W_UK[h]``, ``W_UV[h]``);
the query likewise through ``q_a_proj``, an RMSNorm and ``q_b_proj`` where there is a q-LoRA. An RMSNorm
is a per-position scalar ``r(pos) = 1 / rms(c)`` times ``diag(g)``, so with ``r`` **frozen at its value
on the clean forward** each head's maps are linear in the residual stream:

- content key ``W_K[h] = W_DKV^T · diag(g) · W_UK[h]^T  [d_model, qk_nope]`` (times ``r_kv(pos)``),
- value ``W_V[h] = W_DKV^T · diag(g) · W_UV[h]^T  [d_model, v_head]`` (times ``r_kv(pos)``),
- query ``W_Q[h] = W_DQ^T · diag(g_q) · W_UQ[h]^T`` (times ``r_q(pos)``; exact where there is no q-LoRA),
- the rotary key part ``W_KR = kv_a_proj_with_mqa``'s last ``qk_rope`` rows, **shared by all heads**
  (no norm: exact), the last ``qk_rope`` columns of every head's ``W_K`` (and :meth:`MLAWeights.rope_key`).

So ``W_K``/``W_V`` hold one KV head per query head (``kv_index`` the identity), ``W_Q``/``W_K`` are
``qk_nope + qk_rope`` wide and ``W_V``/``W_O`` ``v_head`` wide. :func:`mla_weights` checks them on real
text: ``r_q``, ``r_kv`` read from the forward's own norm input and output, then ``x W_Q``, the content
key and value (against ``q_b_proj``/``kv_b_proj``'s outputs), the rotary key (against
``kv_a_proj_with_mqa``'s), the pattern recomputed with the family's own rotary and the module's scale,
``pattern × V`` against the heads' output and ``Σ z W_O`` against the output projection's, each to 1e-5.
"""

from __future__ import annotations

import torch
from torch import nn

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.head_check import TOLERANCE
from headscope.probes.models.inhouse.head_weights import LayerWeights

__all__ = ["MLA_MODULES", "is_mla", "mla_weights"]

#: the modules an MLA attention holds (the query either ``q_proj`` or ``q_a_proj``/``q_a_layernorm``/``q_b_proj``)
MLA_MODULES = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj")
#: what the matrices hold frozen, in words (:attr:`HFModelWeights.frozen`)
FROZEN_KV = (
    "kv_a_layernorm's per-position 1/RMS of the shared KV latent, frozen at the clean forward's value: each "
    "head's content key and value are x W_K[h], x W_V[h] times this scalar (its weight is folded into W_K, W_V)"
)
FROZEN_Q = (
    "q_a_layernorm's per-position 1/RMS of the query latent (q-LoRA), frozen at the clean forward's value: "
    "each head's query is x W_Q[h] times this scalar (its weight is folded into W_Q)"
)


def is_mla(attn: nn.Module) -> bool:
    return all(isinstance(getattr(attn, n, None), nn.Module) for n in MLA_MODULES)


def mla_refusal(attn: nn.Module) -> str | None:
    """Why an MLA module's per-head weights are not read (one line), or None."""
    has = lambda n: isinstance(getattr(attn, n, None), nn.Module)  # noqa: E731
    if has("q_gate_proj"):
        return (
            f"MLA {type(attn).__name__}: each query is q_gate_proj over [norm(q latent), q latent], the sum of a "
            "norm-scaled and an unscaled map of the residual: no single per-head W_Q, even with the norm's scale frozen"
        )
    if not (has("q_proj") or (has("q_a_proj") and has("q_a_layernorm") and has("q_b_proj"))):
        return (
            f"MLA {type(attn).__name__}: its query is neither q_proj nor q_a_proj -> q_a_layernorm -> q_b_proj "
            "(read up from the shared latent another way): per-head W_Q not read"
        )
    return None


def _w(mod: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    b = getattr(mod, "bias", None)
    return mod.weight.detach().float().cpu(), (b.detach().float().cpu() if isinstance(b, torch.Tensor) else None)


def _dims(attn: nn.Module, n_heads: int) -> tuple[int, int, int, int]:
    """``(kv_lora_rank, qk_nope, qk_rope, v_head)`` of an MLA module."""
    cfg = attn.config
    return int(cfg.kv_lora_rank), int(cfg.qk_nope_head_dim), int(cfg.qk_rope_head_dim), int(cfg.v_head_dim)


def _const(attn, name: str) -> float:
    v = getattr(attn, name, None)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 1.0


def layer_tensors(attn: nn.Module, n_heads: int) -> dict:
    """One MLA layer's per-head matrices (float32, CPU): ``W_Q [h, d_model, nope+rope]`` (+ ``b_Q``),
    ``W_K [h, d_model, nope+rope]`` (content, then the shared rotary part) and ``b_K``, ``W_V [h, d_model,
    v]``, ``b_V``, ``W_O [h, v, d_model]``, ``b_O``; ``q_lora``: whether the query has a latent norm."""
    rank, dn, dr, dv = _dims(attn, n_heads)
    h = n_heads
    sq, skv = _const(attn, "mla_scale_q_lora"), _const(attn, "mla_scale_kv_lora")  # LongCat-Flash's constants
    skv *= _const(attn, "kv_lora_scale")  # Dots: the normalised latents rescaled before kv_b_proj / q_b_proj
    a_w, a_b = _w(attn.kv_a_proj_with_mqa)
    W_dkv, W_kr = a_w[:rank], a_w[rank:]
    b_dkv, b_kr = (a_b[:rank], a_b[rank:]) if a_b is not None else (None, None)
    g = attn.kv_a_layernorm.weight.detach().float().cpu() * skv
    ub_w, ub_b = _w(attn.kv_b_proj)
    if ub_b is not None:
        raise ModelIncompatibleError("MLA: kv_b_proj has a bias (not scaled by the latent norm): not read")
    ub = ub_w.view(h, dn + dv, rank)
    W_uk, W_uv = ub[:, :dn], ub[:, dn:]
    W_K_c = torch.einsum("hnr,r,rm->hmn", W_uk, g, W_dkv)
    W_V = torch.einsum("hvr,r,rm->hmv", W_uv, g, W_dkv)
    b_K_c = torch.einsum("hnr,r,r->hn", W_uk, g, b_dkv) if b_dkv is not None else torch.zeros(h, dn)
    b_V = torch.einsum("hvr,r,r->hv", W_uv, g, b_dkv) if b_dkv is not None else None
    kr_norm = getattr(attn, "k_rope_only_layernorm", None)  # Dots: an RMSNorm on the shared rotary key
    if isinstance(kr_norm, nn.Module):
        g_kr = kr_norm.weight.detach().float().cpu()
        W_kr = W_kr * g_kr[:, None]
        b_kr = b_kr * g_kr if b_kr is not None else None
    W_K = torch.cat([W_K_c, W_kr.T[None].expand(h, -1, -1)], dim=-1)
    b_K = torch.cat([b_K_c, (b_kr if b_kr is not None else torch.zeros(dr))[None].expand(h, -1)], dim=-1)
    q_lora = isinstance(getattr(attn, "q_a_proj", None), nn.Module)
    if q_lora:
        qa_w, qa_b = _w(attn.q_a_proj)
        gq = attn.q_a_layernorm.weight.detach().float().cpu() * _const(attn, "q_lora_scale")
        qb_w, qb_b = _w(attn.q_b_proj)
        if qb_b is not None:
            raise ModelIncompatibleError("MLA: q_b_proj has a bias (not scaled by the latent norm): not read")
        qb = qb_w.view(h, dn + dr, -1)
        W_Q = torch.einsum("hdr,r,rm->hmd", qb, gq, qa_w)
        b_Q = torch.einsum("hdr,r,r->hd", qb, gq, qa_b) if qa_b is not None else None
    else:
        q_w, q_b = _w(attn.q_proj)
        W_Q = q_w.view(h, dn + dr, -1).transpose(1, 2)
        b_Q = q_b.view(h, dn + dr) if q_b is not None else None
    o_w, o_b = _w(attn.o_proj)
    W_O = o_w.view(-1, h, dv).permute(1, 2, 0)
    return {
        "W_Q": (W_Q * sq).contiguous(),
        "b_Q": b_Q * sq if b_Q is not None else None,
        "W_K": W_K.contiguous(),
        "b_K": b_K.contiguous() if (b_dkv is not None or b_kr is not None) else None,
        "W_V": W_V.contiguous(),
        "b_V": b_V,
        "W_O": W_O.contiguous(),
        "b_O": o_b,
        "q_lora": q_lora,
        "dims": (rank, dn, dr, dv),
        "q_scale": sq,
        "k_rope_norm": isinstance(kr_norm, nn.Module),
    }


def mla_weights(model, attns: list[nn.Module], base_cls, shape, source):
    """The checked MLA weights of ``model`` (``attns``: each layer's attention module), an instance of a
    subclass of ``base_cls`` (:class:`~headscope.probes.models.hf_weights.HFModelWeights`); raises
    :class:`ModelIncompatibleError` naming the part and layer that failed."""
    h = model.spec.n_heads
    why = mla_refusal(attns[0])
    if why is not None:
        raise ModelIncompatibleError(why)

    class _MLA(base_cls):
        def layer(self, layer: int) -> LayerWeights:
            if not 0 <= layer < self.n_layers:
                raise ValueError(f"layer must be in [0, {self.n_layers}); got {layer}")
            t = layer_tensors(attns[layer], h)
            return LayerWeights(
                layer=layer,
                heads=tuple(range(h)),
                kv_index=torch.arange(h),
                W_Q=t["W_Q"],
                W_K=t["W_K"],
                W_V=t["W_V"],
                W_O=t["W_O"],
                b_Q=t["b_Q"],
                b_K=t["b_K"],
                b_V=t["b_V"],
                b_O=t["b_O"],
            )

        def rope_key(self, layer: int) -> torch.Tensor:
            """``W_KR [d_model, qk_rope]``: the rotary key part every head shares (exact, no norm)."""
            rank = _dims(attns[layer], h)[0]
            return attns[layer].kv_a_proj_with_mqa.weight.detach().float().cpu()[rank:].T.contiguous()

    scale = getattr(attns[0], "scaling", None)
    weights = _MLA(shape, source, norm="not found", positions="rope", scales=(float(scale),) if scale else (1.0,))
    record = _check(model, weights, attns)
    if not record["passed"]:
        raise ModelIncompatibleError(f"MLA per-head weights fail the check: {record['reason']}")
    weights.check = {**record, "layout": "MLA (low-rank latent Q/KV)"}
    weights.scale = weights.scales[0]
    weights.norm = record["norm"]
    rot = record["scores"]["rotary"]
    weights.positional = "rope" if rot else "none"
    weights.positions = (
        f"rotary on a {record['scores']['rotary_features']}-feature part of q and of one key part shared by all "
        f"heads ({', '.join(rot)}); the content part carries no position"
        if rot
        else "no position information in attention (NoPE MLA)"
    )
    t0 = layer_tensors(attns[0], h)
    weights.frozen = [FROZEN_KV] + ([FROZEN_Q] if t0["q_lora"] else [])
    if t0["k_rope_norm"]:
        weights.frozen.append(
            "k_rope_only_layernorm's per-position 1/RMS of the shared rotary key, frozen at the clean forward's value"
        )
    if _gate_of(attns[0], model.spec.d_model, h, t0["dims"][3]) is not None:
        weights.frozen.append(
            "output gate sigmoid(x W_gate) multiplies each head's output before W_O: an input-dependent diagonal "
            "frozen at its clean value"
        )
    if torch.is_tensor(getattr(attns[0], "sinks", None)):
        weights.frozen.append("(exact) a learned sink logit per head joins each softmax (rows sum to less than 1)")
    return weights


def _hooks(attns, kept):
    handles = []
    names = ("q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "k_rope_only_layernorm", *MLA_MODULES)

    def io(l, name):
        def hook(m, a, o):
            kept[l, name + "_in"] = a[0].detach().float()
            kept[l, name + "_out"] = (o[0] if isinstance(o, tuple) else o).detach().float()

        return hook

    def args(l):
        def hook(m, a, kw):
            kept[l, "pe"] = kw.get("position_embeddings", a[1] if len(a) > 1 else None)

        return hook

    for l, attn in enumerate(attns):
        for n in names:
            m = getattr(attn, n, None)
            if isinstance(m, nn.Module):
                handles.append(m.register_forward_hook(io(l, n)))
        handles.append(attn.register_forward_pre_hook(args(l), with_kwargs=True))
    return handles


def _norm_scale(n_in: torch.Tensor, n_out: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The per-position scalar ``r`` with ``norm(c) = r · g ⊙ c`` (least squares on the forward's own
    input and output; exact for an RMSNorm), ``[batch, pos, 1]``."""
    gc = n_in * g
    return (n_out * gc).sum(-1, keepdim=True) / (gc * gc).sum(-1, keepdim=True).clamp_min(1e-30)


def _rel(ours, theirs) -> float:
    return float((ours - theirs).abs().max() / max(1.0, float(theirs.abs().max())))


def _rotations(attn):
    import inspect

    mod = inspect.getmodule(type(attn))
    out = [("none", lambda q, k, pe: (q, k))]
    for name in ("apply_rotary_pos_emb_interleave", "apply_rotary_pos_emb", "apply_rotary_emb"):
        fn = getattr(mod, name, None)
        if callable(fn):
            if name == "apply_rotary_emb":
                out.append((f"the family's {name}", lambda q, k, pe, fn=fn: fn(q, k, pe)[:2]))
            else:
                out.append((f"the family's {name}", lambda q, k, pe, fn=fn: fn(q, k, *pe)[:2]))
    return out


def _gate_of(attn, dm: int, h: int, dv: int):
    """``(W_gate [width, d_model], bias or None)`` of the attention's sigmoid output gate, or None."""
    from headscope.probes.models.hf_weights_extras import extras_of, linear_weights

    gate = extras_of(attn, dm, h, dv).get("gate")
    return linear_weights(getattr(attn, gate["module"])) if gate else None


def _check(model, weights, attns) -> dict:
    """Run the check text and compare, layer by layer, what ``weights`` compute with the forward's own
    (see the module doc); the record :func:`~headscope.probes.models.hf_weights_check.check_weights` gives."""
    from headscope.probes.models.hf_weights_check import CHECK_TEXT

    kept: dict = {}
    batch = model.encode(texts=[CHECK_TEXT])
    handles = _hooks(attns, kept)
    try:
        out = model.run(batch, quantities=("pattern", "z", "out"))
    finally:
        for hd in handles:
            hd.remove()
    tol = TOLERANCE.get(next(model.hf.parameters()).dtype, 1e-5)
    worst: dict[str, float] = {}
    reason = None
    rot_used: set = set()
    rot_features = 0
    for l, attn in enumerate(attns):
        errs, best = _layer_errors(model, weights, attn, kept, out, l)
        if best and best != "none":
            rot_used.add(best)
            rot_features = int(attn.config.qk_rope_head_dim)
        for part, e in errs.items():
            worst[part] = max(worst.get(part, 0.0), e)
            if reason is None and not e <= tol:
                reason = f"layer {l}: {_PARTS[part]} differs by {e:.1e} (relative; tolerance {tol:.0e})"
    return {
        "passed": reason is None,
        "reason": reason,
        "errors": worst,
        "tolerance": tol,
        "scores": {"scale": weights.scales[0], "rotary": sorted(rot_used), "rotary_features": rot_features},
        "norm": "the input of kv_a_proj_with_mqa and the query projection (the output of the norm before attention)",
    }


def _qkv(attn, lw, t, kept, l, h):
    """Layer ``l``'s ``(q, content k, rotary k, v)`` from the matrices, the latent norms' scales taken from
    the forward, and the forward's own ``(q, kv_b_proj's output, rotary k)`` to compare them with."""
    rank, dn, dr, dv = t["dims"]
    x = kept[l, "kv_a_proj_with_mqa_in"]
    b_, p_ = x.shape[:2]
    g = attn.kv_a_layernorm.weight.detach().float()
    r_kv = _norm_scale(kept[l, "kv_a_layernorm_in"], kept[l, "kv_a_layernorm_out"], g)[:, None]  # [b, 1, p, 1]

    def proj(W, b):
        y = torch.einsum("bpm,hmd->bhpd", x, W)
        return y + b[None, :, None, :] if b is not None else y

    q = proj(lw.W_Q, lw.b_Q)
    if t["q_lora"]:
        gq = attn.q_a_layernorm.weight.detach().float()
        q = q * _norm_scale(kept[l, "q_a_layernorm_in"], kept[l, "q_a_layernorm_out"], gq)[:, None]
    q_model = kept[l, "q_b_proj_out" if t["q_lora"] else "q_proj_out"]
    q_model = q_model.view(b_, p_, h, dn + dr).transpose(1, 2) * t["q_scale"]
    k = proj(lw.W_K, lw.b_K)
    k_c, k_r = k[..., :dn] * r_kv, k[..., dn:]
    k_r_model = kept[l, "kv_a_proj_with_mqa_out"][..., rank:]
    if t["k_rope_norm"]:  # Dots: the shared rotary key's own norm, its scale from the forward too
        k_in = kept[l, "k_rope_only_layernorm_in"].reshape(b_, -1, dr)
        k_r_model = kept[l, "k_rope_only_layernorm_out"].reshape(b_, -1, dr)
        k_r = k_r * _norm_scale(k_in, k_r_model, attn.k_rope_only_layernorm.weight.detach().float())[:, None]
    v = proj(lw.W_V, lw.b_V) * r_kv
    kvb = kept[l, "kv_b_proj_out"].view(b_, p_, h, dn + dv).transpose(1, 2)
    return (q, k_c, k_r, v), (q_model, kvb, k_r_model)


def _layer_errors(model, weights, attn, kept, out, l):
    """``(relative error by part, the rotary that fits best)`` of MLA layer ``l``."""
    from headscope.probes.models.hf_weights_check import _heads, _softmax

    h = model.spec.n_heads
    t = layer_tensors(attn, h)
    lw = weights.layer(l)
    dn, dv = t["dims"][1], t["dims"][3]
    (q, k_c, k_r, v), (q_model, kvb, k_r_model) = _qkv(attn, lw, t, kept, l, h)
    x = kept[l, "kv_a_proj_with_mqa_in"]
    errs = {
        "q": _rel(q, q_model),
        "k": _rel(k_c, kvb[..., :dn]),
        "k_rope": _rel(k_r[:, 0], k_r_model),
        "v": _rel(v, kvb[..., dn:]),
    }
    pattern, z, o = out["pattern", l].float(), out["z", l].float(), out["out", l].float()
    pv = torch.einsum("bhqk,bhkd->bhqd", pattern, v)
    gate = _gate_of(attn, x.shape[-1], h, dv)
    if gate is not None:
        pv = pv * torch.sigmoid(_heads(x @ gate[0].T + (gate[1] if gate[1] is not None else 0.0), h))
    errs["z"] = _rel(pv, z)
    errs["out"] = _rel(torch.einsum("bhpd,hdm->bpm", z, lw.W_O) + (lw.b_O if lw.b_O is not None else 0.0), o)
    sinks = getattr(attn, "sinks", None)
    sinks = sinks.detach().float() if torch.is_tensor(sinks) and sinks.numel() == h else None
    fits = {}
    for name, rotate in _rotations(attn):
        try:
            with torch.inference_mode():
                q_r, k_rr = rotate(q[..., dn:], k_r[:, :1], kept.get((l, "pe")))
        except (RuntimeError, TypeError, ValueError, AttributeError, IndexError):
            continue
        qq = torch.cat([q[..., :dn], q_r.float()], -1)
        kk = torch.cat([k_c, k_rr.float().expand(-1, h, -1, -1)], -1)
        sc = torch.einsum("bhqd,bhkd->bhqk", qq, kk) * weights.scales[0]
        fits[name] = _rel(_softmax(sc.masked_fill(pattern == 0, float("-inf")), sinks), pattern)
    best = min(fits, key=fits.get) if fits else None
    errs["pattern"] = fits[best] if best else float("inf")
    return errs, best


_PARTS = {
    "q": "x W_Q (times the q-latent norm's frozen scale) does not give q_b_proj's / q_proj's output",
    "k": "x W_K's content part (times the KV-latent norm's frozen scale) does not give kv_b_proj's key output",
    "k_rope": "x W_KR does not give kv_a_proj_with_mqa's rotary key part",
    "v": "x W_V (times the KV-latent norm's frozen scale) does not give kv_b_proj's value output",
    "z": "pattern × V from W_V does not give the heads' output z",
    "out": "Σ z W_O from W_O does not give the output projection's output",
    "pattern": "the pattern recomputed from W_Q, W_K (scale, the family's rotary) is not the model's",
}
