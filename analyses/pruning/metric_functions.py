"""The pure functions pruning metrics are made of: tensors in, new tensors out.

None writes into its inputs; each accumulates in float32 (float64 for float64 inputs).

>>> import torch
>>> logits = torch.zeros(1, 3, 4)                      # uniform over 4 tokens
>>> nll, n = token_nll(logits, torch.tensor([[0, 1, 2]]), torch.tensor([[1, 1, 1]]))
>>> round(float(nll[0] / n[0]), 4), int(n[0])       # log 4, two predicted tokens
(1.3863, 2)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def token_nll(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor, score_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token negative log-likelihood per row and the number of tokens scored.

    ``logits [batch, pos, vocab]`` predict ``input_ids[:, 1:]``; a target counts when it
    is a real token (``attention_mask``) and, if given, ``score_mask [batch, pos]`` is
    True at the target's position. Returns ``(nll_sum [batch], n_scored [batch])`` in float32 (float64 for float64 logits).
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"logits must be [batch, pos, vocab] matching input_ids {tuple(input_ids.shape)}; got {tuple(logits.shape)}"
        )
    logp = F.log_softmax(logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    target = input_ids[:, 1:]
    tok = -logp.gather(-1, target[..., None])[..., 0]  # [batch, pos-1]
    keep = attention_mask[:, 1:].bool()
    if score_mask is not None:
        keep = keep & score_mask[:, 1:].bool()
    keep_f = keep.to(logp.dtype)
    return (tok * keep_f).sum(-1), keep_f.sum(-1)


def token_nll_at(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_nll` from the logits at the scored positions only: ``logits [n, vocab]``
    are the rows, in row-major order, of the positions ``p < pos - 1`` whose target
    ``input_ids[:, p + 1]`` is a real token (:meth:`LMLoss.read_positions`). Same values,
    bit for bit: each scored token's log-probability is computed alike and the sums run
    over the same ``[batch, pos - 1]`` grid (zeros where nothing is scored).

    >>> logits = torch.zeros(1, 3, 4)
    >>> ids, am = torch.tensor([[0, 1, 2]]), torch.tensor([[1, 1, 1]])
    >>> [torch.equal(a, b) for a, b in zip(token_nll_at(logits[0, :2], ids, am), token_nll(logits, ids, am))]
    [True, True]
    """
    keep = attention_mask[:, 1:].bool()
    if logits.dim() != 2 or logits.shape[0] != int(keep.sum()):
        raise ValueError(f"logits must be [{int(keep.sum())} scored positions, vocab]; got {tuple(logits.shape)}")
    logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    scored = -logp.gather(-1, input_ids[:, 1:][keep][:, None])[:, 0]
    tok = torch.zeros(keep.shape, dtype=logp.dtype, device=logp.device).masked_scatter(keep, scored)
    keep_f = keep.to(logp.dtype)
    return (tok * keep_f).sum(-1), keep_f.sum(-1)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """``hidden [batch, pos, d_model]`` -> ``[batch, d_model]``: mean over real tokens
    (sentence-transformers' pooling), then L2-normalised when ``normalize``."""
    m = attention_mask.to(hidden.dtype)[..., None]
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled


def paraphrase_hits(
    anchor: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor, neg_valid: torch.Tensor
) -> torch.Tensor:
    """Unit-norm embeddings ``anchor, positive [item, d]``, ``negatives [item, n_neg, d]``
    (``neg_valid [item, n_neg]`` False on padding) -> ``[item]`` float 1.0 where
    ``cos(anchor, positive)`` beats every valid negative."""
    pos = (anchor * positive).sum(-1)
    neg = torch.einsum("id,ind->in", anchor, negatives).masked_fill(~neg_valid, -math.inf)
    return (pos > neg.max(-1).values).float()


def weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``values [..., item]``, ``weights [item]`` -> ``[...]`` weighted mean over items."""
    w = weights.to(values.dtype)
    return (values * w).sum(-1) / w.sum().clamp(min=1e-12)
