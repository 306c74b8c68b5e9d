"""The check that makes a transformers model's per-head weights trustworthy: on real text, what the
extracted matrices compute must equal what the model's own forward computes, layer by layer.

- **OV**: ``pattern × (x W_V + b_V)``, head by head, equals the heads' output ``z`` the forward hands
  its attention output projection (the projection's input split by head), and
  ``Σ_h z_h W_O[h] + b_O`` equals the projection's output: together, ``pattern × V × W_O`` from
  the matrices is each head's output as the forward computes it.
- **Q/K projections** (separate projections): ``x W_Q + b_Q`` and ``x W_K + b_K`` equal the
  projections' outputs (before rotary and QK-norm).
- **Scores**: the pattern recomputed from the matrices, ``softmax(scale · rot(q) · rot(k) + bias)``,
  equals the model's (eager ``output_attentions``): rotary from the ``position_embeddings``
  ``(cos, sin)`` the attention module receives (rotate-half, on its first ``cos.shape[-1]``
  features), an ALiBi or relative ``position_bias`` it receives added, Gemma 2's soft-capping,
  QK-norm by the module's own ``q_norm``/``k_norm``; the masked keys are those the model gives
  exactly 0. A fused map's Q and K are confirmed by this alone.

Each error is relative: ``max |ours - model's| / max(1, max |model's|)``, within
:data:`~headscope.probes.models.head_check.TOLERANCE` (1e-5 in float32).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from headscope.probes.models.head_check import TOLERANCE

__all__ = ["CHECK_TEXT", "check_weights"]

#: the real text the check runs (a few sentences of plain English, punctuation and a repeat)
CHECK_TEXT = (
    "The cat sat on the mat because it was warm. Later, the cat sat on the mat again, "
    "and the dog watched it from the door."
)
#: the attention module's QK-norm modules, by name (Qwen3 and OLMo 2; Cohere, StableLM; HunYuan)
QK_NORMS = (
    ("q_norm", "k_norm"),
    ("q_layernorm", "k_layernorm"),
    ("query_layernorm", "key_layernorm"),
    ("qk_norm", "qk_norm"),  # Llama 4: one weightless RMSNorm for both
)
#: names of the attention module's arguments that carry a bias added to the scores
_BIAS_ARGS = ("position_bias", "alibi")


def _rel(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    theirs = theirs.float()
    return float((ours.float() - theirs).abs().max() / max(1.0, float(theirs.abs().max())))


def _capture_hooks(projections, kept: dict):
    """Hooks keeping, per layer, the projections' inputs and outputs and the attention module's arguments."""
    handles = []

    def keep_io(l, which):
        def hook(m, a, o):
            x, y = a[0].detach().clone(), (o[0] if isinstance(o, tuple) else o).detach().clone()  # Longformer scales
            if isinstance(m, nn.Conv1d):  # a 1×1 convolution runs channels first (SqueezeBERT): [batch, pos, features]
                x, y = x.transpose(1, 2), y.transpose(1, 2)
            kept[l, which + "_in"], kept[l, which + "_out"] = x, y  # its q in place afterwards: cloned

        return hook

    def keep_args(l):
        def hook(m, args, kwargs):
            try:
                bound = inspect.signature(m.forward).bind_partial(*args, **kwargs).arguments
            except TypeError:
                bound = dict(kwargs)
            kept[l, "args"] = {k: v for k, v in bound.items() if k != "kwargs"} | bound.get("kwargs", {})

        return hook

    def keep_returned(l):
        def hook(m, a, o):  # T5's attention returns (output, position_bias, weights)
            if isinstance(o, tuple) and len(o) > 2 and torch.is_tensor(o[1]) and o[1].dim() == 4:  # (Llama: 2)
                kept[l, "returned_bias"] = o[1].detach()

        return hook

    for l, p in enumerate(projections):
        mods = {"q": p.q} if p.fused else {"q": p.q, "k": p.k, "v": p.v}
        if "heads_part" in p.extras:
            mods["o"] = p.o
        for which, m in mods.items():
            handles.append(m.register_forward_hook(keep_io(l, which)))
        kept[l, "attn"] = p.attn
        handles.append(p.attn.register_forward_pre_hook(keep_args(l), with_kwargs=True))
        handles.append(p.attn.register_forward_hook(keep_returned(l)))
    return handles


def _heads(t: torch.Tensor, n: int) -> torch.Tensor:
    """``[batch, pos, n·d_head]`` -> ``[batch, n, pos, d_head]``."""
    return t.reshape(t.shape[0], t.shape[1], n, -1).transpose(1, 2)


def _project(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x [batch, pos, d_model]`` through ``W [n, d_model, d_head]`` (+ ``b [n, d_head]``) -> ``[batch, n, pos, d_head]``."""
    y = torch.einsum("bpm,nmd->bnpd", x.float(), W)
    return y + b[None, :, None, :] if b is not None else y


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary on the first ``cos.shape[-1]`` features of ``t [batch, n, pos, d_head]``."""
    r = cos.shape[-1]
    cos, sin = cos.float()[:, None], sin.float()[:, None]
    if cos.shape[-2] != t.shape[-2]:
        cos, sin = cos[..., -t.shape[-2] :, :], sin[..., -t.shape[-2] :, :]
    rot, rest = t[..., :r], t[..., r:]
    half = torch.cat((-rot[..., r // 2 :], rot[..., : r // 2]), dim=-1)
    return torch.cat((rot * cos + half * sin, rest), dim=-1)


def _qk_norm(attn, q: torch.Tensor, k: torch.Tensor):
    """The module's own QK-norm applied (per head where its weight is ``d_head`` long, else over all heads)."""
    names = QK_NORMS
    for qn, kn in names:
        nq, nk = getattr(attn, qn, None), getattr(attn, kn, None)
        if nq is None or nk is None:
            continue
        out = []
        for t, norm in ((q, nq), (k, nk)):
            width = getattr(norm, "weight", torch.empty(t.shape[-1])).numel()
            if width == t.shape[-1]:
                out.append(norm(t))
            else:
                b, n, p, d = t.shape
                out.append(norm(t.transpose(1, 2).reshape(b, p, n * d)).reshape(b, p, n, d).transpose(1, 2))
        return out[0].float(), out[1].float(), True
    return q, k, False


def _family_rotary(attn):
    """The family's own ``apply_rotary_pos_emb(q, k, cos, sin)`` from the module defining ``attn``'s class, or None."""
    fn = getattr(inspect.getmodule(type(attn)), "apply_rotary_pos_emb", None)
    return fn if callable(fn) else None


def _rotations(attn, args: dict):
    """``[(name, rotate(q, k) -> (q, k))]``: the family's own rotary function, then rotate-half, on the
    ``position_embeddings`` the module receives; RoFormer's ``sinusoidal_pos`` through the module's own
    ``apply_rotary_position_embeddings``; none without either."""
    out = [("none", lambda q, k: (q, k))]  # a layer may skip the rotary it is handed (SmolLM3's NoPE layers)
    sp = args.get("sinusoidal_pos")
    own = next(  # on BERT-style attention, the self-attention module inside it holds it
        (f for m in attn.modules() if callable(f := getattr(m, "apply_rotary_position_embeddings", None))), None
    )
    if torch.is_tensor(sp) and callable(own):
        out.append(("the module's apply_rotary_position_embeddings", lambda q, k: tuple(own(sp, q, k)[:2])))
    pe = args.get("position_embeddings")
    fn = getattr(inspect.getmodule(type(attn)), "apply_rotary_emb", None)
    if torch.is_tensor(pe) and pe.is_complex() and callable(fn):  # Llama 4: complex frequencies, [b, p, h, d]

        def cplx(q, k):
            qr, kr = fn(q.transpose(1, 2), k.transpose(1, 2), pe)
            return qr.transpose(1, 2).float(), kr.transpose(1, 2).float()

        return [*out, ("the family's apply_rotary_emb (complex)", cplx)]
    rot = getattr(attn, "rotary_emb", None)  # RecurrentGemma: its own rotary embedding, from position_ids
    if pe is None and isinstance(rot, torch.nn.Module) and torch.is_tensor(args.get("position_ids")):
        try:
            with torch.inference_mode():
                pe = tuple(rot(torch.zeros(1), args["position_ids"]))
        except (RuntimeError, TypeError, ValueError):
            pe = None
    if not (isinstance(pe, tuple) and len(pe) == 2 and all(torch.is_tensor(t) for t in pe)):
        return out
    fn = _family_rotary(attn)
    if fn is not None and list(inspect.signature(fn).parameters)[:3] == ["tensor", "sin", "cos"]:
        r = 2 * pe[0].shape[-1]  # GPT-J, CodeGen: interleaved pairs on the first rotary_dim features, [b, p, h, d]

        def pairs(t):
            t = t.transpose(1, 2)
            return torch.cat([fn(t[..., :r], *pe), t[..., r:]], dim=-1).transpose(1, 2).float()

        out.append(("the family's apply_rotary_pos_emb (interleaved pairs)", lambda q, k: (pairs(q), pairs(k))))
    elif fn is not None:
        out.append(("the family's apply_rotary_pos_emb", lambda q, k: tuple(t.float() for t in fn(q, k, *pe)[:2])))
    out.append(("rotate-half", lambda q, k: (_rotate(q, *pe), _rotate(k, *pe))))
    return out


def _score_bias(kept, l, pattern):
    """The bias the attention adds to its scores (an ``alibi`` or ``position_bias`` argument, or the
    ``position_bias`` T5's attention returns), as ``(name, [batch, head, query|1, key])`` or None."""
    args = kept[l, "args"]
    b, h, n_q, n_k = pattern.shape
    for name in _BIAS_ARGS:
        bias = args.get(name)
        if torch.is_tensor(bias):
            bias = bias.float().reshape(b, h, -1, bias.shape[-1]) if bias.dim() == 3 else bias.float()
            return name, bias[..., -n_q:, :n_k] if bias.shape[-2] > 1 else bias[..., :n_k]
    returned = kept.get((l, "returned_bias"))
    if torch.is_tensor(returned) and returned.dim() == 4 and returned.shape[-1] == n_k:
        returned = returned.float()[..., -n_q:, :]
        if (
            returned.shape != pattern.shape or _rel(returned, pattern) > 0
        ):  # GPT-NeoX-Japanese returns its weights there
            return "position_bias", returned
    return _own_bias(kept[l, "attn"], n_q, n_k)


def _own_bias(attn, n_q: int, n_k: int):
    """UMT5: each layer's own relative position bias (``compute_bias``), neither received nor returned."""
    own = next(
        (
            m
            for m in attn.modules()
            if getattr(m, "has_relative_attention_bias", False) and callable(getattr(m, "compute_bias", None))
        ),
        None,
    )
    if own is None:
        return None
    try:
        with torch.inference_mode():
            bias = own.compute_bias(n_q, n_k)
    except (RuntimeError, TypeError, ValueError):
        return None
    return "position_bias", bias.float()


def _layout_scores(attn, kept, l):
    """LiLT: the layout stream's own scores ``(layout_inputs W_LQ) · (layout_inputs W_LK) / sqrt(d_head / r)``,
    added to every text head's scores, from the module's own layout projections, as ``("layout scores", bias)``."""
    own = next((m for m in attn.modules() if hasattr(m, "layout_query") and hasattr(m, "layout_key")), None)
    li = kept[l, "args"].get("layout_inputs")
    if own is None or not torch.is_tensor(li):
        return None
    r = own.channel_shrink_ratio
    with torch.inference_mode():
        lq = own.transpose_for_scores(own.layout_query(li), r=r)
        lk = own.transpose_for_scores(own.layout_key(li), r=r)
        bias = torch.matmul(lq, lk.transpose(-1, -2)).float() / (own.attention_head_size // r) ** 0.5
    return "layout scores", bias


def _dynamic_mask(attn, lw, kept, l, x_q):
    """Doge's dynamic mask, recomputed from the matrices' V: each key's bias ``exp(A · softplus(V W_dt))``
    added to every query's score (the module's own ``prepare_dynamic_mask``), as ``("dynamic mask", bias)``."""
    if not (
        callable(getattr(attn, "prepare_dynamic_mask", None))
        and isinstance(getattr(attn, "dt_proj", None), torch.nn.Module)
    ):
        return None
    x_v = kept.get((l, "v_in"), x_q)
    v = _project(x_v, lw.W_V, lw.b_V)  # [batch, kv_head, pos, d_head]
    b, n, p, d = v.shape
    with torch.inference_mode():
        dt = attn.dt_proj(v.transpose(1, 2).reshape(b, p, n * d))
        dt = torch.exp(attn.A * torch.nn.functional.softplus(dt)).transpose(-1, -2)
        m = attn.prepare_dynamic_mask(
            hidden_states=x_q,
            dt_states=dt,
            keep_window_size=attn.keep_window_size,
            attention_mask=kept[l, "args"].get("attention_mask"),
        ).float()
    return "dynamic mask", m[:, lw.kv_index] if m.shape[1] != len(lw.heads) else m


def _scores_variants(weights, lw, kept, l, x_q, x_k, attn, pattern):
    """``{(scale, rotary, order): recomputed pattern}``: the pattern from ``lw``'s Q/K matrices under each
    candidate scale (:attr:`scales`), rotary function and QK-norm order (before or after rotary)."""
    q0 = _project(x_q, lw.W_Q, lw.b_Q)
    k0 = _project(x_k, lw.W_K, lw.b_K)  # per KV head (OLMo 2 normalises all of k's features at once)
    bias = _score_bias(kept, l, pattern) or _dynamic_mask(attn, lw, kept, l, x_q) or _layout_scores(attn, kept, l)
    cap = getattr(getattr(attn, "config", None), "attn_logit_softcapping", None)
    sinks = getattr(attn, "sinks", None)
    sinks = sinks.detach() if torch.is_tensor(sinks) and sinks.numel() == pattern.shape[1] else None
    out = {}
    with torch.inference_mode():
        for rot_name, rotate in _rotations(attn, kept[l, "args"]):
            orders = ("norm, then rotary", "rotary, then norm") if _has_qk_norm(attn) else ("",)
            for order in orders:
                try:
                    if order.startswith("rotary"):
                        q, k = rotate(q0, k0)
                        q, k, _ = _qk_norm(attn, q, k)
                    else:
                        q, k, _ = _qk_norm(attn, q0, k0)
                        q, k = rotate(q, k)
                except (RuntimeError, TypeError, ValueError):
                    continue
                qs = kept[l, "args"].get("attention_scaling")  # Beam's NoPE layers: a per-position query scale
                if torch.is_tensor(qs):
                    q = q.float() * qs.float()
                if getattr(attn, "attn_temperature_tuning", False) and not getattr(attn, "use_rope", True):
                    pos = torch.arange(q.shape[-2], dtype=torch.float32)  # Llama 4's NoPE layers
                    t = torch.log1p(torch.floor((pos + 1.0) / attn.floor_scale)) * attn.attn_scale + 1.0
                    q = q.float() * t[:, None]
                raw = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()[:, lw.kv_index])
                for scale in weights.scales:
                    sc = raw * scale
                    if cap:
                        sc = torch.tanh(sc / cap) * cap
                    if bias is not None:
                        sc = sc + bias[1]
                    sc = sc.masked_fill(pattern == 0, float("-inf"))
                    out[scale, rot_name, order, "joined" if sinks is not None else ""] = (_softmax(sc, sinks), None)
                    if sinks is not None:  # Granite's SWA: the pattern returned without the sink, the output
                        # scaled by the mass the sink leaves, sigmoid(logsumexp(scores) - sink)
                        lse = torch.logsumexp(sc, dim=-1)
                        factor = torch.sigmoid(lse - sinks.float().reshape(1, -1, 1)).nan_to_num(0.0)
                        out[scale, rot_name, order, "output scaled"] = (_softmax(sc, None), factor[..., None])
    return out, {"bias": bias[0] if bias else None, "softcap": float(cap) if cap else None, "sinks": sinks is not None}


def _softmax(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the keys; with ``sinks [head]`` (GPT-OSS), each head's learned logit joins the
    softmax as one more key whose weight is dropped (the pattern's rows then sum to less than 1)."""
    if sinks is None:
        return torch.softmax(scores, dim=-1).nan_to_num(0.0)
    b, h, q, _ = scores.shape
    joined = torch.cat([scores, sinks.float().reshape(1, h, 1, 1).expand(b, h, q, 1)], dim=-1)
    return torch.softmax(joined, dim=-1)[..., :-1].nan_to_num(0.0)


def _has_qk_norm(attn) -> bool:
    return any(getattr(attn, qn, None) is not None for qn, _ in QK_NORMS)


def _norm_hooks(blocks, kept: dict):
    """Hooks keeping layer 0's block input and the outputs of its norm modules (what precedes the projections)."""
    handles = [
        blocks[0].register_forward_pre_hook(
            lambda m, a: kept.__setitem__("block_in", a[0].detach()) if a and torch.is_tensor(a[0]) else None
        )
    ]
    for rel, m in blocks[0].named_modules():
        if rel and "norm" in type(m).__name__.lower():
            hook = lambda m, a, o, rel=rel: kept.setdefault("norms", {}).__setitem__(  # noqa: E731
                rel, (o[0] if isinstance(o, tuple) else o).detach()
            )
            handles.append(m.register_forward_hook(hook))
    return handles


def _preceding_norm(kept: dict, x: torch.Tensor, tol: float) -> str:
    """In words: which of layer 0's norms gives the projections' input ``x`` (or none: post-norm)."""
    for rel, t in kept.get("norms", {}).items():
        if t.shape == x.shape and _rel(x, t) <= tol:
            return f"the output of {rel}, the norm before attention"
    b = kept.get("block_in")
    if torch.is_tensor(b) and b.shape == x.shape and _rel(x, b) <= tol:
        return "the residual stream itself (no norm before attention: post-norm)"
    return "the input of the projections (no norm module's output matches it)"


def check_weights(model, weights, projections, *, text: str = CHECK_TEXT, blocks=None) -> dict:
    """Run ``text`` through ``model`` (an hf-backend model) and compare, layer by layer, what
    ``weights`` (an :class:`~headscope.probes.models.hf_weights.HFModelWeights`) computes with what
    the forward computed. Returns ``{"passed": bool, "reason": str | None, "errors": {part: worst
    relative error}, "tolerance": float, "positions": …}``; ``reason`` names the first part and layer
    that failed."""
    kept: dict = {}
    batch = model.encode(texts=[text])
    handles = _capture_hooks(projections, kept) + (_norm_hooks(blocks, kept) if blocks else [])
    try:
        out = model.run(batch, quantities=("pattern", "z", "out"))
    finally:
        for h in handles:
            h.remove()
    tol = TOLERANCE.get(next(model.hf.parameters()).dtype, 1e-5)
    worst: dict[str, float] = {}
    chosen: list = []
    reason = None
    acts: set = set()
    sink_modes: set = set()
    for l, p in enumerate(projections):
        errs, best, used = _layer_errors(weights, weights.layer(l), p, kept, out, l)
        acts.add(used.pop("gate_activation"))
        sink_modes.add(used.pop("sink_mode"))
        chosen.append(best)
        for part, e in errs.items():
            worst[part] = max(worst.get(part, 0.0), e)
            if reason is None and not e <= tol:
                reason = f"layer {l}: {_PARTS[part]} differs by {e:.1e} (relative; tolerance {tol:.0e})"
    scales = [c[0] for c in chosen if c is not None]
    scale = max(set(scales), key=scales.count) if scales else None
    rotary = sorted({c[1] for c in chosen if c is not None and c[1] != "none"})
    orders = sorted({c[2] for c in chosen if c is not None and c[2]})
    scores = {**used, "scale": scale, "rotary": rotary, "qk_norm": orders}
    scores["gate_activation"] = sorted(a for a in acts if a)
    scores["sink_mode"] = sorted(m for m in sink_modes if m)
    if rotary:
        l0 = next(l for l in range(len(chosen)) if chosen[l][1] != "none")
        pe, sp = kept[l0, "args"].get("position_embeddings"), kept[l0, "args"].get("sinusoidal_pos")
        rot = getattr(projections[l0].attn, "rotary_emb", None)
        if pe is None and rot is not None:
            with torch.inference_mode():
                pe = tuple(rot(torch.zeros(1), kept[l0, "args"]["position_ids"]))
        scores["rotary_features"] = (
            int(sp.shape[-1])  # RoFormer: all of each head's features
            if "sinusoidal" in chosen[l0][1] or "position_embeddings" in chosen[l0][1]
            else 2 * int(pe[0].shape[-1])  # GPT-J: sin and cos hold one value per pair
            if "pairs" in chosen[l0][1] or "complex" in chosen[l0][1]
            else int(pe[0].shape[-1])
        )
        scores["layers_without_rotary"] = [l for l, c in enumerate(chosen) if c is not None and c[1] == "none"]
    norm = _preceding_norm(kept, kept[0, "q_in"], tol)
    return {
        "passed": reason is None,
        "reason": reason,
        "errors": worst,
        "tolerance": tol,
        "scores": scores,
        "norm": norm,
    }


#: activations an output gate may apply, the check choosing (AFMoE, Beam, LFM3, Qwen3-Next: sigmoid; Laguna: softplus)
GATE_ACTS = {"sigmoid": torch.sigmoid, "softplus": torch.nn.functional.softplus}


def _gate(weights, lw, p, x: torch.Tensor) -> torch.Tensor | None:
    """The output gate's pre-activation ``[batch, head, pos, d_head or 1]`` at ``x``, or None without a gate."""
    gate = p.extras.get("gate")
    if not gate:
        return None
    w = weights._src._layer(lw.layer)["gate.weight"]
    b = weights._src._layer(lw.layer).get("gate.bias")
    g = x.float() @ w.T + (b if b is not None else 0.0)
    return _heads(g, len(lw.heads))


def _heads_output(weights, lw, p, kept, l, pattern, x_v, x_q, factor):
    """``{activation: z [batch, head, pos, d_head]}``: ``pattern × V`` from the matrices, V through the
    module's own V-norm, scaled by the sink's share, gated, through the joined-output norm (the
    per-position scales and gates are the forward's own at this input: what the weights hold frozen)."""
    v = _project(x_v, lw.W_V, lw.b_V)
    if "v_norm" in p.extras:
        with torch.inference_mode():
            v = getattr(p.attn, p.extras["v_norm"])(v).float()
    pv = torch.einsum("bhqk,bhkd->bhqd", pattern, v[:, lw.kv_index])
    if factor is not None:
        pv = pv * factor
    g = _gate(weights, lw, p, x_q)
    outs = {"": pv} if g is None else {name: pv * act(g) for name, act in GATE_ACTS.items()}
    if "z_norm" in p.extras:
        norm = getattr(p.attn, p.extras["z_norm"])
        with torch.inference_mode():
            for name, t in outs.items():
                b, h, q, d = t.shape
                outs[name] = _heads(norm(t.transpose(1, 2).reshape(b, q, h * d)).float(), h)
    return outs


def _batch_first(t: torch.Tensor, batch: int, n_pos: int) -> torch.Tensor:
    """A hooked ``[batch, pos, …]`` tensor from one the module ran position-first (Longformer's
    ``[pos, batch, …]``), at the input's positions (Longformer pads them to a whole number of windows)."""
    if t.dim() >= 3 and t.shape[0] != batch and t.shape[1] == batch:
        t = t.transpose(0, 1)
    return t[:, :n_pos] if t.dim() >= 3 and t.shape[1] > n_pos else t


def _layer_errors(weights, lw, p, kept, out, l):
    """``(errors by part, the scores variant that fits best, what the scores used)`` of layer ``l``."""
    pattern, z, o = out["pattern", l].float(), out["z", l].float(), out["out", l].float()
    for key in ("q_in", "k_in", "v_in", "q_out", "k_out"):
        if (l, key) in kept:
            kept[l, key] = _batch_first(kept[l, key], pattern.shape[0], pattern.shape[-1])
    x_q = kept[l, "q_in"]
    x_k, x_v = (kept[l, "k_in"], kept[l, "v_in"]) if not p.fused else (x_q, x_q)
    if "heads_part" in p.extras:  # ConvBERT: the other mixer's term of the output projection, from the forward
        rest = _batch_first(kept[l, "o_in"], pattern.shape[0], pattern.shape[-1])[..., p.extras["heads_part"] :]
        o = o - rest.float() @ weights._src._layer(l)["other_mixer.weight"].T
    errs = {"out": _rel(torch.einsum("bhpd,hdm->bpm", z, lw.W_O) + (lw.b_O if lw.b_O is not None else 0.0), o)}
    if not p.fused:
        q_out = kept[l, "q_out"]
        if p.extras.get("gate", {}).get("in_q"):  # [query | gate] per head: the query half
            q_out = q_out.reshape(*q_out.shape[:-1], len(lw.heads), 2, -1)[..., 0, :].flatten(-2)
        errs["q"] = _rel(_project(x_q, lw.W_Q, lw.b_Q), _heads(q_out, lw.W_Q.shape[0]))
        errs["k"] = _rel(_project(x_k, lw.W_K, lw.b_K), _heads(kept[l, "k_out"], lw.W_K.shape[0]))
    variants, used = _scores_variants(weights, lw, kept, l, x_q, x_k, p.attn, pattern)
    fits = {key: _rel(rec, pattern) for key, (rec, _) in variants.items()}
    best = min(fits, key=fits.get) if fits else None
    errs["pattern"] = fits[best] if best is not None else float("inf")
    factor = variants[best][1] if best is not None else None
    zs = _heads_output(weights, lw, p, kept, l, pattern, x_v, x_q, factor)
    z_errs = {name: _rel(t, z) for name, t in zs.items()}
    act = min(z_errs, key=z_errs.get)
    errs["z"] = z_errs[act]
    used = {**used, "gate_activation": act or None, "sink_mode": best[3] if best is not None else None}
    return errs, best, used


_PARTS = {
    "z": "pattern × V from W_V does not give the heads' output z",
    "out": "Σ z W_O from W_O does not give the output projection's output",
    "q": "x W_Q + b_Q does not give the query projection's output",
    "k": "x W_K + b_K does not give the key projection's output",
    "pattern": "the pattern recomputed from W_Q, W_K (scale, rotary, bias) is not the model's",
}
