"""Metrics of a pruned embedding model, read from its last hidden states through its sentence
embedding (the model's own sentence-transformers pipeline: Pooling, Dense, Normalize, prompt;
:func:`~headscope.probes.embedding.sentence_embedding`; a folder without ``modules.json``: mean
over real tokens, L2-normalised): :class:`EmbeddingCosine` (cosine to the unpruned model's
embedding) and :class:`ParaphraseAccuracy`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from headscope.analyses.metrics import METRICS, paraphrase_hits, unit_cosine
from headscope.analyses.pruning.metric_base import ItemMetric, Unit, input_device, tile, tokenize_all
from headscope.probes.embedding import pipeline_of, prompt_length, sentence_embedding
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.tokens import collate, pad_id


class _Embedding:
    """The sentence embedding an embedding metric reads: the model's pipeline and prompt."""

    def _setup_embedding(self, model, prompt: str | None) -> None:
        if model.spec.causal:  # the pruning forwards return a causal model's logits
            raise ModelIncompatibleError(
                f"{self.name} reads a sentence embedding from the last hidden states; {model.spec.name!r} runs causal "
                "attention and its forward returns logits: embedding metrics are scored on bidirectional models only"
            )
        self.pipeline = pipeline_of(model)
        self.prompt = self.pipeline.prompt(prompt)
        self.prompt_tokens = prompt_length(model.tokenizer, self.prompt)

    def _texts(self, texts):
        return [(self.prompt or "") + t for t in texts]

    def _embed(self, out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``out [rows, pos, d_model]`` -> the pipeline's embedding ``[rows, d]``."""
        return sentence_embedding(out, mask, self.pipeline, prompt_tokens=self.prompt_tokens, normalize=True)


class EmbeddingCosine(_Embedding, ItemMetric):
    """Mean cosine of each sentence's embedding to the unpruned model's (``reference``,
    computed at construction with every head on unless given).

    The loss cannot be ``1 - cosine``: at the unpruned point cosine is at its maximum and
    the gradient is exactly zero. It is instead the cross-entropy of retrieving each
    sentence's own unpruned embedding among the unit's unpruned embeddings
    (``softmax(cos(e_i, ref_j) / temperature)``, target ``j = i``): zero-gradient-free,
    differentiable, and low exactly when embeddings stay where they were. A one-sentence
    unit (per-example gradients, or a last batch of one) would make that a softmax over
    one logit, the constant 0 with zero gradient; such a unit retrieves its sentence among
    the unpruned embeddings of all the metric's sentences instead (with a single sentence
    in all, the loss is constant and :meth:`loss` raises). ``temperature`` (default 0.2)
    keeps the softmax from saturating, where the gate gradients would vanish.
    """

    registered = METRICS["cosine_to_unpruned"]
    name, higher_is_better, family = registered.name, registered.higher_is_better, registered.model

    def __init__(
        self,
        model,
        texts: Sequence[str],
        *,
        batch_size: int = 32,
        temperature: float = 0.2,
        reference: torch.Tensor | None = None,
        prompt: str | None = None,
    ):
        super().__init__(batch_size)
        self.check_model(model)
        self._setup_embedding(model, prompt)
        self.temperature = temperature
        self.toks = tokenize_all(model.tokenizer, texts=self._texts(texts), max_positions=model.spec.max_positions)
        self.n_items = len(self.toks)
        self.pad = pad_id(model.tokenizer)
        self.reference = None
        self.device = input_device(model)  # units built where the model takes its inputs
        self.units = self.make_units()
        if reference is None:
            with torch.inference_mode():
                for u in self.units:
                    out = model.forward(u.batch.input_ids, u.batch.attention_mask)
                    emb = self._embed(out, u.batch.attention_mask)  # [rows, d]: d_model, or a Dense layer's width
                    if reference is None:
                        reference = torch.zeros(self.n_items, emb.shape[-1], device=self.device, dtype=emb.dtype)
                    reference[u.items] = emb
        self.reference = reference.to(self.device).clone()
        self.units = self.make_units()

    def _lengths(self):
        return [len(t["ids"]) for t in self.toks]

    def _prepare(self, item_ids):
        extra = {} if self.reference is None else {"ref": self.reference[item_ids]}
        return Unit(collate([self.toks[i] for i in item_ids], self.pad), list(item_ids), extra)

    def item_values(self, out, unit):
        r = out.shape[0] // unit.rows
        emb = self._embed(out, tile(unit.batch.attention_mask, r)).view(r, unit.rows, -1)
        return unit_cosine(emb, unit.extra["ref"][None]), torch.ones(unit.rows, device=emb.device)

    def loss(self, out, unit):
        emb = self._embed(out, unit.batch.attention_mask)  # [rows, d]
        if unit.rows > 1:  # among the unit's sentences
            logits = emb @ unit.extra["ref"].to(emb.dtype).T / self.temperature  # [rows, rows]
            return F.cross_entropy(logits, torch.arange(unit.rows, device=logits.device))
        if self.n_items < 2:
            raise ValueError(
                f"{self.name}'s loss retrieves each sentence among the unpruned embeddings of the other "
                f"sentences; with {self.n_items} sentence it is constant (zero gradient). "
                "Give the metric at least 2 texts."
            )
        logits = emb @ self.reference.to(emb.dtype).T / self.temperature  # [1, n_items]
        return F.cross_entropy(logits, torch.tensor(unit.items, device=logits.device))


class ParaphraseAccuracy(_Embedding, ItemMetric):
    """Share of items whose anchor is closer (cosine) to its paraphrase than to every
    distractor. Items: dicts with ``anchor``, ``positive``, ``negatives`` (list of str).

    Loss: cross-entropy of the positive among ``[positive] + negatives`` with logits
    ``cos / temperature`` (sentence-transformers' MultipleNegativesRankingLoss with hard
    negatives, scale 20).
    """

    registered = METRICS["paraphrase_accuracy"]
    name, higher_is_better, family = registered.name, registered.higher_is_better, registered.model

    def __init__(
        self, model, items: Sequence[dict], *, batch_size: int = 8, temperature: float = 0.05, prompt: str | None = None
    ):
        super().__init__(batch_size)
        self.check_model(model)
        self._setup_embedding(model, prompt)
        self.temperature = temperature
        self.items = list(items)
        self.n_items = len(self.items)
        self.pad = pad_id(model.tokenizer)
        self.toks = []
        for i, it in enumerate(self.items):
            negs = list(it.get("negatives") or [])
            if not isinstance(it.get("anchor"), str) or not isinstance(it.get("positive"), str) or not negs:
                raise ValueError(
                    f"paraphrase item {i} needs 'anchor', 'positive' (str) and a non-empty 'negatives' list"
                )
            self.toks.append(
                tokenize_all(
                    model.tokenizer,
                    texts=self._texts([it["anchor"], it["positive"], *negs]),
                    max_positions=model.spec.max_positions,
                )
            )
        self.device = input_device(model)  # units built where the model takes its inputs
        self.units = self.make_units()

    def _lengths(self):
        return [max(len(t["ids"]) for t in ts) for ts in self.toks]

    def _prepare(self, item_ids):
        flat = []
        n_neg = max(len(self.toks[i]) - 2 for i in item_ids)
        index = torch.zeros(len(item_ids), 2 + n_neg, dtype=torch.long)
        valid = torch.zeros(len(item_ids), n_neg, dtype=torch.bool)
        for k, i in enumerate(item_ids):
            for j, t in enumerate(self.toks[i]):
                index[k, j] = len(flat)
                flat.append(t)
            valid[k, : len(self.toks[i]) - 2] = True
        return Unit(collate(flat, self.pad), list(item_ids), {"index": index, "valid": valid})

    def _emb(self, out, unit):
        r = out.shape[0] // unit.rows
        emb = self._embed(out, tile(unit.batch.attention_mask, r)).view(r, unit.rows, -1)
        return emb[:, unit.extra["index"]]  # [R, item, 2 + n_neg, d]

    def item_values(self, out, unit):
        e = self._emb(out, unit)
        hits = torch.stack([paraphrase_hits(x[:, 0], x[:, 1], x[:, 2:], unit.extra["valid"]) for x in e])
        return hits, torch.ones(len(unit.items), device=hits.device)

    def loss(self, out, unit):
        e = self._emb(out, unit)[0]
        sims = torch.einsum("id,ijd->ij", e[:, 0], e[:, 1:]) / self.temperature
        sims = torch.cat([sims[:, :1], sims[:, 1:].masked_fill(~unit.extra["valid"], -math.inf)], dim=1)
        return F.cross_entropy(sims, torch.zeros(len(unit.items), dtype=torch.long, device=sims.device))
