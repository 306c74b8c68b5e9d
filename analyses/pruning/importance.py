"""Gradient head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

Each head's output ``z`` is multiplied by a gate ``ξ_h`` (1 = on); the importance of a
head is how strongly the loss reacts to its gate::

    I_h = mean over batches b of |∂L_b / ∂ξ_h|          (default, per_example=False)
    I_h = mean over items x   of |∂L_x / ∂ξ_h|          (per_example=True; Michel et al.'s E_x|∂L/∂ξ|)

Our choice: the absolute value of each *batch's* gradient, averaged over batches
(weighted by the batch's items). It costs one forward+backward per batch; Michel et al.
take the absolute value per example (``per_example=True``: one forward+backward per
item); on a batch the signed per-example gradients can
cancel, so the batch estimate is a lower bound of theirs and the two rank heads alike
when the signs of a head's per-example gradients agree.

``normalize=True`` divides each layer's importances by their L2 norm (Michel et al.'s
per-layer normalisation). ``unit="kv_group"`` scores a whole GQA group (a KV head and
the query heads reading it) by ``|Σ_{h in group} ∂L/∂ξ_h|``: the first-order change of
the loss when the group's gates go to 0 together.

The loss is the metric's :meth:`~headscope.analyses.pruning.metrics.ItemMetric.loss`
(next-token cross-entropy; for the encoder, a retrieval or contrastive cross-entropy —
``1 - cosine`` to the unpruned embedding would have zero gradient at the unpruned point).
With ``per_example=True`` it is that loss on a one-item unit, which must still depend on
the gates: ``cosine_to_unpruned`` retrieves the sentence among all the metric's
sentences, not only its unit's (on one sentence, the latter is constant and every
importance would be exactly 0).
Gradients are taken at the current head ``mask`` (gates set to it for the call and
restored after), so re-estimating during iterative pruning sees the pruned model.

An importance order sorts heads by importance and breaks ties by head index, so
:func:`head_importance` warns (:class:`ImportanceTieWarning`) when every importance is
0 or when heads share a value: such an order is partly head-index order.

>>> import torch
>>> df = importance_frame(torch.tensor([[0.5, 0.1]]), "lm_loss")
>>> df[["layer", "head", "metric", "value"]].values.tolist()
[[0, 0, 'grad_importance_lm_loss', 0.5], [0, 1, 'grad_importance_lm_loss', 0.10000000149011612]]

See ``tests/analyses/pruning/test_pruning.py`` for the finite-difference check of :func:`gate_gradients`.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import pandas as pd
import torch

from headscope.analyses.pruning.gates import head_gates
from headscope.analyses.pruning.impact import impact_frame, impact_rows
from headscope.analyses.pruning.masks import check_head_hooks
from headscope.analyses.pruning.metric_base import unit_to
from headscope.analyses.pruning.scoring import positions_read
from headscope.probes.models.backends.protocol import unembed_at


class ImportanceTieWarning(UserWarning):
    """Importances that cannot order heads: all 0, or equal for several heads."""


def _check_differentiable(metric) -> None:
    if not metric.differentiable:
        raise ValueError(
            f"gradient importance needs a differentiable metric with items; {metric.name!r} has no "
            "differentiable loss. Use the ablation order instead."
        )


def gate_gradients(model, metric, *, mask: torch.Tensor | None = None, units=None, scores: bool = False):
    """Signed ``∂L_b/∂ξ`` for each batch ``b`` -> ``(grads [batch, layer, head], items [batch])``.

    ``units``: the metric's units (default) or any list of them (e.g. one item each).
    ``scores`` (the metric's own units only): also return the metric at ``mask`` from the
    same forwards, ``(values [1, n_items], weights [n_items])`` as
    :func:`~headscope.analyses.pruning.scoring.evaluate` gives them (the same numbers).
    """
    if scores and units is not None:
        raise ValueError("scores=True reads the metric's own units; pass units=None")
    check_head_hooks(model)
    _check_differentiable(metric)
    spec = model.spec
    mask = torch.ones(spec.n_layers, spec.n_heads) if mask is None else mask
    if hasattr(metric, "place"):  # its tokens go where the model takes its inputs
        metric.place(model)
    device = getattr(metric, "device", None)
    units = metric.units if units is None else [u if device is None else unit_to(u, device) for u in units]
    grads, items = [], []
    values, weights = torch.zeros(1, metric.n_items), torch.zeros(metric.n_items)
    with head_gates(model, mask, requires_grad=True) as gates, torch.enable_grad():
        for u in units:
            keep = positions_read(model, metric, u)
            with unembed_at(model, keep) if keep is not None else nullcontext():  # only the logits the loss reads
                out = model.forward(u.batch.input_ids, u.batch.attention_mask)
            if scores:
                with torch.no_grad():
                    v, w = metric.item_values(out.detach(), u)
                values[:, u.items], weights[u.items] = v.float().cpu(), w.float().cpu()
            loss = metric.loss(out, u)
            g = torch.autograd.grad(loss, gates, allow_unused=True)
            grads.append(torch.stack([torch.zeros(spec.n_heads) if x is None else x.detach().float().cpu() for x in g]))
            items.append(len(u.items))
    out = torch.stack(grads), torch.tensor(items, dtype=torch.float32)
    return (*out, (values, weights)) if scores else out


def head_importance(
    model,
    metric,
    *,
    mask: torch.Tensor | None = None,
    unit: str = "head",
    per_example: bool = False,
    normalize: bool = False,
    scores: bool = False,
):
    """Importance ``[layer, head]`` (``unit="head"``) or ``[layer, kv_head]`` (``"kv_group"``);
    with ``scores`` (batch gradients only), ``(importance, (values, weights))``: the metric
    at ``mask`` too, from the same forwards (:func:`gate_gradients`).

    Raises ``ValueError`` for an unknown unit or a metric without gradients; warns
    (:class:`ImportanceTieWarning`) when the importances are all 0 or tie (see
    :func:`importance_ties`).
    """
    if unit not in ("head", "kv_group"):
        raise ValueError(f"unit must be 'head' or 'kv_group'; got {unit!r}")
    _check_differentiable(metric)
    spec = model.spec
    if scores and per_example:
        raise ValueError("scores=True needs batch gradients (per_example=False)")
    if hasattr(metric, "gate_gradients"):  # its forwards run elsewhere (a sharded run's metric)
        g, items, *scored = metric.gate_gradients(mask=mask, per_example=per_example, scores=scores)
    else:
        units = metric.single_item_units() if per_example else None
        g, items, *scored = gate_gradients(model, metric, mask=mask, units=units, scores=scores)  # [batch, layer, head]
    if unit == "kv_group":
        g = g.view(g.shape[0], spec.n_layers, spec.n_kv_heads, spec.group_size).sum(-1)
    imp = (g.abs() * items[:, None, None]).sum(0) / items.sum()
    if normalize:
        imp = imp / imp.norm(dim=1, keepdim=True).clamp(min=1e-20)
    problem = importance_ties(imp)
    if problem:
        kind = "per-example" if per_example else "batch"
        warnings.warn(
            f"{kind} gradient importance of {metric.name!r} ({unit}): {problem}; an importance order breaks "
            "these ties by index, so it is partly head-index order",
            ImportanceTieWarning,
            stacklevel=2,
        )
    return (imp, scored[0]) if scores else imp


def importance_ties(imp: torch.Tensor) -> str | None:
    """What keeps importances ``[layer, unit]`` from ordering the units, or None.

    >>> importance_ties(torch.zeros(2, 3))
    'all 6 importances are 0'
    >>> importance_ties(torch.tensor([[0.5, 0.0, 0.0], [0.2, 0.5, 0.1]]))
    '4 of 6 importances tie: L0H0 = L1H1 = 0.5; L0H1 = L0H2 = 0'
    >>> importance_ties(torch.tensor([[0.3, 0.1]])) is None
    True
    """
    flat = imp.detach().flatten()
    if not bool((flat != 0).any()):
        return f"all {flat.numel()} importances are 0"
    values, counts = torch.unique(flat, return_counts=True)
    tied = counts > 1
    if not bool(tied.any()):
        return None
    n_units = imp.shape[1]
    groups = []
    for v in torch.flip(values[tied], [0]).tolist():  # largest first
        idx = (flat == v).nonzero().flatten().tolist()
        groups.append(" = ".join(f"L{i // n_units}H{i % n_units}" for i in idx) + f" = {v:.4g}")
    more = f"; and {len(groups) - 3} more groups" if len(groups) > 3 else ""
    return f"{int(counts[tied].sum())} of {flat.numel()} importances tie: " + "; ".join(groups[:3]) + more


def importance_frame(
    imp: torch.Tensor,
    metric_name: str,
    *,
    unit: str = "head",
    study: str = "importance",
    step: int = 0,
    fraction_pruned: float = 0.0,
    seed: int | None = None,
    n: int = 0,
) -> pd.DataFrame:
    """``[layer, head-or-kv_head]`` importances -> IMPACT_COLUMNS rows,
    ``metric = "grad_importance_" + metric_name`` (``head`` is the KV head for ``unit="kv_group"``)."""
    name = f"grad_importance_{metric_name}" + ("_kv_group" if unit == "kv_group" else "")
    rows = [
        impact_rows(
            study,
            name,
            layer=l,
            head=h,
            step=step,
            fraction_pruned=fraction_pruned,
            value=float(imp[l, h]),
            seed=seed,
            n=n,
        )
        for l in range(imp.shape[0])
        for h in range(imp.shape[1])
    ]
    return impact_frame(rows)
