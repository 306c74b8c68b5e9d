"""Self-similarity, anisotropy, intra-sentence similarity and maximum explainable variance
(Ethayarajh 2019, "How Contextual are Contextualized Word Representations?").

Every function takes word representations already pooled (one vector per occurrence),
``reps [..., n, d]`` with any leading dimensions (the depths, say) computed at once, and
returns float tensors ``[...]``; nothing here reads a model.

>>> import torch
>>> reps = torch.ones(3, 4)  # one word, three identical occurrences
>>> round(self_similarity(reps).item(), 6), round(max_explainable_variance(reps).item(), 6)
(1.0, 1.0)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mean_pairwise_cosine(reps: torch.Tensor) -> torch.Tensor:
    """Mean cosine over the distinct pairs of rows of ``reps [..., n, d]`` (n >= 2)."""
    if reps.dim() < 2 or reps.shape[-2] < 2:
        raise ValueError(f"reps must be [..., n >= 2, d]; got shape {tuple(reps.shape)}")
    u = F.normalize(reps.float(), dim=-1)
    total = u.sum(-2)
    n = u.shape[-2]
    # Σ_{i != j} u_i·u_j = ‖Σ u_i‖² - Σ ‖u_i‖²
    return ((total**2).sum(-1) - (u**2).sum((-1, -2))) / (n * (n - 1))


def self_similarity(reps: torch.Tensor) -> torch.Tensor:
    """Mean cosine between one word's representations in different contexts, ``reps [..., n, d]``."""
    return mean_pairwise_cosine(reps)


def max_explainable_variance(reps: torch.Tensor) -> torch.Tensor:
    """Share of the variance of ``reps [n, d]`` a single static vector could explain: the
    first singular value squared over the sum of all squared singular values (uncentred,
    as Ethayarajh's MEV); ``reps [..., n, d]``."""
    if reps.dim() < 2 or reps.shape[-2] < 1:
        raise ValueError(f"reps must be [..., n >= 1, d]; got shape {tuple(reps.shape)}")
    s = torch.linalg.svdvals(reps.double())
    return (s[..., 0] ** 2 / (s**2).sum(-1)).float()


def anisotropy(reps: torch.Tensor, token_ids: torch.Tensor, *, n_pairs: int = 2000, seed: int = 0) -> torch.Tensor:
    """Mean cosine between representations of *different* words: ``n_pairs`` random pairs of
    rows of ``reps [..., n, d]`` whose ``token_ids [n]`` differ (the anisotropy baseline; the
    same pairs for every leading index)."""
    if reps.shape[-2] != token_ids.shape[0]:
        raise ValueError(f"reps and token_ids must have as many rows; got {reps.shape[-2]} and {token_ids.shape[0]}")
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(0, reps.shape[-2], (n_pairs * 2,), generator=gen)
    b = torch.randint(0, reps.shape[-2], (n_pairs * 2,), generator=gen)
    keep = token_ids[a] != token_ids[b]
    a, b = a[keep][:n_pairs], b[keep][:n_pairs]
    if a.numel() == 0:
        return torch.full(reps.shape[:-2], float("nan"))
    # one leading index at a time: [n_pairs, d] gathers, not [..., n_pairs, d]
    flat = reps.reshape(-1, *reps.shape[-2:])
    out = [F.cosine_similarity(r[a].float(), r[b].float(), dim=-1).mean(-1) for r in flat]
    return torch.stack(out).reshape(reps.shape[:-2])


def intra_sentence_similarity(reps: torch.Tensor) -> torch.Tensor:
    """Mean cosine between each word of one sentence ``reps [..., n_words, d]`` and the sentence's
    mean vector (Ethayarajh's intra-sentence similarity)."""
    mean = reps.float().mean(-2, keepdim=True)
    return F.cosine_similarity(reps.float(), mean, dim=-1).mean(-1)
