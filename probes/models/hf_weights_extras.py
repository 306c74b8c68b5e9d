"""What sits between a transformers attention's projections and its output projection, read from its
modules for :mod:`~headscope.probes.models.hf_weights` and :mod:`~headscope.probes.models.hf_weights_mla`
(output gates, norms on V or on the heads' joined output, a constant on V), and what the checked
weights then hold frozen, in words (:func:`frozen_lines`); the position scheme the check used, in
words (:func:`positions_in_words`); the linear maps' float32 copies (:func:`linear_weights`)."""

from __future__ import annotations

import torch
from torch import nn

from headscope.probes.models.hf_layout import linear_shape

__all__ = [
    "GATE_NAMES",
    "V_NORM_NAMES",
    "Z_NORM_NAMES",
    "extras_of",
    "frozen_lines",
    "linear_weights",
    "positions_in_words",
]


def linear_weights(mod: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight [out, in], bias [out] or None)`` of a linear map, float32 CPU copies (GPT-2's
    ``Conv1D`` holds ``[in, out]``: transposed; a 1×1 ``nn.Conv1d`` squeezed, a grouped one block-diagonal)."""
    w = mod.weight.detach()
    if type(mod).__name__ == "Conv1D":
        w = w.T
    elif isinstance(mod, nn.Conv1d):  # 1×1: [out, in / groups, 1]; grouped, the block-diagonal [out, in]
        w = torch.block_diag(*w[:, :, 0].chunk(mod.groups, dim=0))
    b = getattr(mod, "bias", None)
    b = b.detach().float().cpu().clone() if isinstance(b, torch.Tensor) else None
    return w.float().cpu().clone(), b


#: output gates by module name: ``act(x W_gate (+ gate_bias))`` multiplies each head's output
GATE_NAMES = ("gate_proj", "g_proj", "o_gate", "gate")
#: norms on V (Gemma 3n, Gemma 4) and on the heads' joined output before the output projection (BitNet)
V_NORM_NAMES = ("v_norm",)
Z_NORM_NAMES = ("attn_sub_norm", "o_norm", "sub_norm")


def extras_of(attn: nn.Module, dm: int, h: int, d: int) -> dict:
    """What sits between ``x W_V`` and the output projection's input, from the attention module: an
    output gate (a linear map of ``d_model`` onto ``heads`` or ``heads × d_head`` features, its
    activation chosen by the check), a norm on V, a norm on the heads' joined output, a constant
    scale on V (MiMo-V2's ``v_scale``)."""
    out: dict = {}
    for name in GATE_NAMES:
        m = getattr(attn, name, None)
        if isinstance(m, nn.Module) and (linear_shape(m) or (0, 0))[0] == dm and linear_shape(m)[1] in (h, h * d):
            out["gate"] = {"module": name, "width": linear_shape(m)[1], "in_q": False}
            break
    for key, names in (("v_norm", V_NORM_NAMES), ("z_norm", Z_NORM_NAMES)):
        for name in names:
            if isinstance(getattr(attn, name, None), nn.Module):
                out[key] = name
                break
    vs = getattr(attn, "v_scale", None)
    if isinstance(vs, (int, float)) and not isinstance(vs, bool) and float(vs) != 1.0:
        out["v_scale"] = float(vs)
    return out


def positions_in_words(learned: bool, used: dict) -> tuple[str, str]:
    """``(ModelWeights.positional, in words)`` from what the check used."""
    parts = []
    if learned:
        parts.append("learned absolute positions (W_pos)")
    if used.get("rotary"):
        how = " or ".join(used["rotary"])
        parts.append(f"rotary on q and k ({how}, {used.get('rotary_features')} features per head)")
        if used.get("layers_without_rotary"):
            parts.append(f"no rotary in layers {', '.join(map(str, used['layers_without_rotary']))}")
    if used.get("bias") == "alibi":
        parts.append("ALiBi bias added to the scores")
    elif used.get("bias") == "layout scores":
        parts.append(
            "LiLT's layout stream: its own scores (layout_query · layout_key of the bbox embeddings) added to "
            "each text head's scores, a bias from another input"
        )
    elif used.get("bias") == "dynamic mask":
        parts.append(
            "Doge's dynamic mask: a per-key bias exp(A · softplus(V W_dt)), recomputed from W_V, added to the "
            "scores (the scores are not bilinear in the residual)"
        )
    elif used.get("bias"):
        parts.append("a relative position bias added to the scores")
    if used.get("qk_norm"):
        parts.append(f"QK-norm ({' / '.join(used['qk_norm'])}; scores not bilinear in the residual)")
    if used.get("sinks"):
        parts.append("attention sinks: a learned logit per head joins each softmax (the rows sum to less than 1)")
    if used.get("softcap"):
        parts.append(f"scores soft-capped at {used['softcap']:g}")
    kind = "rope" if used.get("rotary") else "learned" if learned else used.get("bias") or "none"
    return kind, "; ".join(parts) or "no position information in attention"


def frozen_lines(extras: dict, scores: dict, n_heads: int = 0, q_path: str = "q_proj") -> list[str]:
    """In words, what the checked matrices hold frozen at the forward's values (:attr:`HFModelWeights.frozen`)."""
    out = []
    if "v_scale" in extras:
        out.append(f"(exact, not frozen) V's constant scale {extras['v_scale']:g} folded into W_V and b_V")
    if "v_norm" in extras:
        out.append(
            f"V-norm ({extras['v_norm']}): each KV head's value x W_V is divided by its own RMS at each position: "
            "a per-position, per-KV-head scale frozen at the forward's value (times the norm's weight, if any)"
        )
    gate = extras.get("gate")
    if gate:
        act = "/".join(scores.get("gate_activation") or ["?"])
        where = (
            f"the second d_head rows of each head in {q_path.rpartition('.')[2]}" if gate["in_q"] else gate["module"]
        )
        per = "one per head" if gate["width"] == n_heads else "one per feature"
        out.append(
            f"output gate {act}(x W_gate) from {where} ({gate['width']} gates, {per}) "
            "multiplies each head's output before W_O: an input-dependent diagonal frozen at its clean value"
        )
    if "z_norm" in extras:
        out.append(
            f"output sub-norm ({extras['z_norm']}): the heads' joined output is RMS-normalised before W_O: a "
            "per-position scale across all heads frozen at the forward's value (its weight is a diagonal before W_O)"
        )
    if "heads_part" in extras:
        out.append(
            f"(exact) the output projection also reads another mixer's {'features'} (ConvBERT's span-based "
            f"convolution) after the heads' first {extras['heads_part']}: W_O holds the heads' columns, and the "
            "other mixer's term is the forward's own, not a head's"
        )
    if "output scaled" in (scores.get("sink_mode") or []):
        out.append(
            "attention sink as output scaling: the pattern returned has no sink column; each head's output is "
            "scaled by sigmoid(logsumexp(scores) - sink), recomputed from W_Q, W_K (exact, not frozen)"
        )
    return out
