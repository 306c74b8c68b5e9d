"""Per-head summary statistics of attention patterns, and the masks every token role uses.

Metrics (rows of :data:`~headscope.analyses.frames.STAT_COLUMNS`; per item the mean over
its real query rows, then the mean over items; ``n`` = items):

* ``entropy`` — Shannon entropy of a query row over the keys it may see, in nats
  (Clark et al. 2019, "What does BERT look at?", §3). With ``cfg.entropy_smoothing = s``
  the row is first mixed with the uniform distribution: ``(1 - s)·p + s/n_keys``
  (a smoothed variant; ``s = 0`` is plain entropy).
* ``kl_from_uniform`` — ``KL(p ‖ uniform) = log(n_keys) - entropy``: the gap to the
  largest entropy the row could have (also called the max-entropy gap); 0 for a uniform head.
* ``mean_distance`` — attention-weighted mean ``|query_pos - key_pos|`` (Vig & Belinkov 2019,
  "Analyzing the structure of attention in a transformer language model").
* ``confidence`` — mean over rows of the largest weight (Voita et al. 2019, "Analyzing
  multi-head self-attention", §4: "confidence").

Masks (used by every module of the token-level roles):

* :func:`allowed_keys` — ``[batch, query_pos, key_pos]``: the keys a query may attend
  (real tokens, and ``key <= query`` for causal models). Padded keys are never allowed.
* :func:`query_rows` — ``[batch, query_pos]``: the query rows analysed (real tokens;
  special tokens excluded unless ``include_special``). Padded rows are never analysed.

>>> import torch
>>> p = torch.full((1, 1, 4, 4), 0.25)                    # uniform over 4 keys
>>> keys = torch.ones(1, 4, dtype=torch.bool)
>>> m = pattern_metrics(p, allowed_keys(keys, causal=False))
>>> round(float(m["entropy"][0, 0, 0]), 4) == round(float(torch.log(torch.tensor(4.0))), 4)
True
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import pandas as pd
import torch

from headscope.analyses.frames import STAT_COLUMNS, empty_roles
from headscope.analyses.roles.base import Role, RoleContext
from headscope.analyses.roles.config import RoleOutput

METRICS = ("entropy", "kl_from_uniform", "mean_distance", "confidence")


# -- masks ------------------------------------------------------------------------------
def allowed_keys(key_mask: torch.Tensor, causal: bool, rows: slice | None = None) -> torch.Tensor:
    """``key_mask [batch, pos]`` (True = real token) -> ``[batch, query_pos, key_pos]`` bool:
    True where a query may attend the key (real key; ``key <= query`` if ``causal``).
    ``rows``: only the query rows ``rows.start:rows.stop`` (a pattern piece's)."""
    if key_mask.dim() != 2:
        raise ValueError(f"key_mask must be [batch, pos]; got shape {tuple(key_mask.shape)}")
    km = key_mask.bool()
    n = km.shape[1]
    start, stop = (0, n) if rows is None else (rows.start, rows.stop)
    allowed = km[:, None, :].expand(km.shape[0], stop - start, n)
    if causal:
        q = torch.arange(start, stop, device=km.device)[:, None]
        allowed = allowed & (torch.arange(n, device=km.device)[None, :] <= q)
    return allowed


def query_rows(
    key_mask: torch.Tensor, special: torch.Tensor | None = None, *, include_special: bool = False
) -> torch.Tensor:
    """``[batch, query_pos]`` bool: real query rows, special tokens excluded unless
    ``include_special``."""
    rows = key_mask.bool().clone()
    if special is not None and not include_special:
        rows &= ~special.bool()
    return rows


def row_mean(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean over the selected query rows: ``x [batch, head, query_pos]`` (or
    ``[batch, query_pos]``), ``rows [batch, query_pos]`` -> ``[batch, head]`` (or
    ``[batch]``); NaN for an item with no selected row."""
    r = rows.to(x.dtype)
    if x.dim() == 3:
        r = r[:, None, :]
    return (x * r).sum(-1) / r.sum(-1)


def argmax_share(pattern: torch.Tensor, allowed: torch.Tensor, *, rel_tol: float = 1e-6) -> torch.Tensor:
    """``[batch, head, query_pos, key_pos]`` weights that put each row's "max-attention"
    on its maximal key; exact ties (within ``rel_tol`` of the max, e.g. a uniform row)
    share the unit equally, so a uniform row scores each key exactly 1/n_keys.
    ``pattern`` holds attention weights (``>= 0``); keys outside ``allowed`` never count."""
    return share_of_max(masked_pattern(pattern, allowed), allowed, rel_tol=rel_tol)


def share_of_max(masked: torch.Tensor, allowed: torch.Tensor, *, rel_tol: float = 1e-6) -> torch.Tensor:
    """:func:`argmax_share` of a pattern already zeroed outside ``allowed``
    (:func:`masked_pattern`)."""
    p = masked
    is_max = p >= p.amax(-1, keepdim=True).mul_(1 - rel_tol)
    is_max &= allowed[:, None]  # a row whose allowed weights are all 0 shares among its allowed keys
    w = is_max.float()
    return w.div_(w.sum(-1, keepdim=True).clamp_min_(1))


def masked_pattern(pattern: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``pattern [batch, head, query_pos, key_pos]`` as float, zero outside ``allowed
    [batch, query_pos, key_pos]`` (a new tensor)."""
    return pattern.float() * allowed[:, None]


# -- metrics ----------------------------------------------------------------------------
_TINY = torch.finfo(torch.float32).tiny


def entropy(p: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Shannon entropy ``-sum p log p`` over the last dim, in nats, for ``p >= 0``
    (0·log 0 = 0). Equals ``torch.special.entr(p).sum(-1)`` (to fp32 rounding; a
    subnormal ``p`` counts as ``p·log(tiny)``), about 3× faster on a CPU, where ``entr``
    is not vectorised. ``out``: scratch of ``p``'s shape and dtype to reuse.

    >>> p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    >>> entropy(p).tolist() == torch.special.entr(p).sum(-1).tolist()
    True
    """
    buf = torch.clamp_min(p, _TINY, out=out) if out is not None else p.clamp_min(_TINY)
    return buf.log_().mul_(p).sum(-1).neg_()


def pattern_metrics(pattern: torch.Tensor, allowed: torch.Tensor, *, smoothing: float = 0.0) -> dict[str, torch.Tensor]:
    """Row metrics of ``pattern [batch, head, query_pos, key_pos]`` over ``allowed
    [batch, query_pos, key_pos]`` keys -> dict of ``[batch, head, query_pos]`` tensors
    (entropy in nats, kl_from_uniform, mean_distance, confidence). Pure: the input is
    not modified."""
    if pattern.dim() != 4:
        raise ValueError(f"pattern must be [batch, head, query_pos, key_pos]; got shape {tuple(pattern.shape)}")
    return masked_metrics(masked_pattern(pattern, allowed), allowed, smoothing=smoothing)


def masked_metrics(
    masked: torch.Tensor, allowed: torch.Tensor, *, smoothing: float = 0.0, start: int = 0
) -> dict[str, torch.Tensor]:
    """:func:`pattern_metrics` of a pattern already zeroed outside ``allowed``
    (:func:`masked_pattern`), as the reducers share it per piece; ``start``: the query
    position of its first row (a pattern piece's)."""
    if not 0 <= smoothing <= 1:
        raise ValueError(f"smoothing must be in [0, 1]; got {smoothing}")
    a = allowed[:, None].float()
    n_keys = a.sum(-1).clamp_min(1)
    p = (1 - smoothing) * masked + smoothing * a / n_keys[..., None] if smoothing else masked
    ent = entropy(p)
    q = torch.arange(start, start + masked.shape[-2], device=masked.device)
    k = torch.arange(masked.shape[-1], device=masked.device)
    dist = (q[:, None] - k[None, :]).abs().float()
    return {
        "entropy": ent,
        "kl_from_uniform": (n_keys.log() - ent).clamp_min(0),
        "mean_distance": (masked * dist).sum(-1),
        "confidence": masked.amax(-1),
    }


# -- per-item storage shared by the role reducers -----------------------------------------
class ItemValues:
    """Per-item values ``[n_items, n_layers, n_heads]`` collected batch by batch under
    names; ``merge`` concatenates, ``get`` returns them ordered by item id.

    Each run of ``consolidate_every`` batch parts of a name is joined into one chunk
    (chunks are never joined again, so no block keeps growing), and ``get`` keeps its
    ordered result in place of the parts: thousands of small tensors left between freed
    attention blocks would hold heap pages resident, and a ``get`` that kept the parts
    beside their concatenation would double the store at the end.
    """

    def __init__(self, consolidate_every: int = 32):
        self.parts: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = defaultdict(list)
        self.loose: dict[str, int] = defaultdict(int)  # batch parts at the end of parts[name], not yet in a chunk
        self.consolidate_every = consolidate_every

    def add(self, name: str, item_ids: list[int], values: torch.Tensor) -> None:
        parts = self.parts[name]
        parts.append(
            (
                torch.as_tensor(list(item_ids), dtype=torch.int64, device="cpu"),
                values.detach().float().cpu().contiguous(),  # the host boundary: small per-item values
            )
        )
        self.loose[name] += 1
        if self.loose[name] >= self.consolidate_every:
            k = self.loose[name]
            parts[-k:] = [_join(parts[-k:])]
            self.loose[name] = 0

    def merge(self, other: ItemValues) -> ItemValues:
        for k, v in other.parts.items():
            self.parts[k].extend(v)
            self.loose[k] = 0  # the merged parts stay as they are
        return self

    def names(self) -> list[str]:
        return list(self.parts)

    def get(self, name: str) -> tuple[list[int], torch.Tensor]:
        parts = self.parts.get(name, [])
        if not parts:
            return [], torch.zeros(0)
        ids, vals = _join(parts)
        order = torch.argsort(ids, stable=True)
        ids, vals = ids[order], vals[order]
        self.parts[name] = [(ids, vals)]
        self.loose[name] = 0
        return ids.tolist(), vals


def _join(parts):
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def special_mask_of(cap) -> torch.Tensor:
    """``[batch, pos]`` bool, True on the capture's special tokens, on the device of its data
    (built on the host from the batch's per-item flags, then moved)."""
    with torch.device("cpu"):
        special = cap.tokens.special_mask()
    return special.to(cap.key_mask.device)


def check_layers(layers, seen):
    if seen is not None and tuple(layers) != tuple(seen):
        raise ValueError(
            f"reducer saw layers {tuple(seen)} before and {tuple(layers)} now; capture the same layers in every batch"
        )
    return tuple(layers)


def allowed_of(piece, causal: bool) -> torch.Tensor:
    """:func:`allowed_keys` of a pattern piece's rows (for ``PatternPiece.cached``: once per piece)."""
    return allowed_keys(piece.key_mask, causal, piece.rows)


def _masked_pattern_of(piece, causal: bool) -> torch.Tensor:
    """:func:`masked_pattern` of a piece over :func:`allowed_keys` (for ``PatternPiece.cached``)."""
    return masked_pattern(piece.pattern, piece.cached(allowed_of, causal))


def _argmax_share_of(piece, causal: bool) -> torch.Tensor:
    """:func:`share_of_max` of :func:`_masked_pattern_of` (for ``PatternPiece.cached``)."""
    return share_of_max(piece.cached(_masked_pattern_of, causal), piece.cached(allowed_of, causal))


def cat_rows(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """Pieces' per-row values joined along their query axis ``dim`` (one piece: as it is)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


class PieceRows:
    """Per-row values of one batch's pattern pieces, by ``(name, layer)``, joined along their
    query axis: the reducers' whole-pattern numbers are the same functions of the joined rows,
    whatever the chunk size.

    Given the batch's ``layers`` and ``n_rows``, a value added with its piece's ``rows`` is
    copied into a buffer of all rows, allocated for every layer at the name's first piece
    (so the small kept tensors do not sit between the pieces' large temporaries, which would
    keep the heap from reusing them); otherwise the pieces are kept and joined by :meth:`get`.
    A view into a larger tensor (a piece's pattern, say) is never kept as it is."""

    def __init__(self, layers=(), n_rows: int | None = None):
        self.parts: dict = defaultdict(list)
        self.buffers: dict = {}
        self.layers, self.n_rows = tuple(layers), n_rows

    def add(self, name: str, layer, values: torch.Tensor, rows: slice | None = None, dim: int = -1) -> None:
        if rows is None or self.n_rows is None:
            if values.untyped_storage().nbytes() > values.numel() * values.element_size():
                values = values.clone()
            self.parts[name, layer].append(values)
            return
        dim = dim % values.dim()
        shape = (*values.shape[:dim], self.n_rows, *values.shape[dim + 1 :])
        buf = self.buffers.get((name, layer))
        if buf is None or buf.shape != shape:
            for l in (self.layers or (layer,)) if layer is not None else (None,):
                if (name, l) not in self.buffers or l == layer:
                    self.buffers[name, l] = values.new_empty(shape)
            buf = self.buffers[name, layer]
        buf.narrow(dim, rows.start, rows.stop - rows.start).copy_(values)

    def get(self, name: str, layer, dim: int = -1) -> torch.Tensor:
        if (name, layer) in self.buffers:
            return self.buffers[name, layer]
        return cat_rows(self.parts[name, layer], dim)


class ItemValuesReducer:
    """Base of the role reducers that keep per-item values (positional, special,
    rare-word, induction): the layers seen, an :class:`ItemValues` store, an exact
    ``merge``, the masks every batch starts from, and the per-piece masked pattern and
    max-attention shares they share.

    A subclass that defines ``piece(cap, piece)`` reduces a batch one pattern piece at a
    time (:func:`~headscope.probes.capture.feed`): ``begin(cap)`` (a fresh :class:`PieceRows`
    in ``self.piece_rows``), ``piece`` per piece of each layer (per-row values into
    ``self.piece_rows``), ``end(cap)`` (the batch's per-item values from the joined rows);
    ``update(cap)`` does all three, for a capture handed over alone. A subclass without
    ``piece`` defines ``update`` on whole patterns (:meth:`_masks`) and keeps stored patterns."""

    def __init__(self, *, causal: bool, include_special: bool = False):
        self.causal = causal
        self.include_special = include_special
        self.values = ItemValues()
        self.layers = None
        self.piece_rows = PieceRows()

    def update(self, cap) -> None:
        from headscope.probes.capture import feed

        feed(cap, [self])

    def begin(self, cap) -> None:
        self.piece_rows = PieceRows(cap.layers, cap.tokens.input_ids.shape[1])

    def _rows(self, cap) -> tuple[torch.Tensor, torch.Tensor]:
        """Check the batch's layers; return ``(rows [batch, q], special [batch, pos])``:
        analysed query rows, special tokens."""
        self.layers = check_layers(cap.layers, self.layers)
        special = special_mask_of(cap)
        return query_rows(cap.key_mask, special, include_special=self.include_special), special

    def _masks(self, cap) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_rows` with ``allowed [batch, q, k]`` (visible keys) first, for an ``update``
        on whole patterns."""
        rows, special = self._rows(cap)
        return allowed_keys(cap.key_mask, self.causal), rows, special

    def _allowed(self, piece) -> torch.Tensor:
        """:func:`allowed_keys` of the piece's rows, ``[batch, rows, key_pos]``."""
        return piece.cached(allowed_of, self.causal)

    def _masked(self, piece) -> torch.Tensor:
        """:func:`masked_pattern` of a piece over the keys ``self.causal`` allows, once per
        piece, shared by reducers through ``piece.cached``."""
        return piece.cached(_masked_pattern_of, self.causal)

    def _argmax_share(self, piece) -> torch.Tensor:
        """:func:`argmax_share` of a piece over the keys ``self.causal`` allows, computed once
        per piece and kept on it (``piece.cached``) for the other reducers that need it."""
        return piece.cached(_argmax_share_of, self.causal)

    def merge(self, other: ItemValuesReducer) -> ItemValuesReducer:
        self.layers = self.layers or other.layers
        self.values.merge(other.values)
        return self

    def _by_role(self, roles) -> tuple[dict, dict, tuple]:
        """``({role: [n_items, layer, head]}, {role: [n_items]} baselines, layers)``."""
        return (
            {r: self.values.get(r)[1] for r in roles},
            {r: self.values.get("baseline:" + r)[1] for r in roles},
            self.layers or (),
        )


class SummaryReducer(ItemValuesReducer):
    """Streaming per-head summary statistics (see module docstring).

    ``update(cap)`` (or ``begin``/``piece``/``end``) reduces a batch's patterns; ``result()`` -> STAT_COLUMNS frame.
    Only sums and item counts per head are kept (no interval is drawn for these
    statistics), so memory does not grow with the corpus; ``merge`` adds them.
    """

    def __init__(self, *, causal: bool, smoothing: float = 0.0, include_special: bool = False):
        super().__init__(causal=causal, include_special=include_special)
        self.smoothing = smoothing
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor] = {}

    def piece(self, cap, piece) -> None:
        m = masked_metrics(self._masked(piece), self._allowed(piece), smoothing=self.smoothing, start=piece.start)
        for k, v in m.items():
            self.piece_rows.add(k, piece.layer, v, piece.rows)

    def end(self, cap) -> None:
        rows, _ = self._rows(cap)
        per = defaultdict(list)
        for layer in cap.layers:
            for k in METRICS:
                per[k].append(row_mean(self.piece_rows.get(k, layer), rows))
        for k, v in per.items():
            s, n = _nan_sums(torch.stack(v, 1).detach().cpu())  # [batch, layer, head]; NaN: item without rows
            self.sums[k] = self.sums[k] + s if k in self.sums else s
            self.counts[k] = self.counts[k] + n if k in self.counts else n

    def merge(self, other: SummaryReducer) -> SummaryReducer:
        self.layers = self.layers or other.layers
        for k in other.sums:
            self.sums[k] = self.sums[k] + other.sums[k] if k in self.sums else other.sums[k].clone()
            self.counts[k] = self.counts[k] + other.counts[k] if k in self.counts else other.counts[k].clone()
        return self

    def result(self) -> pd.DataFrame:
        return stats_frame_from_sums(
            {k: (self.sums[k], self.counts[k]) for k in METRICS if k in self.sums}, self.layers or ()
        )


def stats_frame(metrics: dict[str, torch.Tensor], layers) -> pd.DataFrame:
    """``{metric: [n_items, n_layers, n_heads]}`` -> STAT_COLUMNS frame (NaN items skipped)."""
    return stats_frame_from_sums({name: _nan_sums(v) for name, v in metrics.items() if v.numel()}, layers)


def _nan_sums(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``v [n_items, ...]`` -> (float64 sum over items, item count), NaN items left out."""
    ok = ~torch.isnan(v)
    return torch.where(ok, v, torch.zeros_like(v)).double().sum(0), ok.sum(0)


def stats_frame_from_sums(sums: dict[str, tuple[torch.Tensor, torch.Tensor]], layers) -> pd.DataFrame:
    """``{metric: (sum [n_layers, n_heads], items [n_layers, n_heads])}`` -> STAT_COLUMNS
    frame, ``value`` = sum / items (NaN for a head without items)."""
    rows = []
    for name, (total, n) in sums.items():
        mean = total / n.clamp_min(1)
        for li, layer in enumerate(layers):
            for h in range(total.shape[1]):
                rows.append(
                    {
                        "layer": layer,
                        "head": h,
                        "metric": name,
                        "value": float(mean[li, h]) if n[li, h] else math.nan,
                        "n": int(n[li, h]),
                    }
                )
    df = pd.DataFrame(rows, columns=STAT_COLUMNS)
    return df.astype({"layer": "int64", "head": "int64", "metric": "object", "value": "float64", "n": "int64"})


def _summary_reducer(ctx: RoleContext) -> SummaryReducer:
    return SummaryReducer(
        causal=ctx.model.spec.causal,
        smoothing=ctx.cfg.entropy_smoothing,
        include_special=ctx.options.get("include_special", False),
    )


def _summary_finish(reducer: SummaryReducer, report, ctx: RoleContext) -> RoleOutput:
    """An empty role frame and ``stats`` in STAT_COLUMNS."""
    return RoleOutput(
        frame=empty_roles(), stats=reducer.result(), skipped=Counter(report.skipped), n_items=report.n_used
    )


#: the ``summary`` group (per-head statistics; registered in pipeline order by :mod:`.shipped`)
ROLE_DEF = Role(
    name="summary",
    corpus="text",
    score_kind="none",
    reducer=_summary_reducer,
    finish=_summary_finish,
    options=("include_special",),
    description=(
        "Per-head statistics, no verdicts: entropy (nats), KL from uniform, attention-weighted distance "
        "and confidence (largest weight), each the mean over query rows then items. "
        "Option include_special (default False): keep special tokens as query rows."
    ),
)
