"""Pruning's metrics by name: :func:`build_metric` (a metric on its shipped data),
:func:`default_metric`, and :data:`METRICS`, pruning's view of the one registry.

Every metric is an :class:`ItemMetric`, and pruning code uses nothing else:
:meth:`ItemMetric.score` gives per-item ``values [R, n_items]`` and ``weights [n_items]``
under ``R`` head masks; :meth:`ItemMetric.aggregate` reduces them (item-weighted mean,
then ``finalize``: ``exp`` for perplexity); :meth:`ItemMetric.loss` is the differentiable
loss gradient importance uses (:mod:`headscope.analyses.pruning.importance`), where
``differentiable`` is True; ``has_corpus`` says whether its ``units`` hold tokens (the
corpus mean ablation averages over).

The metrics scored from the model's output tokenise their items once into :class:`Unit`
batches; :meth:`ItemMetric.item_values` turns the model's output for a unit — possibly
``R`` replicas of the unit stacked along the batch dimension, each run with a different
head mask (:func:`headscope.analyses.pruning.scoring.replicated_scores`) — into one
value per replica and item. :class:`CallableMetric` wraps any ``metric_fn(model) ->
float`` as a one-item, non-differentiable metric without a corpus, scored with the
model's gates set to each mask.

What each metric is (its definition, which direction is better, what it reads, the pure
function it is made of) is registered once, in :data:`headscope.analyses.metrics.METRICS`;
pruning scores those whose ``analysis`` is ``"pruning"`` (:func:`~headscope.analyses.metrics.metrics_for`).
Sentence embeddings are the model's own sentence-transformers pipeline (its Pooling, Dense and
Normalize modules: :mod:`headscope.probes.embedding`); a folder without ``modules.json``: the mean
of the last hidden states over real tokens, L2-normalised (all-MiniLM-L6-v2's recipe).

The interface lives in :mod:`~headscope.analyses.pruning.metric_base`, the metrics in
:mod:`~headscope.analyses.pruning.decoder_metrics` and
:mod:`~headscope.analyses.pruning.encoder_metrics`, and are importable from here.

>>> sorted(METRICS) == sorted(("lm_loss", "perplexity", "coref_accuracy", "cosine_to_unpruned", "paraphrase_accuracy"))
True
"""

from __future__ import annotations

from headscope.analyses.metrics import get_metric, metrics_for
from headscope.analyses.pruning.decoder_metrics import CorefAccuracy, LMLoss
from headscope.analyses.pruning.encoder_metrics import EmbeddingCosine, ParaphraseAccuracy
from headscope.analyses.pruning.metric_base import CallableMetric, ItemMetric, Unit, check_kind, purpose_for

__all__ = [
    "METRICS",
    "CallableMetric",
    "CorefAccuracy",
    "EmbeddingCosine",
    "ItemMetric",
    "LMLoss",
    "ParaphraseAccuracy",
    "Unit",
    "build_metric",
    "check_kind",
    "default_metric",
    "metric_notes",
    "purpose_for",
    "read_lines",
    "read_paraphrases",
]


def read_lines(path) -> list[str]:
    from headscope.probes.corpora import read_text

    return list(read_text(path).lines)


def read_paraphrases(path) -> list[dict]:
    """Items of a paraphrase JSONL file (``anchor``, ``positive``, ``negatives``)."""
    import json

    from headscope.probes.errors import InputFileError

    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputFileError(path, n, e.colno, f"invalid JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                raise InputFileError(path, n, 1, "each line must be a JSON object")
            out.append(obj)
    return out


def _take(seq, n_items):
    return list(seq) if n_items is None else list(seq)[:n_items]


def build_metric(
    name: str, model, *, n_items: int | None = None, batch_size: int | None = None, prompt: str | None = None, **kw
):
    """A metric by name on its shipped data (``data/heldout/lm_text.txt``,
    ``data/coref/coref.jsonl``, ``data/paraphrase/pairs.jsonl``), first ``n_items`` items;
    ``prompt``: the name of one of an embedding model's prompts (None: its default prompt, if any).

    >>> build_metric("bleu", None)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ValueError: unknown metric 'bleu'; valid metrics: ...
    """
    from headscope.data import path

    get_metric(name, "pruning")  # ValueError listing pruning's metrics
    bs = {} if batch_size is None else {"batch_size": batch_size}
    if name in ("lm_loss", "perplexity"):
        return LMLoss(
            model, _take(read_lines(path("heldout/lm_text.txt")), n_items), perplexity=name == "perplexity", **bs, **kw
        )
    if name == "coref_accuracy":
        from headscope.probes.corpora import read_coref

        m = CorefAccuracy(model, read_coref(path("coref/coref.jsonl")).items, **bs, **kw)
        if n_items is not None and n_items < m.n_items:
            m = CorefAccuracy(model, m.items[:n_items], kinds=None, scoring=m.scoring, **bs)
        return m
    if name == "cosine_to_unpruned":
        return EmbeddingCosine(
            model, _take(read_lines(path("heldout/lm_text.txt")), n_items), prompt=prompt, **bs, **kw
        )
    return ParaphraseAccuracy(
        model, _take(read_paraphrases(path("paraphrase/pairs.jsonl")), n_items), prompt=prompt, **bs, **kw
    )


#: pruning's view of the one registry (:func:`~headscope.analyses.metrics.metrics_for`):
#: metric name -> the kind of model it reads (``"decoder"``: logits; ``"encoder"``: hidden
#: states), in registry order; the CLI's ``--metric`` choices and the configs' checks read it
METRICS = {name: m.model for name, m in metrics_for("pruning").items()}


def default_metric(model) -> str:
    """``lm_loss`` for a language model, ``cosine_to_unpruned`` for an embedding model: what
    ``model`` is for, decided once at load (:func:`~headscope.analyses.pruning.metric_base.purpose_for`:
    a loaded model, its :class:`~headscope.probes.models.purpose.Purpose`, or a shape planned
    before loading)."""
    return "lm_loss" if purpose_for(model).kind == "lm" else "cosine_to_unpruned"


def metric_notes(model, name: str, base_value: float | None) -> dict:
    """The pruning summary's words about metric ``name`` on ``model``: ``measures`` (its registry
    definition; for an embedding metric, the model's pipeline in words) and, where an LM metric's
    unpruned ``base_value`` is worse than uniform over the vocabulary, ``caveat``
    (:func:`~headscope.analyses.metrics.uniform_caveat`)."""
    from headscope.analyses.metrics import METRICS as REGISTRY
    from headscope.analyses.metrics import uniform_caveat
    from headscope.probes.embedding import pipeline_of

    registered = REGISTRY.get(name)
    if registered is None:  # a CallableMetric: the caller's function
        return {}
    out = {"measures": registered.definition}
    if registered.reads == "embedding":
        out["measures"] += f"; embedding: {pipeline_of(model).describe()}"
    vocab = getattr(model, "vocab_size", None)
    caveat = None if base_value is None else uniform_caveat(name, base_value, vocab)
    if caveat is not None:
        out["caveat"] = caveat
    return out
