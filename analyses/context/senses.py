"""How well a word's senses separate at one layer: leave-one-out nearest-centroid accuracy
(cosine) with a label-permutation baseline, and the silhouette (cosine distance).

>>> import torch
>>> reps = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
>>> labels = torch.tensor([0, 0, 1, 1])
>>> loo_centroid_accuracy(reps, labels).item(), round(silhouette(reps, labels).item(), 3)
(1.0, 0.993)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def loo_centroid_accuracy(reps: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Leave-one-out accuracy of the nearest class centroid (cosine) for ``reps [n, d]`` and
    integer ``labels [n]``; each item's own class centroid is computed without it."""
    u = F.normalize(reps.float(), dim=-1)
    classes = labels.unique()
    onehot = (labels[:, None] == classes[None, :]).float()  # [n, class]
    sums = onehot.T @ u  # [class, d]
    counts = onehot.sum(0)  # [class]
    # centroid of each class for each item, without the item itself
    own = onehot[:, :, None] * u[:, None, :]  # [n, class, d]
    cnt = counts[None, :] - onehot  # [n, class]
    cent = (sums[None] - own) / cnt.clamp_min(1)[..., None]
    sim = F.cosine_similarity(u[:, None, :], cent, dim=-1).masked_fill(cnt == 0, float("-inf"))
    pred = classes[sim.argmax(-1)]
    return (pred == labels).float().mean()


def permutation_baseline(reps: torch.Tensor, labels: torch.Tensor, *, n_perm: int = 50, seed: int = 0):
    """``(mean accuracy under shuffled labels, p-value of the observed accuracy)``."""
    gen = torch.Generator().manual_seed(seed)
    obs = loo_centroid_accuracy(reps, labels)
    accs = torch.stack(
        [loo_centroid_accuracy(reps, labels[torch.randperm(labels.numel(), generator=gen)]) for _ in range(n_perm)]
    )
    p = (1 + (accs >= obs).sum()) / (1 + n_perm)
    return accs.mean(), p.float()


def silhouette(reps: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean silhouette with cosine distance (items of a singleton class count 0)."""
    u = F.normalize(reps.float(), dim=-1)
    dist = 1 - u @ u.T
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(labels), dtype=torch.bool)
    n_same = (same & ~eye).sum(1)
    a = (dist * (same & ~eye)).sum(1) / n_same.clamp_min(1)
    b = torch.full_like(a, float("inf"))
    for c in labels.unique():
        other = labels[None, :] == c
        mask = other & ~same
        has = mask.any(1)
        mean_c = (dist * mask).sum(1) / mask.sum(1).clamp_min(1)
        b = torch.where(has, torch.minimum(b, mean_c), b)
    s = (b - a) / torch.maximum(a, b).clamp_min(1e-12)
    return torch.where(n_same > 0, s, torch.zeros_like(s)).mean()
