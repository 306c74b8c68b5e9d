"""The memo of scored masks: inside :func:`remembered_scores`, each distinct mask is scored once.

A row's per-item values do not depend on which other masks share its forward, so a study
that asks again for a mask it already scored (a role of one head is a single-head ablation
mask) takes the kept values: same figures, fewer forwards. Gates set from outside the
engine (:func:`~headscope.analyses.pruning.gates.head_gates`,
:func:`~headscope.analyses.pruning.gates.gates_as`) change what a mask scores, so they
suspend the memo (:func:`memo_suspended`).
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Callable
from contextlib import contextmanager

import torch

#: per-item ``values [R, n_items]`` and ``weights [n_items]`` of ``R`` masks
Scored = tuple[torch.Tensor, torch.Tensor]

_MEMO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("headscope_pruning_memo", default=None)


@contextmanager
def remembered_scores():
    """Inside the ``with`` block, :func:`~headscope.analyses.pruning.scoring.replicated_scores`
    scores each distinct mask (for the same model and metric objects and ablation values)
    once and hands the kept per-item values to every later call that asks for it: a study's
    single-head ablation already holds the masks of a role with one head and of its one-head
    random draws. A row's values do not depend on which other masks share its forward, so
    the figures are the same. Gates set from outside suspend it (:func:`memo_suspended`)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


@contextmanager
def memo_suspended():
    """No memo inside the ``with`` block: a model whose heads are gated from outside (a
    :class:`~headscope.analyses.pruning.metrics.CallableMetric` evaluates its function under
    :func:`~headscope.analyses.pruning.gates.head_gates`) gives other scores for the same
    mask than the plain model."""
    token = _MEMO.set(None)
    try:
        yield
    finally:
        _MEMO.reset(token)


def scored_once(
    model,
    metric,
    masks: torch.Tensor,
    ablation: torch.Tensor | None,
    score: Callable[[torch.Tensor], Scored],
) -> Scored:
    """``score(masks [R, layer, head]) -> (values [R, n_items], weights [n_items])``, through
    the memo when one is active: only the masks not seen yet (for this model, metric and
    ``ablation [layer, head, d_head]``) are scored, each distinct one once, in order of
    first appearance."""
    memo = _MEMO.get()
    if memo is None:
        return score(masks)
    abl_key = None if ablation is None else hashlib.sha1(ablation.detach().cpu().numpy().tobytes()).hexdigest()
    keys = [(model, metric, abl_key, m.numpy().tobytes()) for m in masks]
    todo = list(dict.fromkeys(k for k in keys if k not in memo))
    if todo:
        first = {k: r for r, k in reversed(list(enumerate(keys)))}
        idx = [first[k] for k in todo]
        v, w = score(masks[idx])
        memo.update({k: (v[i], w) for i, k in enumerate(todo)})
    values = torch.stack([memo[k][0] for k in keys])
    return values, memo[keys[0]][1]
