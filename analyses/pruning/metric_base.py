"""What every pruning metric is: :class:`ItemMetric` (scored per item, aggregated), the
forward batches it scores (:class:`Unit`), and :class:`CallableMetric`, any
``metric_fn(model) -> float`` as a metric of one item.

:meth:`ItemMetric.score` gives per-item ``values [R, n_items]`` and ``weights [n_items]``
under ``R`` head masks ``[R, layer, head]``; :meth:`ItemMetric.aggregate` reduces them
(item-weighted mean, then ``finalize``: ``exp`` for perplexity); :meth:`ItemMetric.loss`
is the differentiable loss gradient importance uses, where ``differentiable`` is True;
``has_corpus`` says whether its ``units`` hold tokens (the corpus mean ablation averages
over). The metrics themselves: :mod:`~headscope.analyses.pruning.decoder_metrics`,
:mod:`~headscope.analyses.pruning.encoder_metrics`; by name: :mod:`~headscope.analyses.pruning.metrics`;
their definitions, directions and pure functions: the one registry, :data:`headscope.analyses.metrics.METRICS`.

>>> from headscope.probes.models.purpose import decide_purpose
>>> check_kind("lm_loss", "decoder", decide_purpose(causal=False, encoder=True))
Traceback (most recent call last):
...
ValueError: metric 'lm_loss' scores next-token predictions: it needs a language model; the model is an embedding model (bidirectional attention (an encoder family)); metrics that apply: cosine_to_unpruned, paraphrase_accuracy
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from headscope.analyses.metrics import weighted_mean
from headscope.probes.capture import buckets
from headscope.probes.models.backends.protocol import batch_to
from headscope.probes.tokens import TokenBatch, tokenize_items


@dataclass
class Unit:
    """One forward batch of a metric: the tokens (rows may be several per item), which
    items it scores (``items``, global indices) and metric-specific tensors."""

    batch: TokenBatch
    items: list[int]
    extra: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.batch.input_ids.shape[0])


def unit_to(unit: Unit, device: torch.device) -> Unit:
    """``unit`` with its tokens and tensors on ``device`` (the same object when already there)."""
    if unit.batch.input_ids.device == device:
        return unit
    extra = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in unit.extra.items()}
    return Unit(batch_to(unit.batch, device), unit.items, extra)


def input_device(model) -> torch.device:
    """Where ``model`` takes its inputs (``model.input_device``, else ``model.device``, else the CPU)."""
    device = getattr(model, "input_device", None) or getattr(model, "device", None)
    return torch.device(device) if device is not None else torch.device("cpu")


def tile(t: torch.Tensor, r: int) -> torch.Tensor:
    """``t [rows, ...]`` repeated ``r`` times along dim 0 -> ``[r × rows, ...]`` (replicas stacked)."""
    return t.repeat(r, *([1] * (t.dim() - 1)))


class ItemMetric:
    """Base class of every metric a pruning study scores: per item, aggregated.

    Subclasses scored from the model's output set ``name``, ``higher_is_better``,
    ``family`` ("llama" or "bert"), ``n_items``, and implement ``_prepare(item_ids) -> Unit``,
    ``item_values`` and ``loss``; :meth:`score` runs them under head masks. A metric
    computed some other way overrides :meth:`score` (and sets ``differentiable`` /
    ``has_corpus`` to False when it has no loss / no tokens), as :class:`CallableMetric` does.
    """

    name: str = "metric"
    higher_is_better: bool = True
    #: the metric's entry in the one registry (:data:`headscope.analyses.metrics.METRICS`: its
    #: definition, direction and pure function); None for a :class:`CallableMetric`
    registered = None
    #: what the metric reads from the model's output: a causal LM's logits (``"decoder"``)
    #: or an encoder's last hidden states (``"encoder"``)
    family: str = "decoder"
    #: :meth:`loss` gives gate gradients (gradient importance, importance orders)
    differentiable: bool = True
    #: :attr:`units` hold the metric's tokens (mean ablation averages ``z`` over them)
    has_corpus: bool = True
    #: where the units' tensors live: the model's input device (:meth:`place`)
    device: torch.device = torch.device("cpu")

    def __init__(self, batch_size: int = 16):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        self.batch_size = batch_size
        self.units: list[Unit] = []

    # -- building units ----------------------------------------------------------------
    def _lengths(self) -> list[int]:
        raise NotImplementedError

    def _prepare(self, item_ids: list[int]) -> Unit:
        raise NotImplementedError

    def make_units(self, batch_size: int | None = None) -> list[Unit]:
        """Length-bucketed units of at most ``batch_size`` items (deterministic)."""
        return [unit_to(self._prepare(g), self.device) for g in buckets(self._lengths(), batch_size or self.batch_size)]

    def single_item_units(self) -> list[Unit]:
        """One unit per item (for per-example gradients)."""
        return [unit_to(self._prepare([i]), self.device) for i in range(self.n_items)]

    def place(self, model) -> ItemMetric:
        """Move the units (and any reference tensor) to where ``model`` takes its inputs;
        units built later are built there. A no-op when they are there already."""
        device = input_device(model)
        if device != self.device:
            self.device = device
            self.units = [unit_to(u, device) for u in self.units]
            if getattr(self, "reference", None) is not None:
                self.reference = self.reference.to(device)
        return self

    # -- scoring -----------------------------------------------------------------------
    def score(
        self, model, masks: torch.Tensor, *, ablation: torch.Tensor | None = None, max_rows: int = 64
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-item ``values [R, n_items]`` and ``weights [n_items]`` under each of
        ``masks [R, layer, head]`` (1 = kept; ``ablation [layer, head, d_head]`` replaces
        the masked heads' ``z``, default zeros): replicated forwards of every unit."""
        from headscope.analyses.pruning.scoring import replicated_scores

        return replicated_scores(model, self, masks, ablation=ablation, max_rows=max_rows)

    #: ``read_positions(unit) -> [rows, pos]`` bool, where a metric reads a decoder's logits
    #: at some positions only (see :meth:`LMLoss.read_positions`); None: it reads them all
    read_positions = None

    def item_values(self, out: torch.Tensor, unit: Unit) -> tuple[torch.Tensor, torch.Tensor]:
        """``out [R*rows, ...]`` (or ``[R*n_read, vocab]``, the logits at
        :attr:`read_positions`) -> ``(values [R, n_unit_items], weights [n_unit_items])``."""
        raise NotImplementedError

    def loss(self, out: torch.Tensor, unit: Unit) -> torch.Tensor:
        """Differentiable scalar loss of one unreplicated unit (lower is better)."""
        raise NotImplementedError

    def finalize(self, x: torch.Tensor) -> torch.Tensor:
        """Map the item-weighted mean to the reported value (identity by default)."""
        return x

    def aggregate(self, values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``values [R, item]``, ``weights [item]`` -> ``[R]`` reported metric."""
        return self.finalize(weighted_mean(values, weights))

    def check_model(self, model) -> None:
        check_kind(self.name, self.family, model)


def purpose_for(target):
    """The :class:`~headscope.probes.models.purpose.Purpose` of ``target``: itself, a loaded
    model's (:func:`~headscope.probes.models.purpose.purpose_of`, decided at load), or, for a
    shape or spec planned before any load (the memory plan), the rule on its attention alone."""
    from headscope.probes.models.purpose import Purpose, decide_purpose, purpose_of

    if isinstance(target, Purpose):
        return target
    if hasattr(target, "spec"):
        return purpose_of(target)
    return decide_purpose(causal=bool(target.causal), encoder=not target.causal, tied=True)


def check_kind(name: str, family: str, target) -> None:
    """``ValueError`` when metric ``name``, reading a ``family`` (``"decoder"``: an LM's
    logits; ``"encoder"``: a sentence embedding) output, does not apply to what ``target`` (a
    loaded model or its :class:`~headscope.probes.models.purpose.Purpose`) is for: one line
    saying why and naming the metrics that apply."""
    from headscope.analyses.metrics import metrics_for

    purpose = purpose_for(target)
    if purpose.metric_kind != family:
        what = (
            "scores next-token predictions: it needs a language model"
            if family == "decoder"
            else "compares sentence embeddings: it needs an embedding model"
        )
        spec = getattr(target, "spec", None)
        who = f"{spec.name!r}" if spec is not None else "the model"
        apply = ", ".join(metrics_for("pruning", purpose.metric_kind))
        raise ValueError(
            f"metric {name!r} {what}; {who} is {purpose.words} ({purpose.reason}); metrics that apply: {apply}"
        )


def tokenize_all(tokenizer, texts=None, words=None, max_positions=None, add_bos=False) -> list[dict]:
    seq = texts if texts is not None else words
    return tokenize_items(
        tokenizer, seq, words=texts is None, max_positions=max_positions, add_bos=add_bos, what="item"
    )


class CallableMetric(ItemMetric):
    """Any ``metric_fn(model) -> float`` (e.g. the accuracy of the best syntactic head from
    the roles pipeline) as a metric of one item: no spread, no gradient, no corpus.
    :meth:`score` sets the model's gates to each head mask and calls the function once
    per mask."""

    differentiable = False
    has_corpus = False

    def __init__(self, fn: Callable[[object], float], *, name: str = "custom", higher_is_better: bool = True):
        if not callable(fn):
            raise TypeError(f"metric_fn must be callable(model) -> float; got {type(fn).__name__}")
        super().__init__()
        self.fn, self.name, self.higher_is_better = fn, name, higher_is_better
        self.n_items = 1

    def score(self, model, masks, *, ablation=None, max_rows=64):
        """``values [R, 1]`` (the function's value under each mask), ``weights [1]``."""
        from headscope.analyses.pruning.gates import head_gates

        vals = []
        for m in masks:
            with head_gates(model, m, ablation=ablation):
                vals.append(float(self.fn(model)))
        return torch.tensor(vals, dtype=torch.float32)[:, None], torch.ones(1)

    def loss(self, out, unit):
        raise ValueError(f"{self.name!r} is a plain callable: it has no differentiable loss")

    def check_model(self, model) -> None:
        """Any model: the function decides what it needs."""
