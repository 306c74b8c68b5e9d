"""Per-item values of the long-context roles, reduced one pattern piece at a time.

Each reducer sees one item's pieces (:class:`~headscope.probes.chunked.PatternPiece`,
``pattern [1, head, rows, key_pos]``, rows ``start:stop``) layer by layer, and keeps per
item a value and a baseline for every head, ``[n_items, layer, head]`` and ``[n_items]``
(``[n_items, layer, head]`` where the baseline depends on the head):

* :class:`RetrievalReducer`: Wu et al.'s retrieval score: of the item's answer tokens the
  model copies, the share at whose step (query ``answer[i] - 1``) the head's top-1 key is
  ``needle[i]``; baseline: the chance a uniformly drawn top-1 key is that one
  (``1 / (answer[i])`` visible keys), over the copied tokens;
* :class:`StreamingReducer`: per window ``w``, the mean over queries ``i >= sink + w`` (whose
  keys sink + window do not all cover) of the mass on keys ``j < sink`` or ``j > i - w``;
  baseline: that set's share of the visible keys, ``(sink + w) / (i + 1)``; where no query has
  such keys (``sink + w >= n``: the window holds the whole item), score and baseline are 1;
* :class:`SinkReducer`: the mean mass on keys ``j < sink`` of the queries at long range
  (``i >= long_range · n``); baseline ``sink / (i + 1)``; and the mean mass profile over keys
  of those queries (where the sink is: its top key).

>>> import torch
>>> from headscope.probes.chunked import PatternPiece
>>> p = torch.zeros(1, 1, 8, 8); p[0, 0, torch.arange(8), torch.arange(8)] = 1.0   # attends itself
>>> r = StreamingReducer(1, 1, windows=(2,), sink=1); r.begin(8)
>>> r.piece(PatternPiece(0, 0, 8, p)); r.end()
>>> float(r.values[2][0][0, 0]), round(float(r.baselines[2][0]), 4)   # rows 3..7: all mass in the window
(1.0, 0.5307)
"""

from __future__ import annotations

import torch


class _Reducer:
    """``begin(n)`` / ``piece(piece)`` / ``end()`` per item; ``values``, ``baselines``: lists
    of per-item tensors ``[layer, head]`` and scalars (or ``[layer, head]``)."""

    def __init__(self, n_layers: int, n_heads: int):
        self.n_layers, self.n_heads = n_layers, n_heads

    def _zeros(self) -> torch.Tensor:
        return torch.zeros(self.n_layers, self.n_heads, dtype=torch.float64)


class RetrievalReducer(_Reducer):
    """Wu et al.'s retrieval score of each head per item (module docstring)."""

    def __init__(self, n_layers: int, n_heads: int):
        super().__init__(n_layers, n_heads)
        self.values: list[torch.Tensor] = []
        self.baselines: list[float] = []
        self.copied_share: list[float] = []

    def begin(self, item, copied: torch.Tensor) -> None:
        self.item, self.copied = item, copied.bool().cpu()
        self.hits = self._zeros()

    def piece(self, piece) -> None:
        for i, (a, key) in enumerate(zip(self.item.answer, self.item.needle)):
            q = a - 1
            if not (piece.start <= q < piece.stop) or not self.copied[i]:
                continue
            top = piece.pattern[0, :, q - piece.start].argmax(-1).cpu()  # [head]
            self.hits[piece.layer] += (top == key).double()

    def end(self) -> None:
        n_copied = int(self.copied.sum())
        k = len(self.item.answer)
        self.values.append(self.hits / k)
        self.baselines.append(sum(1.0 / a for a, c in zip(self.item.answer, self.copied.tolist()) if c) / k)
        self.copied_share.append(n_copied / k)


class StreamingReducer(_Reducer):
    """Mass within sink + recent window, per window (module docstring); ``values[w]``,
    ``baselines[w]`` per window ``w``."""

    def __init__(self, n_layers: int, n_heads: int, *, windows, sink: int):
        super().__init__(n_layers, n_heads)
        self.windows, self.sink = tuple(windows), sink
        self.values = {w: [] for w in self.windows}
        self.baselines = {w: [] for w in self.windows}

    def begin(self, n: int) -> None:
        self.n = n
        self.sums = {w: self._zeros() for w in self.windows}

    def piece(self, piece) -> None:
        pat = piece.pattern[0].double()  # [head, rows, key_pos]
        cs = pat.cumsum(-1)
        rows = torch.arange(piece.start, piece.stop)
        total = cs[:, torch.arange(len(rows)), rows]  # [head, rows]: the visible mass (1)
        sink_mass = cs[..., self.sink - 1]
        for w in self.windows:
            ok = rows >= self.sink + w
            if not bool(ok.any()):
                continue
            r, i = torch.nonzero(ok).flatten(), rows[ok]
            inside = sink_mass[:, r] + total[:, r] - cs[:, r, i - w]  # keys j < sink or j > i - w
            self.sums[w][piece.layer] += inside.sum(-1).cpu()

    def end(self) -> None:
        for w in self.windows:
            if self.sink + w >= self.n:  # sink + window cover every key of every query: all the mass, as uniform's
                self.values[w].append(torch.ones(self.n_layers, self.n_heads, dtype=torch.float64))
                self.baselines[w].append(1.0)
                continue
            i = torch.arange(self.sink + w, self.n, dtype=torch.float64)
            self.values[w].append(self.sums[w] / len(i))
            self.baselines[w].append(float(((self.sink + w) / (i + 1)).mean()))


class SinkReducer(_Reducer):
    """Mass on the first ``sink`` keys at long range, and the mean mass per key of those
    queries (module docstring); ``profiles``: per item ``[layer, head, key_pos]``."""

    def __init__(self, n_layers: int, n_heads: int, *, sink: int, long_range: float):
        super().__init__(n_layers, n_heads)
        self.sink, self.long_range = sink, long_range
        self.values: list[torch.Tensor] = []
        self.baselines: list[float] = []
        self.profiles: list[torch.Tensor] = []

    def begin(self, n: int) -> None:
        self.n, self.first = n, min(int(self.long_range * n), n - 1)
        self.profile = torch.zeros(self.n_layers, self.n_heads, n, dtype=torch.float64)

    def piece(self, piece) -> None:
        lo = max(self.first, piece.start)
        if lo >= piece.stop:
            return
        pat = piece.pattern[0, :, lo - piece.start :].double()  # [head, rows, key_pos]
        self.profile[piece.layer] += pat.sum(1).cpu()

    def end(self) -> None:
        n_rows = self.n - self.first
        profile = self.profile / n_rows
        i = torch.arange(self.first, self.n, dtype=torch.float64)
        self.values.append(profile[..., : self.sink].sum(-1))
        self.baselines.append(float((torch.clamp(self.sink / (i + 1), max=1.0)).mean()))
        self.profiles.append(profile.float())
