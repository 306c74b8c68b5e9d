"""Positional heads: where each query's maximum attention goes, relative to the query.

Definition (Voita et al. 2019, "Analyzing Multi-Head Self-Attention: Specialized Heads Do
the Heavy Lifting, the Rest Can Be Pruned", §4.1): a head is *positional* when at least
90% of the time its maximum attention weight goes to one relative position. For every
real query token we take the key it attends most and bucket the offset
``key - query`` as ``-2, -1, 0, +1, +2`` or ``first`` (key position 0: ``[CLS]``/BOS, or
the first real token of a model that adds none). A row's max is counted for every
bucket its key belongs to (query 1 looking at key 0 counts for ``previous`` and for
``first``); exact ties share the unit equally, so a uniform row gives each key
``1/n_keys``. Per item, a bucket's value is the share of the item's query rows whose max
lands in it; the head's score is the mean over items (each sentence weighs the same —
Voita pool over tokens; the item is our resampling unit for the CI).

Roles: ``positional:previous`` (-1), ``positional:next`` (+1), ``positional:self`` (0),
``positional:first``, ``positional:-2``, ``positional:+2``. Baseline: the share the
bucket gets under uniform attention over the same keys (``1/n_keys`` where the bucket's
key is visible, else 0). Verdict: score ``>= cfg.positional_threshold`` (0.9) and BH-adjusted
p < ``cfg.alpha`` against the baseline. For causal models ``next`` and ``+2`` are
impossible (no query sees a later key): their rows are not emitted, and
``RoleOutput.extra["notes"]`` says so.

Special tokens are excluded as queries by default (the option ``include_special=True``
keeps them: ``run_role("positional", model, texts, include_special=True)``); padded keys
and padded query rows are always excluded.

``positional:first`` counts where each row's *maximum* goes; :mod:`.special` measures
attention *mass*: ``sink:first-token`` on position 0, ``special`` on every special token.
The three often flag the same heads on encoders, where ``[CLS]`` is position 0
(:func:`~headscope.analyses.roles.pipeline.verdict_overlap` states by how much).

>>> import torch
>>> from headscope.analyses.roles.pattern_stats import allowed_keys, query_rows
>>> p = torch.zeros(1, 1, 4, 4); p[0, 0, 0, 0] = 1; p[0, 0, 1:, :3] = torch.eye(3)   # shifted identity
>>> keys = torch.ones(1, 4, dtype=torch.bool)
>>> bos = torch.tensor([[True, False, False, False]])                # position 0 is special
>>> v, base = bucket_values(p, allowed_keys(keys, causal=True), query_rows(keys, bos))
>>> float(v["previous"][0, 0]), round(float(base["previous"][0]), 4)   # baseline: mean of 1/2, 1/3, 1/4
(1.0, 0.3611)
"""

from __future__ import annotations

from collections import Counter

import pandas as pd
import torch

from headscope.analyses.frames import roles_frame
from headscope.analyses.roles.base import Role, RoleContext
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.pattern_stats import ItemValuesReducer, argmax_share, row_mean
from headscope.analyses.stats.verdicts import layered_rows

OFFSETS = {"-2": -2, "previous": -1, "self": 0, "next": 1, "+2": 2}
BUCKETS = (*OFFSETS, "first")
CAUSAL_IMPOSSIBLE = ("next", "+2")

#: what the per-item values are (:mod:`headscope.analyses.stats.verdicts` picks the interval and test)
SCORE_KIND = "share"


def bucket_values(
    pattern: torch.Tensor, allowed: torch.Tensor, rows: torch.Tensor, share: torch.Tensor | None = None
) -> tuple[dict, dict]:
    """Per-item bucket shares of one layer.

    ``pattern [batch, head, query_pos, key_pos]``, ``allowed [batch, query_pos, key_pos]``,
    ``rows [batch, query_pos]`` -> ``({bucket: [batch, head]}, {bucket: [batch]})``:
    share of max-attention per bucket, and its uniform-attention baseline. ``share``:
    ``argmax_share(pattern, allowed)`` when the caller has it already.
    """
    w = argmax_share(pattern, allowed) if share is None else share  # [batch, head, q, k]
    hits, oks, n_keys = bucket_rows(w, allowed)
    values = {b: row_mean(hits[b], rows) for b in BUCKETS}
    base = {b: row_mean(oks[b] / n_keys, rows) for b in BUCKETS}
    return values, base


def bucket_rows(share: torch.Tensor, allowed: torch.Tensor, start: int = 0) -> tuple[dict, dict, torch.Tensor]:
    """Per query row of a pattern piece whose first row is query ``start``: ``share [batch,
    head, rows, key_pos]`` (:func:`argmax_share`), ``allowed [batch, rows, key_pos]`` ->
    ``({bucket: hit [batch, head, rows]}, {bucket: visible [batch, rows]}, n_keys [batch, rows])``:
    the max-attention share on each bucket's key, whether that key is visible, visible keys."""
    n_q, n_k = share.shape[-2:]
    n_keys = allowed.float().sum(-1).clamp_min(1)  # [batch, q]
    hits, oks = {}, {}
    for name, off in OFFSETS.items():
        # rows i whose key start + i + off exists: w[i, start + i + off]
        first, last = max(0, -(start + off)), min(n_q, n_k - start - off)
        hit = torch.zeros(share.shape[:3], device=share.device)
        ok = torch.zeros(allowed.shape[:2], device=allowed.device)
        if last > first:
            hit[..., first:last] = torch.diagonal(share, offset=start + off, dim1=-2, dim2=-1)[..., : last - first]
            ok[:, first:last] = torch.diagonal(allowed, offset=start + off, dim1=-2, dim2=-1)[
                ..., : last - first
            ].float()
        hits[name], oks[name] = hit, ok
    hits["first"] = share[..., 0]
    oks["first"] = allowed[..., 0].float()
    return hits, oks, n_keys


class PositionalReducer(ItemValuesReducer):
    """Streaming positional-head statistics; ``result()`` -> (values, baselines, layers),
    ``{bucket: [n_items, layer, head]}``, ``{bucket: [n_items]}``."""

    def piece(self, cap, piece) -> None:
        hits, oks, n_keys = bucket_rows(self._argmax_share(piece), self._allowed(piece), piece.start)
        for b in BUCKETS:
            self.piece_rows.add(b, piece.layer, hits[b], piece.rows)
        if piece.layer == cap.layers[0]:  # the baselines need the keys only
            for b in BUCKETS:
                self.piece_rows.add("ok:" + b, None, oks[b], piece.rows)
            self.piece_rows.add("n_keys", None, n_keys, piece.rows)

    def end(self, cap) -> None:
        rows, _ = self._rows(cap)
        n_keys = self.piece_rows.get("n_keys", None)
        for b in BUCKETS:
            per = [row_mean(self.piece_rows.get(b, layer), rows) for layer in cap.layers]
            self.values.add(b, cap.item_ids, torch.stack(per, 1))
            self.values.add(
                "baseline:" + b, cap.item_ids, row_mean(self.piece_rows.get("ok:" + b, None) / n_keys, rows)
            )

    def result(self):
        return self._by_role(BUCKETS)


def frame_from(
    values: dict, base: dict, layers, cfg: RolesConfig, *, causal: bool
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Role rows for every bucket, plus a frame of each head's most frequent bucket
    (columns layer, head, bucket, share)."""
    rows = []
    for b in BUCKETS:
        if causal and b in CAUSAL_IMPOSSIBLE:
            continue
        v = values[b]
        if v.numel() == 0:
            continue
        ok = ~torch.isnan(base[b])  # items with no query row analysed
        rows += layered_rows(
            v[ok],
            base[b][ok],
            layers,
            role=f"positional:{b}",
            score_kind=SCORE_KIND,
            cfg=cfg,
            threshold_kind="absolute",
            threshold=cfg.positional_threshold,
        )
    frame = roles_frame(rows)
    top = pd.DataFrame(columns=["layer", "head", "bucket", "share"])
    if len(frame):
        best = frame.loc[frame.groupby(["layer", "head"])["score"].idxmax()]
        top = pd.DataFrame(
            {
                "layer": best["layer"].values,
                "head": best["head"].values,
                "bucket": best["role"].str.removeprefix("positional:").values,
                "share": best["score"].values,
            }
        )
    return frame, top


def _reducer(ctx: RoleContext) -> PositionalReducer:
    return PositionalReducer(causal=ctx.model.spec.causal, include_special=ctx.options.get("include_special", False))


def finish(reducer: PositionalReducer, report, ctx: RoleContext) -> RoleOutput:
    """A filled reducer and the stream's report -> :class:`RoleOutput`: ``frame``
    (ROLE_COLUMNS, roles ``positional:*``), ``extra["top_bucket"]`` (each head's most
    frequent bucket and its share), ``extra["notes"]``."""
    causal = ctx.model.spec.causal
    values, base, layers = reducer.result()
    frame, top = frame_from(values, base, layers, ctx.cfg, causal=causal)
    notes = []
    if causal:
        notes.append(
            "causal model: no query sees a later key, so positional:next and positional:+2 are impossible and not reported"
        )
    return RoleOutput(
        frame=frame, skipped=Counter(report.skipped), n_items=report.n_used, extra={"top_bucket": top, "notes": notes}
    )


#: the group this module defines (registered in pipeline order by :mod:`.shipped`)
ROLE_DEF = Role(
    name="positional",
    corpus="text",
    score_kind=SCORE_KIND,
    reducer=_reducer,
    finish=finish,
    options=("include_special",),
    row_tasks={"positional:previous": "duplicate_token"},
    description=(
        "positional:<bucket>: the share of a head's query rows whose MAXIMUM attention weight lands on one "
        "relative key (-2, previous, self, next, +2) or on key position 0 (positional:first), against the "
        "share under uniform attention (Voita et al. 2019). It counts where each row's argmax goes, not how "
        "much mass goes there: positional:first can be 1 for a head that puts only 40% of its mass on "
        "position 0 (its largest weight), whereas sink:first-token is the attention MASS on position 0 and "
        "special the MASS on every special token ([CLS], [SEP], BOS), wherever they stand. "
        "Option include_special (default False): keep special tokens as query rows."
    ),
)
