"""Attention patterns one query chunk at a time, from each layer's Q and K.

A stored pattern takes ``heads × pos²`` floats per layer and item (Llama-3-8B at 8k tokens:
about 137 GB of fp16 patterns over its layers), but every per-head statistic of the roles
reduces it row by row. :class:`ChunkSource` keeps each layer's Q and K instead (linear in the
length) and recomputes the pattern :data:`QUERY_CHUNK` query rows at a time with the model's
own masking and scaling (:func:`~headscope.probes.models.inhouse.attention.pattern_rows`:
causal, padding, sliding windows, soft-capping, the family's query scale), so no more than one
layer's ``[batch, head, chunk, key_pos]`` is alive. The forward itself runs in the same
chunks (:func:`query_chunks`; at least ``MIN_FORWARD_CHUNK`` = 16 rows each), so the
recomputed pieces are exactly the ones it used.

Only the in-house backend hands over Q and K with the rules to turn them into patterns;
:func:`chunk_support` says why another backend keeps stored patterns.

>>> PatternPiece(layer=0, start=0, stop=2, pattern=torch.ones(1, 1, 2, 2)).rows
slice(0, 2, None)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

#: query rows per chunk of the roles' statistics (``headscope roles``, ``headscope bench``)
QUERY_CHUNK = 128


@dataclass
class PatternPiece:
    """Query rows ``start:stop`` of layer ``layer``'s pattern, ``pattern [batch, head,
    stop - start, key_pos]``. Reducers that need the same result of a piece (its masked
    copy, say) share it through :meth:`cached`, as :meth:`Capture.cached` for a batch."""

    layer: int
    start: int
    stop: int
    pattern: torch.Tensor
    key_mask: torch.Tensor | None = None  # [batch, key_pos] bool, True on real tokens
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def rows(self) -> slice:
        return slice(self.start, self.stop)

    def cached(self, fn: Callable[..., torch.Tensor], *args: Hashable) -> torch.Tensor:
        """``fn(self, *args)``, computed once per piece for each ``(fn, args)``; ``fn`` a
        module-level function, every input besides the piece in ``args``."""
        key = (fn, *args)
        if key not in self._cache:
            self._cache[key] = fn(self, *args)
        return self._cache[key]


def inhouse_network(model):
    """The in-house :class:`~headscope.probes.models.inhouse.transformer.Transformer` behind
    ``model``, or None when its backend is another."""
    from headscope.probes.models.inhouse.transformer import Transformer

    net = getattr(model, "network", None)
    return net if isinstance(net, Transformer) else None


def sliding_windows(model) -> list[int]:
    """The sliding windows of ``model``'s layers, smallest first (in-house models; [] for a
    model without, or one whose backend does not say)."""
    net = inhouse_network(model)
    return sorted({b.window for b in net.blocks if b.window is not None}) if net is not None else []


def chunk_support(model) -> str | None:
    """None when ``model`` can hand over Q and K with its masking rules (the in-house
    backend); else why not, one line for run.json."""
    if inhouse_network(model) is not None:
        return None
    return f"backend {getattr(model, 'backend', type(model).__name__)} cannot hand over Q and K"


def mode_line(model, query_chunk: int | None) -> str:
    """run.json's ``pattern_statistics``: ``chunked (query chunk 128)`` or
    ``materialised (<why>)``."""
    if query_chunk is None:
        return "materialised (query chunks off)"
    why = chunk_support(model)
    return f"materialised ({why})" if why else f"chunked (query chunk {query_chunk})"


def qk_quantities(model) -> tuple[str, str]:
    """The captured quantities holding the Q and K the attention uses: after RoPE where the
    family rotates (``q_rot``, ``k_rot``), else after the QK-norm (``q``, ``k``)."""
    return ("q_rot", "k_rot") if inhouse_network(model).cfg.positional == "rope" else ("q", "k")


@contextmanager
def query_chunks(model, chunk: int):
    """For the ``with`` block, every in-house attention computes ``pattern @ v`` ``chunk``
    query rows at a time (the previous setting comes back on exit, whatever happens)."""
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"query chunk must be a positive int; got {chunk!r}")
    blocks = inhouse_network(model).blocks
    saved = [b.attn.query_chunk for b in blocks]
    try:
        for b in blocks:
            b.attn.query_chunk = chunk
        yield
    finally:
        for b, c in zip(blocks, saved):
            b.attn.query_chunk = c


@dataclass(frozen=True)
class ChunkSource:
    """Recomputes a batch's patterns per query chunk from its captured Q and K:
    ``rules[layer]`` (:class:`~headscope.probes.models.inhouse.attention.PatternRule`),
    ``names`` the Q and K quantities, ``chunk`` rows per piece."""

    rules: dict
    names: tuple[str, str]
    chunk: int

    @classmethod
    def of(cls, model, chunk: int = QUERY_CHUNK) -> ChunkSource:
        net = inhouse_network(model)
        causal = net.cfg.causal
        rules = {l: b.attn.rule(causal=causal, window=b.window) for l, b in enumerate(net.blocks)}
        return cls(rules=rules, names=qk_quantities(model), chunk=chunk)

    def pieces(self, data: dict, attention_mask: torch.Tensor, layer: int) -> Iterator[PatternPiece]:
        """Layer ``layer``'s pattern as :class:`PatternPiece` s of at most ``chunk`` query rows
        (:func:`~headscope.probes.models.inhouse.attention.query_spans`: the forward's own
        chunks when ``chunk`` is at least its ``MIN_FORWARD_CHUNK``)."""
        from headscope.probes.models.inhouse.attention import pattern_rows, query_spans

        q, k = data[self.names[0], layer], data[self.names[1], layer]
        km = attention_mask.bool()
        for s, e in query_spans(q.shape[2], self.chunk):
            yield PatternPiece(layer, s, e, pattern_rows(q, k, attention_mask, self.rules[layer], s, e), km)
