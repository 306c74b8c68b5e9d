"""Closed-form counts of the bench: model FLOPs, linear parameters, padding.

``gflop`` of a path counts model FLOPs as ``2 × linear parameters × real tokens + 4 ×
layers × d_model × n²`` per sequence of ``n`` real tokens (:func:`model_gflop`); the
padding ratio says how much of a batch is padding (:func:`padding_ratio`).
"""

from __future__ import annotations

import torch

__all__ = ["linear_params", "model_gflop", "padding_ratio"]


def linear_params(module: torch.nn.Module) -> int:
    """Parameters of the model's ``nn.Linear`` layers (the matmuls), shared ones once.

    >>> linear_params(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)))
    20
    """
    seen, n = set(), 0
    for m in module.modules():
        if isinstance(m, torch.nn.Linear) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            n += m.weight.numel()
    return n


def model_gflop(*, linear: int, n_layers: int, d_model: int, lengths: list[int]) -> float:
    """Forward FLOPs of one pass, in GFLOP: ``2 × linear × Σn + 4 × layers × d_model × Σn²``
    over the sequences' real lengths ``n`` (for a pruned model pass ``n_layers × d_model``
    as the total attention width ``Σ_layers heads × d_head`` with ``n_layers=1``).

    >>> model_gflop(linear=1_000_000, n_layers=2, d_model=8, lengths=[10, 20])
    0.060032
    """
    tokens = sum(lengths)
    return (2 * linear * tokens + 4 * n_layers * d_model * sum(n * n for n in lengths)) / 1e9


def padding_ratio(lengths: list[int], groups: list[list[int]]) -> float:
    """Padded positions / real positions when ``groups`` of item indices are padded to
    their longest item.

    >>> padding_ratio([2, 4, 4], [[0, 1], [2]])
    0.2
    """
    real = sum(lengths)
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    return (padded - real) / max(real, 1)
