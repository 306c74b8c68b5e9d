"""Induction, duplicate-token, previous-token (and next-token) heads on repeated random tokens.

Probe (Olsson et al. 2022, "In-context Learning and Induction Heads"; transformer-lens
``head_detector``): sequences ``[first] + R + R`` where ``R`` is ``seq_len`` token ids drawn
(seeded) from the tokenizer's ordinary vocabulary (special ids, and bracketed
placeholder tokens such as ``[unused0]`` or ``<|…|>``, excluded). ``first`` is
``[CLS]`` or BOS when the tokenizer has one (BERT-style models also get ``[SEP]`` at
the end), else a random ordinary token.

Detection patterns (exactly transformer-lens 4.3 ``get_*_detection_pattern``), for token
ids ``t``:

* ``duplicate-token``: ``D[q, k] = t[q] == t[k] and q != k``;
* ``induction``: ``I[q, k] = D[q, k - 1]`` for ``k >= 1`` (the token after an earlier copy);
* ``previous-token``: ``P[q, k] = k == q - 1``;
* ``next-token``: ``N[q, k] = k == q + 1`` (not in transformer-lens: bidirectional only).

For causal models every pattern is lower-triangular (``k <= q``), as transformer-lens
takes ``tril``. For bidirectional models (MiniLM), which ``detect_head`` cannot express,
no ``tril`` is taken: a token of the first copy may look FORWARD to its duplicate, or to
the token after it, in the second copy — both directions of the repeat count.

Score (transformer-lens ``error_measure="mul"``): per sequence
``sum(A ⊙ pattern) / sum(A)`` over all real query rows and visible keys, after zeroing
key column 0 (``exclude_bos``) and/or the diagonal (``exclude_current_token``) of a COPY
of the attention ``A`` (our inputs are never modified); the head's score is the mean
over sequences, as ``detect_head`` averages over a list of prompts. Defaults follow
``detect_head`` (nothing excluded). Baseline: the same score of uniform attention over
the visible keys. Verdict: score ``>= cfg.induction_threshold`` and BH-adjusted p <
``cfg.alpha`` against the baseline.

>>> import torch
>>> t = torch.tensor([[1, 5, 6, 5, 6]])
>>> detection_patterns(t, causal=True)["induction"][0].int().tolist()
[[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0]]
"""

from __future__ import annotations

import re
from collections import Counter

import torch

from headscope.analyses.frames import roles_frame
from headscope.analyses.roles.base import Role, RoleContext
from headscope.analyses.roles.config import RoleOutput
from headscope.analyses.roles.pattern_stats import ItemValuesReducer, allowed_keys, check_layers
from headscope.analyses.stats.verdicts import layered_rows
from headscope.probes.capture import (
    Capture,
    StreamReport,
    check_finite,
    chunk_plan,
    in_part,
    on_model_device,
    pattern_line,
    run_batch,
)
from headscope.probes.capture import (
    feed as feed_capture,
)
from headscope.probes.tokens import collate, pad_id

ROLES = ("induction", "duplicate-token", "previous-token", "next-token")
CAUSAL_ROLES = ROLES[:3]
_PLACEHOLDER = re.compile(r"^(\[.*\]|<.*>)$")

#: what the per-item values are (:mod:`headscope.analyses.stats.verdicts` picks the interval and test)
SCORE_KIND = "share"


# -- probe sequences ------------------------------------------------------------------------
def ordinary_vocab(tokenizer) -> list[int]:
    """Token ids that are neither special nor bracketed placeholders (``[unused3]``, ``<|x|>``)."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    toks = tokenizer.convert_ids_to_tokens(ids)
    return [i for i, t in zip(ids, toks) if t is not None and not _PLACEHOLDER.match(t)]


def repeated_random_tokens(
    tokenizer, *, n_sequences: int, seq_len: int, seed: int, vocab_ids=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [n_sequences, pos], special [n_sequences, pos])`` for ``[first] + R + R
    (+ [SEP])``; ``R`` drawn uniformly with replacement from ``vocab_ids`` (default
    :func:`ordinary_vocab`) by a ``torch.Generator`` seeded with ``seed``."""
    if n_sequences < 1 or seq_len < 1:
        raise ValueError(f"n_sequences and seq_len must be >= 1; got {n_sequences}, {seq_len}")
    vocab = torch.tensor(list(vocab_ids) if vocab_ids is not None else ordinary_vocab(tokenizer), dtype=torch.long)
    if vocab.numel() < 2:
        raise ValueError(f"need at least 2 ordinary token ids to draw from; got {vocab.numel()}")
    gen = torch.Generator().manual_seed(seed)
    r = vocab[torch.randint(0, vocab.numel(), (n_sequences, seq_len), generator=gen)]
    first_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    if first_id is not None:
        first = torch.full((n_sequences, 1), first_id, dtype=torch.long)
        first_special = True
    else:
        first = vocab[torch.randint(0, vocab.numel(), (n_sequences, 1), generator=gen)]
        first_special = False
    parts = [first, r, r]
    if tokenizer.cls_token_id is not None and tokenizer.sep_token_id is not None:
        parts.append(torch.full((n_sequences, 1), tokenizer.sep_token_id, dtype=torch.long))
    ids = torch.cat(parts, 1)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = first_special
    if len(parts) == 4:
        special[:, -1] = True
    return ids, special


def capture_ids(
    model,
    ids: torch.Tensor,
    special: torch.Tensor | None = None,
    *,
    layers=None,
    item_ids=None,
    lengths=None,
    query_chunk: int | None = None,
    reducers=(),
) -> Capture:
    """Run ``model`` on token ids ``[batch, pos]`` (right-padded to ``lengths``) and
    capture patterns: the route for probes that are not text. ``query_chunk`` with
    ``reducers`` that all take pieces: Q and K in place of the patterns
    (:func:`~headscope.probes.capture.chunk_plan`)."""
    n, t = ids.shape
    lengths = [t] * n if lengths is None else list(lengths)
    special = torch.zeros_like(ids, dtype=torch.bool) if special is None else special
    tok = model.tokenizer
    items = []
    for i in range(n):
        row = ids[i, : lengths[i]].tolist()
        items.append(
            {
                "ids": row,
                "text": "",
                "words": [],
                "tokens": tok.convert_ids_to_tokens(row),
                "offsets": [(0, 0)] * len(row),
                "word_ids": [None] * len(row),
                "special": special[i, : lengths[i]].tolist(),
            }
        )
    pad = pad_id(tok)
    batch = on_model_device(collate(items, pad), model)
    ls = tuple(range(model.spec.n_layers)) if layers is None else tuple(layers)
    qs, chunks = chunk_plan(model, reducers, ("pattern",), query_chunk)
    data = run_batch(model, batch, qs, ls, chunks)
    cap = Capture(
        tokens=batch,
        data=data,
        layers=ls,
        spec=model.spec,
        item_ids=list(range(n)) if item_ids is None else list(item_ids),
        chunks=chunks,
    )
    check_finite(cap)
    return cap


# -- scores ---------------------------------------------------------------------------------
def detection_patterns(input_ids: torch.Tensor, *, causal: bool) -> dict[str, torch.Tensor]:
    """``input_ids [batch, pos]`` -> ``{role: [batch, query_pos, key_pos] bool}`` (module
    docstring); ``next-token`` only for bidirectional models."""
    b, n = input_ids.shape
    device = input_ids.device
    eye = torch.eye(n, dtype=torch.bool, device=device)
    dup = (input_ids[:, :, None] == input_ids[:, None, :]) & ~eye
    ind = torch.zeros_like(dup)
    ind[:, :, 1:] = dup[:, :, :-1]
    prev = torch.zeros(n, n, dtype=torch.bool, device=device)
    prev[1:, :-1] = torch.eye(n - 1, dtype=torch.bool, device=device)
    out = {"induction": ind, "duplicate-token": dup, "previous-token": prev.expand(b, n, n)}
    if not causal:
        out["next-token"] = prev.T.expand(b, n, n)
    if causal:
        tri = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        out = {k: v & tri for k, v in out.items()}
    return out


def mul_score(
    pattern: torch.Tensor,
    detection: torch.Tensor,
    valid: torch.Tensor,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
) -> torch.Tensor:
    """transformer-lens ``error_measure="mul"`` score per item and head.

    ``pattern [batch, head, query_pos, key_pos]``, ``detection [batch, query_pos, key_pos]``,
    ``valid [batch, query_pos, key_pos]`` (real query row and visible key) ->
    ``[batch, head]``: ``sum(A·det) / sum(A)`` with ``A`` the pattern on valid cells,
    key column 0 and/or the diagonal zeroed (on a copy).
    """
    num, den = mul_sums(pattern, detection, valid, exclude_bos=exclude_bos, exclude_current_token=exclude_current_token)
    return num / den


def mul_sums(
    pattern: torch.Tensor,
    detection: torch.Tensor,
    valid: torch.Tensor,
    *,
    start: int = 0,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mul_score`'s numerator ``sum(A·det)`` and denominator ``sum(A)``, ``[batch, head]``
    each, over the rows of a pattern piece whose first row is query ``start`` (``detection``
    and ``valid`` those rows' too): the sums of a layer's pieces add up to its score's."""
    keep = valid.clone()
    if exclude_bos:
        keep[:, :, 0] = False
    if exclude_current_token:
        n_q, n_k = keep.shape[-2:]
        keep &= (
            torch.arange(n_k, device=keep.device)[None, :]
            != torch.arange(start, start + n_q, device=keep.device)[:, None]
        )
    a = pattern.float() * keep[:, None].float()
    return (a * detection[:, None].float()).sum((-1, -2)), a.sum((-1, -2))


class InductionReducer(ItemValuesReducer):
    """Streaming induction / duplicate / previous (/ next) scores of every head;
    works on any capture (random repeats or natural text). ``result()`` ->
    ``({role: [n_items, layer, head]}, {role: [n_items]}, layers)``."""

    def __init__(self, *, causal: bool, exclude_bos: bool = False, exclude_current_token: bool = False):
        super().__init__(causal=causal)
        self.exclude_bos = exclude_bos
        self.exclude_current_token = exclude_current_token
        self.roles = CAUSAL_ROLES if causal else ROLES

    def begin(self, cap) -> None:
        self.layers = check_layers(cap.layers, self.layers)
        self._dets = detection_patterns(cap.tokens.input_ids, causal=self.causal)
        self._sums: dict = {}  # (role, layer or "baseline") -> (numerator, denominator) [batch, head]

    def _add(self, key, sums) -> None:
        old = self._sums.get(key)
        self._sums[key] = sums if old is None else (old[0] + sums[0], old[1] + sums[1])

    def piece(self, cap, piece) -> None:
        km, rows = cap.key_mask, piece.rows
        valid = allowed_keys(km, self.causal, rows) & km[:, rows, None]  # real query rows, visible keys
        kw = dict(start=piece.start, exclude_bos=self.exclude_bos, exclude_current_token=self.exclude_current_token)
        uniform = None
        if piece.layer == cap.layers[0]:  # the baseline: uniform attention over the same keys
            uniform = (valid.float() / valid.float().sum(-1, keepdim=True).clamp_min(1))[:, None]  # [batch, 1, q, k]
        for role in self.roles:
            det = self._dets[role][:, rows]
            self._add((role, piece.layer), mul_sums(piece.pattern, det, valid, **kw))
            if uniform is not None:
                self._add((role, "baseline"), mul_sums(uniform, det, valid, **kw))

    def end(self, cap) -> None:
        for role in self.roles:
            vals = [torch.div(*self._sums[role, layer]) for layer in cap.layers]
            self.values.add(role, cap.item_ids, torch.stack(vals, 1))
            self.values.add("baseline:" + role, cap.item_ids, torch.div(*self._sums[role, "baseline"])[:, 0])
        self._sums = {}

    def result(self):
        return self._by_role(self.roles)


# -- the role ------------------------------------------------------------------------------
def probe_items(ctx: RoleContext) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The sequences the role runs on, as ``(ids [pos], special [pos])`` pairs.

    Option ``items`` (default ``None``): ``None`` draws ``cfg.induction_n_sequences``
    sequences of ``2 * cfg.induction_seq_len`` repeated random tokens (+ first token)
    seeded with ``cfg.seed`` (from option ``vocab_ids``, default :func:`ordinary_vocab`);
    or a ``[n, pos]`` tensor / list of id lists to use instead (special ids are marked).
    Raises ``ValueError`` for a sequence longer than the model's context.
    """
    model, cfg = ctx.model, ctx.cfg
    given = ctx.options.get("items")
    if given is None:
        ids, special = repeated_random_tokens(
            model.tokenizer,
            n_sequences=cfg.induction_n_sequences,
            seq_len=cfg.induction_seq_len,
            seed=cfg.seed,
            vocab_ids=ctx.options.get("vocab_ids"),
        )
        seqs = list(zip(ids, special))
    else:
        rows = [list(map(int, s)) for s in (given.tolist() if isinstance(given, torch.Tensor) else given)]
        if not rows or any(len(s) < 2 for s in rows):
            raise ValueError("items must be sequences of at least 2 token ids each")
        specials = set(model.tokenizer.all_special_ids)
        seqs = [(torch.tensor(s, dtype=torch.long), torch.tensor([x in specials for x in s])) for s in rows]
    too_long = [i for i, (ids, _) in enumerate(seqs) if len(ids) > model.spec.max_positions]
    if too_long:
        raise ValueError(
            f"sequence {too_long[0]} has {len(seqs[too_long[0]][0])} tokens; the model's context is {model.spec.max_positions}"
        )
    return seqs


def padded(seqs, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``(ids, special)`` pairs -> ``(ids [n, pos], special [n, pos], lengths)``, right-padded with ``pad_id``."""
    lengths = [len(ids) for ids, _ in seqs]
    ids = torch.full((len(seqs), max(lengths)), pad_id, dtype=torch.long)
    special = torch.zeros(ids.shape, dtype=torch.bool)
    for i, (row, spec) in enumerate(seqs):
        ids[i, : len(row)] = row
        special[i, : len(row)] = spec
    return ids, special, lengths


def feed(ctx: RoleContext, reducers, progress=None) -> StreamReport:
    """Run ``ctx.model`` over ``ctx.items`` (:func:`probe_items`), ``cfg.batch_size`` at a
    time in order (under ``ctx.part`` only its batches), into ``reducers``; ``progress(done, total)`` counts items (sequences), as
    the text corpora's capture does."""
    ids, special, lengths = padded(ctx.items, pad_id(ctx.model.tokenizer))
    n = ids.shape[0]
    starts = list(range(0, n, ctx.cfg.batch_size))
    starts = [s for b, s in enumerate(starts) if in_part(ctx.part, b)]  # a sharded run's part: its batches
    ends = [min(s + ctx.cfg.batch_size, n) for s in starts]
    report = StreamReport(n_items=n, n_used=sum(e - s for s, e in zip(starts, ends)), n_batches=len(starts))
    report.real_tokens = sum(sum(lengths[s:e]) for s, e in zip(starts, ends))
    chunk = ctx.cfg.query_chunk
    report.patterns = pattern_line(ctx.model, reducers, chunk, chunk_plan(ctx.model, reducers, ("pattern",), chunk)[1])
    for s, e in zip(starts, ends):
        width = max(lengths[s:e])
        cap = capture_ids(
            model=ctx.model,
            ids=ids[s:e, :width],
            special=special[s:e, :width],
            item_ids=range(s, e),
            lengths=lengths[s:e],
            query_chunk=chunk,
            reducers=reducers,
        )
        feed_capture(cap, reducers)
        report.padded_tokens += width * (e - s) - sum(lengths[s:e])
        if progress is not None:
            progress(e, n)
    return report


def _reducer(ctx: RoleContext) -> InductionReducer:
    return InductionReducer(
        causal=ctx.model.spec.causal,
        exclude_bos=ctx.options.get("exclude_bos", False),
        exclude_current_token=ctx.options.get("exclude_current_token", False),
    )


def finish(reducer: InductionReducer, report, ctx: RoleContext) -> RoleOutput:
    """A filled reducer -> :class:`RoleOutput` with ``extra["sequences"]`` (the ids used,
    ``[n, pos]``) and ``extra["notes"]``."""
    cfg = ctx.cfg
    values, base, layers = reducer.result()
    rows = []
    for role in reducer.roles:
        rows += layered_rows(
            values[role],
            base[role],
            layers,
            role=role,
            score_kind=SCORE_KIND,
            cfg=cfg,
            threshold_kind="absolute",
            threshold=cfg.induction_threshold,
        )
    notes = [] if not ctx.model.spec.causal else ["causal model: next-token is impossible and not reported"]
    ids = padded(ctx.items, pad_id(ctx.model.tokenizer))[0]
    return RoleOutput(
        frame=roles_frame(rows),
        skipped=Counter(report.skipped),
        n_items=report.n_used,
        extra={"sequences": ids, "notes": notes},
    )


#: the group this module defines (registered in pipeline order by :mod:`.shipped`)
ATTENTION_VS_EFFECT = (
    "Attention score and causal effect answer different questions: the score (the roles' induction score, as "
    "transformer-lens' detect_head) is the share of a head's attention on the token after an earlier copy of the "
    "query token; the effect is the share of the answer's log-probability its output restores. A head can attend "
    "like an induction head while later layers barely read what it writes (or others write the same), and a head "
    "that carries the effect may attend elsewhere, reading what an induction head wrote, so the two top lists differ."
)


ROLE_DEF = Role(
    name="induction",
    corpus="generated",
    score_kind=SCORE_KIND,
    reducer=_reducer,
    finish=finish,
    items=probe_items,
    feed=feed,
    shards=True,
    options=("items", "vocab_ids", "exclude_bos", "exclude_current_token"),
    task="induction",
    task_note=ATTENTION_VS_EFFECT,
    generated=lambda cfg: (2 * cfg.induction_seq_len + 2, cfg.induction_n_sequences),
    row_tasks={"previous-token": "duplicate_token", "duplicate-token": "duplicate_token"},
    description=(
        "induction, duplicate-token, previous-token (and next-token, bidirectional models): the share of a "
        "head's attention mass on the cells of the transformer-lens detection pattern over repeated random "
        "token sequences (error_measure='mul'), against uniform attention. Options: items (sequences to use "
        "instead of random ones), vocab_ids (ids to draw from), exclude_bos, exclude_current_token "
        "(default False, as detect_head)."
    ),
)
