"""Uncertainty for per-head scores: bootstrap intervals and paired permutation tests.

All functions take per-item values ``[n_items, n_heads]`` (a hit 0/1 or an attention
mass per item and head) and are vectorised over heads; randomness comes only from the
``seed`` passed in.

>>> import torch
>>> x = torch.tensor([[1.0], [1.0], [1.0], [0.0]])
>>> lo, hi = bootstrap_ci(x, n_boot=2000, seed=0)
>>> float(lo[0]) <= 0.75 <= float(hi[0])
True
>>> p = paired_permutation_p(x, torch.zeros_like(x), n_perm=2000, seed=0)
>>> round(float(p[0]), 2)  # 3 non-zero differences: all signs positive has probability 1/8
0.13
>>> p = paired_permutation_p(torch.tensor([0.1, 0.1, 0.1, 0.1, 0.3]), 0.05, n_perm=2000, seed=0)
>>> round(float(p[0]), 3)  # 1/32 exactly; the no-flip draws count though 0.1 - 0.05 is inexact
0.036
"""

from __future__ import annotations

import torch


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    x = torch.as_tensor(x, dtype=torch.float32)
    if x.dim() == 1:
        x = x[:, None]
    if x.dim() != 2:
        raise ValueError(f"values must be [n_items, n_heads]; got shape {tuple(x.shape)}")
    return x


def bootstrap_ci(values: torch.Tensor, *, n_boot: int = 1000, level: float = 0.95, seed: int = 0):
    """Percentile bootstrap CI of the mean over items, per column.

    Resamples items with replacement via multinomial count weights
    (``[resamples, n_items] @ [n_items, n_heads]``), drawn in chunks of at most
    ``2^21`` indices, so memory stays bounded whatever the number of items (the draws
    are the same as one ``[n_boot, n_items]`` call). Returns ``(low [n_heads],
    high [n_heads])``; NaN where there are no items.
    """
    x = _as_2d(values)
    n, h = x.shape
    if n == 0:
        nan = torch.full((h,), float("nan"))
        return nan, nan.clone()
    gen = torch.Generator().manual_seed(seed)
    means = torch.empty(n_boot, h)
    for start, rows in _chunks(n_boot, n):
        idx = torch.randint(0, n, (rows, n), generator=gen)
        counts = torch.zeros(rows, n).scatter_add_(1, idx, torch.ones(rows, n))
        means[start : start + rows] = counts @ x / n  # [resamples, n_heads]
    alpha = (1 - level) / 2
    q = torch.quantile(means, torch.tensor([alpha, 1 - alpha]), dim=0)
    return q[0], q[1]


def paired_permutation_p(values: torch.Tensor, baseline: torch.Tensor, *, n_perm: int = 2000, seed: int = 0):
    """One-sided p-value that ``mean(values) > mean(baseline)``, paired by item, by random
    sign flips of the per-item differences. ``(count + 1) / (n_perm + 1)`` so p > 0.

    ``baseline`` broadcasts against ``values`` (a constant baseline is fine). A flip whose
    mean equals the observed one (no flip, or flips of zero differences) counts: the means
    are float64 and compared with a slack of ``4 n`` float64 ulps of ``mean |d|`` (the two
    sums, ``d.mean`` and ``signs @ d``, add the same terms in different orders; in
    float32, with a fixed slack below float32's resolution, an equal mean often fell a
    rounding error short and went uncounted, so p came out too small).
    """
    x = _as_2d(values).double()
    b = (
        torch.as_tensor(baseline, dtype=torch.float64).expand_as(x)
        if torch.as_tensor(baseline).dim() < 2
        else _as_2d(baseline).double()
    )
    d = x - b
    n, h = d.shape
    if n == 0:
        return torch.full((h,), float("nan"))
    observed = d.mean(0)
    slack = 4 * n * torch.finfo(torch.float64).eps * d.abs().mean(0)  # [n_heads]
    gen = torch.Generator().manual_seed(seed)
    count = torch.zeros(h)
    for _, rows in _chunks(n_perm, n):  # bounded memory; the same draws as one call
        signs = torch.randint(0, 2, (rows, n), generator=gen).double().mul_(2).sub_(1)
        null = signs @ d / n  # [permutations, n_heads]
        count += (null >= (observed - slack)[None]).sum(0).float()
    return (count + 1) / (n_perm + 1)


def _chunks(n_draws: int, n_items: int, max_elements: int = 1 << 21):
    """``(start, rows)`` blocks of ``n_draws`` so that ``rows × n_items <= max_elements``."""
    per = max(1, max_elements // max(n_items, 1))
    for start in range(0, n_draws, per):
        yield start, min(per, n_draws - start)


def benjamini_hochberg(p: torch.Tensor) -> torch.Tensor:
    """BH-adjusted p-values (false discovery rate), for testing many heads at once."""
    p = torch.as_tensor(p, dtype=torch.float64).flatten()
    m = p.numel()
    if m == 0:
        return p
    order = torch.argsort(p)
    ranked = p[order] * m / torch.arange(1, m + 1, dtype=torch.float64)
    ranked = torch.flip(torch.cummin(torch.flip(ranked, [0]), 0).values, [0]).clamp(max=1.0)
    out = torch.empty_like(p)
    out[order] = ranked
    return out.float()
