"""A synthetic next-token task that needs several heads: induction + long-range agreement.

Each sequence (``seq_len`` tokens, default 24) reads::

    [CLASS_c] filler… s_0 … s_{L-1} [MARK] [AGREE_c] filler… s_0 … s_{L-1} [MARK] [AGREE_c] filler…

* ``s`` is a segment of ``L`` distinct content tokens; fillers are content tokens not in
  ``s``, so every token of the second copy has exactly one previous occurrence. Scored
  **induction** targets: at the second copy's ``s_i`` (``i < L-1``) the next token is
  ``s_{i+1}`` — a previous-token head and an induction head (two layers) find it; the
  random filler lengths stop a fixed-offset head from doing so.
* **agreement** targets: at each ``[MARK]`` the next token is ``AGREE_c``, the agreement
  token of the class token at position 0 — a head must reach back to the first token
  (the second mark can also be solved by induction over the first).

Everything else is unscored filler. Generation is seeded (``torch.Generator``).

>>> task = SyntheticTask()
>>> batch = task.sample(2, torch.Generator().manual_seed(0))
>>> tuple(batch.input_ids.shape), task.vocab_size, int(batch.kind.eq(AGREEMENT).sum(-1)[0])
((2, 24), 33, 2)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

UNSCORED, INDUCTION, AGREEMENT = 0, 1, 2
KINDS = {"induction": INDUCTION, "agreement": AGREEMENT}


@dataclass(frozen=True)
class TaskBatch:
    """``input_ids [batch, pos]``; ``targets [batch, pos]`` (the token that must follow
    position ``pos``; -100 where unscored); ``kind [batch, pos]``: 0 unscored,
    1 induction, 2 agreement."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    kind: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class SyntheticTask:
    """Vocabulary: content tokens ``0..n_content-1``, then ``n_classes`` class tokens,
    ``n_classes`` agreement tokens and one mark."""

    seq_len: int = 24
    n_content: int = 24
    n_classes: int = 4
    min_segment: int = 4
    max_segment: int = 7
    max_lead: int = 3  # filler before the first copy: 1..max_lead
    max_gap: int = 2  # filler between the agreement and the second copy: 0..max_gap

    def __post_init__(self):
        need = 1 + self.max_lead + 2 * self.max_segment + 4 + self.max_gap
        if self.seq_len < need:
            raise ValueError(
                f"seq_len must hold the longest layout (1 + max_lead + 2*max_segment + 4 + max_gap = {need}); "
                f"got {self.seq_len}. Raise seq_len or shorten the segments."
            )
        if not 2 <= self.min_segment <= self.max_segment:
            raise ValueError(f"need 2 <= min_segment <= max_segment; got {self.min_segment}, {self.max_segment}.")
        if self.n_content < self.max_segment + max(self.max_lead, self.max_gap, 1):
            raise ValueError(f"n_content ({self.n_content}) too small for segments of {self.max_segment} plus filler.")
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be >= 2; got {self.n_classes}.")

    @property
    def class_token(self) -> int:
        return self.n_content

    @property
    def agree_token(self) -> int:
        return self.n_content + self.n_classes

    @property
    def mark_token(self) -> int:
        return self.n_content + 2 * self.n_classes

    @property
    def vocab_size(self) -> int:
        return self.mark_token + 1

    def _one(self, gen: torch.Generator) -> tuple[list[int], list[int], list[int]]:
        def randint(lo, hi):  # inclusive
            return int(torch.randint(lo, hi + 1, (1,), generator=gen))

        c = randint(0, self.n_classes - 1)
        length = randint(self.min_segment, self.max_segment)
        perm = torch.randperm(self.n_content, generator=gen).tolist()
        seg, others = perm[:length], perm[length:]

        def filler(n):
            return [others[int(i)] for i in torch.randint(0, len(others), (n,), generator=gen)]

        agree = [self.mark_token, self.agree_token + c]
        toks = [self.class_token + c] + filler(randint(1, self.max_lead)) + seg + agree
        kind = [UNSCORED] * len(toks)
        kind[len(toks) - 2] = AGREEMENT
        toks += filler(randint(0, self.max_gap))
        kind += [UNSCORED] * (len(toks) - len(kind))
        toks += seg + agree
        kind += [INDUCTION] * (length - 1) + [UNSCORED, AGREEMENT, UNSCORED]
        toks += filler(self.seq_len - len(toks))
        kind += [UNSCORED] * (self.seq_len - len(kind))
        targets = [t if k != UNSCORED else -100 for t, k in zip(toks[1:] + [-100], kind)]
        return toks, targets, kind

    def sample(self, n: int, gen: torch.Generator) -> TaskBatch:
        """``n`` sequences drawn with ``gen`` (same generator state, same batch)."""
        if n < 1:
            raise ValueError(f"n must be positive; got {n}.")
        rows = [self._one(gen) for _ in range(n)]
        ids, tgt, kind = (torch.tensor([r[i] for r in rows], dtype=torch.long) for i in range(3))
        return TaskBatch(input_ids=ids, targets=tgt, kind=kind)
