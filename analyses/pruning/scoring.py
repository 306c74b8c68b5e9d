"""The scoring engine: a metric under many head masks, in shared forwards.

:func:`evaluate` scores an :class:`~headscope.analyses.pruning.metrics.ItemMetric` under
``R`` head masks ``[R, layer, head]`` (through the metric's ``score``). A metric scored
from the model's output runs :func:`replicated_scores`: it stacks ``R`` replicas of each
batch along the batch dimension and installs, on every layer's per-head output, a hook
that applies replica ``r``'s mask (:func:`~headscope.analyses.pruning.gates.replica_masks`)::

    z'[r] = mask[r] · z[r] + (1 - mask[r]) · ablation_value      # per head

(zero ablation: ``ablation_value = 0``; mean ablation: the corpus mean of ``z``,
:func:`~headscope.analyses.pruning.ablation.mean_z`). The model's own gates are never
touched, so a crash leaves the model as it was. Ablating all ``H`` heads of a layer
therefore costs one forward of an ``H``-times larger batch instead of ``H`` forwards
(:func:`~headscope.analyses.pruning.ablation.batching_speedup` measures the ratio).

On a resumable backend a replica runs only the layers from the first one its mask
touches, joining the unablated stream there (computed once per batch for all masks of the
call, :func:`staggered_forward`), and a metric that reads a decoder's output at some
positions only (the next-token loss) gets only the logits it reads
(:func:`~headscope.probes.models.backends.protocol.unembed_at`);
the studies put all their masks in one call (:func:`evaluate_groups`), and inside
:func:`~headscope.analyses.pruning.memo.remembered_scores` each distinct mask is scored
once. Every figure is the same as a replica run alone, bit for bit.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from headscope.analyses.pruning.gates import replica_masks
from headscope.analyses.pruning.masks import check_head_hooks, first_changed
from headscope.analyses.pruning.memo import Scored, scored_once
from headscope.probes.models.backends.protocol import rows_unembedded, unembed_at


def evaluate(
    model, metric, masks: torch.Tensor | None = None, *, ablation: torch.Tensor | None = None, max_rows: int = 64
) -> Scored:
    """Score ``metric`` under each head mask.

    ``masks [R, layer, head]`` (1 = kept; None: one all-ones mask); ``ablation [layer,
    head, d_head]`` replaces the masked heads' ``z`` (default zeros). Returns per-item
    ``values [R, n_items]`` and ``weights [n_items]``; ``metric.aggregate(values, weights)``
    gives the ``R`` reported values. Every metric goes through its ``score`` (see
    :meth:`~headscope.analyses.pruning.metrics.ItemMetric.score`). Raises
    :class:`~headscope.probes.errors.ModelIncompatibleError` for a model without head hooks.
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
    ``values [R_g, n_items]``, and the ``weights [n_items]``."""
    v, w = evaluate(model, metric, torch.cat(list(groups)), ablation=ablation, max_rows=max_rows)
    return list(torch.split(v, [len(g) for g in groups])), w


def replicated_scores(
    model, metric, masks: torch.Tensor, *, ablation: torch.Tensor | None = None, max_rows: int = 64
) -> Scored:
    """:meth:`~headscope.analyses.pruning.metrics.ItemMetric.score` of a metric scored from
    the model's output: per unit, replicas of the batch, one per mask ``[R, layer, head]``,
    stacked so one forward holds at most ``max_rows`` rows -> ``(values [R, n_items],
    weights [n_items])``.

    On a resumable backend (``model.resumable``) each replica runs only the layers from the
    first one its mask touches (:func:`~headscope.analyses.pruning.masks.first_changed`): the
    masks are taken in that order, the unablated residual stream of the unit is advanced once
    through the layers before (:class:`UnablatedStream`), and a replica joins its batch at its
    own first layer (:func:`staggered_forward`). A metric that reads the output at some
    positions only (``metric.read_positions``, e.g. the next-token loss: not at padding nor at
    the last position) gets the decoder's logits at those positions only
    (:func:`~headscope.probes.models.backends.protocol.unembed_at`).
    Every row's arithmetic is the same as in a plain forward of the replica alone. Inside
    :func:`~headscope.analyses.pruning.memo.remembered_scores` each distinct mask is scored once."""
    if hasattr(metric, "place"):  # its tokens go where the model takes its inputs
        metric.place(model)
    return scored_once(
        model,
        metric,
        masks,
        ablation,
        lambda todo: _staggered_scores(model, metric, todo, ablation=ablation, max_rows=max_rows),
    )


def _staggered_scores(model, metric, masks, *, ablation=None, max_rows=64) -> Scored:
    """The scoring of :func:`replicated_scores`, every mask computed."""
    r_total = masks.shape[0]
    values = torch.zeros(r_total, metric.n_items)  # per-item values: on the host
    weights = torch.zeros(metric.n_items)
    first = first_changed(masks) if model.resumable else torch.zeros(r_total, dtype=torch.long)
    order = sorted(range(r_total), key=lambda r: (int(first[r]), r))
    with torch.inference_mode():
        for unit in metric.units:
            chunk = max(1, max_rows // unit.rows)
            stream = UnablatedStream(model, unit.batch.input_ids, unit.batch.attention_mask)
            keep = positions_read(model, metric, unit)
            for start in range(0, r_total, chunk):
                idx = order[start : start + chunk]
                out = staggered_forward(model, stream, masks[idx], first[idx], ablation=ablation, keep=keep)
                v, w = metric.item_values(out, unit)
                values[torch.tensor(idx)[:, None], torch.tensor(unit.items)[None, :]] = v.float().cpu()
                weights[unit.items] = w.float().cpu()
    return values, weights


class UnablatedStream:
    """The residual stream of one batch without ablation, advanced layer by layer on demand:
    :meth:`at` ``(layer)`` gives the stream entering ``layer`` (``[batch, pos, d_model]``)
    for increasing layers, each layer run once (resumable backends only)."""

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.model, self.ids, self.am = model, input_ids, attention_mask
        self.layer, self.x = 0, None

    def at(self, layer: int) -> torch.Tensor:
        """The stream entering ``layer`` ``[batch, pos, d_model]``; ``ValueError`` for a layer
        before the one reached, or layer 0."""
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
    (:func:`~headscope.analyses.pruning.gates.replica_masks`), replica ``r`` joining at layer
    ``first[r]`` (``first [R]`` ascending) with the unablated stream there, so it runs the
    layers from ``first[r]`` only: ``[R × batch, pos, ...]``, or with ``keep [batch, pos]``
    the logits at the kept positions only, ``[R × n_kept, vocab]``
    (:func:`~headscope.probes.models.backends.protocol.unembed_at`)."""
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


def positions_read(model, metric, unit) -> torch.Tensor | None:
    """``[rows, pos]`` bool: the positions whose output ``metric`` reads in ``unit``
    (``metric.read_positions``), where the model is a decoder that can unembed only those
    (:func:`~headscope.probes.models.backends.protocol.rows_unembedded`); None where every logit is computed."""
    read = getattr(metric, "read_positions", None)
    if read is None or not (model.spec.causal and rows_unembedded(model)):
        return None
    return read(unit)
