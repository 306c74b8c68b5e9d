"""Word-level attention from token-level patterns, vectorised over layers and heads.

Definition (Clark, Khandelwal, Levy & Manning 2019, "What Does BERT Look At?", §4.1):
"For attention *to* a split-up word, we sum up the attention weights over its tokens.
For attention *from* a split-up word, we take the mean of the attention weights over
its tokens." So, with pooling matrices built from the token→word alignment
(:func:`headscope.probes.alignment.word_matrices`)::

    word_pattern[w_q, w_k] = query_mean[w_q] @ pattern @ key_sum[w_k].T

Rows of a word pattern still sum to at most 1: special tokens ([CLS], [SEP], BOS) belong
to no word, so attention to them drops out (it is not renormalised away; pass
``renormalise=True`` to :func:`word_patterns` to rescale rows to 1 over words, an
option Clark et al. do not use).

The pooling matrices are built once per batch (``[batch, word, pos]``) and applied to
all layers and heads with one batched matmul:
``[1, batch, 1, word, q] @ [layer, batch, head, q, k] @ [1, batch, 1, k, word]``.

>>> import torch
>>> pool = pooling_from_word_ids([[None, 0, 0, 1, None]], [2])
>>> p = torch.tensor([[[[.2, .2, .2, .2, .2],
...                     [.1, .3, .1, .4, .1],
...                     [.0, .5, .1, .2, .2],
...                     [.3, .1, .1, .1, .4],
...                     [.2, .2, .2, .2, .2]]]])
>>> word_patterns(p, pool)[0, 0]
tensor([[0.5000, 0.3000],
        [0.2000, 0.1000]])
>>> most_attended(word_patterns(p, pool), pool)[0, 0].tolist()  # self excluded
[1, 0]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["WordPooling", "pooling_from_word_ids", "pooling_matrices", "word_patterns", "most_attended"]


@dataclass(frozen=True)
class WordPooling:
    """Per-batch pooling matrices.

    ``query_mean`` ``[batch, word, pos]`` (1/len(word) on the word's tokens),
    ``key_sum`` ``[batch, word, pos]`` (1 on the word's tokens), ``n_words`` per item,
    ``aligned`` ``[batch, word]`` bool: the word exists in the item and owns >= 1 token.
    ``word`` is the largest word count in the batch; missing words are all-zero rows.
    """

    query_mean: torch.Tensor
    key_sum: torch.Tensor
    n_words: tuple[int, ...]
    aligned: torch.Tensor

    @property
    def word_mask(self) -> torch.Tensor:
        """``[batch, word]`` bool: the word index exists in the item (aligned or not)."""
        w = self.aligned.shape[1]
        device = self.aligned.device
        return (
            torch.arange(w, device=device)[None, :]
            < torch.tensor(self.n_words, dtype=torch.long, device=device)[:, None]
        )

    def item_aligned(self, row: int) -> bool:
        """True when every word of item ``row`` owns at least one token."""
        return bool(self.aligned[row, : self.n_words[row]].all())


def pooling_from_word_ids(
    word_ids: list[list[int | None]], n_words: list[int], n_pos: int | None = None
) -> WordPooling:
    """Pooling matrices from per-item token→word ids (``None`` for special tokens).

    ``n_pos`` defaults to the longest ``word_ids`` list. Raises ``ValueError`` when a
    word id is outside ``0..n_words-1`` or the lists disagree in length.
    """
    if len(word_ids) != len(n_words):
        raise ValueError(f"word_ids and n_words must have one entry per item; got {len(word_ids)} and {len(n_words)}")
    b = len(word_ids)
    n = max((len(w) for w in word_ids), default=0) if n_pos is None else n_pos
    w_max = max(n_words, default=0)
    rows, words, poss = [], [], []
    for r, ids in enumerate(word_ids):
        for pos, w in enumerate(ids[:n]):
            if w is None:
                continue
            if not 0 <= w < n_words[r]:
                raise ValueError(f"word id {w} at item {r}, position {pos} is outside 0..{n_words[r] - 1}")
            rows.append(r)
            words.append(w)
            poss.append(pos)
    key_sum = torch.zeros(b, w_max, n)
    if rows:
        key_sum[torch.tensor(rows), torch.tensor(words), torch.tensor(poss)] = 1.0
    counts = key_sum.sum(-1)  # [batch, word]
    query_mean = key_sum / counts.clamp_min(1.0)[..., None]
    return WordPooling(
        query_mean=query_mean, key_sum=key_sum, n_words=tuple(int(x) for x in n_words), aligned=counts > 0
    )


def pooling_matrices(tokens, n_pos: int | None = None) -> WordPooling:
    """Pooling matrices for a :class:`~headscope.probes.tokens.TokenBatch` (uses its
    ``word_ids`` and ``words``; ``n_pos`` defaults to the padded batch length)."""
    n = tokens.input_ids.shape[1] if n_pos is None else n_pos
    with torch.device("cpu"):  # built on the host from Python lists, then moved to the data
        pool = pooling_from_word_ids(tokens.word_ids, [len(w) for w in tokens.words], n)
    device = tokens.input_ids.device
    if device.type == "cpu":
        return pool
    return WordPooling(
        query_mean=pool.query_mean.to(device),
        key_sum=pool.key_sum.to(device),
        n_words=pool.n_words,
        aligned=pool.aligned.to(device),
    )


def word_patterns(pattern: torch.Tensor, pool: WordPooling, *, renormalise: bool = False) -> torch.Tensor:
    """Word-level attention (Clark et al. 2019): mean over query pieces, sum over key pieces.

    ``pattern``: ``[batch, head, query_pos, key_pos]`` or ``[layer, batch, head, query_pos, key_pos]``.
    Returns ``[batch, head, word, word]`` or ``[layer, batch, head, word, word]`` (float32).
    ``renormalise=True`` rescales each query row to sum to 1 over words (not Clark's choice).
    Raises ``ValueError`` on a shape that does not match the pooling matrices.
    """
    if pattern.dim() not in (4, 5):
        raise ValueError(
            f"pattern must be [batch, head, query_pos, key_pos] or [layer, batch, head, query_pos, key_pos]; got shape {tuple(pattern.shape)}"
        )
    b, n = pool.key_sum.shape[0], pool.key_sum.shape[2]
    if pattern.shape[-4] != b or pattern.shape[-1] != n or pattern.shape[-2] != n:
        raise ValueError(
            f"pattern batch/positions {tuple(pattern.shape)} do not match the pooling matrices (batch {b}, pos {n})"
        )
    q = pool.query_mean[:, None]  # [batch, 1, word, q]
    k = pool.key_sum.transpose(1, 2)[:, None]  # [batch, 1, k, word]
    if pattern.dim() == 5:
        q, k = q[None], k[None]
    out = q @ pattern.float() @ k
    if renormalise:
        out = out / out.sum(-1, keepdim=True).clamp_min(1e-12)
    return out


class WordRows:
    """:func:`word_patterns` of every layer from pattern pieces: each piece's query rows pooled
    into words at once (``query_mean[..., rows] @ piece``, ``[batch, head, word, key_pos]``,
    summed over a layer's pieces), the key pieces pooled when the batch ends."""

    def __init__(self, pool: WordPooling):
        self.pool = pool
        self.by_layer: dict = {}

    def add(self, piece) -> None:
        part = self.pool.query_mean[:, None, :, piece.rows] @ piece.pattern.float()
        old = self.by_layer.get(piece.layer)
        self.by_layer[piece.layer] = part if old is None else old + part

    def word_patterns(self, layers) -> torch.Tensor:
        """``[layer, batch, head, word, word]``, as :func:`word_patterns` of the stacked patterns."""
        k = self.pool.key_sum.transpose(1, 2)[:, None]  # [batch, 1, k, word]
        return torch.stack([self.by_layer[l] for l in layers]) @ k[None]


def most_attended(word_pattern: torch.Tensor, pool: WordPooling, *, exclude_self: bool = True) -> torch.Tensor:
    """Index of the most-attended word for every query word: ``[..., batch, head, word]`` (long).

    Keys that do not exist in the item, or own no token, can never win; with
    ``exclude_self`` (Clark et al.: "the most-attended-to *other* word") the query word
    itself is excluded. Ties go to the earlier word. Rows whose keys are all excluded
    return 0; callers skip such items (a one-word sentence has no other word).
    """
    w = word_pattern.shape[-1]
    bad = ~pool.aligned[:, None, None, :]  # [batch, 1, 1(query), key]
    if exclude_self:
        bad = bad | torch.eye(w, dtype=torch.bool, device=bad.device)[None, None]
    masked = word_pattern.masked_fill(bad, float("-inf"))
    return masked.argmax(-1)
