"""The metrics of headscope: pure functions, and the one registry pruning and patching look up.

Every metric is a pure function (tensors in, new tensors out; no model access, no write into
its inputs, float32 accumulation, float64 kept for float64 inputs) registered once in
:data:`METRICS` as a :class:`Metric`: its name, its definition in words, which direction is
better, what it reads from the model's output (:data:`READS`), the kind of model it applies to
(``"decoder"``: a causal LM's logits; ``"encoder"``: its last hidden states) and the analysis
that scores it (``"pruning"``: a study of removed heads, per item then aggregated;
``"patching"``: per item of a minimal pair, clean vs corrupted).

=======================  ========  =========  =================  ===============================================
name                     analysis  better     reads              per item
=======================  ========  =========  =================  ===============================================
``lm_loss``              pruning   lower      ``logits``         mean next-token NLL of a text (weight: its
                                                                 predicted tokens, so the aggregate is the token
                                                                 mean)
``perplexity``           pruning   lower      ``logits``         as ``lm_loss``; reported ``exp`` of the mean
``coref_accuracy``       pruning   higher     ``logits``         1 when the gold candidate's substituted sentence
                                                                 has the highest summed log-probability
``cosine_to_unpruned``   pruning   higher     ``embedding``      cosine of the sentence embedding (the model's own
                                                                 pipeline) to the unpruned model's
``paraphrase_accuracy``  pruning   higher     ``embedding``      1 when the anchor is closer to its paraphrase than
                                                                 to every distractor
``logprob``              patching  higher     ``logits_last``    ``log p(answer)`` at the last position
``logit_diff``           patching  higher     ``logits_last``    ``logit(answer) - logit(wrong)`` at the last position
``greater_than``         patching  higher     ``logits_last``    ``P(YY' > YY) - P(YY' <= YY)`` over two-digit tokens
``greater_than_tens``    patching  higher     ``logits_last``    ``P(tens > Y) - P(tens < Y)`` over digit tokens
``embedding_cosine``     patching  higher     ``embedding``      cosine of the sentence embedding (pooling, Dense)
                                                                 to the clean run's
=======================  ========  =========  =================  ===============================================

``cosine_to_unpruned`` and ``embedding_cosine`` are both cosines of pooled embeddings but not
the same computation: the first L2-normalises each sentence-transformers embedding and takes
the dot product (:func:`unit_cosine`), the second is :func:`torch.nn.functional.cosine_similarity`
of unnormalised pools; each keeps its own numbers.

Pruning builds the stateful scorer of a metric (its data, batches and loss) by name
(:func:`headscope.analyses.pruning.metrics.build_metric`); patching reads the function
(:func:`headscope.analyses.patching.tasks.metric_fn`). :func:`metrics_for` is what each analysis
(and its CLI choices) iterates; :func:`get_metric` raises listing the valid names.

>>> [m.name for m in metrics_for("patching").values()]
['logprob', 'logit_diff', 'greater_than', 'greater_than_tens', 'embedding_cosine']
>>> get_metric("lm_loss").higher_is_better, get_metric("lm_loss").reads
(False, 'logits')
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from headscope.probes.budget import LOGP_CHUNK_BYTES
from headscope.probes.shapes import Float, Shaped, Tensor, TokenIds

# ----------------------------------------------------------------------------- shapes
# the style guide's vocabulary (headscope.probes.shapes), plus ``vocab``, ``item`` (one scored
# item: a text, a coreference item, a paraphrase set), ``cand`` and ``neg`` (an item's candidates
# and distractors), and ``*replica`` (any leading replica dimensions: R head masks)

#: next-token logits at every position
Logits = Float[Tensor, "batch pos vocab"]
#: next-token logits at the last position
LastLogits = Float[Tensor, "batch vocab"]
#: 1 on a real token, 0 on padding (any integer or bool dtype)
TokenMask = Shaped[Tensor, "batch pos"]
#: one value per row of a batch
PerRow = Float[Tensor, "batch"]
#: one value per item, under any leading replica dimensions
PerItem = Float[Tensor, "*replica item"]
#: last hidden states
Hidden = Float[Tensor, "batch pos d_model"]
#: a pooled last hidden state per row
Pooled = Float[Tensor, "batch d_model"]
#: unit-norm sentence embeddings per item, under any leading replica dimensions
Embeddings = Float[Tensor, "*replica item d_model"]
#: the logits at the positions a metric scores, one row each
ScoredLogits = Float[Tensor, "n_scored vocab"]
#: one token id per row (an answer, a wrong token)
RowIds = Shaped[Tensor, "batch"]
#: a row's candidate token ids in numeric order (greater-than: "00" … "99" or "0" … "9")
Candidates = Shaped[Tensor, "batch n_cand"]
#: one weight per item
ItemWeights = Float[Tensor, "item"]
#: a candidate's summed log-probability per item (``-inf`` where an item has fewer)
CandidateLogp = Float[Tensor, "*replica item cand"]
#: the index of each item's gold candidate
Gold = Shaped[Tensor, "*replica item"]
#: one unit-norm embedding per item
ItemEmbedding = Float[Tensor, "item d_model"]
#: an item's distractor embeddings, and which are real (not padding)
Negatives = Float[Tensor, "item neg d_model"]
NegativesValid = Shaped[Tensor, "item neg"]
#: the reported value under each replica
Reported = Float[Tensor, "*replica"]

# ----------------------------------------------------------------------------- pure functions


def token_nll(
    logits: Logits, input_ids: TokenIds, attention_mask: TokenMask, score_mask: TokenMask | None = None
) -> tuple[PerRow, PerRow]:
    """Summed next-token negative log-likelihood per row and the number of tokens scored.

    ``logits [batch, pos, vocab]`` predict ``input_ids[:, 1:]``; a target counts when it
    is a real token (``attention_mask``) and, if given, ``score_mask [batch, pos]`` is
    True at the target's position. Returns ``(nll_sum [batch], n_scored [batch])`` in float32
    (float64 for float64 logits). ``ValueError`` when the shapes disagree.

    >>> logits = torch.zeros(1, 3, 4)                      # uniform over 4 tokens
    >>> nll, n = token_nll(logits, torch.tensor([[0, 1, 2]]), torch.tensor([[1, 1, 1]]))
    >>> round(float(nll[0] / n[0]), 4), int(n[0])       # log 4, two predicted tokens
    (1.3863, 2)
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"logits must be [batch, pos, vocab] matching input_ids {tuple(input_ids.shape)}; got {tuple(logits.shape)}"
        )
    target = input_ids[:, 1:]
    tok = -_target_logp(logits[:, :-1], target)  # [batch, pos-1]
    keep = attention_mask[:, 1:].bool()
    if score_mask is not None:
        keep = keep & score_mask[:, 1:].bool()
    keep_f = keep.to(tok.dtype)
    return (tok * keep_f).sum(-1), keep_f.sum(-1)


def _target_logp(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits [..., vocab])[..., target]`` -> ``target``'s shape (float32, float64 for
    float64 logits), computed over chunks of :data:`~headscope.probes.budget.LOGP_CHUNK_BYTES` along the first dimension:
    the same values, bit for bit, as one log-softmax over every row (it is row-wise), without a
    second copy of all the logits."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    per_row = max(1, math.prod(logits.shape[1:]) * 4)
    step = max(1, LOGP_CHUNK_BYTES // per_row)
    parts = [
        F.log_softmax(logits[i : i + step].to(dtype), dim=-1).gather(-1, target[i : i + step, ..., None])[..., 0]
        for i in range(0, logits.shape[0], step)
    ]
    return torch.cat(parts) if parts else torch.zeros(target.shape, dtype=dtype, device=logits.device)


def token_nll_at(logits: ScoredLogits, input_ids: TokenIds, attention_mask: TokenMask) -> tuple[PerRow, PerRow]:
    """:func:`token_nll` from the logits at the scored positions only: ``logits [n, vocab]``
    are the rows, in row-major order, of the positions ``p < pos - 1`` whose target
    ``input_ids[:, p + 1]`` is a real token (:meth:`LMLoss.read_positions`). Same values,
    bit for bit: each scored token's log-probability is computed alike and the sums run
    over the same ``[batch, pos - 1]`` grid (zeros where nothing is scored).

    >>> logits = torch.zeros(1, 3, 4)
    >>> ids, am = torch.tensor([[0, 1, 2]]), torch.tensor([[1, 1, 1]])
    >>> [torch.equal(a, b) for a, b in zip(token_nll_at(logits[0, :2], ids, am), token_nll(logits, ids, am))]
    [True, True]
    """
    keep = attention_mask[:, 1:].bool()
    if logits.dim() != 2 or logits.shape[0] != int(keep.sum()):
        raise ValueError(f"logits must be [{int(keep.sum())} scored positions, vocab]; got {tuple(logits.shape)}")
    scored = -_target_logp(logits, input_ids[:, 1:][keep])
    tok = torch.zeros(keep.shape, dtype=scored.dtype, device=scored.device).masked_scatter(keep, scored)
    keep_f = keep.to(scored.dtype)
    return (tok * keep_f).sum(-1), keep_f.sum(-1)


def nll_per_token(nll_sum: PerItem, n_scored: ItemWeights) -> PerItem:
    """``nll_sum [...]`` / ``n_scored [...]`` (at least 1): a text's mean next-token NLL.

    >>> nll_per_token(torch.tensor([3.0, 0.0]), torch.tensor([2.0, 0.0])).tolist()
    [1.5, 0.0]
    """
    return nll_sum / n_scored.clamp(min=1)


def lm_loss(logits: Logits, input_ids: TokenIds, attention_mask: TokenMask) -> tuple[PerRow, PerRow]:
    """Per-text mean next-token NLL ``[batch]`` and its weight, the predicted tokens ``[batch]``,
    from ``logits [batch, pos, vocab]`` (:func:`token_nll`, :func:`nll_per_token`).

    >>> v, w = lm_loss(torch.zeros(1, 3, 4), torch.tensor([[0, 1, 2]]), torch.tensor([[1, 1, 1]]))
    >>> round(float(v[0]), 4), float(w[0])                # log 4 over 2 predicted tokens
    (1.3863, 2.0)
    """
    s, n = token_nll(logits, input_ids, attention_mask)
    return nll_per_token(s, n), n


def candidate_hits(cand_logp: CandidateLogp, gold: Gold) -> PerItem:
    """``cand_logp [..., item, cand]`` (a candidate's summed log-probability; ``-inf`` where an
    item has fewer candidates), ``gold [item]`` -> ``[..., item]`` float, 1.0 where the gold
    candidate scores highest (the first on a tie).

    >>> candidate_hits(torch.tensor([[-1.0, -3.0], [-4.0, -2.0]]), torch.tensor([0, 0])).tolist()
    [1.0, 0.0]
    """
    return (cand_logp.argmax(-1) == gold).float()


def mean_pool(hidden: Hidden, attention_mask: TokenMask, normalize: bool = True) -> Pooled:
    """``hidden [batch, pos, d_model]`` -> ``[batch, d_model]``: mean over real tokens
    (sentence-transformers' pooling), then L2-normalised when ``normalize``.

    >>> mean_pool(torch.tensor([[[3.0, 0.0], [0.0, 4.0], [9.0, 9.0]]]), torch.tensor([[1, 1, 0]])).tolist()
    [[0.6000000238418579, 0.800000011920929]]
    """
    m = attention_mask.to(hidden.dtype)[..., None]
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled


def unit_cosine(emb: Embeddings, reference: Embeddings) -> PerItem:
    """Cosine of unit-norm embeddings ``emb [..., item, d_model]`` to ``reference [..., item,
    d_model]`` (broadcast; cast to ``emb``'s dtype): their dot product -> ``[..., item]``.

    >>> unit_cosine(torch.tensor([[0.6, 0.8]]), torch.tensor([[1.0, 0.0]])).tolist()
    [0.6000000238418579]
    """
    return (emb * reference.to(emb.dtype)).sum(-1)


def paraphrase_hits(
    anchor: ItemEmbedding, positive: ItemEmbedding, negatives: Negatives, neg_valid: NegativesValid
) -> PerItem:
    """Unit-norm embeddings ``anchor, positive [item, d]``, ``negatives [item, n_neg, d]``
    (``neg_valid [item, n_neg]`` False on padding) -> ``[item]`` float 1.0 where
    ``cos(anchor, positive)`` beats every valid negative.

    >>> a = torch.tensor([[1.0, 0.0]])
    >>> paraphrase_hits(a, a, torch.tensor([[[0.0, 1.0]]]), torch.tensor([[True]])).tolist()
    [1.0]
    """
    pos = (anchor * positive).sum(-1)
    neg = torch.einsum("id,ind->in", anchor, negatives).masked_fill(~neg_valid, -math.inf)
    return (pos > neg.max(-1).values).float()


def weighted_mean(values: PerItem, weights: ItemWeights) -> Reported:
    """``values [..., item]``, ``weights [item]`` -> ``[...]`` weighted mean over items.

    >>> weighted_mean(torch.tensor([1.0, 4.0]), torch.tensor([3.0, 1.0])).item()
    1.75
    """
    w = weights.to(values.dtype)
    return (values * w).sum(-1) / w.sum().clamp(min=1e-12)


def logprob_metric(logits: LastLogits, answer: RowIds, wrong: RowIds | None = None) -> PerRow:
    """``log p(answer)``: ``logits [batch, vocab]`` (the last position), ``answer [batch]`` -> ``[batch]`` (float32).

    >>> logprob_metric(torch.tensor([[0.0, 0.0]]), torch.tensor([1])).tolist()
    [-0.6931471824645996]
    """
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, answer.to(logits.device)[:, None])[:, 0]


def logit_diff_metric(logits: LastLogits, answer: RowIds, wrong: RowIds | None = None) -> PerRow:
    """``logit(answer) - logit(wrong)``: ``[batch, vocab]``, ``[batch]``, ``[batch]`` -> ``[batch]`` (float32);
    ``ValueError`` without ``wrong``.

    >>> logit_diff_metric(torch.tensor([[1.0, 3.0]]), torch.tensor([1]), torch.tensor([0])).tolist()
    [2.0]
    """
    if wrong is None:
        raise ValueError("the logit_diff metric needs a wrong token per item; got none")
    lf = logits.float()
    answer, wrong = answer.to(lf.device), wrong.to(lf.device)
    return lf.gather(-1, answer[:, None])[:, 0] - lf.gather(-1, wrong[:, None])[:, 0]


def embedding_cosine_metric(pooled: Pooled, reference: Pooled, wrong: RowIds | None = None) -> PerRow:
    """Cosine similarity of ``pooled [batch, d]`` (a run's sentence embedding: the model's pooling
    and Dense layers) to ``reference [batch, d]`` (the clean run's) -> ``[batch]`` (float32).

    >>> embedding_cosine_metric(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[1.0, 0.0], [1.0, 0.0]])).tolist()
    [1.0, 0.7071067690849304]
    """
    return torch.nn.functional.cosine_similarity(pooled.float(), reference.to(pooled.device).float(), dim=-1)


def _ordered_probs(
    logits: LastLogits, answer: RowIds, candidates: Candidates | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p of each candidate [batch, n_cand] (float32), index of ``answer`` among its row's
    candidates [batch])``; ``ValueError`` without candidates or when an answer is not among them."""
    if candidates is None or candidates.dim() != 2:
        raise ValueError(
            "a greater-than metric needs the candidate ids [batch, n_cand] in numeric order as its third "
            f"argument; got {None if candidates is None else tuple(candidates.shape)}"
        )
    lf = logits.float()
    cand, answer = candidates.to(lf.device), answer.to(lf.device)
    hit = cand == answer[:, None]
    if not bool(hit.any(-1).all()):
        raise ValueError("every answer of a greater-than metric must be one of its row's candidates")
    return torch.softmax(lf, dim=-1).gather(-1, cand), hit.float().argmax(-1)


def greater_than_metric(logits: LastLogits, answer: RowIds, candidates: Candidates | None = None) -> PerRow:
    """Hanna et al. (2023)'s probability difference on a tokenizer with two-digit tokens:
    ``sum p(yy) for yy > YY - sum p(yy) for yy <= YY`` over the 100 candidates ``candidates
    [batch, 100]`` (the ids of ``"00"`` … ``"99"`` in numeric order), ``answer [batch]`` the id
    of the clean year's own ``YY`` (the threshold) -> ``[batch]`` (float32).

    >>> c = torch.tensor([[0, 1, 2]])                   # a 3-candidate toy: numbers 0, 1, 2
    >>> round(greater_than_metric(torch.log(torch.tensor([[0.2, 0.3, 0.5]])), torch.tensor([1]), c).item(), 4)
    0.0
    """
    p, idx = _ordered_probs(logits, answer, candidates)
    k = torch.arange(p.shape[-1], device=p.device)[None, :]
    return (p * (k > idx[:, None])).sum(-1) - (p * (k <= idx[:, None])).sum(-1)


def greater_than_tens_metric(logits: LastLogits, answer: RowIds, candidates: Candidates | None = None) -> PerRow:
    """Greater-than on a tokenizer that splits digits (no two-digit tokens): at the first digit
    of the answer, ``P(tens digit > Y) - P(tens digit < Y)``, ``Y`` the tens digit of the
    clean ``YY``; ``candidates [batch, 10]`` the ids of ``"0"`` … ``"9"``, ``answer [batch]``
    the id of ``Y`` -> ``[batch]`` (float32). A tens digit equal to ``Y`` counts on neither
    side: the ones digit that would decide it is not read.

    >>> c = torch.tensor([[0, 1, 2]])
    >>> round(greater_than_tens_metric(torch.log(torch.tensor([[0.2, 0.3, 0.5]])), torch.tensor([1]), c).item(), 4)
    0.3
    """
    p, idx = _ordered_probs(logits, answer, candidates)
    k = torch.arange(p.shape[-1], device=p.device)[None, :]
    return (p * (k > idx[:, None])).sum(-1) - (p * (k < idx[:, None])).sum(-1)


# ----------------------------------------------------------------------------- the registry

#: what a metric reads from the model's output
READS = {
    "logits": "next-token logits at the positions it scores ([batch, pos, vocab])",
    "logits_last": "next-token logits at the last position ([batch, vocab])",
    "embedding": "the sentence embedding of the last hidden states, through the model's own pipeline ([batch, d])",
}
#: the kind of model a metric applies to
MODELS = ("decoder", "encoder")
#: the analyses that score metrics
ANALYSES = ("pruning", "patching")


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One registered metric: ``fn`` the pure per-item function, ``definition`` what one item's
    value is, ``higher_is_better``, ``reads`` (:data:`READS`), ``model`` (:data:`MODELS`),
    ``analysis`` (:data:`ANALYSES`) and ``finalize``, applied to the item-weighted mean to give
    the reported value (identity but for perplexity's ``exp``). ``ValueError`` for an unknown
    ``reads``, ``model`` or ``analysis``."""

    name: str = ""
    fn: Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]] = _identity
    definition: str = ""
    higher_is_better: bool = True
    reads: str = "logits"
    model: str = "decoder"
    analysis: str = "pruning"
    finalize: Callable[[torch.Tensor], torch.Tensor] = _identity

    def __post_init__(self):
        for field_name, valid in (("reads", tuple(READS)), ("model", MODELS), ("analysis", ANALYSES)):
            if getattr(self, field_name) not in valid:
                raise ValueError(
                    f"The {field_name!r} parameter of Metric must be one of {valid}; "
                    f"got {getattr(self, field_name)!r} instead."
                )

    def aggregate(self, values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``values [..., item]``, ``weights [item]`` -> ``[...]``: the reported value,
        ``finalize`` of the :func:`weighted_mean`."""
        return self.finalize(weighted_mean(values, weights))


_DEFINED = (
    Metric(
        name="lm_loss",
        fn=lm_loss,
        definition="mean next-token cross-entropy of a text, weighted by its predicted tokens (so the aggregate "
        "is the token mean; padding never counts)",
        higher_is_better=False,
        reads="logits",
        model="decoder",
        analysis="pruning",
    ),
    Metric(
        name="perplexity",
        fn=lm_loss,
        definition="exp of lm_loss (the same items and weights; exp taken after the token mean)",
        higher_is_better=False,
        reads="logits",
        model="decoder",
        analysis="pruning",
        finalize=torch.exp,
    ),
    Metric(
        name="coref_accuracy",
        fn=candidate_hits,
        definition="1 when the gold antecedent, substituted for the pronoun, gives the sentence the highest "
        "log-probability (summed over the words after it), else 0",
        higher_is_better=True,
        reads="logits",
        model="decoder",
        analysis="pruning",
    ),
    Metric(
        name="cosine_to_unpruned",
        fn=unit_cosine,
        definition="cosine of each sentence's embedding (the model's own pooling, Dense and Normalize) to the "
        "unpruned model's",
        higher_is_better=True,
        reads="embedding",
        model="encoder",
        analysis="pruning",
    ),
    Metric(
        name="paraphrase_accuracy",
        fn=paraphrase_hits,
        definition="1 when the anchor's embedding (the model's own pooling, Dense and Normalize) is closer "
        "(cosine) to its paraphrase's than to every distractor's, else 0",
        higher_is_better=True,
        reads="embedding",
        model="encoder",
        analysis="pruning",
    ),
    Metric(
        name="logprob",
        fn=logprob_metric,
        definition="log p(answer) at the last position (next-token log-prob of the clean answer)",
        higher_is_better=True,
        reads="logits_last",
        model="decoder",
        analysis="patching",
    ),
    Metric(
        name="logit_diff",
        fn=logit_diff_metric,
        definition="logit(answer) - logit(wrong) at the last position (= log p(answer) - log p(wrong))",
        higher_is_better=True,
        reads="logits_last",
        model="decoder",
        analysis="patching",
    ),
    Metric(
        name="greater_than",
        fn=greater_than_metric,
        definition="P(two-digit answer > YY) - P(two-digit answer <= YY) at the last position (Hanna et al. "
        "2023; tokenizers with two-digit tokens)",
        higher_is_better=True,
        reads="logits_last",
        model="decoder",
        analysis="patching",
    ),
    Metric(
        name="greater_than_tens",
        fn=greater_than_tens_metric,
        definition="P(tens digit > Y) - P(tens digit < Y) at the last position, Y the tens digit of YY "
        "(greater-than on tokenizers that split digits)",
        higher_is_better=True,
        reads="logits_last",
        model="decoder",
        analysis="patching",
    ),
    Metric(
        name="embedding_cosine",
        fn=embedding_cosine_metric,
        definition="cosine similarity of the run's sentence embedding (the model's own pooling and Dense layers) "
        "to the clean run's (an embedding model predicts no tokens; clean = 1, corrupted < 1)",
        higher_is_better=True,
        reads="embedding",
        model="encoder",
        analysis="patching",
    ),
)

#: every metric, by name (the table of the module docstring)
METRICS: dict[str, Metric] = {m.name: m for m in _DEFINED}


def uniform_caveat(name: str, value: float, vocab_size: int | None) -> str | None:
    """The caveat of an LM metric whose unpruned ``value`` is worse than guessing uniformly over
    ``vocab_size`` tokens (``lm_loss`` > ln V, ``perplexity`` > V): the model does not predict
    tokens here, so a pruning curve of it measures nothing the model was trained for. None
    otherwise (another metric, an unknown vocabulary, a value within the uniform baseline).

    >>> uniform_caveat("lm_loss", 2.0, 4) is None, uniform_caveat("lm_loss", 1.0, 4)
    (False, None)
    """
    if name not in ("lm_loss", "perplexity") or not vocab_size or not math.isfinite(value):
        return None
    uniform = math.log(vocab_size) if name == "lm_loss" else float(vocab_size)
    if value <= uniform:
        return None
    return (
        f"the unpruned {name} ({value:.2f}) is worse than guessing uniformly over the {vocab_size:,}-token "
        f"vocabulary ({'ln V = ' if name == 'lm_loss' else 'V = '}{uniform:.2f}): the model does not predict tokens "
        "here, and its pruning curves measure a quantity it was never trained for"
    )


def get_metric(name: str, analysis: str | None = None) -> Metric:
    """The metric registered as ``name`` (scored by ``analysis`` when given); ``ValueError``
    listing the valid names otherwise.

    >>> get_metric("bleu")
    Traceback (most recent call last):
    ...
    ValueError: unknown metric 'bleu'; valid metrics: lm_loss, perplexity, coref_accuracy, cosine_to_unpruned, paraphrase_accuracy, logprob, logit_diff, greater_than, greater_than_tens, embedding_cosine
    """
    valid = METRICS if analysis is None else metrics_for(analysis)
    if name not in valid:
        raise ValueError(f"unknown metric {name!r}; valid metrics: {', '.join(valid)}")
    return valid[name]


def metrics_for(analysis: str, model: str | None = None) -> dict[str, Metric]:
    """``{name: Metric}`` of the metrics ``analysis`` scores (on ``model`` kind when given), in
    registry order; ``ValueError`` for an unknown analysis.

    >>> list(metrics_for("pruning", "encoder"))
    ['cosine_to_unpruned', 'paraphrase_accuracy']
    """
    if analysis not in ANALYSES:
        raise ValueError(f"analysis must be one of {ANALYSES}; got {analysis!r}")
    return {n: m for n, m in METRICS.items() if m.analysis == analysis and model in (None, m.model)}
