"""What the patching tests share: the planted-model settings, frame lookups and random
clean/corrupted pairs (a helper module, not a test module: test files import from here, never
from each other)."""

from __future__ import annotations

import pandas as pd
import torch

from headscope.analyses.patching.activation import PatchConfig
from headscope.analyses.patching.items import PairItem

#: enough permutations and bootstrap draws for the planted model's verdicts
CFG = PatchConfig(n_perm=2000, n_boot=200)


def effects(frame: pd.DataFrame, method: str) -> dict[tuple[int, int], float]:
    f = frame[frame["method"] == method]
    return {(int(r.layer), int(r.head)): float(r.effect) for r in f.itertuples()}


def significant(frame: pd.DataFrame, method: str) -> set[tuple[int, int]]:
    f = frame[(frame["method"] == method) & frame["significant"]]
    return {(int(r.layer), int(r.head)) for r in f.itertuples()}


def gap_items(model, n: int, length: int, seed: int) -> list[PairItem]:
    """Random clean/corrupted ids; answer = the clean run's top token, wrong = the
    corrupted run's (so the logit-difference gap is positive on this random model)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = model.vocab_size
    clean = torch.randint(5, vocab, (n, length), generator=gen)
    corrupted = clean.clone()
    corrupted[:, : length // 2] = torch.randint(5, vocab, (n, length // 2), generator=gen)
    with torch.inference_mode():
        a = model.forward(clean, torch.ones_like(clean))[:, -1].argmax(-1)
        w = model.forward(corrupted, torch.ones_like(corrupted))[:, -1].argmax(-1)
    return [
        PairItem(tuple(c), tuple(x), int(ai), int(wi))
        for c, x, ai, wi in zip(clean.tolist(), corrupted.tolist(), a, w)
        if ai != wi
    ]
