"""Gaussian stand-ins for weight matrices, and empirical p-values against them.

A baseline draw replaces a matrix by i.i.d. Gaussian entries of the same shape, rescaled to the
same Frobenius norm (seeded: no hidden randomness).

>>> g = torch.Generator().manual_seed(0)
>>> w = torch.ones(3, 4, 2)
>>> d = gaussian_like(w, 5, g)
>>> tuple(d.shape), torch.allclose(d.flatten(2).norm(dim=-1), w.flatten(1).norm(dim=-1).expand(5, 3))
((5, 3, 4, 2), True)
>>> empirical_p(torch.tensor([2.0]), torch.tensor([[0.0], [1.0], [3.0]])).tolist()
[0.5]
"""

from __future__ import annotations

import torch

from headscope.analyses.stats.resampling import benjamini_hochberg


def gaussian_like(w: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """``w [unit, *shape]`` -> ``[n, unit, *shape]``: Gaussian draws, each with its unit's
    Frobenius norm (over ``shape``)."""
    draws = torch.randn((n, *w.shape), generator=gen)
    target = w.flatten(1).norm(dim=-1)  # [unit]
    have = draws.flatten(2).norm(dim=-1).clamp_min(1e-30)  # [n, unit]
    return draws * (target / have).view(n, -1, *([1] * (w.dim() - 1)))


def empirical_p(value: torch.Tensor, null: torch.Tensor) -> torch.Tensor:
    """One-sided upper p ``(1 + #{null >= value}) / (n + 1)`` for ``value [unit]`` against
    ``null [n, unit]`` (or ``[n]``, shared by every unit). NaN values give NaN."""
    if null.dim() == 1:
        null = null[:, None]
    p = (1.0 + (null >= value[None]).sum(0).double()) / (null.shape[0] + 1.0)
    return torch.where(torch.isnan(value), torch.full_like(p, float("nan")), p)


def bh_adjust(p: torch.Tensor) -> torch.Tensor:
    """Benjamini–Hochberg over the non-NaN entries of ``p``; NaN stays NaN."""
    p = torch.as_tensor(p, dtype=torch.float64)
    out = torch.full_like(p, float("nan"))
    ok = ~torch.isnan(p)
    if ok.any():
        out[ok] = benjamini_hochberg(p[ok])
    return out
