"""Attention weights beside what they carry: norm-based attention (Kobayashi et al. 2020),
saturation under the model's scale and under none, attention distance, rollout (Abnar &
Zuidema 2020). Pure functions over one sentence's tensors.

Shapes: ``pattern``, ``raw`` ``[head, query_pos, key_pos]``; ``v`` ``[head, key_pos, d_head]``
(one slice per query head); ``W_O`` ``[head, d_head, d_model]``; ``allowed``
``[query_pos, key_pos]`` bool (the keys each query may read under its mask). The per-head
functions also take leading dimensions (``[layer, head, ...]``: every layer at once).

Head ``h``'s contribution of key ``j`` to query ``i`` is ``α_ij (x_j W_V + b_V) W_O^h``; its
norm factorises as ``α_ij · ‖v_j W_O^h‖``, so the per-head norm-based weights need only
``[head, key_pos]`` value norms beside the pattern (memory linear in length). The per-layer
contribution ``‖Σ_h α^h_ij v^h_j W_O^h‖`` does not factorise: :func:`layer_contributions`
streams it in query chunks.

>>> import torch
>>> p = torch.full((1, 4, 4), 0.25)
>>> round(row_entropy(p).mean().item(), 4) == round(math.log(4), 4)
True
"""

from __future__ import annotations

import math

import torch


def allowed_keys(n_pos: int, causal: bool) -> torch.Tensor:
    """``[query_pos, key_pos]`` bool: key ``j`` visible to query ``i`` (``j <= i`` when causal)."""
    full = torch.ones(n_pos, n_pos, dtype=torch.bool)
    return torch.tril(full) if causal else full


def value_norms(v: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """``‖v_j W_O^h‖`` ``[head, key_pos]`` from ``v [head, key_pos, d_head]``, ``W_O [head, d_head, d_model]``."""
    return torch.linalg.vector_norm(value_outputs(v, W_O), dim=-1)


def value_outputs(v: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """``v_j W_O^h`` ``[..., head, key_pos, d_model]``: what each key hands each head's output."""
    return torch.einsum("...hkd,...hdm->...hkm", v.float(), W_O.float())


def norm_attention(pattern: torch.Tensor, vnorm: torch.Tensor) -> torch.Tensor:
    """Kobayashi's ``‖α_ij v_j W_O^h‖`` ``[head, query_pos, key_pos]`` (``vnorm`` from :func:`value_norms`)."""
    return pattern.float() * vnorm[..., None, :]


def head_outputs(pattern: torch.Tensor, v: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """``Σ_j α_ij (v_j W_O^h)`` per head, ``[head, query_pos, d_model]``: the decomposition summed back."""
    return pattern.float() @ value_outputs(v, W_O)


def _ranks(x: torch.Tensor) -> torch.Tensor:
    return x.argsort(-1).argsort(-1).float()


def spearman(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Spearman ρ along the last dimension (ties broken by order)."""
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(-1, keepdim=True), ry - ry.mean(-1, keepdim=True)
    den = torch.sqrt((rx**2).sum(-1) * (ry**2).sum(-1))
    return (rx * ry).sum(-1) / den.clamp_min(1e-12)


def weight_norm_rank_correlation(pattern: torch.Tensor, normed: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Per head ``[head]``: Spearman ρ between ``α_ij`` and ``‖α_ij v_j W_O‖`` over the visible pairs."""
    return spearman(pattern[..., allowed], normed[..., allowed])


def sink_share(weights: torch.Tensor, sink: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Per head ``[head]``: mean over queries of the share of a row's weight on ``sink [key_pos]``
    keys (special tokens and the first position), rows normalised to sum 1 first."""
    w = weights.float() * allowed
    rows = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
    return (rows * sink).sum(-1).mean(-1)


def row_entropy(pattern: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row ``[head, query_pos]``."""
    p = pattern.float()
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over visible keys of ``scores [head, query_pos, key_pos]``."""
    return torch.softmax(scores.float().masked_fill(~allowed, float("-inf")), dim=-1)


def capped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """``c·tanh(s / c)`` where the family soft-caps its scores, ``s`` otherwise."""
    return scores if softcap is None else softcap * torch.tanh(scores / softcap)


def ranking_reversals(raw: torch.Tensor, scale: float, allowed: torch.Tensor) -> int:
    """Pairs of visible keys whose order under ``raw × scale`` is the reverse of their order under
    ``raw`` (0 for any positive scale: the exact check of ranking invariance)."""
    big = torch.finfo(torch.float32).max
    r = raw.float().masked_fill(~allowed, -big)
    order = r.argsort(dim=-1, stable=True)
    scaled = (raw.float() * scale).masked_fill(~allowed, -big).gather(-1, order)
    sorted_raw = r.gather(-1, order)
    strict = sorted_raw[..., 1:] > sorted_raw[..., :-1]
    return int(((scaled[..., 1:] < scaled[..., :-1]) & strict).sum())


def available_distance(n_pos: int, causal: bool) -> torch.Tensor:
    """``[query_pos]``: the furthest key each query may read (its context under the mask)."""
    i = torch.arange(n_pos, dtype=torch.float32)
    return i if causal else torch.maximum(i, n_pos - 1 - i)


def mean_distance(weights: torch.Tensor, allowed: torch.Tensor, causal: bool) -> torch.Tensor:
    """Per head ``[head]``: mean over queries of ``Σ_j w_ij |i - j|`` (rows normalised) divided by
    the query's available context (:func:`available_distance`); queries with none are skipped."""
    n = weights.shape[-1]
    w = weights.float() * allowed
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
    dist = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().float()
    avail = available_distance(n, causal)
    keep = avail > 0
    per_row = (w * dist).sum(-1)[..., keep] / avail[keep]
    return per_row.mean(-1)


def layer_contributions(
    pattern: torch.Tensor, v: torch.Tensor, W_O: torch.Tensor, *, chunk_cells: int = 1 << 22
) -> torch.Tensor:
    """``‖Σ_h α^h_ij v^h_j W_O^h‖`` ``[query_pos, key_pos]``, computed a chunk of queries at a
    time so no more than ``chunk_cells`` floats of ``[query, key, d_model]`` exist at once."""
    vo = torch.einsum("hkd,hdm->hkm", v.float(), W_O.float())  # [head, key_pos, d_model]
    n_q, n_k, d = pattern.shape[1], pattern.shape[2], vo.shape[-1]
    step = max(1, chunk_cells // max(1, n_k * d))
    out = torch.empty(n_q, n_k)
    for s in range(0, n_q, step):
        f = torch.einsum("hqk,hkm->qkm", pattern[:, s : s + step].float(), vo)
        out[s : s + step] = torch.linalg.vector_norm(f, dim=-1)
    return out


def rollout(mats: list[torch.Tensor]) -> torch.Tensor:
    """Abnar & Zuidema's rollout of per-layer ``[query_pos, key_pos]`` weight matrices (rows
    normalised, averaged with the identity for the residual), layer 0 first;
    ``[layer, query_pos, key_pos]``: how much each query at the output of layer ``l`` draws on
    each input token."""
    out, acc = [], None
    for a in mats:
        a = a.float() / a.float().sum(-1, keepdim=True).clamp_min(1e-30)
        a = 0.5 * a + 0.5 * torch.eye(a.shape[0])
        acc = a if acc is None else a @ acc
        out.append(acc)
    return torch.stack(out)


__all__ = [
    "allowed_keys",
    "available_distance",
    "capped",
    "head_outputs",
    "layer_contributions",
    "masked_softmax",
    "mean_distance",
    "norm_attention",
    "ranking_reversals",
    "rollout",
    "row_entropy",
    "sink_share",
    "spearman",
    "value_norms",
    "value_outputs",
    "weight_norm_rank_correlation",
]

_ = math  # used by the doctest
