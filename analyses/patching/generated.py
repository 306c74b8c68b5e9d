"""Tasks drawn from random tokens, built for the model's own tokenizer (seeded, no global state):

* ``induction`` (:func:`induction_task`): ``[first] + S + S[:-1]``, ``S`` ``seq_len``
  distinct ordinary token ids (``first`` is BOS/CLS where the tokenizer has one,
  as the roles' induction probe; :func:`leading_specials`); corrupted: the first copy of
  ``S`` replaced by other random ids (disjoint from ``S``); metric ``logprob`` of ``S[-1]``,
  the token the induction rule predicts after ``S[-2]``.
* ``duplicate_token`` (:func:`duplicate_token_task`): one token repeated in random
  context, ``[first] + A + [x, y] + B + [x]``, answer ``y`` (the token that followed the
  earlier ``x``); corrupted: the earlier ``x`` replaced by a fresh token, so nothing is
  repeated; metric ``logprob``.

Each makes at most :data:`MAX_GENERATED_ITEMS` items.
"""

from __future__ import annotations

import torch

from headscope.analyses.patching.items import PairItem, Task

#: most items a generated task (induction, duplicate_token) makes: past it the items alone
#: fill gigabytes, and patching them takes days (write a larger task to a JSONL file)
MAX_GENERATED_ITEMS = 100_000


def leading_specials(tokenizer) -> list[int]:
    """The ids the tokenizer itself puts in front of a text ([CLS], a BOS), found by encoding a
    probe word with and without special tokens: ``[]`` for a tokenizer that adds none, as
    SmolLM2's, whose ``bos_token`` (``<|im_start|>``) never starts an encoded text."""
    with_specials = tokenizer("a", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    for start in range(len(with_specials) - len(plain) + 1):
        if with_specials[start : start + len(plain)] == plain:
            return list(with_specials[:start])
    return []


def _first_convention(first: list[int], tokenizer) -> str:
    """How a generated task's items start, in words (its :attr:`Task.source`)."""
    if not first:
        return "no BOS: the tokenizer adds none to a text"
    return f"starts with {', '.join(tokenizer.convert_ids_to_tokens(first))} as the tokenizer's own texts do"


def _random_items_setup(tokenizer, vocab_ids, need: int, task: str, seed: int):
    """``(vocab ids [n], first tokens (what the tokenizer puts in front of a text: [CLS], a BOS,
    or nothing; :func:`leading_specials`), seeded generator)`` of a task drawn from random
    tokens; ``ValueError`` when fewer than ``need`` ids can be drawn."""
    from headscope.analyses.roles.induction import ordinary_vocab

    vocab = torch.tensor(list(vocab_ids) if vocab_ids is not None else ordinary_vocab(tokenizer), dtype=torch.long)
    if vocab.numel() < need:
        raise ValueError(f"{task} needs {need} distinct ordinary token ids; the tokenizer has {vocab.numel()}")
    return vocab, leading_specials(tokenizer), torch.Generator().manual_seed(seed)


def induction_task(tokenizer, *, n_items: int = 16, seq_len: int = 10, seed: int = 0, vocab_ids=None) -> Task:
    """Repeated random tokens (see the module docstring): ``n_items`` pairs of
    ``[first] + S + S[:-1]`` vs ``[first] + T + S[:-1]`` (``len(S) = len(T) = seq_len``,
    all ``2 seq_len`` ids distinct), answer ``S[-1]``, metric ``logprob``. ``vocab_ids``:
    the ids to draw from (default the roles' ordinary vocabulary). Seeded, no global state."""

    if not 1 <= n_items <= MAX_GENERATED_ITEMS or seq_len < 2:
        raise ValueError(f"n_items must be in [1, {MAX_GENERATED_ITEMS}] and seq_len >= 2; got {n_items}, {seq_len}")
    vocab, first, gen = _random_items_setup(tokenizer, vocab_ids, 2 * seq_len, "induction", seed)
    items = []
    for _ in range(n_items):
        draw = vocab[torch.randperm(vocab.numel(), generator=gen)[: 2 * seq_len]].tolist()
        s, t = draw[:seq_len], draw[seq_len:]
        items.append(PairItem(tuple(first + s + s[:-1]), tuple(first + t + s[:-1]), s[-1]))
    source = f"generated (seq_len={seq_len}, seed={seed}; {_first_convention(first, tokenizer)})"
    return Task(name="induction", items=items, metric="logprob", source=source)


def duplicate_token_task(
    tokenizer, *, n_items: int = 16, seq_len: int = 10, seed: int = 0, vocab_ids=None, first_at: int | None = None
) -> Task:
    """One repeated token (see the module docstring): ``n_items`` pairs of ``[first] + A + [x,
    y] + B + [x]`` vs the same with the earlier ``x`` replaced by a fresh token ``z``;
    ``len(A) + 2 + len(B) = seq_len``, all ids distinct except the repeated ``x``; answer
    ``y``, metric ``logprob``. ``first_at``: the earlier ``x`` is the ``first_at``-th token of
    ``A + [x, y] + B`` counting from 1 (so its index in an input with ``[first]`` is
    ``first_at``; default ``seq_len // 2``); the same in every item, so positions line up.
    Seeded, no global state.

    >>> from headscope.probes.models.inhouse.planted import planted_tokenizer
    >>> it = duplicate_token_task(planted_tokenizer(), n_items=1, seq_len=6).items[0]
    >>> len(it.clean), it.clean[3] == it.clean[-1], it.clean[4] == it.answer, it.corrupted[3] != it.clean[3]
    (8, True, True, True)
    """

    at = seq_len // 2 if first_at is None else first_at
    if not 1 <= n_items <= MAX_GENERATED_ITEMS or seq_len < 3 or not 1 <= at <= seq_len - 2:
        raise ValueError(
            f"n_items must be in [1, {MAX_GENERATED_ITEMS}], seq_len >= 3 and 1 <= first_at <= seq_len - 2; "
            f"got {n_items}, {seq_len}, {at}"
        )
    vocab, first, gen = _random_items_setup(tokenizer, vocab_ids, seq_len + 1, "duplicate_token", seed)
    items = []
    for _ in range(n_items):
        draw = vocab[torch.randperm(vocab.numel(), generator=gen)[: seq_len + 1]].tolist()
        x, y, z, rest = draw[0], draw[1], draw[2], draw[3:]
        a, b = rest[: at - 1], rest[at - 1 :]
        body = a + [x, y] + b
        clean = first + body + [x]
        corrupted = first + a + [z, y] + b + [x]
        items.append(PairItem(tuple(clean), tuple(corrupted), y))
    return Task(
        name="duplicate_token",
        items=items,
        metric="logprob",
        source=f"generated (seq_len={seq_len}, seed={seed}; {_first_convention(first, tokenizer)})",
    )
