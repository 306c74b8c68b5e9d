"""The next-token loss runs its log-softmax over row chunks (issue #38: the pruning stage held
all the logits three times); the values must be those of one log-softmax over every row, bit for
bit, with and without a backward pass."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import headscope.analyses.metrics as metrics


def _reference(logits, ids, am):
    """The loss as it was: one log-softmax over all the logits."""
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    tok = -logp.gather(-1, ids[:, 1:, None])[..., 0]
    keep = am[:, 1:].float()
    return (tok * keep).sum(-1), keep.sum(-1)


def test_chunked_loss_equals_one_log_softmax_bit_for_bit(monkeypatch):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 9, 301, generator=g) * 4
    ids = torch.randint(0, 301, (5, 9), generator=g)
    am = torch.ones(5, 9, dtype=torch.long)
    am[1, 6:] = 0
    am[3, 2:] = 0
    want = _reference(logits, ids, am)
    monkeypatch.setattr(metrics, "LOGP_CHUNK_BYTES", 301 * 4 * 2)  # two rows at a time: many chunks
    for got in (metrics.token_nll(logits, ids, am), metrics.token_nll_at(logits[:, :-1][am[:, 1:].bool()], ids, am)):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    bf16 = logits.bfloat16()
    assert torch.equal(metrics.token_nll(bf16, ids, am)[0], _reference(bf16, ids, am)[0])


def test_chunked_loss_has_the_same_gradient(monkeypatch):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(3, 7, 50, generator=g)
    ids = torch.randint(0, 50, (3, 7), generator=g)
    am = torch.ones(3, 7, dtype=torch.long)
    a, b = base.clone().requires_grad_(), base.clone().requires_grad_()
    _reference(a, ids, am)[0].sum().backward()
    monkeypatch.setattr(metrics, "LOGP_CHUNK_BYTES", 50 * 4)  # one row at a time
    metrics.token_nll(b, ids, am)[0].sum().backward()
    assert torch.equal(a.grad, b.grad)
