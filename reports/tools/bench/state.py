"""What every bench path shares: the sentences, their batches, lazily loaded models, and
the shape of a prepared path.

A path is a function ``(bench: BenchState) -> Prepared`` (registered in
:data:`~headscope.reports.tools.bench.registry.PATHS`): it builds what it needs from the
shared state and returns the function that runs one timed pass, the function that warms
it up, its GFLOP per pass and a note. One that cannot run on this machine raises
:class:`PathSkipped`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch

from headscope.probes.capture import buckets
from headscope.probes.corpora.bench_sentences import corpus_sentences
from headscope.probes.tokens import collate, pad_id, tokenize_one
from headscope.reports.tools.bench.counts import linear_params, model_gflop
from headscope.reports.tools.bench.machine import bf16_support

if TYPE_CHECKING:
    from headscope.reports.tools.bench.config import BenchConfig

__all__ = ["MODEL_KINDS", "BenchState", "PathSkipped", "Prepared"]

#: the kinds of model :meth:`BenchState.model` loads
MODEL_KINDS = ("inhouse", "inhouse_bf16", "hf_sdpa", "hf_eager", "bridge")


class PathSkipped(Exception):
    """A path that cannot run here; the message becomes the row's note."""


class Prepared(NamedTuple):
    """A path ready to time: ``one_pass()`` runs it once over all its inputs (the timed
    call), ``warm()`` once on a little of them; ``gflop`` per pass (None: not counted);
    ``note`` for the row."""

    one_pass: Callable[[], object]
    warm: Callable[[], object]
    gflop: float | None
    note: str


Step = Callable[[torch.Tensor, torch.Tensor], object]  # (input_ids [batch, pos], attention_mask [batch, pos])


class BenchState:
    """Shared state of one bench run: the sentences (``cfg.corpus``), their token items
    (those longer than the model's context are counted in ``n_skipped`` and left out),
    length-bucketed batches (``batches``, and ``ids``: ``(input_ids, attention_mask)``,
    each ``[batch, pos]``, on ``device``), FLOP counts, and the models, loaded on first use."""

    def __init__(self, cfg: BenchConfig):
        from headscope.probes.models.checkpoints import resolve

        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
        self.source = resolve(cfg.model)
        self._models: dict = {}
        self.sentences = corpus_sentences(cfg.corpus, cfg.n_sentences, cfg.seed)
        inhouse = self.model("inhouse")
        tok = inhouse.tokenizer
        items, skipped = [], 0
        for s in self.sentences:
            it = tokenize_one(tok, text=s)
            if len(it["ids"]) > inhouse.spec.max_positions:
                skipped += 1
                continue
            items.append(it)
        if not items:
            raise ValueError("no sentence fits the model's context")
        self.lengths = [len(it["ids"]) for it in items]
        pad = pad_id(tok)
        self.groups = buckets(self.lengths, cfg.batch_size, None)
        self.batches = [collate([items[i] for i in g], pad) for g in self.groups]
        self.unsorted_groups = [
            list(range(i, min(i + cfg.batch_size, len(items)))) for i in range(0, len(items), cfg.batch_size)
        ]
        self.n_skipped = skipped
        self.spec = inhouse.spec
        self.linear = linear_params(inhouse.network)
        self.fwd_gflop = model_gflop(
            linear=self.linear, n_layers=self.spec.n_layers, d_model=self.spec.d_model, lengths=self.lengths
        )
        self.bf16 = bf16_support(self.device)
        self.ids = [(b.input_ids.to(self.device), b.attention_mask.to(self.device)) for b in self.batches]

    def model(self, kind: str):
        """The model of ``kind`` (:data:`MODEL_KINDS`) on the bench's device, loaded once."""
        if kind in self._models:
            return self._models[kind]
        from headscope.probes.models.backends.bridge import BridgeModel
        from headscope.probes.models.backends.hf import HFReference
        from headscope.probes.models.backends.inhouse import InHouseModel

        if kind == "inhouse":
            m = InHouseModel.from_source(self.source, dtype=self.dtype).to(self.device)
        elif kind == "inhouse_bf16":
            m = InHouseModel.from_source(self.source, dtype=torch.bfloat16).to(self.device)
        elif kind in ("hf_sdpa", "hf_eager"):
            m = HFReference.from_source(self.source, attn_implementation="sdpa" if kind == "hf_sdpa" else "eager")
            m.hf.to(device=self.device, dtype=self.dtype)
        elif kind == "bridge":
            m = BridgeModel.from_source(self.source)
            if self.device.type != "cpu":
                with contextlib.redirect_stdout(sys.stderr):  # the bridge's .to() prints "Moving model to device"
                    m.bridge.to(self.device)
        else:
            raise ValueError(f"unknown bench model kind {kind!r}; valid: {', '.join(MODEL_KINDS)}")
        self._models[kind] = m
        return m

    def over_batches(self, step: Step) -> tuple[Callable[[], None], Callable[[], None]]:
        """``(one_pass, warm)``: ``step(input_ids, attention_mask)`` over every batch, and
        over the first batch only."""

        def one_pass():
            for ids, mask in self.ids:
                step(ids, mask)

        def warm():
            step(*self.ids[0])

        return one_pass, warm

    def gflop_of(self, lengths: list[int]) -> float:
        """Forward GFLOP of the bench's in-house model over sequences of ``lengths`` real tokens."""
        return model_gflop(linear=self.linear, n_layers=self.spec.n_layers, d_model=self.spec.d_model, lengths=lengths)
