"""Local -> global with depth: a trend test of attention distance over layers, bootstrapped
over sentences, and its verdict sentence.

>>> import torch
>>> d = torch.tensor([[[0.1, 0.1], [0.5, 0.5], [0.9, 0.9]]] * 4)  # [sentence, layer, head]
>>> t = distance_trend(d, n_boot=50)
>>> round(t["rho"], 3), t["direction"]
(1.0, 'more global')
"""

from __future__ import annotations

import torch


def _depth_ranks(n_layer: int, n_head: int) -> torch.Tensor:
    """Average ranks of the layer index over every ``(layer, head)``: a layer's heads tie."""
    return (torch.arange(n_layer, dtype=torch.float32) * n_head + (n_head - 1) / 2)[:, None].expand(n_layer, n_head)


def _rho(per_head: torch.Tensor) -> float:
    """Spearman ρ of ``per_head [..., layer, head]`` distances against the layer index (depth
    ties take average ranks; distances are ranked by order)."""
    n_layer, n_head = per_head.shape[-2:]
    rx = _depth_ranks(n_layer, n_head).reshape(-1)
    ry = spearman_ranks(per_head.reshape(*per_head.shape[:-2], -1))
    rx, ry = rx - rx.mean(), ry - ry.mean(-1, keepdim=True)
    return (rx * ry).sum(-1) / torch.sqrt((rx**2).sum() * (ry**2).sum(-1)).clamp_min(1e-12)


def spearman_ranks(x: torch.Tensor) -> torch.Tensor:
    """Average ranks (0-based) along the last dimension: tied values share the mean of their ranks."""
    srt = x.sort(dim=-1).values.contiguous()
    lo = torch.searchsorted(srt, x.contiguous(), right=False)
    hi = torch.searchsorted(srt, x.contiguous(), right=True)
    return (lo + hi - 1).float() / 2


def distance_trend(distance: torch.Tensor, *, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> dict:
    """Spearman ρ of mean attention distance against depth over every ``(layer, head)``, with a
    percentile bootstrap CI over sentences. ``distance [sentence, layer, head]`` (normalised
    distances, :func:`~headscope.analyses.context.attention.mean_distance`). Returns ``rho``,
    ``ci_low``, ``ci_high``, ``n`` (sentences), ``direction`` ("more global", "more local" or
    "no clear trend": the CI must exclude 0) and ``verdict`` (one sentence)."""
    if distance.dim() != 3 or distance.shape[0] < 1 or distance.shape[1] < 2:
        raise ValueError(f"distance must be [sentence >= 1, layer >= 2, head]; got shape {tuple(distance.shape)}")
    d = distance.float()
    rho = float(_rho(d.nanmean(0)))
    gen = torch.Generator().manual_seed(seed)
    n = d.shape[0]
    idx = torch.randint(0, n, (n_boot, n), generator=gen)
    boots = _rho(d[idx].nanmean(1))  # [n_boot]
    alpha = (1 - level) / 2
    low, high = (float(x) for x in torch.quantile(boots, torch.tensor([alpha, 1 - alpha])))
    direction = "more global" if low > 0 else "more local" if high < 0 else "no clear trend"
    ci = f"{level:.0%} CI [{low:.2f}, {high:.2f}] over {n} sentences"
    if direction == "no clear trend":
        verdict = f"this model's attention shows no clear trend with depth: ρ = {rho:.2f}, {ci}"
    else:
        verdict = f"this model's attention becomes {direction} with depth: ρ = {rho:.2f}, {ci}"
    return {"rho": rho, "ci_low": low, "ci_high": high, "n": n, "direction": direction, "verdict": verdict}


__all__ = ["distance_trend", "spearman_ranks"]
