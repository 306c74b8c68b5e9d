"""Rare-word heads: heads whose maximum attention goes to the sentence's rarest token.

Definition (Voita et al. 2019, "Analyzing Multi-Head Self-Attention", §4.3): a head points
to the least frequent token of the sentence. Frequencies are token-level counts over the
corpus analysed (every real, non-special token of every item; the option ``frequencies``
— ``run_role("rare-word", model, texts, frequencies=counts)`` — uses another corpus' counts). The rarest token of an item is the non-special token with the
lowest count; ties go to the earliest position. Every occurrence of that token id in the
item counts as "the rarest token".

Per item, the value of a head is the share of its analysed query rows (real, non-special)
whose max-attention key is a rarest-token position (exact ties share the unit, as in
:mod:`headscope.analyses.roles.positional`). Baseline: the share under uniform attention over
the same keys (``n_rare_keys / n_keys``, 0 for a causal query before the rare token).
Role ``rare-word``; verdict: score ``>= cfg.rare_threshold`` and BH-adjusted p < ``cfg.alpha``.

>>> import torch
>>> rarest_positions(torch.tensor([[5, 7, 9, 7]]), torch.ones(1, 4, dtype=torch.bool), torch.tensor([0.0] * 5 + [3.0, 0, 1.0, 0, 1.0])).tolist()
[[False, True, False, True]]
"""

from __future__ import annotations

from collections import Counter

import torch

from headscope.analyses.frames import roles_frame
from headscope.analyses.roles.base import Role, RoleContext
from headscope.analyses.roles.config import RoleOutput
from headscope.analyses.roles.pattern_stats import ItemValuesReducer, row_mean
from headscope.analyses.stats.verdicts import layered_rows

ROLE = "rare-word"

#: what the per-item values are (:mod:`headscope.analyses.stats.verdicts` picks the interval and test)
SCORE_KIND = "share"


def count_tokens(tokenizer, items, *, chunk: int = 1024) -> Counter:
    """Token-id counts over ``items`` (texts), special tokens excluded (the rule of
    :func:`~headscope.probes.tokens.tokenize_one`: a special id with an empty span; text
    read as plain text, as there); items that are not text or are blank are ignored here
    (the stream counts them as skipped). Texts are tokenised ``chunk`` at a time in one
    batched call."""
    from headscope.probes.corpora.text import is_blank
    from headscope.probes.tokens import encode_plain

    counts: Counter = Counter()
    special_ids = set(tokenizer.all_special_ids)
    texts = [t for t in items if isinstance(t, str) and not is_blank(t)]
    for start in range(0, len(texts), chunk):
        enc = encode_plain(
            tokenizer, texts[start : start + chunk], return_offsets_mapping=True, add_special_tokens=True
        )
        for ids, offsets in zip(enc["input_ids"], enc["offset_mapping"]):
            counts.update(i for i, (a, b) in zip(ids, offsets) if not (i in special_ids and a == b))
    return counts


def frequency_table(counts: Counter, vocab_size: int) -> torch.Tensor:
    """``[vocab_size]`` float counts (0 for unseen ids)."""
    lut = torch.zeros(max(vocab_size, max(counts, default=-1) + 1))
    if counts:
        ids = torch.tensor(list(counts.keys()))
        lut[ids] = torch.tensor(list(counts.values()), dtype=torch.float32)
    return lut


def rarest_positions(input_ids: torch.Tensor, candidates: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    """``[batch, pos]`` bool: positions holding each item's rarest token id among
    ``candidates [batch, pos]`` (real, non-special); ties -> earliest position."""
    f = freq[input_ids.clamp(0, freq.numel() - 1)].masked_fill(~candidates, float("inf"))
    first = f.argmin(-1)  # earliest minimum
    rare_id = input_ids.gather(1, first[:, None])
    has = candidates.any(-1, keepdim=True)
    return (input_ids == rare_id) & candidates & has


class RareWordReducer(ItemValuesReducer):
    """Streaming rare-word statistics; needs the corpus ``frequencies`` up front.
    ``result()`` -> (values ``[n_items, layer, head]``, baseline ``[n_items]``, layers)."""

    def __init__(self, frequencies: Counter, *, causal: bool, vocab_size: int, include_special: bool = False):
        super().__init__(causal=causal, include_special=include_special)
        self.freq = frequency_table(frequencies, vocab_size)
        self.n_token_types = len(frequencies)

    def begin(self, cap) -> None:
        super().begin(cap)
        _, special = self._rows(cap)
        km = cap.key_mask
        if self.freq.device != km.device:  # the table follows the data (once: the next batches find it there)
            self.freq = self.freq.to(km.device)
        self._rare = rarest_positions(cap.tokens.input_ids, km & ~special, self.freq)

    def piece(self, cap, piece) -> None:
        rare = self._rare
        w = self._argmax_share(piece)
        self.piece_rows.add("mass", piece.layer, (w * rare[:, None, None].float()).sum(-1), piece.rows)
        if piece.layer == cap.layers[0]:  # the baseline needs the keys only
            allowed = self._allowed(piece)
            n_keys = allowed.float().sum(-1).clamp_min(1)
            self.piece_rows.add("base", None, (allowed & rare[:, None]).float().sum(-1) / n_keys, piece.rows)

    def end(self, cap) -> None:
        rows, _ = self._rows(cap)
        vals = [row_mean(self.piece_rows.get("mass", layer), rows) for layer in cap.layers]
        self.values.add(ROLE, cap.item_ids, torch.stack(vals, 1))
        self.values.add("baseline", cap.item_ids, row_mean(self.piece_rows.get("base", None), rows))

    def result(self):
        return self.values.get(ROLE)[1], self.values.get("baseline")[1], self.layers or ()


def _reducer(ctx: RoleContext) -> RareWordReducer:
    freq = ctx.options.get("frequencies")
    counts = freq if freq is not None else count_tokens(ctx.model.tokenizer, ctx.items)
    return RareWordReducer(
        counts,
        causal=ctx.model.spec.causal,
        vocab_size=len(ctx.model.tokenizer),
        include_special=ctx.options.get("include_special", False),
    )


def finish(reducer: RareWordReducer, report, ctx: RoleContext) -> RoleOutput:
    """A filled reducer and the stream's report -> :class:`RoleOutput` (role ``rare-word``;
    ``extra["n_token_types"]``: token types in the frequency table)."""
    v, b, layers = reducer.result()
    rows = []
    if v.numel():
        ok = ~torch.isnan(b)
        rows = layered_rows(
            v[ok],
            b[ok],
            layers,
            role=ROLE,
            score_kind=SCORE_KIND,
            cfg=ctx.cfg,
            threshold_kind="absolute",
            threshold=ctx.cfg.rare_threshold,
        )
    return RoleOutput(
        frame=roles_frame(rows),
        skipped=Counter(report.skipped),
        n_items=report.n_used,
        extra={"n_token_types": reducer.n_token_types},
    )


#: the group this module defines (registered in pipeline order by :mod:`.shipped`)
ROLE_DEF = Role(
    name=ROLE,
    corpus="text",
    score_kind=SCORE_KIND,
    reducer=_reducer,
    finish=finish,
    options=("frequencies", "include_special"),
    description=(
        "rare-word: the share of a head's query rows whose MAXIMUM attention weight lands on the item's "
        "least frequent token (corpus token counts), against the share under uniform attention "
        "(Voita et al. 2019). Options: frequencies (a Counter of token ids; default: counted over the "
        "items analysed), include_special (default False)."
    ),
)
