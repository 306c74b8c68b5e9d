"""Head masks: which heads a pruning study keeps.

A mask is a float tensor ``[layer, head]`` (1 = kept, 0 = removed); ``R`` masks scored
together are ``[R, layer, head]``. A removable *unit* is a list of ``(layer, head)``
pairs: one query head, or with ``unit="kv_group"`` every query head reading one KV head.

>>> masks = head_masks(n_layers=2, n_heads=3, heads=[(0, 1), (1, 2)])
>>> masks[:, 0].tolist(), masks[:, 1].tolist()
([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]], [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
"""

from __future__ import annotations

import torch

# the head-hook check lives with the protocol; pruning's modules import it from here
from headscope.probes.models.backends.protocol import ModelSpec, check_head_hooks  # noqa: F401

#: ``(layer, head)`` pairs removed together
PruneUnit = list[tuple[int, int]]


def head_masks(
    *, n_layers: int, n_heads: int, heads: list[tuple[int, int]], base: torch.Tensor | None = None
) -> torch.Tensor:
    """One mask per ablated head: ``heads`` = ``[(layer, head), ...]`` -> ``[R, layer, head]``
    (1 = kept), each on top of ``base [layer, head]`` (default all ones)."""
    heads = list(heads)
    b = torch.ones(n_layers, n_heads) if base is None else base.float()
    m = b[None].repeat(len(heads), 1, 1)
    for r, (l, h) in enumerate(heads):
        m[r, l, h] = 0.0
    return m


def prune_units(spec: ModelSpec, unit: str = "head") -> list[PruneUnit]:
    """The removable units: ``unit="head"`` -> one ``[(layer, head)]`` per query head;
    ``unit="kv_group"`` -> per layer and KV head, the query heads reading it (removing a
    KV head removes all of them). Raises ``ValueError`` for another ``unit``."""
    if unit == "head":
        return [[(l, h)] for l in range(spec.n_layers) for h in range(spec.n_heads)]
    if unit == "kv_group":
        return [[(l, h) for h in hs] for l in range(spec.n_layers) for hs in spec.kv_groups().values()]
    raise ValueError(f"unit must be 'head' or 'kv_group'; got {unit!r}")


def mask_of(spec: ModelSpec, units: list[PruneUnit], removed) -> torch.Tensor:
    """``[layer, head]`` mask with the heads of the ``removed`` unit indices set to 0."""
    m = torch.ones(spec.n_layers, spec.n_heads)
    for u in removed:
        for l, h in units[u]:
            m[l, h] = 0.0
    return m


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
