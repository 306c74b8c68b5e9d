"""Per-sentence measurements over :class:`~headscope.probes.states.SentenceStates`: the pooled
representation of a target word at every depth, and every per-head attention statistic of
one sentence (norm-based vs raw weights, saturation, distance, how far each head moves a
token from its static row).

Depth convention: ``depth -1`` is the static token-embedding row, ``0`` the input to the first
layer (transformers' ``hidden_states[0]``), ``l + 1`` the output of layer ``l`` (for a decoder,
the last one before the final norm).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headscope.analyses.context import attention as A

POOLINGS = ("mean", "first")

#: per-head statistics of :func:`head_stats`, in the order of its last dimension
HEAD_METRICS = (
    "weight_norm_rho",  # Spearman ρ between α_ij and ‖α_ij v_j W_O‖ over visible pairs
    "sink_share_raw",  # share of weight on special tokens and the first position (α)
    "sink_share_norm",  # the same share under norm-based weights
    "entropy_actual",  # mean row entropy (nats) under the model's scale
    "entropy_scale1",  # ... under scale 1 (no division by sqrt(d_k))
    "saturated_actual",  # share of rows whose max weight exceeds 0.9, model's scale
    "saturated_scale1",  # ... scale 1
    "distance_raw",  # mean attention distance / available context, α
    "distance_norm",  # the same under norm-based weights
    "output_norm_ratio",  # ‖head output‖ / ‖residual stream entering the layer‖
    "static_cos_change",  # cos(x + head output, static row) - cos(x, static row)
)


def target_positions(st, start: int, end: int) -> list[int]:
    """Token positions (no special token) whose character span overlaps ``[start, end)``."""
    offs, special = st.tokens.offsets[0], st.tokens.special[0]
    return [i for i, (s, e) in enumerate(offs) if not special[i] and s < end and e > start and e > s]


def pooled(st, positions: list[int], pooling: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(static [d_model], states [layer + 1, d_model])`` of a word's pieces, pooled by
    ``pooling`` ("mean" of the pieces or the "first" piece)."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}; got {pooling!r}")
    if not positions:
        raise ValueError("a word must cover at least one token")
    idx = positions[:1] if pooling == "first" else positions
    return st.static[idx].mean(0), st.states[:, idx].mean(1)


def content_positions(st) -> torch.Tensor:
    """``[pos]`` bool: the sentence's non-special tokens."""
    return ~st.special


def head_stats(st) -> torch.Tensor:
    """``[layer, head, metric]`` (:data:`HEAD_METRICS`) for one sentence, every layer at once."""
    n, causal = st.n_pos, st.causal
    allowed = A.allowed_keys(n, causal)
    sink = st.special.clone()
    sink[0] = True
    rows = content_positions(st)
    if not rows.any():
        rows = torch.ones(n, dtype=torch.bool)
    pattern = torch.stack(st.pattern).float()  # [layer, head, query_pos, key_pos]
    vo = A.value_outputs(torch.stack(st.v), torch.stack(st.W_O))  # [layer, head, key_pos, d_model]
    normed = A.norm_attention(pattern, torch.linalg.vector_norm(vo, dim=-1))
    raw = torch.stack([A.capped(r, c) for r, c in zip(st.raw, st.softcap)])
    scale1 = A.masked_softmax(raw, allowed)
    heads_out = pattern @ vo  # [layer, head, pos, d_model]
    x, static = st.states[:-1, None], st.static  # the stream entering each layer, [layer, 1, pos, d_model]
    ratio = torch.linalg.vector_norm(heads_out, dim=-1) / torch.linalg.vector_norm(x, dim=-1).clamp_min(1e-12)
    before = F.cosine_similarity(x, static, dim=-1)
    after = F.cosine_similarity(x + heads_out, static, dim=-1)
    stats = [
        A.weight_norm_rank_correlation(pattern, normed, allowed),
        A.sink_share(pattern, sink, allowed),
        A.sink_share(normed, sink, allowed),
        A.row_entropy(pattern)[..., rows].mean(-1),
        A.row_entropy(scale1)[..., rows].mean(-1),
        (pattern.max(-1).values > 0.9)[..., rows].float().mean(-1),
        (scale1.max(-1).values > 0.9)[..., rows].float().mean(-1),
        A.mean_distance(pattern, allowed, causal),
        A.mean_distance(normed, allowed, causal),
        ratio[..., rows].mean(-1),
        (after - before)[..., rows].mean(-1),
    ]
    return torch.stack(stats, -1)


def layer_stats(st) -> torch.Tensor:
    """``[layer, 2]``: std of raw ``q·k`` over visible pairs and heads, and the number of key
    pairs whose order the model's scale reverses (:func:`~.attention.ranking_reversals`, 0)."""
    allowed = A.allowed_keys(st.n_pos, st.causal)
    rows = []
    for l, raw in enumerate(st.raw):
        rows.append(torch.tensor([raw[:, allowed].std().item(), float(A.ranking_reversals(raw, st.scale[l], allowed))]))
    return torch.stack(rows)


def word_spans(tokens) -> list[tuple[str, list[int]]]:
    """The words of a one-text :class:`~headscope.probes.tokens.TokenBatch` with their token
    positions (special tokens excluded), in order."""
    out: dict[int, list[int]] = {}
    for i, w in enumerate(tokens.word_ids[0]):
        if w is not None and not tokens.special[0][i]:
            out.setdefault(w, []).append(i)
    text = tokens.texts[0]
    offs = tokens.offsets[0]
    # a byte-level BPE piece's span may hold the space before its word (" bat"): the word is stripped
    return [(text[offs[p[0]][0] : offs[p[-1]][1]].strip(), p) for _, p in sorted(out.items())]
