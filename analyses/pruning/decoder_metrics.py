"""Metrics of a pruned causal LM, read from its logits: :class:`LMLoss` (next-token
cross-entropy, or perplexity) and :class:`CorefAccuracy` (coreference by LM scoring).

Both tokenise their items once into length-bucketed :class:`~headscope.analyses.pruning.metric_base.Unit`
batches; :meth:`~headscope.analyses.pruning.metric_base.ItemMetric.item_values` turns the
model's output for a unit (possibly ``R`` replicas stacked along the batch dimension, each
run under another head mask) into one value per replica and item, with the pure functions of
their entries in :data:`headscope.analyses.metrics.METRICS` (name, direction, definition).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from headscope.analyses.metrics import METRICS, candidate_hits, nll_per_token, token_nll, token_nll_at
from headscope.analyses.pruning.metric_base import ItemMetric, Unit, input_device, tile, tokenize_all
from headscope.probes.tokens import collate, pad_id, tokenize_one


class LMLoss(ItemMetric):
    """Next-token cross-entropy on held-out texts (``perplexity=True``: report ``exp``).

    Per item: mean NLL of the text's predicted tokens; weight: that token count; so the
    aggregate is the mean over all real predicted tokens. ``add_bos`` prepends the
    tokenizer's BOS (SmolLM2's tokenizer adds none; default False: the first token is
    context only).
    """

    higher_is_better = METRICS["lm_loss"].higher_is_better
    family = METRICS["lm_loss"].model

    def __init__(
        self, model, texts: Sequence[str], *, perplexity: bool = False, batch_size: int = 16, add_bos: bool = False
    ):
        super().__init__(batch_size)
        self.registered = METRICS["perplexity" if perplexity else "lm_loss"]
        self.name = self.registered.name  # before check_model, whose message names it
        self.check_model(model)
        self.perplexity = perplexity
        self.toks = tokenize_all(
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
            s, n = token_nll_at(out, tile(ids, r), tile(mask, r))
        else:
            r = out.shape[0] // unit.rows
            s, n = token_nll(out, tile(ids, r), tile(mask, r))
        return s.view(r, unit.rows), n.view(r, unit.rows)[0]

    def item_values(self, out, unit):
        s, n = self._nll(out, unit)
        return nll_per_token(s, n), n

    def loss(self, out, unit):
        s, n = self._nll(out, unit)
        return s.sum() / n.sum()

    def finalize(self, x):
        return self.registered.finalize(x)  # exp for perplexity


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

    registered = METRICS["coref_accuracy"]
    name, higher_is_better, family = registered.name, registered.higher_is_better, registered.model

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
            out, tile(unit.batch.input_ids, r), tile(unit.batch.attention_mask, r), tile(e["score_mask"], r)
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
        hits = candidate_hits(table, unit.extra["gold"][None])
        return hits, torch.ones(len(unit.items), device=hits.device)

    def loss(self, out, unit):
        table = self._cand_logp(out, unit)[0]
        return F.cross_entropy(table, unit.extra["gold"])
