"""Copy-suppression heads (McDougall et al. 2023, "Copy Suppression: Comprehensively Understanding
an Attention Head"): heads that attend to an earlier token which earlier layers predict as the next
token, and lower that token's logit (GPT-2 Small's L10H7; the negative name movers of IOI and the
anti-induction heads are instances).

Probe: sequences ``[first] + R + R`` of ``cfg.induction_seq_len`` distinct random ordinary tokens
``R`` (seeded; ``first`` is BOS where the tokenizer has one). In the repeat, the context predicts
the next token by induction (the token after the earlier copy of the query token; earlier layers'
induction heads predict it), and that token occurs earlier: the setting of copy suppression. Each
such query position is scored; for given sequences (option ``items``), every position whose token
occurred earlier with a real token after it, before the query.

At a scored position, the head's **top key** is the earlier key (not the first or a special token,
not the query itself) it attends most; its **direct logits** are its write there, ``z_h W_O[h]``,
read through the unembedding ``W_U`` (the final norm's scale folded on the in-house stack) over the
item's distinct tokens. A **hit** is the head attending most to an occurrence of the predicted
token *and* giving that token the strictly lowest direct logit among the item's tokens (negative
copying of the predicted token it attends). Score: the share of hits over the item's positions,
averaged over items. Baseline: the same share for a random earlier token (one seeded key per
position): its token attended most and given the lowest logit. Verdict: score ``>= THRESHOLD`` and
the adjusted p below ``cfg.alpha``.

Statistics (``RoleOutput.stats``, STAT_COLUMNS, ``metric`` prefixed ``copy-suppression:``):

* ``attention_to_predicted``: the head's attention on earlier occurrences of the predicted token;
* ``direct_logit``: its direct logit for the predicted token minus the mean over the item's
  tokens (negative: it lowers it); the direct part of what ablating the head does to that logit,
  in the units of the residual before the final norm's ``1 / rms``;
* ``ov_negative_copying`` (weights only): the share of ``OV_TOKENS`` tokens (the items' first
  distinct ones) that the head's effective OV circuit ``W_E W_V W_O W_U`` maps to their own
  lowest logit among those tokens (the paper's negative copying; norms folded, centring and
  biases not applied). Only where the input norms are folded (the in-house stack).

An encoder (no unembedding) or a backend without per-head weights gives no rows, with a note
saying why. Options: ``items`` (token-id sequences to use instead), ``vocab_ids`` (ids to draw
``R`` from; default the ordinary vocabulary). Sizes: ``cfg.induction_n_sequences`` sequences, at
most :data:`MAX_SEQUENCES`.

>>> scored_positions([1, 5, 6, 7, 5, 6, 7], [True] + [False] * 6)
((4, 5, 6), (6, 7, 5))
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd
import torch

from headscope.analyses.frames import STAT_COLUMNS, roles_frame
from headscope.analyses.roles.base import Role, RoleContext
from headscope.analyses.roles.config import RoleOutput
from headscope.analyses.roles.induction import ordinary_vocab
from headscope.analyses.roles.pattern_stats import ItemValuesReducer, check_layers, stats_frame
from headscope.analyses.roles.sequences import feed_sequences
from headscope.analyses.stats.verdicts import layered_rows
from headscope.probes.capture import Capture, StreamReport
from headscope.probes.errors import ModelIncompatibleError

ROLE = "copy-suppression"
SCORE_KIND = "share"
#: the share of hits a copy-suppression head reaches at least
THRESHOLD = 0.5
#: tokens the weights-only negative-copying statistic ranks among
OV_TOKENS = 256
#: at most this many sequences (fewer where ``cfg.induction_n_sequences`` says so): the forward,
#: which computes the unembedding, dominates the cost (SmolLM2: ~0.3 s per sequence on one core)
MAX_SEQUENCES = 32
#: how :attr:`~headscope.probes.models.inhouse.head_weights.ModelWeights.folding` starts where
#: the norms' scales are folded (the in-house stack)
FOLDED = "input-norm scales folded"
#: the per-item statistics, besides the score
ITEM_METRICS = ("attention_to_predicted", "direct_logit")


@dataclass(frozen=True)
class CopyItem:
    """One probe sequence: ``ids``, ``special`` marks, the scored query ``positions`` with the
    token the context ``predicted`` there and a seeded ``random_keys`` (an earlier key each, the
    baseline's), and ``columns``: the item's distinct non-special tokens (the logits compared)."""

    ids: tuple[int, ...]
    special: tuple[bool, ...]
    positions: tuple[int, ...]
    predicted: tuple[int, ...]
    random_keys: tuple[int, ...]
    columns: tuple[int, ...]


def scored_positions(ids, special) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(positions, predicted)``: the query positions ``p`` whose token occurred earlier at ``j``
    (the latest such) with a real token at ``j + 1 < p``, and that token, ``ids[j + 1]`` (the
    induction prediction, which occurs before ``p``)."""
    last: dict[int, int] = {}
    pos, pred = [], []
    for p, (t, s) in enumerate(zip(ids, special)):
        j = last.get(t)
        if not s and j is not None and j + 1 < p and not special[j + 1]:
            pos.append(p)
            pred.append(ids[j + 1])
        if not s:
            last[t] = p
    return tuple(pos), tuple(pred)


def make_item(ids, special, gen: torch.Generator) -> CopyItem:
    """A :class:`CopyItem` of one sequence (``random_keys`` drawn from ``gen``)."""
    ids, special = tuple(int(i) for i in ids), tuple(bool(s) for s in special)
    pos, pred = scored_positions(ids, special)
    keys = []
    for p in pos:
        earlier = [k for k in range(p) if not special[k] and k > 0]
        keys.append(earlier[int(torch.randint(len(earlier), (1,), generator=gen))])
    cols = tuple(dict.fromkeys(t for t, s in zip(ids, special) if not s))
    return CopyItem(ids, special, pos, pred, tuple(keys), cols)


def _no_logits(model) -> str | None:
    if not model.spec.causal or getattr(model, "unembedding", None) is None:
        return f"{ROLE}: no unembedding (an encoder): copy suppression is read through the logits"
    return None


def _given(ctx: RoleContext, given) -> list[CopyItem]:
    rows = given.tolist() if isinstance(given, torch.Tensor) else given
    try:
        rows = [[int(t) for t in r] for r in rows]
    except (TypeError, ValueError):
        rows = []
    if not rows:
        raise ValueError(f"{ROLE}: items must be a non-empty list of token-id sequences")
    specials = set(ctx.model.tokenizer.all_special_ids)
    gen = torch.Generator().manual_seed(ctx.cfg.seed)
    items = [make_item(r, [t in specials for t in r], gen) for r in rows]
    empty = [i for i, it in enumerate(items) if not it.positions]
    if empty:
        raise ValueError(f"{ROLE}: item {empty[0]} has no position whose token occurred earlier with a token after it")
    return items


def probe_items(ctx: RoleContext) -> list[CopyItem]:
    """The role's items (module docstring); ``ValueError`` for an empty ``items`` option, an item
    without a scored position, or fewer ordinary tokens than ``cfg.induction_seq_len``; ``[]`` for a
    model without logits."""
    given = ctx.options.get("items")
    if given is not None:
        return _given(ctx, given)
    if _no_logits(ctx.model) is not None:
        return []
    tok, cfg = ctx.model.tokenizer, ctx.cfg
    vocab = list(ctx.options.get("vocab_ids") or ordinary_vocab(tok))
    n = cfg.induction_seq_len
    if len(vocab) < max(n, 2):
        raise ValueError(f"{ROLE}: need at least {max(n, 2)} ordinary token ids to draw from; got {len(vocab)}")
    first = tok.bos_token_id
    gen = torch.Generator().manual_seed(cfg.seed)
    items = []
    for _ in range(min(cfg.induction_n_sequences, MAX_SEQUENCES)):
        r = [vocab[i] for i in torch.randperm(len(vocab), generator=gen)[:n].tolist()]
        head = [] if first is None else [first]
        items.append(make_item(head + r + r, [True] * len(head) + [False] * (2 * n), gen))
    return items


class CopySuppressionReducer(ItemValuesReducer):
    """Per item and head, the share of hits (module docstring), its random-key baseline and the
    per-item statistics. ``result()`` -> ``({role: [n, layer, head]}, {role: [n, layer, head]}, layers)``."""

    def __init__(self, model, items: list[CopyItem]):
        super().__init__(causal=True)
        self.model, self.items = model, items
        self._w_o: dict[int, torch.Tensor] = {}  # layer -> W_O [head, d_head, d_model]
        self._w_u: torch.Tensor | None = None  # W_U over the items' columns [d_model, n_cols]
        self._col: dict[int, int] = {}  # token id -> column of _w_u
        self.refused: str | None = None  # why the head outputs cannot be read as logits
        self.folding: str | None = None  # how the weights were read (ModelWeights.folding)

    def _weights(self, layers) -> None:
        from headscope.probes.models.weights_provider import model_weights

        try:
            w = model_weights(self.model)
            lws = [w.layer(l) for l in layers]
        except ModelIncompatibleError as e:
            self.refused = f"{ROLE}: {str(e).strip().splitlines()[0]}"
            return
        if any(len(lw.heads) != self.model.spec.n_heads for lw in lws):
            self.refused = f"{ROLE}: a layer holds fewer heads than the model's {self.model.spec.n_heads} (pruned)"
            return
        self._w_o = {l: lw.W_O for l, lw in zip(layers, lws)}
        self.folding = w.folding
        cols = list(dict.fromkeys(t for it in self.items for t in it.columns))
        self._col = {t: i for i, t in enumerate(cols)}
        self._w_u = w.W_U_columns(cols)

    def update(self, cap: Capture) -> None:
        self.layers = check_layers(cap.layers, self.layers)
        if self.refused is None and self._w_u is None:
            self._weights(cap.layers)
        if self.refused is not None:
            return
        n_l, n_h = len(cap.layers), self.model.spec.n_heads
        out = {k: torch.zeros(len(cap.item_ids), n_l, n_h, device="cpu") for k in ("hit", "base", *ITEM_METRICS)}
        for b, item_id in enumerate(cap.item_ids):
            for k, v in self._item_values(cap, b, self.items[item_id]).items():
                out[k][b] = v
        self.values.add(ROLE, cap.item_ids, out["hit"])
        self.values.add("baseline:" + ROLE, cap.item_ids, out["base"])
        for k in ITEM_METRICS:
            self.values.add(k, cap.item_ids, out[k])

    def _item_values(self, cap: Capture, b: int, it: CopyItem) -> dict[str, torch.Tensor]:
        """``{hit, base, attention_to_predicted, direct_logit: [layer, head]}`` of one item."""
        dev = cap["z", cap.layers[0]].device  # computed where the capture is, read back to the host
        n = len(it.ids)
        pos = torch.tensor(it.positions, device=dev)
        ids = torch.tensor(it.ids, device=dev)
        keys = torch.arange(n, device=dev)
        real = ~torch.tensor(it.special, device=dev) & (keys > 0)
        earlier = real[None, :] & (keys[None, :] < pos[:, None])  # [n_pos, key]
        pred = torch.tensor(it.predicted, device=dev)
        rand = ids[torch.tensor(it.random_keys, device=dev)]
        cols = torch.tensor(it.columns, device=dev)
        pred_col = torch.tensor([it.columns.index(t) for t in it.predicted], device=dev)
        w_u = self._w_u[:, [self._col[t] for t in it.columns]].to(dev)  # [d_model, n_cols]
        on_pred = (ids[None, :] == pred[:, None]) & earlier  # [n_pos, key]
        res = {k: [] for k in ("hit", "base", *ITEM_METRICS)}
        for layer in cap.layers:
            z = cap["z", layer][b][:, pos].float()  # [head, n_pos, d_head]
            pat = cap["pattern", layer][b][:, pos, :n].float()  # [head, n_pos, key]
            readout = torch.einsum("hed,dc->hec", self._w_o[layer].to(dev), w_u)  # [head, d_head, n_cols]
            logits = torch.einsum("hpe,hec->hpc", z, readout)  # [head, n_pos, n_cols]
            top_tok = ids[pat.masked_fill(~earlier, -1.0).argmax(-1)]  # [head, n_pos]
            low = logits.topk(min(2, logits.shape[-1]), dim=-1, largest=False)
            strict = low.values[..., 0] < low.values[..., -1]  # one column: never (nothing to be lower than)
            low_tok = cols[low.indices[..., 0]]
            res["hit"].append((strict & (low_tok == pred) & (top_tok == pred)).float().mean(-1))
            res["base"].append((strict & (low_tok == rand) & (top_tok == rand)).float().mean(-1))
            res["attention_to_predicted"].append((pat * on_pred).sum(-1).mean(-1))
            own = logits.gather(-1, pred_col[None, :, None].expand(logits.shape[0], -1, 1))[..., 0]
            res["direct_logit"].append((own - logits.mean(-1)).mean(-1))
        return {k: torch.stack(v).cpu() for k, v in res.items()}

    def __getstate__(self) -> dict:
        """Pickled (a Ray part's result, on its way to the driver) without the model and what was read
        from its weights: merging, ``result()`` and the role's finish read the values alone (the finish
        reads the driver's own model), while the model would ship a copy of every weight with each part
        (SmolLM2-135M: 0.5 GiB a part, held by the driver in the object store and again unpickled).
        An unpickled reducer merges and finishes; it is not fed again."""
        return {**self.__dict__, "model": None, "_w_o": {}}

    def merge(self, other: CopySuppressionReducer) -> CopySuppressionReducer:
        super().merge(other)
        self.refused = self.refused or other.refused
        self.folding = self.folding or other.folding
        return self

    def result(self):
        return (
            {ROLE: self.values.get(ROLE)[1]},
            {ROLE: self.values.get("baseline:" + ROLE)[1]},
            self.layers or (),
        )

    def w_u_columns(self, tokens) -> torch.Tensor | None:
        """``W_U[:, tokens]`` from the columns read (None where a token is not among them)."""
        if self._w_u is None or any(t not in self._col for t in tokens):
            return None
        return self._w_u[:, [self._col[t] for t in tokens]]

    def item_stats(self) -> pd.DataFrame:
        """The per-item statistics as STAT_COLUMNS rows (``metric`` prefixed ``copy-suppression:``)."""
        return stats_frame({f"{ROLE}:{k}": self.values.get(k)[1] for k in ITEM_METRICS}, self.layers or ())


def ov_negative_copying(model, tokens, layers, w_u: torch.Tensor | None = None) -> pd.DataFrame | str:
    """STAT_COLUMNS rows ``copy-suppression:ov_negative_copying`` per head (module docstring) over
    ``tokens`` (ids), or the reason (one line) it cannot be read from this model's weights.
    ``w_u``: ``W_U[:, tokens]`` where the caller has it (default: read from the weights)."""
    from headscope.probes.models.weights_provider import model_weights

    try:
        w = model_weights(model)
    except ModelIncompatibleError as e:
        return str(e).strip().splitlines()[0]
    if not w.folding.startswith(FOLDED):
        return f"ov_negative_copying needs the input norms folded into W_V ({w.folding})"
    tokens = list(tokens)
    if len(tokens) < 2:
        return f"ov_negative_copying ranks a token among others: got {len(tokens)} token"
    e = w.W_E_rows(tokens)  # [n, d_model]
    u = w.W_U_columns(tokens) if w_u is None else w_u  # [d_model, n]
    own = torch.arange(len(tokens))
    rows = []
    for layer in layers:
        lw = w.layer(layer)
        ev = torch.einsum("nd,kde->kne", e, lw.W_V)[lw.kv_index]  # [head, n, d_head]
        ou = torch.einsum("hed,dm->hem", lw.W_O, u)  # [head, d_head, n]
        m = torch.einsum("hne,hem->hnm", ev, ou)  # [head, token in, token read]
        low = m.topk(2, dim=-1, largest=False)
        strict = low.values[..., 0] < low.values[..., 1]
        share = (strict & (low.indices[..., 0] == own)).float().mean(-1)
        rows += [
            {"layer": layer, "head": h, "metric": f"{ROLE}:ov_negative_copying", "value": float(v), "n": len(tokens)}
            for h, v in zip(lw.heads, share.tolist())
        ]
    return pd.DataFrame(rows, columns=STAT_COLUMNS)


def feed(ctx: RoleContext, reducers, progress=None) -> StreamReport:
    """Run ``ctx.model`` over ``ctx.items``, ``cfg.batch_size`` at a time, capturing ``z`` and the
    patterns (stored: the sequences are short)."""
    return feed_sequences(ctx, reducers, progress, kinds=("z", "pattern"))


def finish(reducer: CopySuppressionReducer, report, ctx: RoleContext) -> RoleOutput:
    """A filled reducer -> :class:`RoleOutput` with the statistics (no rows, with the reason, for a
    model without logits or per-head weights)."""
    why = _no_logits(ctx.model) or reducer.refused
    if why is None and not ctx.items:
        why = f"{ROLE}: no item"
    if why is not None:
        return RoleOutput(frame=roles_frame([]), n_items=0, extra={"notes": [why]})
    values, base, layers = reducer.result()
    rows = layered_rows(
        values[ROLE],
        base[ROLE],
        layers,
        role=ROLE,
        score_kind=SCORE_KIND,
        cfg=ctx.cfg,
        threshold_kind="absolute",
        threshold=THRESHOLD,
    )
    notes, stats = [], [reducer.item_stats()]
    if reducer.folding is not None and not reducer.folding.startswith(FOLDED):
        notes.append(f"{ROLE}: the direct logits read W_U without the final norm's scale ({reducer.folding})")
    tokens = list(dict.fromkeys(t for it in ctx.items for t in it.columns))[:OV_TOKENS]
    ov = ov_negative_copying(ctx.model, tokens, layers, reducer.w_u_columns(tokens))
    if isinstance(ov, str):
        notes.append(f"{ROLE}: {ov}")
    else:
        stats.append(ov)
    return RoleOutput(
        frame=roles_frame(rows),
        stats=pd.concat(stats, ignore_index=True),
        skipped=Counter(report.skipped),
        n_items=report.n_used,
        extra={"notes": notes},
    )


def _reducer(ctx: RoleContext) -> CopySuppressionReducer:
    return CopySuppressionReducer(ctx.model, ctx.items)


ROLE_DEF = Role(
    name=ROLE,
    corpus="generated",
    score_kind=SCORE_KIND,
    reducer=_reducer,
    finish=finish,
    items=probe_items,
    feed=feed,
    needs_logits=True,
    shards=True,
    options=("items", "vocab_ids"),
    generated=lambda cfg: (2 * cfg.induction_seq_len + 1, min(cfg.induction_n_sequences, MAX_SEQUENCES)),
    description=(
        "copy-suppression heads (McDougall et al. 2023): in the repeat of repeated random tokens, where the "
        "context predicts a token that occurred earlier, the share of positions where the head attends most to "
        "that token and its direct logits over the item's tokens put it lowest, against the same for a random "
        "earlier token. Statistics: attention to the predicted token, its direct logit, the weights' negative "
        "copying (W_E W_V W_O W_U). Options: items (token-id sequences to use instead), vocab_ids (ids to draw from)."
    ),
)
