"""Metrics of what a (partly pruned) model still does, scored per item.

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
head mask (:func:`headscope.analyses.pruning.ablation.replicated_scores`) — into one
value per replica and item. :class:`CallableMetric` wraps any ``metric_fn(model) ->
float`` as a one-item, non-differentiable metric without a corpus, scored with the
model's gates set to each mask.

=========================  =======  ===============================================================
name                       better   per item / aggregate
=========================  =======  ===============================================================
``lm_loss``                lower    mean next-token cross-entropy of a text, weighted by its
                                    predicted tokens (so the aggregate is the token mean; padding
                                    never counts)
``perplexity``             lower    same items, aggregate ``exp(lm_loss)``
``coref_accuracy``         higher   1 when the gold antecedent, substituted for the pronoun, gives
                                    the sentence the highest log-probability (see :class:`CorefAccuracy`)
``cosine_to_unpruned``     higher   cosine of the sentence embedding to the unpruned model's
``paraphrase_accuracy``    higher   1 when the anchor is closer to its paraphrase than to every
                                    distractor
=========================  =======  ===============================================================

Sentence embeddings are sentence-transformers' ``all-MiniLM-L6-v2`` recipe: mean of
the last hidden states over real tokens (attention-mask weighted), L2-normalised.

The pure functions (:func:`token_nll`, :func:`mean_pool`, :func:`paraphrase_hits`,
:func:`weighted_mean`) take tensors and return new tensors; they never write into
their inputs.

>>> import torch
>>> logits = torch.zeros(1, 3, 4)                      # uniform over 4 tokens
>>> nll, n = token_nll(logits, torch.tensor([[0, 1, 2]]), torch.tensor([[1, 1, 1]]))
>>> round(float(nll[0] / n[0]), 4), int(n[0])       # log 4, two predicted tokens
(1.3863, 2)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from headscope.probes.capture import buckets
from headscope.probes.models.backend import batch_to
from headscope.probes.tokens import TokenBatch, collate, pad_id, tokenize_items, tokenize_one

# ----------------------------------------------------------------------------- pure math


def token_nll(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor, score_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token negative log-likelihood per row and the number of tokens scored.

    ``logits [batch, pos, vocab]`` predict ``input_ids[:, 1:]``; a target counts when it
    is a real token (``attention_mask``) and, if given, ``score_mask [batch, pos]`` is
    True at the target's position. Returns ``(nll_sum [batch], n_scored [batch])`` in float32 (float64 for float64 logits).
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"logits must be [batch, pos, vocab] matching input_ids {tuple(input_ids.shape)}; got {tuple(logits.shape)}"
        )
    logp = F.log_softmax(logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    target = input_ids[:, 1:]
    tok = -logp.gather(-1, target[..., None])[..., 0]  # [batch, pos-1]
    keep = attention_mask[:, 1:].bool()
    if score_mask is not None:
        keep = keep & score_mask[:, 1:].bool()
    keep_f = keep.to(logp.dtype)
    return (tok * keep_f).sum(-1), keep_f.sum(-1)


def token_nll_at(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
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
    logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    scored = -logp.gather(-1, input_ids[:, 1:][keep][:, None])[:, 0]
    tok = torch.zeros(keep.shape, dtype=logp.dtype, device=logp.device).masked_scatter(keep, scored)
    keep_f = keep.to(logp.dtype)
    return (tok * keep_f).sum(-1), keep_f.sum(-1)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """``hidden [batch, pos, d_model]`` -> ``[batch, d_model]``: mean over real tokens
    (sentence-transformers' pooling), then L2-normalised when ``normalize``."""
    m = attention_mask.to(hidden.dtype)[..., None]
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled


def paraphrase_hits(
    anchor: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor, neg_valid: torch.Tensor
) -> torch.Tensor:
    """Unit-norm embeddings ``anchor, positive [item, d]``, ``negatives [item, n_neg, d]``
    (``neg_valid [item, n_neg]`` False on padding) -> ``[item]`` float 1.0 where
    ``cos(anchor, positive)`` beats every valid negative."""
    pos = (anchor * positive).sum(-1)
    neg = torch.einsum("id,ind->in", anchor, negatives).masked_fill(~neg_valid, -math.inf)
    return (pos > neg.max(-1).values).float()


def weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``values [..., item]``, ``weights [item]`` -> ``[...]`` weighted mean over items."""
    w = weights.to(values.dtype)
    return (values * w).sum(-1) / w.sum().clamp(min=1e-12)


# ----------------------------------------------------------------------------- units


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


def _tile(t: torch.Tensor, r: int) -> torch.Tensor:
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
        from headscope.analyses.pruning.ablation import replicated_scores

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
        check_kind(self.name, self.family, model.spec)


def check_kind(name: str, family: str, spec) -> None:
    """``ValueError`` when metric ``name``, reading a ``family`` (``"decoder"``/``"encoder"``)
    output, cannot score a model of ``spec``."""
    kind = "decoder" if spec.causal else "encoder"
    if kind != family:
        raise ValueError(
            f"metric {name!r} needs {'a causal LM' if family == 'decoder' else 'an encoder'}; "
            f"got {spec.name!r}, an {kind} ({spec.family})"
        )


def _tokenize_all(tokenizer, texts=None, words=None, max_positions=None, add_bos=False) -> list[dict]:
    seq = texts if texts is not None else words
    return tokenize_items(
        tokenizer, seq, words=texts is None, max_positions=max_positions, add_bos=add_bos, what="item"
    )


# ----------------------------------------------------------------------------- decoder metrics


class LMLoss(ItemMetric):
    """Next-token cross-entropy on held-out texts (``perplexity=True``: report ``exp``).

    Per item: mean NLL of the text's predicted tokens; weight: that token count; so the
    aggregate is the mean over all real predicted tokens. ``add_bos`` prepends the
    tokenizer's BOS (SmolLM2's tokenizer adds none; default False: the first token is
    context only).
    """

    higher_is_better = False
    family = "decoder"

    def __init__(
        self, model, texts: Sequence[str], *, perplexity: bool = False, batch_size: int = 16, add_bos: bool = False
    ):
        super().__init__(batch_size)
        self.name = "perplexity" if perplexity else "lm_loss"  # before check_model, whose message names it
        self.check_model(model)
        self.perplexity = perplexity
        self.toks = _tokenize_all(
            model.tokenizer, texts=list(texts), max_positions=model.spec.max_positions, add_bos=add_bos
        )
        bad = [i for i, t in enumerate(self.toks) if len(t["ids"]) < 2]
        if bad:
            raise ValueError(f"texts need at least 2 tokens to score a next token; text {bad[0]} has fewer")
        self.n_items = len(self.toks)
        self.pad = pad_id(model.tokenizer)
        self.device = input_device(model)  # units built where the model takes its inputs
        self.units = self.make_units()

    def _lengths(self):
        return [len(t["ids"]) for t in self.toks]

    def _prepare(self, item_ids):
        return Unit(collate([self.toks[i] for i in item_ids], self.pad), list(item_ids))

    def read_positions(self, unit: Unit) -> torch.Tensor:
        """``[rows, pos]`` True where the output is read: position ``p`` predicts token
        ``p + 1``, read when that token is real (never the last position nor padding). The
        scoring engine may then hand :meth:`item_values` / :meth:`loss` the logits at these
        positions only, ``[R × n_read, vocab]`` (:func:`token_nll_at`)."""
        am = unit.batch.attention_mask
        keep = torch.zeros(am.shape, dtype=torch.bool, device=am.device)
        keep[:, :-1] = am[:, 1:].bool()
        return keep

    def _nll(self, out, unit):
        ids, mask = unit.batch.input_ids, unit.batch.attention_mask
        if out.dim() == 2:  # logits at read_positions only
            r = out.shape[0] // int(mask[:, 1:].bool().sum())
            s, n = token_nll_at(out, _tile(ids, r), _tile(mask, r))
        else:
            r = out.shape[0] // unit.rows
            s, n = token_nll(out, _tile(ids, r), _tile(mask, r))
        return s.view(r, unit.rows), n.view(r, unit.rows)[0]

    def item_values(self, out, unit):
        s, n = self._nll(out, unit)
        return s / n.clamp(min=1), n

    def loss(self, out, unit):
        s, n = self._nll(out, unit)
        return s.sum() / n.sum()

    def finalize(self, x):
        return torch.exp(x) if self.perplexity else x


_DETERMINERS = {
    "The",
    "A",
    "An",
    "This",
    "That",
    "These",
    "Those",
    "His",
    "Her",
    "Their",
    "Its",
    "My",
    "Our",
    "Your",
    "Some",
    "Every",
}


def substitute(words: Sequence[str], pronoun: int, span: tuple[int, int]) -> tuple[list[str], int]:
    """Words with the pronoun replaced by the candidate span's words (a sentence-initial
    determiner is lower-cased mid-sentence; the first word is capitalised at position 0).
    Returns ``(words, first word index after the substituted span)``.

    >>> substitute("The cat sat because it was tired .".split(), 4, (0, 2))
    (['The', 'cat', 'sat', 'because', 'the', 'cat', 'was', 'tired', '.'], 6)
    """
    cand = list(words[span[0] : span[1]])
    if pronoun > 0 and cand[0] in _DETERMINERS:
        cand[0] = cand[0].lower()
    if pronoun == 0:
        cand[0] = cand[0][:1].upper() + cand[0][1:]
    new = list(words[:pronoun]) + cand + list(words[pronoun + 1 :])
    return new, pronoun + len(cand)


class CorefAccuracy(ItemMetric):
    """Coreference by language-model scoring (Trinh & Le 2018): substitute each candidate's
    words for the pronoun and score the sentence; a hit when the gold antecedent scores best.

    ``scoring="partial"`` (default) sums the log-probabilities of the words after the
    substituted candidate (the continuation, which carries the disambiguating cue);
    ``"full"`` sums over the whole sentence. ``kinds`` keeps items of those kinds
    (default ``("winograd", "number")``: in ``"gender"`` items the cue is the pronoun
    itself, which substitution removes, so they sit at chance by construction).
    The loss is the cross-entropy of the gold candidate under a softmax over candidates'
    summed log-probabilities.
    """

    name = "coref_accuracy"
    higher_is_better = True
    family = "decoder"

    def __init__(
        self,
        model,
        items,
        *,
        scoring: str = "partial",
        kinds: Sequence[str] | None = ("winograd", "number"),
        batch_size: int = 16,
    ):
        super().__init__(batch_size)
        self.check_model(model)
        if scoring not in ("partial", "full"):
            raise ValueError(f"scoring must be 'partial' or 'full'; got {scoring!r}")
        self.scoring = scoring
        items = [it for it in items if kinds is None or it.kind is None or it.kind in kinds]
        if not items:
            raise ValueError(f"no coreference items left after keeping kinds {kinds}; pass kinds=None to keep all")
        self.items = items
        self.n_items = len(items)
        self.pad = pad_id(model.tokenizer)
        self.rows: list[list[tuple[dict, int]]] = []  # per item: (tokenised candidate sentence, first scored word)
        for it in items:
            per = []
            for span in it.candidates:
                words, after = substitute(it.words, it.pronoun, span)
                tok = tokenize_one(model.tokenizer, words=words)
                start = after if (scoring == "partial" and after < len(words)) else 0
                per.append((tok, start))
            self.rows.append(per)
        self.device = input_device(model)  # units built where the model takes its inputs
        self.units = self.make_units()

    def _lengths(self):
        return [max(len(t["ids"]) for t, _ in per) for per in self.rows]

    def _prepare(self, item_ids):
        toks, score, owner, cand = [], [], [], []
        for k, i in enumerate(item_ids):
            for c, (tok, start) in enumerate(self.rows[i]):
                toks.append(tok)
                score.append([w is not None and w >= start for w in tok["word_ids"]])
                owner.append(k)
                cand.append(c)
        batch = collate(toks, self.pad)
        sm = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
        for r, s in enumerate(score):
            sm[r, : len(s)] = torch.tensor(s, dtype=torch.bool)
        n_c = max(cand) + 1
        gold = torch.tensor([self.items[i].antecedent for i in item_ids])
        return Unit(
            batch,
            list(item_ids),
            {"score_mask": sm, "owner": torch.tensor(owner), "cand": torch.tensor(cand), "n_cand": n_c, "gold": gold},
        )

    def _cand_logp(self, out, unit):
        r = out.shape[0] // unit.rows
        e = unit.extra
        s, _ = token_nll(
            out, _tile(unit.batch.input_ids, r), _tile(unit.batch.attention_mask, r), _tile(e["score_mask"], r)
        )
        logp = -s.view(r, unit.rows)
        table = torch.full((r, len(unit.items), e["n_cand"]), -math.inf, dtype=logp.dtype, device=logp.device)
        return table.index_put(
            (
                torch.arange(r, device=logp.device)[:, None],
                e["owner"][None].expand(r, -1),
                e["cand"][None].expand(r, -1),
            ),
            logp,
        )

    def item_values(self, out, unit):
        table = self._cand_logp(out, unit)
        hits = (table.argmax(-1) == unit.extra["gold"][None]).float()
        return hits, torch.ones(len(unit.items), device=hits.device)

    def loss(self, out, unit):
        table = self._cand_logp(out, unit)[0]
        return F.cross_entropy(table, unit.extra["gold"])


# ----------------------------------------------------------------------------- encoder metrics


class EmbeddingCosine(ItemMetric):
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

    name = "cosine_to_unpruned"
    higher_is_better = True
    family = "encoder"

    def __init__(
        self,
        model,
        texts: Sequence[str],
        *,
        batch_size: int = 32,
        temperature: float = 0.2,
        reference: torch.Tensor | None = None,
    ):
        super().__init__(batch_size)
        self.check_model(model)
        self.temperature = temperature
        self.toks = _tokenize_all(model.tokenizer, texts=list(texts), max_positions=model.spec.max_positions)
        self.n_items = len(self.toks)
        self.pad = pad_id(model.tokenizer)
        self.reference = None
        self.device = input_device(model)  # units built where the model takes its inputs
        self.units = self.make_units()
        if reference is None:
            reference = torch.zeros(self.n_items, model.spec.d_model, device=self.device)
            with torch.inference_mode():
                for u in self.units:
                    out = model.forward(u.batch.input_ids, u.batch.attention_mask)
                    reference = reference.to(out.dtype)
                    reference[u.items] = mean_pool(out, u.batch.attention_mask)
        self.reference = reference.to(self.device).clone()
        self.units = self.make_units()

    def _lengths(self):
        return [len(t["ids"]) for t in self.toks]

    def _prepare(self, item_ids):
        extra = {} if self.reference is None else {"ref": self.reference[item_ids]}
        return Unit(collate([self.toks[i] for i in item_ids], self.pad), list(item_ids), extra)

    def item_values(self, out, unit):
        r = out.shape[0] // unit.rows
        emb = mean_pool(out, _tile(unit.batch.attention_mask, r)).view(r, unit.rows, -1)
        return (emb * unit.extra["ref"].to(emb.dtype)[None]).sum(-1), torch.ones(unit.rows, device=emb.device)

    def loss(self, out, unit):
        emb = mean_pool(out, unit.batch.attention_mask)  # [rows, d_model]
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


class ParaphraseAccuracy(ItemMetric):
    """Share of items whose anchor is closer (cosine) to its paraphrase than to every
    distractor. Items: dicts with ``anchor``, ``positive``, ``negatives`` (list of str).

    Loss: cross-entropy of the positive among ``[positive] + negatives`` with logits
    ``cos / temperature`` (sentence-transformers' MultipleNegativesRankingLoss with hard
    negatives, scale 20).
    """

    name = "paraphrase_accuracy"
    higher_is_better = True
    family = "encoder"

    def __init__(self, model, items: Sequence[dict], *, batch_size: int = 8, temperature: float = 0.05):
        super().__init__(batch_size)
        self.check_model(model)
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
                _tokenize_all(
                    model.tokenizer, texts=[it["anchor"], it["positive"], *negs], max_positions=model.spec.max_positions
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
        emb = mean_pool(out, _tile(unit.batch.attention_mask, r)).view(r, unit.rows, -1)
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


# ----------------------------------------------------------------------------- plug-in metric


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
        from headscope.analyses.pruning.ablation import head_gates

        vals = []
        for m in masks:
            with head_gates(model, m, ablation=ablation):
                vals.append(float(self.fn(model)))
        return torch.tensor(vals, dtype=torch.float32)[:, None], torch.ones(1)

    def loss(self, out, unit):
        raise ValueError(f"{self.name!r} is a plain callable: it has no differentiable loss")

    def check_model(self, model) -> None:
        """Any model: the function decides what it needs."""


# ----------------------------------------------------------------------------- registry


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


def build_metric(name: str, model, *, n_items: int | None = None, batch_size: int | None = None, **kw):
    """A metric by name on its shipped data (``data/heldout/lm_text.txt``,
    ``data/coref/coref.jsonl``, ``data/paraphrase/pairs.jsonl``), first ``n_items`` items.

    >>> build_metric("bleu", None)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ValueError: unknown metric 'bleu'; valid metrics: ...
    """
    from headscope.data import path

    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; valid metrics: {', '.join(METRICS)}")
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
        return EmbeddingCosine(model, _take(read_lines(path("heldout/lm_text.txt")), n_items), **bs, **kw)
    return ParaphraseAccuracy(model, _take(read_paraphrases(path("paraphrase/pairs.jsonl")), n_items), **bs, **kw)


#: metric name -> the kind of model it reads (``"decoder"``: logits; ``"encoder"``: hidden states)
METRICS = {
    "lm_loss": "decoder",
    "perplexity": "decoder",
    "coref_accuracy": "decoder",
    "cosine_to_unpruned": "encoder",
    "paraphrase_accuracy": "encoder",
}


def default_metric(spec) -> str:
    """``lm_loss`` for decoders (causal), ``cosine_to_unpruned`` for encoders."""
    return "lm_loss" if spec.causal else "cosine_to_unpruned"
