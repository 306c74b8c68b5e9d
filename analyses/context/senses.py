"""How well a word's senses separate at one layer: leave-one-out nearest-centroid accuracy
(cosine) with a label-permutation baseline, and the silhouette (cosine distance).

Every function takes ``reps [..., n, d]``: one word's ``n`` occurrences, with any leading
dimensions (the depths, say) computed at once.

>>> import torch
>>> reps = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
>>> labels = torch.tensor([0, 0, 1, 1])
>>> loo_centroid_accuracy(reps, labels).item(), round(silhouette(reps, labels).item(), 3)
(1.0, 0.993)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: cosines closer than this to the best one count as tied with it
TIE = 1e-6


def loo_centroid_accuracy(reps: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Leave-one-out accuracy of the nearest class centroid (cosine): each item's own class
    centroid is computed without it. ``reps [..., n, d]``; integer ``labels [n]`` or
    ``[labelling, n]`` (several labellings of the same classes at once, e.g. permutations).
    Returns ``[...]``, or ``[labelling, ...]`` for 2-D labels.

    The cosine to a centroid needs no ``[n, class, d]`` tensor: with unit rows ``u`` and class
    sums ``s_c``, the centroid without item ``i`` is ``(s_c - o_ic u_i) / count`` (``o``: one-hot
    of ``i``'s class), so its cosine with ``u_i`` is ``(u_i·s_c - o_ic) / ‖s_c - o_ic u_i‖``
    and ``‖s_c - o_ic u_i‖² = ‖s_c‖² - 2 o_ic u_i·s_c + o_ic``. Cosines within :data:`TIE` of the
    best are a tie, given to the first class."""
    if labels.dim() not in (1, 2) or labels.shape[-1] != reps.shape[-2]:
        raise ValueError(f"labels must be [n] or [labelling, n] with n = {reps.shape[-2]}; got {tuple(labels.shape)}")
    lead, (n, d) = reps.shape[:-2], reps.shape[-2:]
    u = F.normalize(reps.float(), dim=-1).reshape(-1, n, d)  # [rep, n, d]
    lab = labels.reshape(-1, n)  # [labelling, n]
    classes = lab[0].unique()
    onehot = (lab[..., None] == classes).float()  # [labelling, n, class]
    sums = torch.einsum("pnc,rnd->prcd", onehot, u)  # [labelling, rep, class, d]
    dots = torch.einsum("rnd,prcd->prnc", u, sums)  # u_i · s_c
    o = onehot[:, None]  # [labelling, 1, n, class]
    sq = (sums**2).sum(-1)[:, :, None, :]  # ‖s_c‖², [labelling, rep, 1, class]
    norm = (sq - 2 * o * dots + o).clamp_min(0).sqrt().clamp_min(1e-8)
    cnt = onehot.sum(1)[:, None, None, :] - o  # class sizes without item i
    sim = ((dots - o) / norm).masked_fill(cnt == 0, float("-inf"))
    # ties within float rounding (a static row: every occurrence the same vector) go to the first class
    near = sim >= sim.max(-1, keepdim=True).values - TIE
    pred = classes[near.float().argmax(-1)]  # [labelling, rep, n]
    acc = (pred == lab[:, None, :]).float().mean(-1).reshape(lab.shape[0], *lead)
    return acc if labels.dim() == 2 else acc[0]


def permutation_baseline(reps: torch.Tensor, labels: torch.Tensor, *, n_perm: int = 50, seed: int = 0):
    """``(mean accuracy under shuffled labels, p-value of the observed accuracy)``, each ``[...]``
    for ``reps [..., n, d]`` (the same shuffles for every leading index)."""
    gen = torch.Generator().manual_seed(seed)
    obs = loo_centroid_accuracy(reps, labels)
    perms = torch.stack([labels[torch.randperm(labels.numel(), generator=gen)] for _ in range(n_perm)])
    accs = loo_centroid_accuracy(reps, perms)  # [perm, ...]
    p = (1 + (accs >= obs).sum(0)) / (1 + n_perm)
    return accs.mean(0), p.float()


def silhouette(reps: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean silhouette with cosine distance (items of a singleton class count 0), ``[...]`` for
    ``reps [..., n, d]`` and ``labels [n]``."""
    u = F.normalize(reps.float(), dim=-1)
    dist = 1 - u @ u.transpose(-1, -2)  # [..., n, n]
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(labels), dtype=torch.bool)
    n_same = (same & ~eye).sum(1)
    a = (dist * (same & ~eye)).sum(-1) / n_same.clamp_min(1)
    b = torch.full_like(a, float("inf"))
    for c in labels.unique():
        mask = (labels[None, :] == c) & ~same
        has = mask.any(1)
        mean_c = (dist * mask).sum(-1) / mask.sum(1).clamp_min(1)
        b = torch.where(has, torch.minimum(b, mean_c), b)
    s = (b - a) / torch.maximum(a, b).clamp_min(1e-12)
    return torch.where(n_same > 0, s, torch.zeros_like(s)).mean(-1)
