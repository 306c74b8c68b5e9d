"""One call from texts to per-head tensors, and streaming over a corpus.

:func:`capture` runs a model once over a batch of texts (or pre-split words) and returns
a :class:`Capture`: the tensors asked for, keyed by quantity and layer, with the token
metadata. :func:`stream` walks a corpus in length-bucketed batches and hands each
:class:`Capture` to reducers, keeping nothing itself, so memory does not grow with the
corpus.

Shapes: ``pattern``/``scores`` ``[batch, head, query_pos, key_pos]``; ``q``/``z``
``[batch, head, pos, d_head]``; ``k``/``v`` ``[batch, kv_head, pos, d_head]`` (not
expanded; ``capture.kv_groups`` says which query heads read each KV head).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Protocol

import torch

from headscope.probes.chunked import ChunkSource, PatternPiece, chunk_support, query_chunks
from headscope.probes.errors import MemoryBudgetError, NumericalError
from headscope.probes.models.backends.protocol import (
    Backend,
    ModelSpec,
    batch_to,
    placement,
    rows_unembedded,
    unembed_at,
)
from headscope.probes.tokens import TokenBatch, collate, pad_id, tokenize_one

log = logging.getLogger(__name__)


@dataclass
class Capture:
    """Tensors of one batch. ``capture["pattern", 3]`` is layer 3's pattern;
    ``capture.stack("pattern")`` is ``[layer, batch, head, query_pos, key_pos]``.

    Reducers that need the same result of a batch (a masked pattern, say) share it
    through :meth:`cached`, which keys it by the function that computes it and that
    function's arguments, so one reducer never reads what another computed from inputs
    of its own."""

    tokens: TokenBatch
    data: dict
    layers: tuple[int, ...]
    spec: ModelSpec
    item_ids: list[int] = field(default_factory=list)
    chunks: ChunkSource | None = None  # patterns recomputed per query chunk from Q and K (none stored)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def pattern_pieces(self, layer: int) -> Iterator[PatternPiece]:
        """Layer ``layer``'s pattern as :class:`~headscope.probes.chunked.PatternPiece` s: the
        stored pattern as one piece of every row, or, for a capture of Q and K
        (``chunks``), one piece per query chunk, recomputed as the forward computed it."""
        if ("pattern", layer) in self.data or self.chunks is None:
            yield PatternPiece(layer, 0, self.tokens.input_ids.shape[1], self["pattern", layer], self.key_mask)
        else:
            yield from self.chunks.pieces(self.data, self.tokens.attention_mask, layer)

    def cached(self, fn: Callable[..., torch.Tensor], *args: Hashable) -> torch.Tensor:
        """``fn(self, *args)``, computed once per capture for each ``(fn, args)``.

        ``fn`` must be a module-level function (its identity is part of the key) of the
        capture and ``args`` alone: every input besides the capture goes in ``args``
        (a layer, ``causal``, …), never in a closure, so equal keys mean equal results.

        >>> cap = Capture(tokens=None, data={("pattern", 0): torch.ones(1, 1, 2, 2)}, layers=(0,), spec=None)
        >>> def total(c, layer, scale): return c["pattern", layer].sum() * scale
        >>> cap.cached(total, 0, 2.0).item(), cap.cached(total, 0, 3.0).item(), len(cap._cache)
        (8.0, 12.0, 2)
        """
        key = (fn, *args)
        if key not in self._cache:
            self._cache[key] = fn(self, *args)
        return self._cache[key]

    def __getitem__(self, key):
        quantity, layer = key
        try:
            return self.data[(quantity, layer)]
        except KeyError:
            have = sorted({q for q, _ in self.data if q != "output"})
            raise KeyError(
                f"({quantity!r}, {layer}) not captured; captured quantities {have}, layers {list(self.layers)}"
            ) from None

    def stack(self, quantity: str) -> torch.Tensor:
        return torch.stack([self[quantity, l] for l in self.layers])

    @property
    def output(self) -> torch.Tensor | None:
        return self.data.get(("output", None))

    @property
    def kv_groups(self) -> dict[int, list[int]]:
        return self.spec.kv_groups()

    @property
    def key_mask(self) -> torch.Tensor:
        """``[batch, key_pos]`` bool, True on real (non-padding) tokens."""
        return self.tokens.attention_mask.bool()


def pattern_bytes(batch: int, n_pos: int, n_heads: int, n_layers: int, bytes_per: int = 4) -> int:
    """Bytes of full patterns for a batch: ``batch × heads × layers × n² × 4``."""
    return batch * n_heads * n_layers * n_pos * n_pos * bytes_per


#: float copies of one layer's ``[batch, head, query_pos, key_pos]`` alive at once besides the kept
#: patterns (scores, softmax, a reducer's masked copy and its temporaries)
WORK_CELLS = 4
#: floats per token and ``d_model`` alive at once (residual, Q/K/V, MLP hidden ~3.5 × d_model, outputs)
WORK_ACTIVATIONS = 16


def max_batch(
    n_pos: int,
    *,
    n_heads: int,
    d_model: int,
    free_bytes: int,
    kept_layers: int = 1,
    bytes_per: int = 4,
    headroom: float = 0.8,
) -> int:
    """The most items of ``n_pos`` tokens one forward may hold in ``free_bytes`` (times
    ``headroom``): per item, the attention cells ``n_heads × n_pos²`` of the ``kept_layers``
    captured patterns plus :data:`WORK_CELLS` working copies, and
    :data:`WORK_ACTIVATIONS` ``× n_pos × d_model`` activations, ``bytes_per`` bytes each.
    :class:`~headscope.probes.errors.MemoryBudgetError` (one line; the CLI exits 2) when
    one item alone does not fit.

    >>> max_batch(512, n_heads=32, d_model=4096, free_bytes=80 * 2**30, kept_layers=1, bytes_per=2)
    455
    >>> max_batch(128, n_heads=12, d_model=384, free_bytes=2**30)
    121
    >>> max_batch(4096, n_heads=32, d_model=4096, free_bytes=2**30, kept_layers=32)
    Traceback (most recent call last):
    ...
    headscope.probes.errors.MemoryBudgetError: one item of 4096 tokens needs 73.0 GiB (patterns of 32 layers x 32 heads + activations, 4 bytes each); 0.8 GiB of the device's 1.0 GiB free may be used: capture fewer layers, shorter items or a 16-bit dtype
    """
    for name, v in (("n_pos", n_pos), ("n_heads", n_heads), ("d_model", d_model), ("kept_layers", kept_layers)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int; got {v!r}")
    per_item = bytes_per * (n_heads * n_pos * n_pos * (kept_layers + WORK_CELLS) + WORK_ACTIVATIONS * n_pos * d_model)
    budget = int(free_bytes * headroom)
    if per_item > budget:
        raise MemoryBudgetError(
            f"one item of {n_pos} tokens needs {per_item / 2**30:.1f} GiB (patterns of {kept_layers} layers x "
            f"{n_heads} heads + activations, {bytes_per} bytes each); {budget / 2**30:.1f} GiB of the device's "
            f"{free_bytes / 2**30:.1f} GiB free may be used: capture fewer layers, shorter items or a 16-bit dtype"
        )
    return budget // per_item


def device_free_bytes(device) -> int | None:
    """Free memory of a CUDA ``device`` in bytes (``torch.cuda.mem_get_info``); None on the CPU,
    where batches keep their fixed sizes."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def check_finite(cap: Capture) -> None:
    """Raise :class:`NumericalError` naming layer and head of the first NaN/inf."""
    for (q, layer), t in cap.data.items():
        if q == "output" or not t.is_floating_point():
            continue
        if not torch.isfinite(t).all():
            bad = (~torch.isfinite(t)).nonzero()[0].tolist()
            head = bad[1] if t.dim() == 4 else None
            raise NumericalError(f"non-finite value in {q} at layer {layer}, head {head} (index {bad})")


def capture(
    model: Backend,
    texts: Sequence[str] | None = None,
    *,
    words: Sequence[Sequence[str]] | None = None,
    quantities: Iterable[str] = ("pattern",),
    layers: Iterable[int] | None = None,
    memory_budget: int | None = 4 << 30,
) -> Capture:
    """Run ``model`` over ``texts`` (or pre-split ``words``) and capture ``quantities``.

    Raises ``ValueError`` on empty input or text past the context, and
    :class:`MemoryBudgetError` when full patterns would exceed ``memory_budget`` bytes.

    >>> cap = capture(model, ["The cat sat."], quantities=["pattern", "k"])  # doctest: +SKIP
    >>> cap["pattern", 0].shape  # doctest: +SKIP
    torch.Size([1, 12, 6, 6])
    """
    batch = model.encode(
        texts=list(texts) if texts is not None else None, words=[list(w) for w in words] if words is not None else None
    )
    qs = tuple(quantities)
    ls = tuple(range(model.spec.n_layers)) if layers is None else tuple(layers)
    if memory_budget is not None and ("pattern" in qs or "scores" in qs):
        need = pattern_bytes(batch.shape[0], batch.shape[1], model.spec.n_heads, len(ls)) * (
            ("pattern" in qs) + ("scores" in qs)
        )
        if need > memory_budget:
            raise MemoryBudgetError(
                f"capturing patterns for {batch.shape[0]} texts of {batch.shape[1]} tokens needs {need / 2**30:.1f} GiB, "
                f"over the budget of {memory_budget / 2**30:.1f} GiB; use stream() or fewer layers/texts"
            )
    batch = on_model_device(batch, model)
    data = model.run(batch, qs, ls)
    cap = Capture(tokens=batch, data=data, layers=ls, spec=model.spec, item_ids=list(range(batch.shape[0])))
    check_finite(cap)
    return cap


def on_model_device(batch: TokenBatch, model) -> TokenBatch:
    """``batch`` with its ids and mask on the device where ``model`` takes its inputs
    (``model.input_device``, else ``model.device``; as is for a model that names neither),
    so a capture's tokens and data share one device: reducers then build every mask
    there, and nothing crosses to the host until a result is read."""
    device = getattr(model, "input_device", None) or getattr(model, "device", None)
    return batch if device is None else batch_to(batch, device)


class Reducer(Protocol):
    """A streaming statistic: ``update`` with each batch, ``merge`` partial results
    (e.g. from Ray workers), ``result`` at the end. A reducer that also has ``begin(cap)``,
    ``piece(cap, piece)`` and ``end(cap)`` reduces a batch one pattern piece at a time
    (:func:`feed`), so its batches need no stored pattern."""

    def update(self, cap: Capture) -> None: ...

    def merge(self, other: Reducer) -> Reducer: ...

    def result(self): ...


def takes_pieces(reducer) -> bool:
    """Whether ``reducer`` reduces pattern pieces (``begin``/``piece``/``end``)."""
    return all(callable(getattr(reducer, m, None)) for m in ("begin", "piece", "end"))


def feed(cap: Capture, reducers: Sequence) -> None:
    """Hand one batch to ``reducers``: those taking pieces (:func:`takes_pieces`) share each
    layer's pieces (:meth:`Capture.pattern_pieces`, computed once for all of them, one at a
    time), the others get ``update(cap)``."""
    by_piece = [r for r in reducers if takes_pieces(r)]
    for r in reducers:
        if not takes_pieces(r):
            r.update(cap)
    if not by_piece:
        return
    for r in by_piece:
        r.begin(cap)
    for layer in cap.layers:
        for piece in cap.pattern_pieces(layer):
            for r in by_piece:
                r.piece(cap, piece)
    for r in by_piece:
        r.end(cap)


def chunk_plan(model, reducers: Sequence, quantities: tuple[str, ...], query_chunk: int | None):
    """``(quantities, ChunkSource or None)`` of a stream: Q and K in place of the pattern when
    ``query_chunk`` is set, the backend can hand them over (:func:`chunk_support`) and every
    reducer takes pieces; the quantities as given otherwise."""
    if query_chunk is None or "pattern" not in quantities or chunk_support(model) is not None:
        return quantities, None
    if not all(takes_pieces(r) for r in reducers):
        return quantities, None
    src = ChunkSource.of(model, query_chunk)
    rest = tuple(q for q in quantities if q != "pattern" and q not in src.names)
    return (*src.names, *rest), src


def pattern_line(model, reducers: Sequence, query_chunk: int | None, chunks: ChunkSource | None) -> str:
    """How a stream reduces its patterns, one line for run.json's ``pattern_statistics``."""
    if chunks is not None:
        return f"chunked (query chunk {chunks.chunk})"
    why = chunk_support(model) if query_chunk is not None else "query chunks off"
    if why is None:
        names = sorted({type(r).__name__ for r in reducers if not takes_pieces(r)})
        why = f"{', '.join(names)} needs stored patterns"
    return f"materialised ({why})"


def run_batch(model, batch: TokenBatch, quantities, layers, chunks: ChunkSource | None) -> dict:
    """``model.run`` of one batch; with ``chunks``, the attention computes ``pattern @ v`` in
    the same query chunks the pieces are recomputed in (:func:`~headscope.probes.chunked.query_chunks`).
    The logits, unless ``"output"`` is among ``quantities``, are neither computed where the model's
    unembedding reads chosen rows (:func:`~headscope.probes.models.backends.protocol.unembed_at`:
    none) nor returned: a stream holds one batch's captures while the next batch runs, and two
    batches' logits (``rows × vocab``) were the largest thing a roles run held at a 151,936-entry
    vocabulary (issue #38)."""
    want = "output" in quantities
    quantities = tuple(q for q in quantities if q != "output")  # the logits are the run's own, not a hook's
    with ExitStack() as stack:
        if chunks is not None:
            stack.enter_context(query_chunks(model, chunks.chunk))
        if not want and rows_unembedded(model):
            stack.enter_context(unembed_at(model, torch.zeros(batch.input_ids.shape, dtype=torch.bool)))
        data = model.run(batch, quantities, layers)
    if not want:
        data.pop(("output", None), None)
    return data


@dataclass
class StreamReport:
    """What a streaming run saw: items used, items skipped (by reason, with their index),
    batches, padding ratio (padded positions / real positions)."""

    n_items: int = 0
    n_used: int = 0
    skipped: Counter = field(default_factory=Counter)
    skipped_items: list[tuple[int, str]] = field(default_factory=list)
    n_batches: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    patterns: str = "materialised"  # how pattern statistics were reduced (run.json's pattern_statistics)

    @property
    def padding_ratio(self) -> float:
        return self.padded_tokens / max(self.real_tokens, 1)


def in_part(part: tuple[int, int] | None, batch: int) -> bool:
    """Whether batch number ``batch`` (0-based, over the whole corpus) belongs to ``part``
    ``(k, n)``: every ``n``-th batch from the ``k``-th (None: every batch). A sharded run
    (``--ray``) has each worker run one part of the same batches, so each batch, and each item's
    values, is the one a single process computes.

    >>> [b for b in range(7) if in_part((1, 3), b)], in_part(None, 5)
    ([1, 4], True)
    """
    return part is None or batch % part[1] == part[0]


def merge_reports(reports: Sequence[StreamReport]) -> StreamReport:
    """The report of a whole corpus from its parts' (:func:`in_part`, in part order; each part
    reads, tokenises and counts every item, and cuts the whole run's batches): what each part ran (``n_used``, ``n_batches``, real and padded tokens) added, what every part saw alike
    (``n_items``, the skipped items, ``patterns``, any attribute a role's feed set) from the first.
    Raises ``ValueError`` for no reports."""
    if not reports:
        raise ValueError("merge_reports needs at least one report; got none")
    import copy

    out = copy.copy(reports[0])
    for r in reports[1:]:
        out.n_used += r.n_used
        out.n_batches += r.n_batches
        out.real_tokens += r.real_tokens
        out.padded_tokens += r.padded_tokens
    return out


def buckets(
    lengths: list[int], max_batch: int, max_tokens: int | None = None, max_cells: int | None = None
) -> list[list[int]]:
    """Group item indices into batches of similar length (sorted by length, then cut),
    so padding stays small. Deterministic: ties keep input order.

    A batch holds at most ``max_batch`` items, ``max_tokens`` padded tokens (rows ×
    length) and ``max_cells`` attention cells per head (rows × length²), so the
    patterns of a batch of long items take no more memory than those of short ones.
    An item alone is never split.

    >>> buckets([5, 2, 9, 3, 2], max_batch=2)
    [[1, 4], [3, 0], [2]]
    >>> buckets([10, 10, 10, 40, 40], max_batch=8, max_cells=3200)
    [[0, 1, 2], [3, 4]]
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    out, cur = [], []
    for i in order:
        rows, n = len(cur) + 1, lengths[i]
        if cur and (
            len(cur) >= max_batch or (max_tokens and rows * n > max_tokens) or (max_cells and rows * n * n > max_cells)
        ):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def stream(
    model: Backend,
    items: Iterable,
    reducers: Sequence[Reducer] | dict,
    *,
    quantities: Iterable[str] = ("pattern",),
    layers: Iterable[int] | None = None,
    batch_size: int = 32,
    max_tokens: int | None = 8192,
    max_cells: int | None = 1 << 17,
    words: bool | None = None,
    progress=None,
    window: int | None = None,
    query_chunk: int | None = None,
    part: tuple[int, int] | None = None,
) -> StreamReport:
    """Feed a corpus through ``model`` batch by batch into ``reducers``.

    ``items``: texts, or word lists (``words=True``; inferred from the first item); a
    list or any iterable (a generator reading a file works: the corpus is never held
    whole). Items are tokenised ``window`` at a time (default ``max(16 * batch_size,
    512)``), each window cut into length-bucketed batches of at most ``batch_size``
    items, ``max_tokens`` tokens and ``max_cells`` attention cells per head (rows ×
    length²), so memory does not grow with the corpus, nor with its longest items,
    while padding stays small (:func:`_stream_window`). Items that are empty, too long for the
    context, or fail to tokenise are skipped and counted in the returned :class:`StreamReport`
    (never dropped silently). ``progress(done, total)`` counts items (``total`` is None for an
    iterable without a length).

    ``query_chunk``: where the backend hands over Q and K and every reducer takes pattern pieces
    (:func:`chunk_plan`), no pattern is stored: each layer's is recomputed ``query_chunk`` query
    rows at a time and reduced at once (:func:`feed`); ``report.patterns`` says which path ran
    and, for stored patterns, why. ``part`` ``(k, n)``: only the batches :func:`in_part` gives it.

    On a CUDA device the free memory bounds each batch instead (:func:`memory_limits`,
    :func:`max_batch`), and an item that cannot fit alone raises :class:`MemoryBudgetError`;
    batches and their tensors stay on the device (reducers move only their small results).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    window = max(16 * batch_size, 512) if window is None else window
    if window < 1:
        raise ValueError(f"window must be >= 1; got {window}")
    red = list(reducers.values()) if isinstance(reducers, dict) else list(reducers)
    total = len(items) if hasattr(items, "__len__") else None
    report = StreamReport(n_items=0)
    it = iter(items)
    first = next(it, None)
    if first is None:
        return report
    if words is None:
        words = not isinstance(first, str)
    qs, chunks = chunk_plan(model, red, tuple(quantities), query_chunk)
    report.patterns = pattern_line(model, red, query_chunk, chunks)
    run = _StreamRun(
        model=model,
        reducers=red,
        quantities=qs,
        chunks=chunks,
        layers=tuple(range(model.spec.n_layers)) if layers is None else tuple(layers),
        pad=pad_id(model.tokenizer),
        batch_size=batch_size,
        max_tokens=max_tokens,
        max_cells=max_cells,
        words=words,
        progress=progress,
        total=total,
        part=part,
    )
    chunk = [first]
    for item in it:
        chunk.append(item)
        if len(chunk) >= window:
            _stream_window(run, chunk, report)
            chunk = []
    if chunk:
        _stream_window(run, chunk, report)
    if report.skipped:
        log.warning("skipped %d of %d items: %s", sum(report.skipped.values()), report.n_items, dict(report.skipped))
    return report


@dataclass(frozen=True)
class _StreamRun:
    """What every window of one :func:`stream` call shares (see its parameters)."""

    model: Backend
    reducers: list
    quantities: tuple[str, ...]
    chunks: ChunkSource | None  # patterns recomputed per query chunk (None: stored)
    layers: tuple[int, ...]
    pad: int  # id of padding positions
    batch_size: int
    max_tokens: int | None
    max_cells: int | None
    words: bool  # items are word lists, not texts
    progress: Callable | None
    total: int | None  # items in the corpus, None when unknown
    part: tuple[int, int] | None = None  # (k, n): run every n-th batch from the k-th (None: all)
    seen: list = field(default_factory=lambda: [0])  # batches cut so far, over every window


#: batches on a GPU hold at most this many items, whatever the memory allows
MAX_DEVICE_BATCH = 1024


def memory_limits(run: _StreamRun, longest: int) -> tuple[int, int, int] | None:
    """``(batch_size, max_tokens, max_cells)`` for :func:`buckets` from the free memory of the
    model's CUDA device (half of :func:`max_batch`'s budget for attention cells, half for
    activations), so batches grow with the GPU, not a fixed count; None on the CPU (batches
    keep ``batch_size``, ``max_tokens``, ``max_cells``: the CPU figures do not change).
    Raises :class:`MemoryBudgetError` when one item of ``longest`` tokens does not fit."""
    device = getattr(run.model, "input_device", None) or getattr(run.model, "device", None)
    free = device_free_bytes(device)
    if free is None:
        return None
    spec = run.model.spec
    kept = len(run.layers) * (("pattern" in run.quantities) + ("scores" in run.quantities))
    bytes_per = 2 if placement(run.model)["dtype"] in ("bf16", "fp16") else 4
    max_batch(
        longest,
        n_heads=spec.n_heads,
        d_model=spec.d_model,
        free_bytes=free,
        kept_layers=max(kept, 1),
        bytes_per=bytes_per,
    )
    budget = int(free * 0.8) // 2
    cells = budget // (bytes_per * spec.n_heads * (max(kept, 1) + WORK_CELLS))
    tokens = budget // (bytes_per * WORK_ACTIVATIONS * spec.d_model)
    return MAX_DEVICE_BATCH, max(tokens, longest), max(cells, longest * longest)


def _stream_window(run: _StreamRun, chunk: list, report: StreamReport) -> None:
    """Tokenise one window of items (indices continue from ``report.n_items``), bucket it
    by length and feed its batches to the reducers. (A window's batches run from short to long,
    each allocating larger tensors than the last; short windows let the next window reuse that
    memory: ``headscope bench --memory`` measures it.)"""
    model, words = run.model, run.words
    start = report.n_items
    report.n_items += len(chunk)
    toks, keep = [], []
    vocab = model.vocab_size  # None: the backend does not know its embedding size
    for k, it in enumerate(chunk):
        i = start + k
        try:
            t = (
                tokenize_one(model.tokenizer, words=list(it), add_bos=False)
                if words
                else tokenize_one(model.tokenizer, text=it)
            )
        except (ValueError, TypeError) as e:
            if words and any(isinstance(w, str) and any(c.isspace() for c in w) for w in it):
                reason = "space_in_word"  # words are matched to tokens at spaces
            else:
                reason = "empty" if "empty" in str(e) else "untokenisable"
            report.skipped[reason] += 1
            report.skipped_items.append((i, reason))
            continue
        if vocab is not None and t["ids"] and max(t["ids"]) >= vocab:  # an added token with no embedding row
            report.skipped["id past vocabulary"] += 1
            report.skipped_items.append((i, f"id past vocabulary ({max(t['ids'])} >= {vocab})"))
            continue
        if len(t["ids"]) > model.spec.max_positions:
            report.skipped["longer than context"] += 1
            report.skipped_items.append((i, f"longer than context ({len(t['ids'])} > {model.spec.max_positions})"))
            continue
        toks.append(t)
        keep.append(i)
    done = start + len(chunk) - len(toks)  # skipped items count as done
    lengths = [len(t["ids"]) for t in toks]
    limits = memory_limits(run, max(lengths, default=1)) or (run.batch_size, run.max_tokens, run.max_cells)
    for group in buckets(lengths, *limits):
        b, run.seen[0] = run.seen[0], run.seen[0] + 1
        if not in_part(run.part, b):
            done += len(group)
            continue
        batch = on_model_device(collate([toks[j] for j in group], run.pad), model)
        data = run_batch(model, batch, run.quantities, run.layers, run.chunks)
        cap = Capture(
            tokens=batch,
            data=data,
            layers=run.layers,
            spec=model.spec,
            item_ids=[keep[j] for j in group],
            chunks=run.chunks,
        )
        check_finite(cap)
        feed(cap, run.reducers)
        report.n_batches += 1
        report.n_used += len(group)
        real = sum(batch.lengths)
        report.real_tokens += real
        report.padded_tokens += batch.input_ids.numel() - real
        done += len(group)
        if run.progress is not None:
            run.progress(done, run.total)
