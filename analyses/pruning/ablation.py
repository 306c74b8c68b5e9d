"""Ablating heads: batched evaluation under many head masks, single-head ablation,
all-but-one per layer, and ablating a role's heads against random heads.

The engine is :func:`evaluate`: it scores an :class:`~headscope.analyses.pruning.metrics.ItemMetric`
under ``R`` head masks ``[R, layer, head]`` (through the metric's ``score``). A metric
scored from the model's output runs :func:`replicated_scores`: it stacks ``R`` replicas
of each batch along the batch dimension and installs, on every
``blocks.{l}.attn.hook_z``, a hook that applies replica ``r``'s mask::

    z'[r] = mask[r] · z[r] + (1 - mask[r]) · ablation_value      # per head

(zero ablation: ``ablation_value = 0``; mean ablation: the corpus mean of ``z``,
:func:`mean_z`). The model's own gates are never touched, so a crash leaves the model
as it was. Ablating all ``H`` heads of a layer therefore costs one forward of an
``H``-times larger batch instead of ``H`` forwards (:func:`batching_speedup` measures
the ratio). On the in-house backend a replica runs only the layers from the first one
its mask touches, joining the unablated stream there (computed once per batch for all
masks of the call, :func:`staggered_forward`), and a next-token loss gets only the
logits it reads (:func:`unembed_at`); the studies put all their masks in one call
(:func:`evaluate_groups`). Every figure is the same as a replica run alone
(:func:`unshared` runs the previous engine, for ``headscope bench``).

Frames follow :data:`~headscope.analyses.frames.IMPACT_COLUMNS`; ``value`` holds the
metric (``metric = name``) or its change from the unablated model
(``metric = "delta_" + name``); ``spread`` is the bootstrap standard error over items
(``n_boot`` resamples of items, seeded), NaN for a metric without items.

>>> import torch
>>> masks = head_masks(n_layers=2, n_heads=3, heads=[(0, 1), (1, 2)])
>>> masks[:, 0].tolist(), masks[:, 1].tolist()
([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]], [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import pandas as pd
import torch

from headscope.analyses.frames import IMPACT_COLUMNS
from headscope.probes.capture import Capture
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.backend import Backend

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- masks


def check_head_hooks(model) -> None:
    """Pruning studies drive a model through its head hooks (:meth:`Backend.head_hooks`):
    any loaded backend whose per-head outputs can be reached (the HF backend checks that
    it finds each layer's attention output projection)."""
    if not isinstance(model, Backend):
        raise ModelIncompatibleError(
            f"pruning studies need a loaded model (load_model(...)); got {type(model).__name__}"
        )
    if model.backend == "hf":
        model.layout  # noqa: B018 - raises ModelIncompatibleError naming the bridge when the heads cannot be found


def head_masks(*, n_layers: int, n_heads: int, heads, base: torch.Tensor | None = None) -> torch.Tensor:
    """One mask per ablated head: ``heads`` = ``[(layer, head), ...]`` -> ``[R, layer, head]``
    (1 = kept), each on top of ``base [layer, head]`` (default all ones)."""
    heads = list(heads)
    b = torch.ones(n_layers, n_heads) if base is None else base.float()
    m = b[None].repeat(len(heads), 1, 1)
    for r, (l, h) in enumerate(heads):
        m[r, l, h] = 0.0
    return m


def prune_units(spec, unit: str = "head") -> list[list[tuple[int, int]]]:
    """The removable units: ``unit="head"`` -> one ``[(layer, head)]`` per query head;
    ``unit="kv_group"`` -> per layer and KV head, the query heads reading it (removing a
    KV head removes all of them)."""
    if unit == "head":
        return [[(l, h)] for l in range(spec.n_layers) for h in range(spec.n_heads)]
    if unit == "kv_group":
        return [[(l, h) for h in hs] for l in range(spec.n_layers) for hs in spec.kv_groups().values()]
    raise ValueError(f"unit must be 'head' or 'kv_group'; got {unit!r}")


def mask_of(spec, units: list[list[tuple[int, int]]], removed) -> torch.Tensor:
    """``[layer, head]`` mask with the heads of the ``removed`` unit indices set to 0."""
    m = torch.ones(spec.n_layers, spec.n_heads)
    for u in removed:
        for l, h in units[u]:
            m[l, h] = 0.0
    return m


# ----------------------------------------------------------------------------- engine


@contextmanager
def replica_masks(model, masks: torch.Tensor, ablation: torch.Tensor | None = None):
    """Install head hooks (:meth:`Backend.head_hooks`) applying ``masks [R, layer, head]`` to
    ``R`` stacked replicas of the batch (rows ``r*B .. (r+1)*B``); ``ablation [layer, head,
    d_head]`` replaces the masked part (default zeros). Hooks are removed on exit, whatever
    happens."""
    n_layers = model.spec.n_layers
    if masks.dim() != 3 or masks.shape[1] != n_layers:
        raise ValueError(f"masks must be [replica, layer={n_layers}, head]; got {tuple(masks.shape)}")
    fns = {}
    for l in range(n_layers):
        m = masks[:, l]
        if bool((m == 1).all()):
            continue
        a = None if ablation is None else ablation[l]

        def fn(z, m=m, a=a):
            r = m.shape[0]
            zr = z.reshape(r, z.shape[0] // r, *z.shape[1:])  # [R, batch, head, pos, d_head]
            mm = m.to(z.device, z.dtype)[:, None, :, None, None]
            out = zr * mm
            if a is not None:
                out = out + (1 - mm) * a.to(z.device, z.dtype)[None, None, :, None, :]
            return out.reshape(z.shape)

        fns[l] = fn
    with model.head_hooks(fns):
        yield


@contextmanager
def head_gates(model, mask: torch.Tensor, *, requires_grad: bool = False, ablation: torch.Tensor | None = None):
    """Per-head gates on any backend, through its head hooks: for the ``with`` block every
    forward computes ``z' = gate·z + (1 - gate)·ablation`` with ``gate = mask[l]`` (and
    ``ablation [layer, head, d_head]``, default zeros), the in-house :class:`Attention`'s
    own formula. Yields the gates ``[head]`` per layer; with ``requires_grad`` they are
    leaves whose gradients are Michel et al.'s importance. The model is never modified."""
    spec = model.spec
    device = model.device
    gates = [
        mask[l].detach().to(device, torch.float32).clone().requires_grad_(requires_grad) for l in range(spec.n_layers)
    ]
    fns = {}
    for l, g in enumerate(gates):
        if not requires_grad and bool((mask[l] == 1).all()):
            continue
        a = torch.zeros(spec.n_heads, spec.d_head, device=device) if ablation is None else ablation[l].to(device)

        def fn(z, g=g, a=a):  # z may sit on another GPU than the first layer (a device map)
            gate = g.to(z.device, z.dtype)[None, :, None, None]
            return gate * z + (1 - gate) * a.to(z.device, z.dtype)[None, :, None, :]

        fns[l] = fn
    with model.head_hooks(fns), memo_suspended():  # scores under these gates are not the plain masks'
        yield gates


@contextmanager
def gates_as(module, mask: torch.Tensor, *, requires_grad: bool = False, ablation: torch.Tensor | None = None):
    """Set the in-house transformer's built-in gates (``module.blocks[l].attn.gate``) to
    ``mask[l]`` (and ``ablation_value`` to ``ablation[l]``) for the ``with`` block; the
    previous gates, buffers and ``requires_grad`` come back on exit. The studies use
    :func:`head_gates` (any backend); ``headscope bench`` compares the two."""
    saved = [
        (b.attn.gate.detach().clone(), b.attn.gate.requires_grad, b.attn.ablation_value.clone()) for b in module.blocks
    ]
    try:
        for l, b in enumerate(module.blocks):
            with torch.no_grad():
                b.attn.gate.copy_(mask[l].to(b.attn.gate.dtype))
                if ablation is not None:
                    b.attn.ablation_value.copy_(ablation[l].to(b.attn.ablation_value.dtype))
            b.attn.gate.requires_grad_(requires_grad)
        with memo_suspended():
            yield [b.attn.gate for b in module.blocks]
    finally:
        for b, (g, rg, av) in zip(module.blocks, saved):
            with torch.no_grad():
                b.attn.gate.copy_(g)
                b.attn.ablation_value.copy_(av)
            b.attn.gate.requires_grad_(rg)
            b.attn.gate.grad = None


def evaluate(
    model, metric, masks: torch.Tensor | None = None, *, ablation: torch.Tensor | None = None, max_rows: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score ``metric`` under each head mask.

    ``masks [R, layer, head]`` (1 = kept; None: one all-ones mask). Returns per-item
    ``values [R, n_items]`` and ``weights [n_items]``; ``metric.aggregate(values, weights)``
    gives the ``R`` reported values. Every metric goes through its ``score`` (see
    :meth:`~headscope.analyses.pruning.metrics.ItemMetric.score`).
    """
    check_head_hooks(model)
    spec = model.spec
    if masks is None:
        masks = torch.ones(1, spec.n_layers, spec.n_heads)
    if hasattr(metric, "place"):  # the metric's tokens go where the model takes its inputs
        metric.place(model)
    return metric.score(model, masks, ablation=ablation, max_rows=max_rows)


def evaluate_groups(
    model, metric, groups: list[torch.Tensor], *, ablation: torch.Tensor | None = None, max_rows: int = 64
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """:func:`evaluate` of several groups of masks ``[R_g, layer, head]`` in one call (so
    they share the unablated prefix and fill forwards across groups) -> per group its
    ``values [R_g, n_items]``, and the ``weights``. Inside :func:`unshared`: a call per group."""
    if not sharing():
        scored = [evaluate(model, metric, g, ablation=ablation, max_rows=max_rows) for g in groups]
        return [v for v, _ in scored], scored[-1][1]
    v, w = evaluate(model, metric, torch.cat(list(groups)), ablation=ablation, max_rows=max_rows)
    return list(torch.split(v, [len(g) for g in groups])), w


def replicated_scores(
    model, metric, masks: torch.Tensor, *, ablation: torch.Tensor | None = None, max_rows: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`~headscope.analyses.pruning.metrics.ItemMetric.score` of a metric scored from
    the model's output: per unit, replicas of the batch, one per mask, stacked so one
    forward holds at most ``max_rows`` rows.

    On a resumable backend (``model.resumable``) each replica runs only the layers from the
    first one its mask touches (:func:`first_changed`): the masks are taken in that order,
    the unablated residual stream of the unit is advanced once through the layers before
    (:class:`UnablatedStream`), and a replica joins its batch at its own first layer
    (:func:`staggered_forward`). A metric that reads the output at some positions only
    (``metric.read_positions``, e.g. the next-token loss: not at padding nor at the last
    position) gets the in-house decoder's logits at those positions only (:func:`unembed_at`).
    Every row's arithmetic is the same as in a plain forward of the replica alone.
    :func:`unshared` restores the previous engine (a prefix per forward, every logit), which
    ``headscope bench`` compares with."""
    if not _SHARED.get():
        return _replicated_scores_unshared(model, metric, masks, ablation=ablation, max_rows=max_rows)
    if hasattr(metric, "place"):  # its tokens go where the model takes its inputs
        metric.place(model)
    memo = _MEMO.get()
    if memo is None:
        return _staggered_scores(model, metric, masks, ablation=ablation, max_rows=max_rows)
    # inside remembered_scores(): score each distinct (metric, ablation, mask) once
    abl_key = None if ablation is None else hashlib.sha1(ablation.detach().cpu().numpy().tobytes()).hexdigest()
    keys = [(model, metric, abl_key, m.numpy().tobytes()) for m in masks]
    todo = list(dict.fromkeys(k for k in keys if k not in memo))
    if todo:
        first = {k: r for r, k in reversed(list(enumerate(keys)))}
        idx = [first[k] for k in todo]
        v, w = _staggered_scores(model, metric, masks[idx], ablation=ablation, max_rows=max_rows)
        memo.update({k: (v[i], w) for i, k in enumerate(todo)})
    values = torch.stack([memo[k][0] for k in keys])
    return values, memo[keys[0]][1]


_MEMO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("headscope_pruning_memo", default=None)


@contextmanager
def remembered_scores():
    """Inside the ``with`` block, :func:`replicated_scores` scores each distinct mask (for the
    same model and metric objects and ablation values) once and hands the kept per-item values to
    every later call that asks for it: a study's single-head ablation already holds the
    masks of a role with one head and of its one-head random draws. A row's values do not
    depend on which other masks share its forward, so the figures are the same. Gates set
    from outside (:func:`head_gates`, :func:`gates_as`) suspend it (:func:`memo_suspended`)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


@contextmanager
def memo_suspended():
    """No memo inside the ``with`` block: a model whose heads are gated from outside (a
    :class:`~headscope.analyses.pruning.metrics.CallableMetric` evaluates its function under
    :func:`head_gates`) gives other scores for the same mask than the plain model."""
    token = _MEMO.set(None)
    try:
        yield
    finally:
        _MEMO.reset(token)


def _staggered_scores(model, metric, masks, *, ablation=None, max_rows=64):
    """The scoring of :func:`replicated_scores` (shared engine), every mask computed."""
    r_total = masks.shape[0]
    values = torch.zeros(r_total, metric.n_items)  # per-item values: on the host
    weights = torch.zeros(metric.n_items)
    first = first_changed(masks) if model.resumable else torch.zeros(r_total, dtype=torch.long)
    order = sorted(range(r_total), key=lambda r: (int(first[r]), r))
    with torch.inference_mode():
        for unit in metric.units:
            chunk = max(1, max_rows // unit.rows)
            stream = UnablatedStream(model, unit.batch.input_ids, unit.batch.attention_mask)
            keep = _read_positions(model, metric, unit)
            for start in range(0, r_total, chunk):
                idx = order[start : start + chunk]
                out = staggered_forward(model, stream, masks[idx], first[idx], ablation=ablation, keep=keep)
                v, w = metric.item_values(out, unit)
                values[torch.tensor(idx)[:, None], torch.tensor(unit.items)[None, :]] = v.float().cpu()
                weights[unit.items] = w.float().cpu()
    return values, weights


_SHARED: contextvars.ContextVar[bool] = contextvars.ContextVar("headscope_pruning_shared", default=True)


@contextmanager
def unshared():
    """Inside the ``with`` block, :func:`replicated_scores` and
    :func:`~headscope.analyses.pruning.study.pruning_study` run the previous algorithm (no
    work shared across masks, studies, curves or steps): ``headscope bench`` times it
    against the current one (``quick_pruning_before``). Same figures, slower."""
    token = _SHARED.set(False)
    try:
        yield
    finally:
        _SHARED.reset(token)


def sharing() -> bool:
    """False inside :func:`unshared`."""
    return _SHARED.get()


def first_changed(masks: torch.Tensor) -> torch.Tensor:
    """``masks [R, layer, head]`` -> ``[R]``: the first layer each mask touches (a mask
    touching none joins at the last layer, which leaves it as it is).

    >>> first_changed(torch.tensor([[[1.0, 1.0], [1.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]], [[0.0, 1.0], [1.0, 1.0]]]))
    tensor([1, 1, 0])
    """
    changed = (masks != 1).any(-1)  # [R, layer]
    n_layers = masks.shape[1]
    idx = torch.arange(n_layers).expand_as(changed)
    return torch.where(changed, idx, n_layers - 1).min(-1).values


class UnablatedStream:
    """The residual stream of one batch without ablation, advanced layer by layer on demand:
    :meth:`at` ``(layer)`` gives the stream entering ``layer`` (``[batch, pos, d_model]``)
    for increasing layers, each layer run once (resumable backends only)."""

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.model, self.ids, self.am = model, input_ids, attention_mask
        self.layer, self.x = 0, None

    def at(self, layer: int) -> torch.Tensor:
        if layer < self.layer or layer < 1:
            raise ValueError(f"the stream is at layer {self.layer}; asked for layer {layer}")
        if layer > self.layer:
            resume = {} if self.x is None else {"start_at_layer": self.layer, "resid": self.x}
            self.x = self.model.forward(self.ids, self.am, stop_at_layer=layer, **resume)
            self.layer = layer
        return self.x


def staggered_forward(
    model,
    stream: UnablatedStream,
    masks: torch.Tensor,
    first: torch.Tensor,
    *,
    ablation: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Output of ``R`` replicas of ``stream``'s batch under ``masks [R, layer, head]``
    (:func:`replica_masks`), replica ``r`` joining at layer ``first[r]`` (ascending) with the
    unablated stream there, so it runs the layers from ``first[r]`` only; ``keep [batch, pos]``:
    see :func:`unembed_at`."""
    ids, am = stream.ids, stream.am
    starts = sorted(set(first.tolist()))
    x, n = None, 0
    for i, s in enumerate(starts):
        joining = int((first == s).sum())
        if s > 0:
            join = stream.at(s).repeat(joining, 1, 1)
            x = join if x is None else torch.cat([x, join])
        n += joining
        resume = {} if s == 0 else {"start_at_layer": s, "resid": x}
        last = i + 1 == len(starts)
        if not last:
            resume["stop_at_layer"] = starts[i + 1]
        ctx = unembed_at(model, keep.repeat(n, 1)) if last and keep is not None else nullcontext()
        with replica_masks(model, masks[:n], ablation), ctx:
            x = model.forward(ids.repeat(n, 1), am.repeat(n, 1), **resume)
    return x


def _read_positions(model, metric, unit) -> torch.Tensor | None:
    """The positions whose output ``metric`` reads, where the model can unembed only those."""
    read = getattr(metric, "read_positions", None)
    if read is None or not _sharing_logits(model):
        return None
    return read(unit)


def _sharing_logits(model) -> bool:
    return bool(_SHARED.get() and model.spec.causal and rows_unembedded(model))


def rows_unembedded(model) -> bool:
    """Whether the model's unembedding can read some rows only (:func:`unembed_at`): the
    in-house decoder, and an HF causal LM where checked on load (``model.unembedding``)."""
    return getattr(model, "unembedding", None) is not None


@contextmanager
def unembed_at(model, keep: torch.Tensor):
    """A decoder whose ``unembedding`` module is known (:func:`rows_unembedded`): inside the
    ``with`` block the unembedding reads the final hidden states at ``keep [batch, pos]``
    (True) only, so ``forward`` returns logits ``[n_kept, vocab]`` (rows in row-major order
    of ``keep``): the logits nobody reads are never computed. Each kept row's arithmetic is
    the full forward's."""
    handle = model.unembedding.register_forward_pre_hook(lambda mod, args: (args[0][keep.to(args[0].device)],))
    try:
        yield
    finally:
        handle.remove()


def _replicated_scores_unshared(model, metric, masks, *, ablation=None, max_rows=64):
    """The previous engine (:func:`unshared`): per forward, the layers before the first one
    any of its masks touches are run anew; every logit is computed."""
    if hasattr(metric, "place"):  # its tokens go where the model takes its inputs
        metric.place(model)
    r_total = masks.shape[0]
    values = torch.zeros(r_total, metric.n_items)
    weights = torch.zeros(metric.n_items)
    changed = (masks != 1).any(0).any(-1)  # [layer]
    first = int(changed.nonzero()[0]) if bool(changed.any()) else 0  # layers before it run once, not once per mask
    with torch.inference_mode():
        for unit in metric.units:
            chunk = max(1, max_rows // unit.rows)
            ids, am = unit.batch.input_ids, unit.batch.attention_mask
            prefix = model.forward(ids, am, stop_at_layer=first) if first and model.resumable else None
            for start in range(0, r_total, chunk):
                m = masks[start : start + chunk]
                r = m.shape[0]
                with replica_masks(model, m, ablation):
                    if prefix is None:
                        out = model.forward(ids.repeat(r, 1), am.repeat(r, 1))
                    else:
                        out = model.forward(
                            ids.repeat(r, 1), am.repeat(r, 1), start_at_layer=first, resid=prefix.repeat(r, 1, 1)
                        )
                v, w = metric.item_values(out, unit)
                values[start : start + r, unit.items] = v.float().cpu()
                weights[unit.items] = w.float().cpu()
    return values, weights


def bootstrap_se(
    metric,
    values: torch.Tensor,
    weights: torch.Tensor,
    base: torch.Tensor | None = None,
    *,
    n_boot: int = 200,
    seed: int = 0,
) -> torch.Tensor:
    """Bootstrap standard error over items of ``metric.aggregate(values[r])`` (minus the
    aggregate of ``base [item]`` on the same resample when given) -> ``[R]``."""
    n = values.shape[1]
    if n < 2:
        return torch.full((values.shape[0],), float("nan"))
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (n_boot, n), generator=gen)
    counts = torch.zeros(n_boot, n).scatter_add_(1, idx, torch.ones(n_boot, n)).double()
    w = weights.double()
    denom = (counts @ w).clamp(min=1e-12)  # [n_boot]
    agg = metric.finalize((values.double() * w) @ counts.T / denom)  # [R, n_boot]
    if base is not None:
        agg = agg - metric.finalize((base.double() * w) @ counts.T / denom)[None]
    return agg.std(dim=1).float()


def impact_rows(
    study: str,
    metric_name: str,
    *,
    layer=None,
    head=None,
    step=0,
    fraction_pruned=0.0,
    value=float("nan"),
    spread=float("nan"),
    seed=None,
    n=0,
) -> dict:
    """One IMPACT_COLUMNS row (``layer``/``head``/``seed`` may be None)."""
    return {
        "study": study,
        "layer": layer,
        "head": head,
        "step": step,
        "fraction_pruned": float(fraction_pruned),
        "metric": metric_name,
        "value": float(value),
        "spread": float(spread),
        "seed": seed,
        "n": int(n),
    }


def impact_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows -> frame with IMPACT_COLUMNS and stable dtypes (nullable ints for layer/head/seed)."""
    df = pd.DataFrame(rows, columns=IMPACT_COLUMNS)
    return df.astype(
        {
            "study": "str",
            "layer": "Int64",
            "head": "Int64",
            "step": "int64",
            "fraction_pruned": "float64",
            "metric": "str",
            "value": "float64",
            "spread": "float64",
            "seed": "Int64",
            "n": "int64",
        }
    )


# ----------------------------------------------------------------------------- mean ablation


class MeanZ:
    """Streaming mean of ``z`` over real tokens, per layer and head -> ``[layer, head, d_head]``.
    A :class:`~headscope.probes.capture.Reducer` (``update(cap)``, exact ``merge``, ``result``)."""

    def __init__(self, n_layers: int, n_heads: int, d_head: int):
        self.sum = torch.zeros(n_layers, n_heads, d_head, dtype=torch.float64)
        self.count = 0.0

    def update(self, cap: Capture) -> None:
        keep = cap.key_mask.to(torch.float64)  # [batch, pos]
        if self.sum.device != keep.device:  # the sums follow the data
            self.sum = self.sum.to(keep.device)
        for l in cap.layers:
            z = cap["z", l].to(torch.float64)  # [batch, head, pos, d_head]
            self.sum[l] += torch.einsum("bhpd,bp->hd", z, keep)
        self.count += float(keep.sum())

    def merge(self, other: MeanZ) -> MeanZ:
        self.sum += other.sum.to(self.sum.device)
        self.count += other.count
        return self

    def result(self) -> torch.Tensor:
        return (self.sum / max(self.count, 1.0)).float()


def mean_z(model, metric) -> torch.Tensor:
    """Corpus mean of ``z`` over the metric's tokens (padding excluded), with every head
    on: the mean-ablation value ``[layer, head, d_head]``."""
    check_head_hooks(model)
    red = MeanZ(model.spec.n_layers, model.spec.n_heads, model.spec.d_head)
    layers = tuple(range(model.spec.n_layers))
    if hasattr(metric, "place"):  # its tokens go where the model takes its inputs
        metric.place(model)
    for unit in metric.units:
        data = model.run(unit.batch, ("z",), layers)
        red.update(Capture(tokens=unit.batch, data=data, layers=layers, spec=model.spec, item_ids=unit.items))
    return red.result()


def ablation_values(model, metric, mode: str) -> torch.Tensor | None:
    """``None`` for zero ablation, :func:`mean_z` for mean ablation."""
    if mode == "zero":
        return None
    if mode == "mean":
        if not metric.has_corpus:
            raise ValueError(
                "mean ablation needs a metric with items (its corpus gives the mean of z); use mode='zero'"
            )
        return mean_z(model, metric)
    raise ValueError(f"mode must be 'zero' or 'mean'; got {mode!r}")


# ----------------------------------------------------------------------------- studies


def _group_heads(spec, per_forward: str):
    heads = [(l, h) for l in range(spec.n_layers) for h in range(spec.n_heads)]
    if per_forward == "layer":
        return [heads[l * spec.n_heads : (l + 1) * spec.n_heads] for l in range(spec.n_layers)]
    if per_forward == "all":
        return [heads]
    if per_forward == "one":
        return [[x] for x in heads]
    raise ValueError(f"per_forward must be 'layer', 'all' or 'one'; got {per_forward!r}")


def single_head_ablation(
    model,
    metric,
    *,
    mode: str = "zero",
    ablation: torch.Tensor | None = None,
    per_forward: str = "layer",
    n_boot: int = 200,
    seed: int = 0,
    max_rows: int = 64,
    unpruned: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> pd.DataFrame:
    """Ablate each head alone; rows per head: ``metric=name`` (ablated value) and
    ``metric="delta_"+name`` (ablated - unablated), ``spread`` = bootstrap SE over items.

    ``study = "ablation:zero"`` or ``"ablation:mean"``; ``ablation`` overrides the
    mean-ablation values (computed by :func:`mean_z` otherwise). ``per_forward``:
    ``"layer"`` or ``"all"`` (every head in one :func:`evaluate` call: replicas of a batch
    per forward, each running the layers from its own), or ``"one"`` (a call per head).
    ``unpruned``: the unablated model's ``(values, weights)`` from :func:`evaluate`, to skip
    re-scoring it.
    """
    spec = model.spec
    if ablation is None:
        ablation = ablation_values(model, metric, mode)
    base_v, w = _unpruned(model, metric, unpruned, max_rows)
    rows = []
    total = spec.n_layers * spec.n_heads
    groups = _group_heads(spec, per_forward)
    masks = [head_masks(n_layers=spec.n_layers, n_heads=spec.n_heads, heads=group) for group in groups]
    if per_forward == "one":
        scored = [evaluate(model, metric, m, ablation=ablation, max_rows=max_rows)[0] for m in masks]
    else:  # every head in one call: the unablated prefix is shared by all layers' heads
        scored, _ = evaluate_groups(model, metric, masks, ablation=ablation, max_rows=max_rows)
    for group, v in zip(groups, scored):
        agg = metric.aggregate(v, w)
        base = metric.aggregate(base_v, w)[0]
        se = bootstrap_se(metric, v, w, n_boot=n_boot, seed=seed)
        se_d = bootstrap_se(metric, v, w, base_v[0], n_boot=n_boot, seed=seed)
        for r, (l, h) in enumerate(group):
            common = dict(layer=l, head=h, fraction_pruned=1 / total, seed=seed, n=metric.n_items)
            rows.append(impact_rows(f"ablation:{mode}", metric.name, value=agg[r], spread=se[r], **common))
            rows.append(
                impact_rows(f"ablation:{mode}", f"delta_{metric.name}", value=agg[r] - base, spread=se_d[r], **common)
            )
    return impact_frame(rows)


def _unpruned(model, metric, unpruned, max_rows):
    """The unablated ``(values, weights)``: ``unpruned`` when given (and sharing), else scored."""
    if unpruned is not None and sharing():
        return unpruned
    return evaluate(model, metric, max_rows=max_rows)


def harm(metric, delta):
    """Positive when a change of the metric is for the worse (higher loss, lower accuracy)."""
    return -delta if metric.higher_is_better else delta


def all_but_one(
    model,
    metric,
    *,
    n_boot: int = 200,
    seed: int = 0,
    max_rows: int = 64,
    unpruned: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> pd.DataFrame:
    """Michel et al. (2019): in each layer keep only one head (zero-ablate the others,
    every other layer intact); the best single head of the layer is the one whose
    keep-only metric is best. Rows per layer: ``head`` = that head, ``metric=name`` and
    ``"delta_"+name`` (vs the unablated model), ``study="all_but_one"``. Every layer's masks
    go in one :func:`evaluate_groups` call; ``unpruned``: as in :func:`single_head_ablation`."""
    spec = model.spec
    base_v, w = _unpruned(model, metric, unpruned, max_rows)
    base = metric.aggregate(base_v, w)[0]
    rows = []
    masks = []
    for l in range(spec.n_layers):
        m = torch.ones(spec.n_heads, spec.n_layers, spec.n_heads)
        m[:, l] = torch.eye(spec.n_heads)
        masks.append(m)
    scored, _ = evaluate_groups(model, metric, masks, max_rows=max_rows)
    for l, v in enumerate(scored):
        agg = metric.aggregate(v, w)
        score = agg if metric.higher_is_better else -agg
        best = int(torch.argmax(score))
        se = bootstrap_se(metric, v[best : best + 1], w, n_boot=n_boot, seed=seed)[0]
        se_d = bootstrap_se(metric, v[best : best + 1], w, base_v[0], n_boot=n_boot, seed=seed)[0]
        common = dict(
            layer=l,
            head=best,
            fraction_pruned=(spec.n_heads - 1) / (spec.n_layers * spec.n_heads),
            seed=seed,
            n=metric.n_items,
        )
        rows.append(impact_rows("all_but_one", metric.name, value=agg[best], spread=se, **common))
        rows.append(impact_rows("all_but_one", f"delta_{metric.name}", value=agg[best] - base, spread=se_d, **common))
    return impact_frame(rows)


def batching_speedup(model, metric, *, layer: int = 0, repeats: int = 1, max_rows: int = 1 << 30) -> dict:
    """Wall time of zero-ablating each head of ``layer`` by separate forwards vs one
    replicated forward; returns ``{"heads", "separate_s", "batched_s", "ratio", "max_abs_diff"}``
    (``max_abs_diff``: largest difference between the two ways' per-item values)."""
    spec = model.spec
    masks = head_masks(n_layers=spec.n_layers, n_heads=spec.n_heads, heads=[(layer, h) for h in range(spec.n_heads)])
    evaluate(model, metric, masks[:1], max_rows=max_rows)  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        sep = torch.cat([evaluate(model, metric, masks[r : r + 1], max_rows=max_rows)[0] for r in range(len(masks))])
    t1 = time.perf_counter()
    for _ in range(repeats):
        bat, _ = evaluate(model, metric, masks, max_rows=max_rows)
    t2 = time.perf_counter()
    sep_s, bat_s = (t1 - t0) / repeats, (t2 - t1) / repeats
    return {
        "heads": spec.n_heads,
        "separate_s": sep_s,
        "batched_s": bat_s,
        "ratio": sep_s / max(bat_s, 1e-9),
        "max_abs_diff": float((sep - bat).abs().max()),
    }


ROLE_ABLATION_COLUMNS = ["role", "k", "metric", "value_role", "value_random_mean", "value_random_std", "n_draws"]


def role_heads(roles: pd.DataFrame, k: int) -> dict[str, list[tuple[int, int]]]:
    """Per role, its top-``k`` heads by ``score`` among rows with ``verdict`` True
    (a head listed under several relations of a role counts once, at its best score)."""
    need = {"layer", "head", "role", "score", "verdict"}
    if missing := sorted(need - set(roles.columns)):
        raise ValueError(f"roles frame lacks columns {missing}; expected ROLE_COLUMNS")
    out = {}
    true = roles[roles["verdict"].astype(bool)]
    for role, g in true.groupby("role", sort=True):
        best = g.sort_values(["score", "layer", "head"], ascending=[False, True, True], kind="stable")
        best = best.drop_duplicates(["layer", "head"])
        out[str(role)] = [(int(l), int(h)) for l, h in zip(best["layer"], best["head"])][:k]
    return out


def role_ablation(
    model,
    metric,
    roles: pd.DataFrame,
    *,
    k: int = 3,
    n_draws: int = 5,
    seed: int = 0,
    mode: str = "zero",
    max_rows: int = 64,
    unpruned: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> pd.DataFrame:
    """Metric change from ablating a role's top-``k`` heads vs as many random heads
    (``n_draws`` seeded draws among the heads outside the role's set; every role's masks
    scored in one :func:`evaluate_groups` call; ``unpruned``: as in :func:`single_head_ablation`).

    Frame (:data:`ROLE_ABLATION_COLUMNS`): ``role``, ``k`` (heads actually ablated: fewer
    when the role has fewer heads with a True verdict), ``metric`` (``"delta_"+name``),
    ``value_role``, ``value_random_mean``, ``value_random_std`` (std over draws), ``n_draws``.
    """
    if n_draws < 1:
        raise ValueError(f"n_draws must be >= 1; got {n_draws}")
    spec = model.spec
    ablation = ablation_values(model, metric, mode)
    base_v, w = _unpruned(model, metric, unpruned, max_rows)
    base = metric.aggregate(base_v, w)[0]
    rng = np.random.default_rng(seed)
    all_heads = [(l, h) for l in range(spec.n_layers) for h in range(spec.n_heads)]
    rows = []
    by_role = role_heads(roles, k)
    masks = []
    for heads in by_role.values():
        pool = [x for x in all_heads if x not in heads]
        sets = [heads] + [
            [pool[i] for i in rng.choice(len(pool), size=len(heads), replace=False)] for _ in range(n_draws)
        ]
        m = torch.ones(len(sets), spec.n_layers, spec.n_heads)
        for r, s in enumerate(sets):
            for l, h in s:
                m[r, l, h] = 0.0
        masks.append(m)
    scored, _ = evaluate_groups(model, metric, masks, ablation=ablation, max_rows=max_rows) if masks else ([], None)
    for (role, heads), v in zip(by_role.items(), scored):
        agg = metric.aggregate(v, w) - base
        rand = agg[1:].double()
        rows.append(
            {
                "role": role,
                "k": len(heads),
                "metric": f"delta_{metric.name}",
                "value_role": float(agg[0]),
                "value_random_mean": float(rand.mean()),
                "value_random_std": float(rand.std()) if n_draws > 1 else float("nan"),
                "n_draws": n_draws,
            }
        )
    df = pd.DataFrame(rows, columns=ROLE_ABLATION_COLUMNS)
    return df.astype(
        {
            "role": "str",
            "k": "int64",
            "metric": "str",
            "value_role": "float64",
            "value_random_mean": "float64",
            "value_random_std": "float64",
            "n_draws": "int64",
        }
    )
