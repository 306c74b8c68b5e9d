"""Heads that park attention on special tokens, the first token, or punctuation.

Definitions:

* ``special`` — mean attention mass on special tokens (``[CLS]``, ``[SEP]``, BOS/EOS, as
  flagged by :attr:`TokenBatch.special`). Clark et al. 2019, "What Does BERT Look At?",
  §3: heads that put most of their attention on ``[SEP]``/``[CLS]``.
* ``sink:first-token`` — mean attention mass on the first position (``[CLS]``/BOS, or the
  first real token when the tokenizer adds none). Xiao et al. 2023, "Efficient Streaming
  Language Models with Attention Sinks".
* ``punctuation`` — mean attention mass on punctuation tokens: a token whose non-space
  characters (taken from the text through its character offsets) are all Unicode
  punctuation (category ``P*``). Clark et al. 2019 §3 (attention to "." and ",").

Each value is per item the mean over its analysed query rows (real, non-special unless
``include_special``), of the row's mass on the token set. Rows that cannot see any token
of the set (a causal query before the first punctuation mark) are left out of that set's
mean, and items with no such row are left out of the role (``n`` counts the rest).
Baseline: the mass the same rows would put on the set under uniform attention over
the keys they see (``n_set_keys / n_keys``). Verdict: score ``>= cfg.special_threshold``
(special, sink) or ``>= cfg.punctuation_threshold`` (punctuation), and BH-adjusted p <
``cfg.alpha`` against the baseline. (The summary statistics — entropy, KL from uniform,
… — are the ``summary`` group, :mod:`headscope.analyses.roles.pattern_stats`.)

``special`` and ``sink:first-token`` are masses on different key sets (every special
token vs position 0); ``positional:first`` (:mod:`.positional`) counts the rows whose
*maximum* lands on position 0. On encoders, where ``[CLS]`` is position 0, the three
flag many of the same heads (:func:`~headscope.analyses.roles.pipeline.verdict_overlap`).

>>> punctuation_token("Ġ,") , is_punctuation(" ,"), is_punctuation("a."), is_punctuation("...")
(False, True, False, True)
"""

from __future__ import annotations

import unicodedata
from collections import Counter

import torch

from headscope.analyses.frames import roles_frame
from headscope.analyses.roles.base import Role, RoleContext
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.pattern_stats import ItemValuesReducer, masked_pattern
from headscope.analyses.stats.verdicts import layered_rows

ROLES = {
    "special": "special_threshold",
    "sink:first-token": "special_threshold",
    "punctuation": "punctuation_threshold",
}

#: what the per-item values are (:mod:`headscope.analyses.stats.verdicts` picks the interval and test)
SCORE_KIND = "share"


def is_punctuation(s: str) -> bool:
    """True when ``s`` has a non-space character and all of them are Unicode punctuation."""
    chars = [c for c in s if not c.isspace()]
    return bool(chars) and all(unicodedata.category(c).startswith("P") for c in chars)


def punctuation_token(token: str) -> bool:
    """Whether a token STRING is punctuation (no offsets: BPE markers such as ``Ġ`` count
    as letters, so prefer :func:`punctuation_mask`, which reads the text)."""
    return is_punctuation(token)


def punctuation_mask(tokens) -> torch.Tensor:
    """``[batch, pos]`` bool from a :class:`TokenBatch`: True on punctuation tokens,
    judged on the text span each token covers (special and padding tokens are False)."""
    m = torch.zeros(tokens.input_ids.shape, dtype=torch.bool, device="cpu")  # from Python lists: on the host
    for i, (text, offs, spec) in enumerate(zip(tokens.texts, tokens.offsets, tokens.special)):
        flags = [(not s) and b > a and is_punctuation(text[a:b]) for (a, b), s in zip(offs, spec)]
        m[i, : len(flags)] = torch.tensor(flags, dtype=torch.bool, device="cpu")
    return m


def set_mass(pattern: torch.Tensor, allowed: torch.Tensor, rows: torch.Tensor, key_set: torch.Tensor):
    """Mass on a key set, per item.

    ``pattern [batch, head, query_pos, key_pos]``, ``allowed [batch, query_pos, key_pos]``,
    ``rows [batch, query_pos]``, ``key_set [batch, key_pos]`` ->
    ``(value [batch, head], baseline [batch])``; NaN for items where no analysed row sees
    a key of the set.
    """
    value, base = set_masses(pattern, allowed, rows, key_set[..., None])
    return value[..., 0], base[..., 0]


def set_masses(pattern: torch.Tensor, allowed: torch.Tensor, rows: torch.Tensor, key_sets: torch.Tensor):
    """:func:`set_mass` of several key sets at once: ``key_sets [batch, key_pos, n_sets]``
    -> ``(value [batch, head, n_sets], baseline [batch, n_sets])``. The masses are one
    matrix product over keys, ``(pattern * allowed) @ key_sets``."""
    return masked_set_masses(masked_pattern(pattern, allowed), allowed, rows, key_sets)


def masked_set_masses(masked: torch.Tensor, allowed: torch.Tensor, rows: torch.Tensor, key_sets: torch.Tensor):
    """:func:`set_masses` of a pattern already zeroed outside ``allowed``
    (:func:`~headscope.analyses.roles.pattern_stats.masked_pattern`), as the reducers share it."""
    mass, n_set, n_keys = set_mass_rows(masked, allowed, key_sets)
    return masses_from_rows(mass, n_set, n_keys, rows)


def set_mass_rows(masked: torch.Tensor, allowed: torch.Tensor, key_sets: torch.Tensor):
    """Per query row of a (piece of a) masked pattern ``[batch, head, rows, key_pos]``:
    ``(mass [batch, head, rows, set], visible keys of each set [batch, rows, set], visible
    keys [batch, rows, 1])``; the masses are one matrix product over keys."""
    b, h, q, k = masked.shape
    sets = key_sets.float()
    mass = (masked.reshape(b, h * q, k) @ sets).view(b, h, q, -1)  # [batch, head, q, set]
    allowed_f = allowed.float()
    return mass, allowed_f @ sets, allowed_f.sum(-1, keepdim=True)


def masses_from_rows(mass: torch.Tensor, n_set: torch.Tensor, n_keys: torch.Tensor, rows: torch.Tensor):
    """:func:`masked_set_masses` from every row's :func:`set_mass_rows`."""
    r = (rows[..., None] & (n_set > 0)).float()  # rows that can see the set
    denom = r.sum(1)  # [batch, set]
    value = (mass * r[:, None]).sum(2) / denom[:, None]
    base = (n_set / n_keys.clamp_min(1) * r).sum(1) / denom
    return value, base


class SpecialReducer(ItemValuesReducer):
    """Streaming masses on special tokens, the first token and punctuation;
    ``result()`` -> ``({role: [n_items, layer, head]}, {role: [n_items]}, layers)``."""

    def begin(self, cap) -> None:
        super().begin(cap)
        _, special = self._rows(cap)
        km = cap.key_mask
        first = torch.zeros_like(km)
        first[:, 0] = km[:, 0]
        sets = {
            "special": special & km,
            "sink:first-token": first,
            "punctuation": punctuation_mask(cap.tokens).to(km.device) & km,
        }
        self._key_sets = torch.stack([sets[r] for r in ROLES], -1)  # [batch, pos, set]

    def piece(self, cap, piece) -> None:
        mass, n_set, n_keys = set_mass_rows(self._masked(piece), self._allowed(piece), self._key_sets)
        self.piece_rows.add("mass", piece.layer, mass, piece.rows, 2)
        if piece.layer == cap.layers[0]:  # the baselines need the keys only
            self.piece_rows.add("n_set", None, n_set, piece.rows, 1)
            self.piece_rows.add("n_keys", None, n_keys, piece.rows, 1)

    def end(self, cap) -> None:
        rows, _ = self._rows(cap)
        n_set, n_keys = self.piece_rows.get("n_set", None, 1), self.piece_rows.get("n_keys", None, 1)
        vals, base = [], None
        for layer in cap.layers:
            v, base = masses_from_rows(self.piece_rows.get("mass", layer, 2), n_set, n_keys, rows)
            vals.append(v)
        vals = torch.stack(vals, 1)  # [batch, layer, head, set]
        for i, role in enumerate(ROLES):
            self.values.add(role, cap.item_ids, vals[..., i].contiguous())
            self.values.add("baseline:" + role, cap.item_ids, base[:, i])

    def result(self):
        return self._by_role(ROLES)


def frame_from(values: dict, base: dict, layers, cfg: RolesConfig):
    """ROLE_COLUMNS rows for the roles that have items; and the count of items left out
    per role (no visible key of the set)."""
    rows, left_out = [], {}
    for role, attr in ROLES.items():
        v, b = values[role], base[role]
        if v.numel() == 0:
            continue
        ok = ~torch.isnan(b)
        left_out[role] = int((~ok).sum())
        if not bool(ok.any()):
            continue
        rows += layered_rows(
            v[ok],
            b[ok],
            layers,
            role=role,
            score_kind=SCORE_KIND,
            cfg=cfg,
            threshold_kind="absolute",
            threshold=getattr(cfg, attr),
        )
    return roles_frame(rows), left_out


def _reducer(ctx: RoleContext) -> SpecialReducer:
    return SpecialReducer(causal=ctx.model.spec.causal, include_special=ctx.options.get("include_special", False))


def finish(reducer: SpecialReducer, report, ctx: RoleContext) -> RoleOutput:
    """A filled reducer and the stream's report -> :class:`RoleOutput` (roles ``special``,
    ``sink:first-token``, ``punctuation``). ``skipped`` also counts, per role, items where
    no analysed row sees a token of the role's set (``"no punctuation token visible"``,
    ...); ``extra["left_out"]`` holds those counts."""
    values, base, layers = reducer.result()
    frame, left_out = frame_from(values, base, layers, ctx.cfg)
    skipped = Counter(report.skipped)
    for role, n in left_out.items():
        if n:
            skipped[f"no {role} token visible"] += n
    return RoleOutput(frame=frame, skipped=skipped, n_items=report.n_used, extra={"left_out": left_out})


#: the group this module defines (registered in pipeline order by :mod:`.shipped`)
ROLE_DEF = Role(
    name="special",
    corpus="text",
    score_kind=SCORE_KIND,
    reducer=_reducer,
    finish=finish,
    options=("include_special",),
    description=(
        "Attention MASS (mean over a head's query rows of the weight summed over a key set), against the "
        "mass under uniform attention. special: mass on every special token ([CLS], [SEP], BOS/EOS) "
        "wherever it stands (Clark et al. 2019); sink:first-token: mass on key position 0 alone, special "
        "or not (Xiao et al. 2023), so it leaves out [SEP] and counts a first real token when the tokenizer "
        "adds no BOS; punctuation: mass on punctuation tokens. Unlike positional:first, which counts the "
        "rows whose MAXIMUM lands on position 0, both are masses: a head whose largest weight is on [CLS] "
        "in every row but holds only 40% of the mass there is positional:first and neither sink nor special. "
        "Option include_special (default False): keep special tokens as query rows."
    ),
)
