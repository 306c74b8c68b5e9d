"""What the chunked-pattern tests share (tests/probes/test_chunked.py,
tests/analyses/roles/test_chunked_roles.py): every in-house family's parity model
(tests/tiny_models.py PARITY), a padded batch with punctuation, special tokens and words,
a reducer that records the pieces it is handed, and a capture of Q and K in query chunks."""

from __future__ import annotations

import torch

from headscope.probes.capture import Capture, chunk_plan, feed, run_batch
from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.config import INHOUSE_MODEL_TYPES, config_from_arch
from headscope.probes.models.loading import InHouseModel
from headscope.probes.tokens import TokenBatch
from tests.tiny_models import PARITY, parity_hf_model

#: every in-house family, then the PARITY variants ("model_type:what")
CASES = [*INHOUSE_MODEL_TYPES, *(case for case in PARITY if ":" in case)]


def family_model(case: str) -> tuple[InHouseModel, bool]:
    """``(in-house model, encoder?)`` of a PARITY case, loaded as tests/probes/test_families.py loads it."""
    hf, encoder = parity_hf_model(case)
    cfg = config_from_arch(arch_from_hf_config(hf.config.to_dict(), case.split(":")[0]))
    return InHouseModel.from_hf_state(cfg, hf.state_dict(), None, name=case, where=case), encoder


LENGTHS = (20, 13, 7)
CHUNKS = (1, 7, 64)  # 64 > every length: one piece


def chunk_batch(vocab: int, pad: int, lengths=LENGTHS, *, encoder: bool = False) -> TokenBatch:
    """Right-padded random ids (item 0 repeats its first half, so induction and duplicate cells
    exist), text ``x,x,...`` (every second token punctuation), a special first token (and last,
    for an encoder), two tokens per word (special tokens in none)."""
    gen = torch.Generator().manual_seed(3)
    n = max(lengths)
    ids = torch.full((len(lengths), n), pad)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    texts, offsets, special, words, word_ids, tokens = [], [], [], [], [], []
    for i, length in enumerate(lengths):
        row = torch.randint(4, vocab, (length,), generator=gen)
        if i == 0:
            half = length // 2
            row[half : 2 * half] = row[:half]
        ids[i, :length], mask[i, :length] = row, 1
        texts.append("x," * length)
        offsets.append([(2 * j, 2 * j + 1) if j % 2 == 0 else (2 * j - 1, 2 * j) for j in range(length)])
        special.append([j == 0 or (encoder and j == length - 1) for j in range(length)])
        inner = [j for j in range(length) if not special[-1][j]]
        words.append(["w"] * ((len(inner) + 1) // 2))
        word_ids.append([None if special[-1][j] else (j - inner[0]) // 2 for j in range(length)])
        tokens.append(["t"] * length)
    return TokenBatch(
        input_ids=ids,
        attention_mask=mask,
        texts=texts,
        words=words,
        tokens=tokens,
        offsets=offsets,
        word_ids=word_ids,
        special=special,
        lengths=list(lengths),
    )


class PieceShapes:
    """A reducer that keeps only the shape of every piece it is handed."""

    def __init__(self):
        self.shapes = []

    def update(self, cap):
        feed(cap, [self])

    def begin(self, cap):
        pass

    def piece(self, cap, piece):
        self.shapes.append((piece.layer, piece.start, piece.stop, tuple(piece.pattern.shape)))

    def end(self, cap):
        pass

    def merge(self, other):
        return self

    def result(self):
        return self.shapes


def chunked_capture(model, batch, chunk: int, reducers=()) -> Capture:
    """``batch`` run with Q and K captured in place of patterns, pieces of ``chunk`` rows."""
    qs, src = chunk_plan(model, list(reducers) or [PieceShapes()], ("pattern",), chunk)
    assert src is not None
    data = run_batch(model, batch, [*qs, "output"], None, src)  # the logits too: the tests compare them
    ids = list(range(batch.input_ids.shape[0]))
    return Capture(
        tokens=batch, data=data, layers=tuple(range(model.spec.n_layers)), spec=model.spec, item_ids=ids, chunks=src
    )


def stored_capture(model, batch) -> Capture:
    """``batch`` run with every layer's pattern stored (the materialised path)."""
    data = model.run(batch, ["pattern"])
    ids = list(range(batch.input_ids.shape[0]))
    return Capture(tokens=batch, data=data, layers=tuple(range(model.spec.n_layers)), spec=model.spec, item_ids=ids)
