"""Uncertainty for per-head scores: intervals, one-sided tests, multiplicity corrections.

* continuous scores (shares in [0, 1]): :func:`bootstrap_ci` (percentile bootstrap over
  items) and :func:`paired_permutation_p` (paired sign flips), which take per-item values
  ``[n_items, n_heads]``, are vectorised over heads and draw only from the ``seed``
  passed in;
* 0/1 scores (hits): :func:`wilson_ci` / :func:`clopper_pearson_ci` of the hit rate,
  :func:`sign_test_p` (exact McNemar test against a paired 0/1 baseline) and
  :func:`binomial_p` (exact binomial test against a constant rate), from ``scipy.stats``;
* corrections: :func:`benjamini_hochberg`, :func:`benjamini_yekutieli`,
  :func:`adjust_p` (by name), :func:`required_p` (what a raw p must beat).

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

import math

import numpy as np
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
    """BH-adjusted p-values (false discovery rate), for testing many heads at once:
    ``min(1, min_{j >= i} p_(j) m / j)`` for the i-th smallest. float64.

    >>> [round(x, 12) for x in benjamini_hochberg([0.01, 0.04, 0.03]).tolist()]
    [0.03, 0.04, 0.04]
    """
    p = torch.as_tensor(p, dtype=torch.float64).flatten()
    m = p.numel()
    if m == 0:
        return p
    order = torch.argsort(p)
    ranked = p[order] * m / torch.arange(1, m + 1, dtype=torch.float64)
    ranked = torch.flip(torch.cummin(torch.flip(ranked, [0]), 0).values, [0]).clamp(max=1.0)
    out = torch.empty_like(p)
    out[order] = ranked
    return out


# ------------------------------------------------------------------------- 0/1 (hit) scores
def _z(level: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(1 - (1 - level) / 2))


def wilson_ci(k, n, *, level: float = 0.95):
    """Wilson score interval of a binomial rate ``k / n``, elementwise (float64 tensors).

    ``center = (k + z²/2) / (n + z²)``, ``half = z / (n + z²) · sqrt(k (n - k) / n + z² / 4)``
    with ``z`` the normal quantile of ``1 - (1 - level)/2``. Unlike the bootstrap (or the
    Wald interval) it never collapses to a point at 0/n or n/n: 30 hits of 30 give
    ``[30 / (30 + z²), 1] = [0.886, 1]`` at 95%. NaN where ``n == 0``.

    >>> lo, hi = wilson_ci(30, 30)
    >>> round(float(lo), 4), float(hi)
    (0.8865, 1.0)
    """
    k = torch.as_tensor(k, dtype=torch.float64)
    n = torch.as_tensor(n, dtype=torch.float64)
    z2 = _z(level) ** 2
    nn = n.clamp_min(1)
    center = (k + z2 / 2) / (nn + z2)
    half = math.sqrt(z2) / (nn + z2) * (k * (nn - k) / nn + z2 / 4).clamp_min(0).sqrt()
    lo, hi = (center - half).clamp(0, 1), (center + half).clamp(0, 1)
    # at k = 0 / k = n the bound is exactly 0 / 1 (the formula gives it up to rounding)
    lo, hi = torch.where(k <= 0, torch.zeros_like(lo), lo), torch.where(k >= nn, torch.ones_like(hi), hi)
    nan = torch.full_like(lo, float("nan"))
    return torch.where(n > 0, lo, nan), torch.where(n > 0, hi, nan)


def clopper_pearson_ci(k, n, *, level: float = 0.95):
    """Clopper-Pearson ("exact") interval of ``k / n`` from beta quantiles, elementwise:
    ``[Beta(a/2; k, n-k+1), Beta(1-a/2; k+1, n-k)]`` with ``a = 1 - level`` (0 at k = 0,
    1 at k = n). Conservative: coverage >= level for every rate. NaN where ``n == 0``.

    >>> lo, hi = clopper_pearson_ci(30, 30)
    >>> round(float(lo), 4), float(hi)  # (0.025)^(1/30)
    (0.8843, 1.0)
    """
    from scipy.stats import beta

    k = np.asarray(torch.as_tensor(k, dtype=torch.float64).numpy())
    n = np.asarray(torch.as_tensor(n, dtype=torch.float64).numpy())
    a = 1 - level
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.where(k > 0, beta.ppf(a / 2, np.maximum(k, 1), n - k + 1), 0.0)
        hi = np.where(k < n, beta.ppf(1 - a / 2, k + 1, np.maximum(n - k, 1)), 1.0)
    lo, hi = np.where(n > 0, lo, np.nan), np.where(n > 0, hi, np.nan)
    return torch.as_tensor(np.asarray(lo, dtype=np.float64)), torch.as_tensor(np.asarray(hi, dtype=np.float64))


def binomial_p(k, n, p0):
    """Exact one-sided binomial p that the rate of ``k`` hits in ``n`` exceeds ``p0``:
    ``P(X >= k)``, ``X ~ Binomial(n, p0)`` (``scipy.stats.binom.sf(k - 1, n, p0)``, the
    same as ``scipy.stats.binomtest(k, n, p0, alternative="greater").pvalue``),
    elementwise. 1 where ``n == 0``.

    >>> round(float(binomial_p(9, 10, 0.5)), 6)  # (10 + 1) / 2^10
    0.010742
    """
    from scipy.stats import binom

    k = torch.as_tensor(k, dtype=torch.float64).numpy()
    n = torch.as_tensor(n, dtype=torch.float64).numpy()
    p0 = torch.as_tensor(p0, dtype=torch.float64).numpy()
    p = np.where(n > 0, binom.sf(k - 1, n, p0), 1.0)
    return torch.as_tensor(np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0))


def sign_test_p(n_pos, n_neg):
    """Exact one-sided sign test (McNemar's exact test for paired 0/1 outcomes): with
    ``n_pos`` items where only the head hits and ``n_neg`` where only the baseline hits,
    ``p = P(X >= n_pos)``, ``X ~ Binomial(n_pos + n_neg, 1/2)``; ties (both hit or both
    miss) carry no information and drop out. 1 where there is no discordant pair.

    >>> float(sign_test_p(5, 0))  # five discordant pairs, all for the head: 2^-5
    0.03125
    >>> float(sign_test_p(4, 1))  # (1 + 5) / 32
    0.1875
    """
    n_pos = torch.as_tensor(n_pos, dtype=torch.float64)
    return binomial_p(n_pos, n_pos + torch.as_tensor(n_neg, dtype=torch.float64), 0.5)


# -------------------------------------------------------------------- multiple testing
def harmonic(m: int) -> float:
    """``sum(1/i for i in 1..m)``, Benjamini-Yekutieli's factor for arbitrary dependence."""
    return float(sum(1.0 / i for i in range(1, m + 1)))


def benjamini_yekutieli(p: torch.Tensor) -> torch.Tensor:
    """BY-adjusted p-values: FDR control under any dependence between the tests (heads of
    one model share their inputs). Equal to ``min(1, BH · sum_{i<=m} 1/i)``.

    >>> [round(x, 12) for x in benjamini_yekutieli([0.01, 0.04]).tolist()]  # BH [0.02, 0.04] × 1.5
    [0.03, 0.06]
    """
    p = torch.as_tensor(p, dtype=torch.float64).flatten()
    if p.numel() == 0:
        return p
    return (benjamini_hochberg(p).double() * harmonic(p.numel())).clamp(max=1.0)


CORRECTIONS = ("bh", "by", "none")


def adjust_p(p: torch.Tensor, method: str) -> torch.Tensor:
    """Adjust the finite entries of ``p`` for multiplicity by ``method`` (one of
    :data:`CORRECTIONS`) as ONE family; NaN stays NaN. float64.

    >>> [round(x, 12) for x in adjust_p(torch.tensor([0.01, float("nan"), 0.04], dtype=torch.float64), "bh").tolist()]
    [0.02, nan, 0.04]
    """
    if method not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}; got {method!r}")
    p = torch.as_tensor(p, dtype=torch.float64).flatten().clone()
    finite = ~torch.isnan(p)
    if method != "none" and bool(finite.any()):
        fn = benjamini_hochberg if method == "bh" else benjamini_yekutieli
        p[finite] = fn(p[finite]).double()
    return p


def required_p(m: int, alpha: float, method: str) -> float:
    """The largest raw p that can survive the correction in a family of ``m`` tests (the
    rank-1 bound): ``alpha / m`` for BH, ``alpha / (m · sum 1/i)`` for BY, ``alpha`` for
    none. A Monte-Carlo p whose floor ``1/(n_perm+1)`` is not below this cannot be told
    apart from a p that would survive."""
    if method == "none" or m <= 1:
        return alpha
    return alpha / (m * (harmonic(m) if method == "by" else 1.0))
