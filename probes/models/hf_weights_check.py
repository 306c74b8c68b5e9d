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

from headscope.probes.models.head_check import TOLERANCE

__all__ = ["CHECK_TEXT", "check_weights"]

#: the real text the check runs (a few sentences of plain English, punctuation and a repeat)
CHECK_TEXT = (
    "The cat sat on the mat because it was warm. Later, the cat sat on the mat again, "
    "and the dog watched it from the door."
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
            kept[l, which + "_in"] = a[0].detach()
            kept[l, which + "_out"] = (o[0] if isinstance(o, tuple) else o).detach()

        return hook

    def keep_args(l):
        def hook(m, args, kwargs):
            try:
                bound = inspect.signature(m.forward).bind_partial(*args, **kwargs).arguments
            except TypeError:
                bound = dict(kwargs)
            kept[l, "args"] = {k: v for k, v in bound.items() if k != "kwargs"} | bound.get("kwargs", {})

        return hook

    for l, p in enumerate(projections):
        mods = {"q": p.q} if p.fused else {"q": p.q, "k": p.k, "v": p.v}
        for which, m in mods.items():
            handles.append(m.register_forward_hook(keep_io(l, which)))
        handles.append(p.attn.register_forward_pre_hook(keep_args(l), with_kwargs=True))
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
    names = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"))
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


def _scores_pattern(weights, lw, kept, l, x_q, x_k, attn, pattern):
    """The pattern recomputed from ``lw``'s Q/K matrices, and what it used (``rotary``, ``bias``, ``qk_norm``)."""
    args = kept[l, "args"]
    q = _project(x_q, lw.W_Q, lw.b_Q)
    k = _project(x_k, lw.W_K, lw.b_K)
    with torch.inference_mode():
        q, k, normed = _qk_norm(attn, q, k)  # K per KV head (OLMo 2 normalises all of k's features at once)
    k = k[:, lw.kv_index]
    used = {"qk_norm": normed}
    pe = args.get("position_embeddings")
    if isinstance(pe, tuple) and len(pe) == 2 and all(torch.is_tensor(t) for t in pe):
        q, k = _rotate(q, *pe), _rotate(k, *pe)
        used["rotary"] = int(pe[0].shape[-1])
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * weights.scale
    cap = getattr(getattr(attn, "config", None), "attn_logit_softcapping", None)
    if cap:
        s = torch.tanh(s / cap) * cap
        used["softcap"] = float(cap)
    for name in _BIAS_ARGS:
        bias = args.get(name)
        if torch.is_tensor(bias):
            b, h = pattern.shape[:2]
            bias = bias.float().reshape(b, h, -1, bias.shape[-1]) if bias.dim() == 3 else bias.float()
            s = s + bias[..., : s.shape[-2], : s.shape[-1]] if bias.shape[-2] > 1 else s + bias[..., : s.shape[-1]]
            used["bias"] = name
    s = s.masked_fill(pattern == 0, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0), used


def _norm_hooks(blocks, kept: dict):
    """Hooks keeping layer 0's block input and the outputs of its norm modules (what precedes the projections)."""
    handles = [blocks[0].register_forward_pre_hook(lambda m, a: kept.__setitem__("block_in", a[0].detach()))]
    for rel, m in blocks[0].named_modules():
        if rel and "norm" in type(m).__name__.lower():
            hook = lambda m, a, o, rel=rel: kept.setdefault("norms", {}).__setitem__(rel, o.detach())  # noqa: E731
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
    used: dict = {}
    reason = None
    for l, p in enumerate(projections):
        lw = weights.layer(l)
        pattern, z, o = out["pattern", l].float(), out["z", l].float(), out["out", l].float()
        x_q = kept[l, "q_in"]
        x_k, x_v = (kept[l, "k_in"], kept[l, "v_in"]) if not p.fused else (x_q, x_q)
        v = _project(x_v, lw.W_V, lw.b_V)[:, lw.kv_index]
        errs = {
            "z": _rel(torch.einsum("bhqk,bhkd->bhqd", pattern, v), z),
            "out": _rel(torch.einsum("bhpd,hdm->bpm", z, lw.W_O) + (lw.b_O if lw.b_O is not None else 0.0), o),
        }
        if not p.fused:
            errs["q"] = _rel(_project(x_q, lw.W_Q, lw.b_Q), _heads(kept[l, "q_out"], lw.W_Q.shape[0]))
            errs["k"] = _rel(_project(x_k, lw.W_K, lw.b_K), _heads(kept[l, "k_out"], lw.W_K.shape[0]))
        recomputed, used = _scores_pattern(weights, lw, kept, l, x_q, x_k, p.attn, pattern)
        errs["pattern"] = _rel(recomputed, pattern)
        for part, e in errs.items():
            worst[part] = max(worst.get(part, 0.0), e)
            if reason is None and not e <= tol:
                reason = f"layer {l}: {_PARTS[part]} differs by {e:.1e} (relative; tolerance {tol:.0e})"
    norm = _preceding_norm(kept, kept[0, "q_in"], tol)
    return {"passed": reason is None, "reason": reason, "errors": worst, "tolerance": tol, "scores": used, "norm": norm}


_PARTS = {
    "z": "pattern × V from W_V does not give the heads' output z",
    "out": "Σ z W_O from W_O does not give the output projection's output",
    "q": "x W_Q + b_Q does not give the query projection's output",
    "k": "x W_K + b_K does not give the key projection's output",
    "pattern": "the pattern recomputed from W_Q, W_K (scale, rotary, bias) is not the model's",
}
