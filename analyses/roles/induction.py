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

import torch

from headscope.analyses.frames import roles_frame
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.pattern_stats import ItemValuesReducer, allowed_keys, check_layers
from headscope.analyses.stats.verdicts import layered_rows
from headscope.probes.capture import Capture, check_finite
from headscope.probes.tokens import collate

ROLES = ("induction", "duplicate-token", "previous-token", "next-token")
CAUSAL_ROLES = ROLES[:3]
_PLACEHOLDER = re.compile(r"^(\[.*\]|<.*>)$")


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
    model, ids: torch.Tensor, special: torch.Tensor | None = None, *, layers=None, item_ids=None, lengths=None
) -> Capture:
    """Run ``model`` on token ids ``[batch, pos]`` (right-padded to ``lengths``) and
    capture patterns: the route for probes that are not text."""
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
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    batch = collate(items, pad)
    ls = tuple(range(model.spec.n_layers)) if layers is None else tuple(layers)
    data = model.run(batch, ("pattern",), ls)
    cap = Capture(
        tokens=batch,
        data=data,
        layers=ls,
        spec=model.spec,
        item_ids=list(range(n)) if item_ids is None else list(item_ids),
    )
    check_finite(cap)
    return cap


# -- scores ---------------------------------------------------------------------------------
def detection_patterns(input_ids: torch.Tensor, *, causal: bool) -> dict[str, torch.Tensor]:
    """``input_ids [batch, pos]`` -> ``{role: [batch, query_pos, key_pos] bool}`` (module
    docstring); ``next-token`` only for bidirectional models."""
    b, n = input_ids.shape
    eye = torch.eye(n, dtype=torch.bool)
    dup = (input_ids[:, :, None] == input_ids[:, None, :]) & ~eye
    ind = torch.zeros_like(dup)
    ind[:, :, 1:] = dup[:, :, :-1]
    prev = torch.zeros(n, n, dtype=torch.bool)
    prev[1:, :-1] = torch.eye(n - 1, dtype=torch.bool)
    out = {"induction": ind, "duplicate-token": dup, "previous-token": prev.expand(b, n, n)}
    if not causal:
        out["next-token"] = prev.T.expand(b, n, n)
    if causal:
        tri = torch.ones(n, n, dtype=torch.bool).tril()
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
    keep = valid.clone()
    if exclude_bos:
        keep[:, :, 0] = False
    if exclude_current_token:
        keep &= ~torch.eye(keep.shape[-1], dtype=torch.bool)
    a = pattern.float() * keep[:, None].float()
    return (a * detection[:, None].float()).sum((-1, -2)) / a.sum((-1, -2))


class InductionReducer(ItemValuesReducer):
    """Streaming induction / duplicate / previous (/ next) scores of every head;
    works on any capture (random repeats or natural text). ``result()`` ->
    ``({role: [n_items, layer, head]}, {role: [n_items]}, layers)``."""

    def __init__(self, *, causal: bool, exclude_bos: bool = False, exclude_current_token: bool = False):
        super().__init__(causal=causal)
        self.exclude_bos = exclude_bos
        self.exclude_current_token = exclude_current_token
        self.roles = CAUSAL_ROLES if causal else ROLES

    def update(self, cap) -> None:
        self.layers = check_layers(cap.layers, self.layers)
        km = cap.key_mask
        valid = allowed_keys(km, self.causal) & km[:, :, None]  # real query rows, visible keys
        dets = detection_patterns(cap.tokens.input_ids, causal=self.causal)
        n_vis = valid.float().sum(-1, keepdim=True).clamp_min(1)
        uniform = (valid.float() / n_vis)[:, None]  # [batch, 1, q, k]
        kw = dict(exclude_bos=self.exclude_bos, exclude_current_token=self.exclude_current_token)
        for role in self.roles:
            det = dets[role]
            vals = [mul_score(cap["pattern", layer], det, valid, **kw) for layer in cap.layers]
            self.values.add(role, cap.item_ids, torch.stack(vals, 1))
            self.values.add("baseline:" + role, cap.item_ids, mul_score(uniform, det, valid, **kw)[:, 0])

    def result(self):
        return self._by_role(self.roles)


def run(
    model,
    items=None,
    cfg: RolesConfig = RolesConfig(),
    *,
    progress=None,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    vocab_ids=None,
) -> RoleOutput:
    """Induction-family roles of every head.

    ``items``: ``None`` (default) draws ``cfg.induction_n_sequences`` sequences of
    ``2 * cfg.induction_seq_len`` repeated random tokens (+ first token) seeded with
    ``cfg.seed``; or a ``[n, pos]`` tensor / list of id lists to use instead.
    Returns :class:`RoleOutput` with ``extra["sequences"]`` (the ids used).
    """
    if items is None:
        ids, special = repeated_random_tokens(
            model.tokenizer,
            n_sequences=cfg.induction_n_sequences,
            seq_len=cfg.induction_seq_len,
            seed=cfg.seed,
            vocab_ids=vocab_ids,
        )
        lengths = [ids.shape[1]] * ids.shape[0]
    else:
        seqs = [list(map(int, s)) for s in (items.tolist() if isinstance(items, torch.Tensor) else items)]
        if not seqs or any(len(s) < 2 for s in seqs):
            raise ValueError("items must be sequences of at least 2 token ids each")
        lengths = [len(s) for s in seqs]
        pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(seqs), max(lengths)), pad, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
        specials = set(model.tokenizer.all_special_ids)
        special = torch.tensor([[int(x) in specials for x in row] for row in ids.tolist()]) & (
            torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]
        )
    too_long = [i for i, n in enumerate(lengths) if n > model.spec.max_positions]
    if too_long:
        raise ValueError(
            f"sequence {too_long[0]} has {lengths[too_long[0]]} tokens; the model's context is {model.spec.max_positions}"
        )
    red = InductionReducer(
        causal=model.spec.causal, exclude_bos=exclude_bos, exclude_current_token=exclude_current_token
    )
    n = ids.shape[0]
    starts = list(range(0, n, cfg.batch_size))
    for bi, s in enumerate(starts):
        e = min(s + cfg.batch_size, n)
        cap = capture_ids(
            model,
            ids[s:e, : max(lengths[s:e])],
            special[s:e, : max(lengths[s:e])],
            item_ids=range(s, e),
            lengths=lengths[s:e],
        )
        red.update(cap)
        if progress is not None:
            progress(bi + 1, len(starts))
    values, base, layers = red.result()
    rows = []
    for role in red.roles:
        rows += layered_rows(
            values[role],
            base[role],
            layers,
            role=role,
            cfg=cfg,
            threshold_kind="absolute",
            threshold=cfg.induction_threshold,
        )
    notes = [] if not model.spec.causal else ["causal model: next-token is impossible and not reported"]
    return RoleOutput(frame=roles_frame(rows), n_items=n, extra={"sequences": ids, "notes": notes})
