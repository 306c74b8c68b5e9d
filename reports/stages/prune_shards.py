"""The pruning study on Ray workers (``--ray``): its logic in the driver, its forwards on the workers,
each over its part of the metric's items.

Every figure of a pruning study (:func:`~headscope.analyses.pruning.study.pruning_study`) is made of
three kinds of forwards, and each is a sum or a list over the metric's batches (its ``units``):

- **scores**: per-item values ``[R, n_items]`` of the metric under ``R`` head masks (the baseline,
  single-head ablation, all-but-one, role ablation and its random draws, every curve step);
- **gate gradients**: per-batch ``∂L/∂ξ`` ``[batch, layer, head]`` (the importance table and the
  importance orders' ranking at each curve step);
- **the mean of z** over the metric's tokens (mean ablation's value), a float64 sum per batch.

A worker holds the metric built once (the same batches one process builds) and computes these on
every ``n``-th batch from its ``k``-th (:class:`~headscope.reports.stages.sharded.Interleaved`), the
masks of a call exactly as one process scores them for those batches. The driver runs the study
itself with a :class:`ShardedMetric`: each of its forwards is one round over the workers, the
per-item values put back by item, the per-batch gradients and sums back in batch order. What ranks
heads (importance at a curve's mask, ablation harms, the best head of a layer) is computed in the
driver from the whole, and the next round's masks follow from it: an iterative curve goes back to
the workers once per step (all curves' steps of a round in one call, as one process does). Means,
bootstrap SEs, the curve summary and the prunable table run in the driver on the merged values, as
one process runs them: every table ``DataFrame.equals`` the single-process run.

Work the driver repeats: it builds the metric too (tokenising its items; an embedding metric's
reference embeddings take one forward of the items), and each worker builds it once.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

__all__ = ["PruneRequest", "ShardedMetric", "serve"]

#: a worker's metrics, built once per model and settings (the full metric; parts are views of it)
_BUILT: dict = {}


@dataclass(frozen=True)
class PruneRequest:
    """One round's work for part ``k`` of ``n``: ``kind`` ``"items"`` (which batches and items the
    part holds), ``"score"`` (``masks [R, layer, head]``, ``ablation [layer, head, d_head]`` or None),
    ``"gradients"`` (at ``masks [layer, head]``; ``per_example``; ``scores``: the metric there too)
    or ``"mean_z"``."""

    kind: str
    k: int
    n: int
    masks: torch.Tensor | None = None
    ablation: torch.Tensor | None = None
    max_rows: int = 64
    per_example: bool = False
    scores: bool = False

    def __repr__(self) -> str:
        what = self.kind if self.masks is None or self.masks.dim() < 3 else f"{self.kind} of {len(self.masks)} masks"
        return f"{what}, batches {self.k}, {self.k + self.n}, ..."


def _full_metric(model, cfg):
    """The study's metric on ``model`` (built once per worker and settings)."""
    from headscope.analyses.pruning.study import study_metric

    key = (id(model), cfg.metric, cfg.items, cfg.batch_size, cfg.prompt)
    if key not in _BUILT:
        _BUILT.clear()  # one model, one run's settings at a time
        _BUILT[key] = study_metric(model, cfg, None)
    return _BUILT[key]


def serve(model, cfg, req: PruneRequest) -> dict:
    """On a worker: ``req`` on every ``req.n``-th batch of the metric from the ``req.k``-th. Returns
    ``units`` (the batches' indices), ``items`` (their items, ascending) and per kind: ``values``
    ``[R, items]`` / ``weights [items]`` (score, or gradients with ``scores``), ``grads``
    ``[unit, layer, head]`` / ``counts [unit]`` / ``order`` (gradients: the batches', or with
    ``per_example`` the items', global positions), ``reducers`` (mean_z: one
    :class:`~headscope.analyses.pruning.ablation.MeanZ` per batch)."""
    from headscope.analyses.pruning.ablation import unit_mean_z
    from headscope.analyses.pruning.importance import gate_gradients

    full = _full_metric(model, cfg)
    part = copy.copy(full)
    part.units = full.units[req.k :: req.n]
    units = list(range(len(full.units)))[req.k :: req.n]
    items = sorted(i for u in part.units for i in u.items)
    out: dict = {"units": units, "items": items}
    if req.kind == "score":
        v, w = part.score(model, req.masks, ablation=req.ablation, max_rows=req.max_rows)
        out.update(values=v[:, items], weights=w[items])
    elif req.kind == "mean_z":
        out["reducers"] = list(unit_mean_z(model, part))
    elif req.kind == "gradients":
        mine = set(items)
        single = [u for u in full.single_item_units() if u.items[0] in mine] if req.per_example else None
        if part.units if single is None else single:
            g, counts, *scored = gate_gradients(model, part, mask=req.masks, units=single, scores=req.scores)
        else:  # a part with no batch (fewer batches than parts)
            s = model.spec
            g, counts = torch.zeros(0, s.n_layers, s.n_heads), torch.zeros(0)
            scored = [(torch.zeros(1, full.n_items), torch.zeros(full.n_items))] if req.scores else []
        out.update(grads=g, counts=counts, order=[u.items[0] for u in single] if single is not None else units)
        if scored:
            v, w = scored[0]
            out.update(values=v[:, items], weights=w[items])
    elif req.kind != "items":
        raise ValueError(f"a pruning request's kind must be items, score, gradients or mean_z; got {req.kind!r}")
    return out


class ShardedMetric:
    """The study's metric in the driver, its forwards run on the workers: :meth:`score`,
    :meth:`gate_gradients` and :meth:`mean_z` each send one round of :class:`PruneRequest` (one per
    part) through ``call(requests) -> replies`` and merge the replies exactly; everything else
    (``name``, ``n_items``, ``aggregate``, ...) is ``metric``'s own."""

    def __init__(self, metric, call, n: int, spec):
        self._metric, self._call, self._n, self._spec = metric, call, n, spec

    def __getattr__(self, name):
        return getattr(self._metric, name)

    def place(self, model):
        return self  # its tokens live on the workers

    def _round(self, kind: str, **kw) -> list[dict]:
        return self._call([PruneRequest(kind, k, self._n, **kw) for k in range(self._n)])

    def _values(self, replies, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-item ``values [r, n_items]`` and ``weights [n_items]``, each part's items put back."""
        values, weights = torch.zeros(r, self._metric.n_items), torch.zeros(self._metric.n_items)
        for rep in replies:
            values[:, rep["items"]], weights[rep["items"]] = rep["values"], rep["weights"]
        return values, weights

    def score(self, model, masks, *, ablation=None, max_rows: int = 64):
        """As :meth:`~headscope.analyses.pruning.metric_base.ItemMetric.score` (through the study's
        memo: each distinct mask is sent once)."""
        from headscope.analyses.pruning.memo import scored_once

        def remote(todo):
            return self._values(self._round("score", masks=todo, ablation=ablation, max_rows=max_rows), len(todo))

        return scored_once(model, self, masks, ablation, remote)

    def gate_gradients(self, *, mask=None, per_example: bool = False, scores: bool = False):
        """As :func:`~headscope.analyses.pruning.importance.gate_gradients`: ``(grads [batch,
        layer, head], items [batch])`` in the batches' order (or the items' with ``per_example``),
        and with ``scores`` the metric at ``mask``."""
        s = self._spec
        mask = torch.ones(s.n_layers, s.n_heads) if mask is None else mask
        replies = self._round("gradients", masks=mask, per_example=per_example, scores=scores)
        rows = {}
        for rep in replies:
            for j, pos in enumerate(rep["order"]):
                rows[pos] = (rep["grads"][j], rep["counts"][j])
        order = sorted(rows)
        g = torch.stack([rows[p][0] for p in order])
        counts = torch.stack([rows[p][1] for p in order])
        return (g, counts, self._values(replies, 1)) if scores else (g, counts)

    def mean_z(self) -> torch.Tensor:
        """As :func:`~headscope.analyses.pruning.ablation.mean_z`: the batches' sums folded in batch order."""
        from headscope.analyses.pruning.ablation import MeanZ

        s = self._spec
        by_unit = {u: red for rep in self._round("mean_z") for u, red in zip(rep["units"], rep["reducers"])}
        total = MeanZ(s.n_layers, s.n_heads, s.d_head)
        for u in sorted(by_unit):
            total.sum = total.sum.to(by_unit[u].sum.device)
            total.merge(by_unit[u])
        return total.result()
