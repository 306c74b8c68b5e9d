"""Gates on a model's heads, for the ``with`` block of a context manager; the model is never modified
(except by :func:`gates_as`, which restores what it changes).

* :func:`replica_masks`: ``R`` stacked replicas of a batch, replica ``r`` under mask ``r``
  (the scoring engine, :mod:`~headscope.analyses.pruning.scoring`);
* :func:`head_gates`: one mask on every forward, through the head hooks of any backend;
  its gates can be gradient leaves (gradient importance);
* :func:`gates_as`: the in-house transformer's built-in gates set to a mask (``headscope
  bench`` compares them with :func:`head_gates`).

Each computes, per head, ``z' = gate·z + (1 - gate)·ablation`` (zero ablation:
``ablation = 0``; mean ablation: the corpus mean of ``z``).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from headscope.analyses.pruning.memo import memo_suspended


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
    """The in-house transformer's built-in gates set to ``mask [layer, head]`` (and its
    ablation values to ``ablation [layer, head, d_head]``) for the ``with`` block, through
    :meth:`~headscope.probes.models.backends.protocol.Backend.gates_set` (``module``: an
    :class:`~headscope.probes.models.backends.inhouse.InHouseModel`, or its ``Transformer``); everything comes
    back on exit. Yields the gates ``[head]`` per layer. The studies use :func:`head_gates`
    (any backend); ``headscope bench`` compares the two."""
    with module.gates_set(mask, requires_grad=requires_grad, ablation=ablation) as gates, memo_suspended():
        yield gates
