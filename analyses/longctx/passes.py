"""One forward of a needle item, its attention handed over one query chunk at a time.

:func:`item_pass` runs one :class:`~headscope.analyses.longctx.needle.NeedleItem` (batch 1,
no padding) and returns the logits at the answer rows and the pattern pieces of every layer.
Where the backend hands over Q and K (the in-house backend,
:func:`~headscope.probes.chunked.chunk_support`), the forward runs in query chunks and each
layer's pattern is recomputed :class:`~headscope.probes.chunked.ChunkSource`'s ``chunk`` rows
at a time from them: no ``[head, query_pos, key_pos]`` pattern is ever stored, at most one
``[head, chunk, key_pos]`` piece (Q and K themselves are linear in the length). Elsewhere
(hf, bridge) each layer's stored pattern is captured by a forward of its own, one layer at a
time, and handed over as one piece; :func:`pass_mode` says which path ran.

>>> from headscope.probes.models.inhouse.planted_long import planted_long_model
>>> from headscope.analyses.longctx.needle import needle_items
>>> m = planted_long_model()
>>> p = item_pass(m, needle_items(m.tokenizer, 200, 1)[0], chunk=64)
>>> p.logits.shape[0], [(pc.layer, pc.start, pc.stop) for pc in p.pieces()][:3], pass_mode(m, 64)
(8, [(0, 0, 50), (0, 50, 100), (0, 100, 150)], 'chunked (query chunk 64)')
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from headscope.probes.chunked import ChunkSource, PatternPiece, chunk_support, query_chunks
from headscope.probes.tokens import TokenBatch


def _why_stored(model, chunk: int | None) -> str | None:
    return "query chunks off" if chunk is None else chunk_support(model)


def pass_mode(model, chunk: int | None) -> str:
    """``chunked (query chunk N)`` or ``materialised (<why>; one forward per layer)``, for the
    run's notes (``chunk`` None: stored patterns on any backend)."""
    why = _why_stored(model, chunk)
    return f"materialised ({why}; one forward per layer)" if why else f"chunked (query chunk {chunk})"


def item_batch(ids: list[int]) -> TokenBatch:
    """A :class:`TokenBatch` of one item of token ids (no text: its words are its tokens)."""
    n = len(ids)
    return TokenBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        attention_mask=torch.ones(1, n, dtype=torch.long),
        texts=[""],
        words=[[str(i) for i in ids]],
        tokens=[[str(i) for i in ids]],
        offsets=[[(0, 0)] * n],
        word_ids=[list(range(n))],
        special=[[False] * n],
        lengths=[n],
    )


@dataclass
class ItemPass:
    """What one forward of an item hands over: ``logits [len(answer), vocab]`` at the
    answer rows, and ``pieces()``, each layer's pattern pieces in layer order (consumed
    once: a layer's Q and K are dropped once its pieces are out)."""

    logits: torch.Tensor
    pieces: Callable[[], Iterator[PatternPiece]]


def item_pass(model, item, chunk: int | None) -> ItemPass:
    """One forward of ``item`` under the caller's gates or hooks; see the module docstring
    (``chunk`` None: the stored patterns' path on any backend)."""
    from headscope.analyses.longctx.needle import item_logits

    batch = item_batch(item.input_ids)
    n_layers = model.spec.n_layers
    if _why_stored(model, chunk) is not None:
        logits = item_logits(model, item)

        def stored() -> Iterator[PatternPiece]:
            for layer in range(n_layers):
                pattern = model.run(batch, ("pattern",), [layer])["pattern", layer]
                yield PatternPiece(layer, 0, pattern.shape[2], pattern, batch.attention_mask.bool())

        return ItemPass(logits, stored)
    src = ChunkSource.of(model, chunk)
    keep = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    keep[0, [a - 1 for a in item.answer]] = True
    with query_chunks(model, src.chunk), model.unembed_at(keep):
        data = model.run(batch, src.names)
    logits = data.pop(("output", None)).float()

    def chunked() -> Iterator[PatternPiece]:
        for layer in range(n_layers):
            yield from src.pieces(data, batch.attention_mask, layer)
            for name in src.names:
                data.pop((name, layer), None)

    return ItemPass(logits, chunked)
