"""Multi-head attention with MHA, GQA and MQA, written to be read.

The math is in pure functions (:func:`attention_pattern`, :func:`repeat_kv`,
:func:`apply_rope`); :class:`Attention` wires them to projections, hook points and the
per-head gate.

Shapes::

    x        [batch, pos, d_model]
    q        [batch, head, query_pos, d_head]
    k, v     [batch, kv_head, key_pos, d_head]      (never expanded in captures)
    scores   [batch, head, query_pos, key_pos]      (q·k × scale, soft-capped, before the mask)
    pattern  [batch, head, query_pos, key_pos]      (softmax over key_pos, rows sum to 1)
    z        [batch, head, query_pos, d_head]       (pattern @ v, before W_O)

Query head ``h`` reads KV head ``kv_index[h]``; for an unpruned model that is
``h // group_size`` exactly as HF's ``repeat_kv``. The scale is ``d_head ** -0.5`` unless
given (Gemma: ``query_pre_attn_scalar ** -0.5``); a soft cap ``c`` maps the scaled scores
to ``c·tanh(scores / c)`` (Gemma 2). A sliding window ``w`` lets query ``i`` see key ``j``
only when ``i - j < w`` (transformers' ``sliding_window_overlay``).

:func:`pattern_rows` is a layer's pattern for a range of query rows from its Q and K
(:class:`PatternRule` holds the masking and scaling), the function that statistics over
patterns too large to store call per query chunk (:mod:`headscope.probes.chunked`);
:class:`Attention` computes its own pattern with the same :func:`attention_pattern`, one
query chunk at a time when ``query_chunk`` is set, so the two cannot drift.

:attr:`Attention.kv_window` restricts chosen KV heads' caches to sink + window tokens
(:func:`kv_window_mask`, on top of the causal, padding and sliding masks), the KV-cache study's
one change to the forward; unset, the forward is exactly what it was.

>>> import torch
>>> q = torch.zeros(1, 2, 3, 4); k = torch.randn(1, 1, 3, 4)
>>> p = attention_pattern(q, k, mask=None)
>>> torch.allclose(p, torch.full((1, 2, 3, 3), 1 / 3))
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from headscope.probes.models.inhouse.hooks import HookPoint
from headscope.probes.shapes import (
    AdditiveMask,
    HeadKeys,
    KeyMask,
    Keys,
    KVIndex,
    Pattern,
    PerHead,
    Positions,
    Queries,
    Residual,
    Rotary,
    Scores,
)


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in float32 as HF does.

    ``offset=False`` (Llama, Qwen): ``w · x̂`` with ``x̂`` cast back to the input dtype first,
    ``w`` starting at 1. ``offset=True`` (Gemma): ``(1 + w) · x̂`` in float32, then cast,
    ``w`` starting at 0.
    """

    def __init__(self, d: int, eps: float, *, offset: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d) if offset else torch.ones(d))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (x * (1.0 + self.weight.float())).to(dtype)
        return self.weight * x.to(dtype)


def repeat_kv(kv: Keys, kv_index: KVIndex) -> HeadKeys:
    """``[batch, kv_head, pos, d_head]`` -> ``[batch, head, pos, d_head]``: query head ``h``
    gets KV head ``kv_index[h]``."""
    if kv.shape[1] == kv_index.numel():
        return kv
    return kv.index_select(1, kv_index)


#: the RoPE scalings the in-house stack computes (``rope_type`` of an HF config): both change
#: the frequencies only (no attention factor), the same at every length
ROPE_SCALINGS = ("linear", "llama3")


def scaled_inv_freq(inv_freq: torch.Tensor, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies under a RoPE scaling ``{"rope_type": ..., parameters}`` (None: as
    they are), in float32 as transformers computes them: ``linear`` divides every one by
    ``factor`` (Gemma 3's global layers); ``llama3`` (Llama 3.1+) divides the low frequencies
    (wavelength above ``original_max_position_embeddings / low_freq_factor``) by ``factor``,
    keeps the high ones (below ``... / high_freq_factor``) and interpolates between."""
    if not scaling:
        return inv_freq
    kind, factor = scaling["rope_type"], scaling["factor"]
    if kind == "linear":
        return inv_freq / factor
    if kind != "llama3":
        raise ValueError(f"RoPE scaling {kind!r} is not computed in-house (only {', '.join(ROPE_SCALINGS)})")
    context, low, high = (
        scaling["original_max_position_embeddings"],
        scaling["low_freq_factor"],
        scaling["high_freq_factor"],
    )
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < context / high) * ~(wavelen > context / low)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(positions: Positions, d_head: int, theta: float, scaling: dict | None = None) -> tuple[Rotary, Rotary]:
    """Rotary tables for ``positions [batch, pos]`` -> cos, sin ``[batch, 1, pos, d_head]``
    (Llama's "rotate half" convention, computed in float32 as HF does); ``scaling``: see
    :func:`scaled_inv_freq`."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, d_head, 2, dtype=torch.int64, device=positions.device).float() / d_head)
    )
    inv_freq = scaled_inv_freq(inv_freq, scaling)
    freqs = positions.float()[:, :, None] * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[:, None], emb.sin()[:, None]


def apply_rope(x: PerHead, cos: Rotary, sin: Rotary) -> PerHead:
    """Rotate ``x [batch, head, pos, d_head]`` by the position's angle."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def attention_scores(q: Queries, k: HeadKeys, scale: float | None = None, softcap: float | None = None) -> Scores:
    """Scaled dot products ``q·k × scale`` (default ``scale = d_head ** -0.5``), then
    ``softcap · tanh(scores / softcap)`` where a soft cap is given; ``k`` already expanded
    to query heads. ``[batch, head, query_pos, key_pos]``."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return scores


def attention_pattern(
    q: Queries,
    k: Keys,
    mask: AdditiveMask | None,
    kv_index: KVIndex | None = None,
    *,
    on_scores=None,
    scale: float | None = None,
    softcap: float | None = None,
) -> Pattern:
    """Softmax over keys of the scaled (and soft-capped, see :func:`attention_scores`)
    scores plus an additive ``mask`` (0 or dtype-min).

    Masked keys get exactly 0 (exp underflows), rows over unmasked keys sum to 1. ``k``
    with fewer heads than ``q`` is expanded: query head ``h`` reads KV head ``kv_index[h]``
    (default ``h // group_size``, HF's ``repeat_kv``; a physically pruned layer passes its
    own). ``on_scores`` sees the scaled, soft-capped scores before the mask
    (:class:`Attention` hooks them there) and returns them.
    """
    if k.shape[1] != q.shape[1]:
        if kv_index is None:
            kv_index = torch.arange(q.shape[1], device=k.device) // (q.shape[1] // k.shape[1])
        k = repeat_kv(k, kv_index)
    scores = attention_scores(q, k, scale, softcap)
    if on_scores is not None:
        scores = on_scores(scores)
    if mask is not None:
        scores = scores + mask
    return F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)


def additive_mask(
    attention_mask: KeyMask,
    causal: bool,
    n_query: int | None = None,
    dtype=torch.float32,
    window: int | None = None,
) -> AdditiveMask:
    """``attention_mask [batch, key_pos]`` (1 = real token) -> ``[batch, 1, query_pos, key_pos]``
    additive mask: 0 where a query may look, ``finfo(dtype).min`` where it may not.

    ``window`` (causal only): query ``i`` sees key ``j`` only when ``i - j < window``, as
    transformers' ``sliding_window_causal_mask_function`` (the last ``n_query`` positions are
    the queries)."""
    batch, n_key = attention_mask.shape
    n_query = n_key if n_query is None else n_query
    allowed = attention_mask[:, None, None, :].bool().expand(batch, 1, n_query, n_key)
    if causal:
        tri = torch.ones(n_query, n_key, dtype=torch.bool, device=attention_mask.device).tril(n_key - n_query)
        allowed = allowed & tri
        if window is not None:
            allowed = allowed & tri.triu(n_key - n_query - window + 1)
    elif window is not None:
        raise ValueError("a sliding window is implemented for causal attention only")
    mask = torch.zeros(allowed.shape, dtype=dtype, device=attention_mask.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


def allowed_rows(
    attention_mask: KeyMask, causal: bool, start: int, stop: int, window: int | None = None
) -> torch.Tensor:
    """Rows ``start:stop`` of the keys each query may see, ``[batch, stop - start, key_pos]``
    bool: exactly ``additive_mask(...)[:, 0, start:stop] == 0`` (query ``i`` sees a real key
    ``j``; causal: ``j <= i``; ``window``: also ``i - j < window``), built for those rows only."""
    if window is not None and not causal:
        raise ValueError("a sliding window is implemented for causal attention only")
    n_key = attention_mask.shape[1]
    allowed = attention_mask[:, None, :].bool().expand(attention_mask.shape[0], stop - start, n_key)
    if causal:
        q = torch.arange(start, stop, device=attention_mask.device)[:, None]
        k = torch.arange(n_key, device=attention_mask.device)[None, :]
        band = k <= q
        if window is not None:
            band = band & (q - k < window)
        allowed = allowed & band
    return allowed


def query_spans(n: int, chunk: int) -> list[tuple[int, int]]:
    """``n`` query rows cut into ``ceil(n / chunk)`` runs of at most ``chunk`` rows, as equal as
    they can be (no short tail: a matrix product of a few rows may round differently from one
    of many, and the forward and the pieces recomputed after it should multiply alike).

    >>> query_spans(10, 4), query_spans(3, 8)
    ([(0, 4), (4, 7), (7, 10)], [(0, 3)])
    """
    k = -(-n // chunk)
    base, extra = divmod(n, k)
    out, s = [], 0
    for i in range(k):
        e = s + base + (i < extra)
        out.append((s, e))
        s = e
    return out


#: the fewest query rows per chunk of the forward (:attr:`Attention.query_chunk`): products of
#: fewer rows can round differently from the whole, and the difference would carry into later layers
MIN_FORWARD_CHUNK = 16


@dataclass(frozen=True)
class PatternRule:
    """How one layer turns its Q and K into its pattern: ``causal``, the sliding ``window``
    (None: global), ``scale`` and ``softcap`` of :func:`attention_scores`, ``kv_index [head]``
    (the KV head each query head reads). No in-house family has learned sink logits."""

    causal: bool
    window: int | None
    scale: float | None
    softcap: float | None
    kv_index: torch.Tensor


def pattern_rows(q: Queries, k: Keys, attention_mask: KeyMask, rule: PatternRule, start: int, stop: int) -> Pattern:
    """Query rows ``start:stop`` of a layer's pattern, ``[batch, head, stop - start, key_pos]``,
    from the ``q [batch, head, pos, d_head]`` and ``k [batch, kv_head, pos, d_head]`` the
    attention uses (after QK-norm and RoPE), the ``attention_mask [batch, pos]`` and the
    layer's :class:`PatternRule`: :func:`attention_pattern` of those rows, the same function
    :class:`Attention` computes its pattern with, so a pattern recomputed in chunks equals
    the one the forward used."""
    allowed = allowed_rows(attention_mask, rule.causal, start, stop, rule.window)[:, None]
    mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, torch.finfo(q.dtype).min)
    kv_index = rule.kv_index.to(k.device)
    return attention_pattern(
        q[:, :, start:stop], repeat_kv(k, kv_index), mask, kv_index, scale=rule.scale, softcap=rule.softcap
    )


def sink_window_keep(n_query: int, n_key: int, sink: int, window: int, device=None) -> torch.Tensor:
    """``[query_pos, key_pos]`` bool: the keys a query keeps when its KV cache holds only the
    first ``sink`` positions and the last ``window`` ones (StreamingLLM's sinks + window): key
    ``j`` for query ``i`` when ``j < sink`` or ``i - j < window`` (the last ``n_query``
    positions are the queries; the causal mask still removes ``j > i``).

    >>> sink_window_keep(5, 5, 1, 2).int()[4].tolist()
    [1, 0, 0, 1, 1]
    """
    i = torch.arange(n_key - n_query, n_key, device=device)[:, None]
    j = torch.arange(n_key, device=device)[None, :]
    return (j < sink) | (i - j < window)


def kv_window_mask(
    mask: AdditiveMask | None, kv_window: dict[int, tuple[int, int]], kv_index: KVIndex, n_query: int, n_key: int, dtype
) -> torch.Tensor:
    """The additive ``mask [batch, 1, query_pos, key_pos]`` (None: no mask) with the keys each
    restricted KV head drops set to ``finfo(dtype).min``: ``kv_window`` maps a KV head to
    ``(sink, window)`` (:func:`sink_window_keep`), and every query head reading it
    (``kv_index[h]``) drops them alike. ``[batch, head, query_pos, key_pos]``."""
    device = kv_index.device
    keep = torch.ones(kv_index.numel(), n_query, n_key, dtype=torch.bool, device=device)
    for group, (sink, window) in kv_window.items():
        keep[kv_index == group] = sink_window_keep(n_query, n_key, sink, window, device)
    base = torch.zeros(1, 1, n_query, n_key, dtype=dtype, device=device) if mask is None else mask
    return torch.where(keep[None], base, torch.tensor(torch.finfo(dtype).min, dtype=base.dtype, device=device))


class Attention(nn.Module):
    """Self-attention with ``n_heads`` query heads sharing ``n_kv_heads`` K/V heads.

    ``gate [head]`` multiplies each head's ``z`` (1 = on, 0 = ablated); where a head is
    gated off, ``ablation_value [head, d_head]`` is added instead (0 for zero ablation,
    the corpus mean of ``z`` for mean ablation): ``z' = gate·z + (1 - gate)·ablation_value``.
    Gradients of a loss with respect to ``gate`` are Michel et al.'s head importance.

    Options: ``bias`` on q/k/v, ``o_bias`` on the output projection (default ``bias``);
    ``qk_norm`` (an :class:`RMSNorm` over ``d_head`` shared by all query heads, another by all
    key heads, applied before RoPE; ``norm_offset`` makes them Gemma's ``(1 + w)``); ``scale``
    and ``softcap`` of :func:`attention_scores`. ``hook_q``/``hook_k`` see q and k after the
    QK-norm, before RoPE; ``hook_k_head``/``hook_v_head`` see K (after RoPE) and V repeated to
    one slice per query head ``[batch, head, pos, d_head]``, so one query head's read of a
    shared KV head can be changed alone.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        d_head: int,
        *,
        bias: bool,
        kv_index: list[int] | None = None,
        o_bias: bool | None = None,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        norm_offset: bool = False,
        scale: float | None = None,
        softcap: float | None = None,
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.scale, self.softcap = scale, softcap
        self.q_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)
        self.o_proj = nn.Linear(n_heads * d_head, d_model, bias=bias if o_bias is None else o_bias)
        if qk_norm:
            self.q_norm = RMSNorm(d_head, norm_eps, offset=norm_offset)
            self.k_norm = RMSNorm(d_head, norm_eps, offset=norm_offset)
        self.qk_norm = qk_norm
        if kv_index is None:
            kv_index = [h // (n_heads // n_kv_heads) for h in range(n_heads)]
        if len(kv_index) != n_heads or (n_heads and max(kv_index) >= n_kv_heads):
            raise ValueError(f"kv_index must map {n_heads} query heads to KV heads < {n_kv_heads}; got {kv_index}")
        self.register_buffer("kv_index", torch.tensor(kv_index, dtype=torch.long), persistent=False)
        self.gate = nn.Parameter(torch.ones(n_heads), requires_grad=False)
        self.register_buffer("ablation_value", torch.zeros(n_heads, d_head), persistent=False)
        #: rows per query chunk of the explicit path (None: all at once, or the fused kernel where
        #: nobody looks at the pattern); set by :func:`headscope.probes.chunked.query_chunks`
        self.query_chunk: int | None = None
        #: KV head -> ``(sink, window)``: that KV head's cache holds only the first ``sink`` and the
        #: last ``window`` positions for every query (:func:`kv_window_mask`); None: the whole cache
        self.kv_window: dict[int, tuple[int, int]] | None = None
        for name in ("q", "k", "v", "q_rot", "k_rot", "k_head", "v_head", "scores", "pattern", "z", "out"):
            setattr(self, f"hook_{name}", HookPoint())

    def rule(self, *, causal: bool, window: int | None) -> PatternRule:
        """This attention's :class:`PatternRule` (``causal`` and ``window`` are the block's)."""
        return PatternRule(causal=causal, window=window, scale=self.scale, softcap=self.softcap, kv_index=self.kv_index)

    def _chunked_z(self, q, k_full, v_full, mask) -> torch.Tensor:
        """``pattern @ v`` at most ``max(query_chunk, MIN_FORWARD_CHUNK)`` query rows at a time
        (:func:`query_spans`), each chunk's pattern :func:`attention_pattern`'s (the path a
        stored pattern takes; one chunk = all rows)."""
        parts = []
        for s, e in query_spans(q.shape[2], max(self.query_chunk, MIN_FORWARD_CHUNK)):
            m = None if mask is None else mask[:, :, s:e]
            p = attention_pattern(q[:, :, s:e], k_full, m, scale=self.scale, softcap=self.softcap)
            parts.append(torch.matmul(p, v_full))
        return parts[0] if len(parts) == 1 else torch.cat(parts, 2)

    def _split(self, x: torch.Tensor, n: int) -> torch.Tensor:
        batch, pos, _ = x.shape
        return x.view(batch, pos, n, self.d_head).transpose(1, 2)  # [batch, n, pos, d_head]

    def forward(
        self,
        x: Residual,
        mask: AdditiveMask | None,
        *,
        rope: tuple[Rotary, Rotary] | None = None,
        need_pattern: bool = False,
    ) -> Residual:
        """``x [batch, pos, d_model]`` -> ``[batch, pos, d_model]``; ``mask`` is additive,
        ``[batch, 1, query_pos, key_pos]``. The pattern is :func:`attention_pattern`'s."""
        q = self._split(self.q_proj(x), self.n_heads)  # [batch, head, pos, d_head]
        k = self._split(self.k_proj(x), self.n_kv_heads)  # [batch, kv_head, pos, d_head]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.hook_q(q), self.hook_k(k)
        v = self.hook_v(self._split(self.v_proj(x), self.n_kv_heads))
        if rope is not None:
            q = self.hook_q_rot(apply_rope(q, *rope))
            k = self.hook_k_rot(apply_rope(k, *rope))
        # [batch, head, pos, d_head]: each query head's own read of its group's K and V
        k_full, v_full = self.hook_k_head(repeat_kv(k, self.kv_index)), self.hook_v_head(repeat_kv(v, self.kv_index))
        if self.kv_window:  # [batch, head, query_pos, key_pos]: each restricted group's heads drop the same keys
            mask = kv_window_mask(mask, self.kv_window, self.kv_index, q.shape[2], k.shape[2], q.dtype)

        if self.query_chunk is not None and not (self.hook_scores.active or self.hook_pattern.active):
            z = self._chunked_z(q, k_full, v_full, mask)  # never more than [batch, head, chunk, key_pos]
        elif need_pattern or self.softcap is not None or self.hook_scores.active or self.hook_pattern.active:
            pattern = attention_pattern(
                q, k_full, mask, on_scores=self.hook_scores, scale=self.scale, softcap=self.softcap
            )  # [batch, head, query_pos, key_pos]
            z = torch.matmul(self.hook_pattern(pattern), v_full)
        else:  # nobody looks at the pattern and nothing is soft-capped: fused kernel, same math
            z = F.scaled_dot_product_attention(q, k_full, v_full, attn_mask=mask, scale=self.scale)
        z = self.hook_z(z)
        gate = self.gate.to(z.dtype)[None, :, None, None]
        if not bool((self.gate == 1).all()) or self.gate.requires_grad:
            z = gate * z + (1 - gate) * self.ablation_value.to(z.dtype)[None, :, None, :]
        batch, _, pos, _ = z.shape
        out = self.o_proj(z.transpose(1, 2).reshape(batch, pos, self.n_heads * self.d_head))
        return self.hook_out(out)
