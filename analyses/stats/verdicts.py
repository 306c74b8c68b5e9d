"""Per-item values of a role -> ROLE_COLUMNS rows (score, baseline, CI, p, verdict).

Every role analysis ends the same way: for each head it has one value per item (a 0/1
hit, an attention mass, a share of max-attention) and a baseline value per item (what
uniform attention, or a positional rule, would score on the same item). This module
turns those into rows of :data:`~headscope.analyses.frames.ROLE_COLUMNS`:

* ``score`` = mean value over items; ``baseline`` = mean baseline; ``margin`` = difference;
* ``ci_low``/``ci_high`` (named in ``interval``) and ``p_raw``, the one-sided p that
  score > baseline (named in ``test``), depend on ``score_kind``:

  - ``"share"`` (continuous values in [0, 1]; the default): percentile bootstrap CI over
    items (:func:`~headscope.analyses.stats.resampling.bootstrap_ci`, seeded with
    ``cfg.seed``) and the paired sign-flip permutation p
    (:func:`~headscope.analyses.stats.resampling.paired_permutation_p`, ``cfg.n_perm``
    draws). Its floor ``1/(n_perm+1)`` may be above what the correction needs (rank 1 of
    BH over m heads: ``alpha/m``): then the heads whose p is at that floor or a few draws
    above it (any p below ``cfg.alpha``, the only ones that could pass), and only those,
    are redrawn with ``ceil(1/needed)`` permutations (at most ``cfg.n_perm_max``; same
    seed); only where that cap leaves them at a floor still too high does the normal
    approximation of the same null (:func:`tail_p`) stand in. ``test`` says which:
    ``"sign-flip permutation (2000)"``, ``"sign-flip permutation (7200, refined)"``,
    ``"sign-flip permutation (200000) + normal tail"``. ``needed`` is ``alpha/m`` (BH),
    ``alpha/(m·sum 1/i)`` (BY) or ``alpha`` (none), m = heads with a p in this call.
  - ``"hit"`` (0/1 values; anything else is a ``ValueError``): the Wilson score interval
    of the hit rate at ``cfg.ci_level`` (:func:`~headscope.analyses.stats.resampling.wilson_ci`).
    Wilson rather than Clopper-Pearson: its coverage is close to nominal on average,
    where Clopper-Pearson's guaranteed coverage makes it wider than needed (the decision
    rests on the exact p, not on the interval), and unlike the bootstrap or Wald it never
    collapses to a point at 0/n or n/n. The p is exact: against a 0/1 per-item baseline
    (constant or not)
    (syntactic's best fixed offset, coreference's nearest/first candidate) the exact
    sign test on the discordant items (McNemar's exact test: ``Binomial(head-only,
    head-only + baseline-only, 1/2)``, greater), ``test="exact sign test"``; against a
    constant rate ``p0`` the exact binomial test of k hits in n, ``"exact binomial"``;
    against any other baseline the sign-flip permutation as for shares.

* ``p_value`` = ``p_raw`` adjusted over the heads of this call (one role / relation /
  direction: ``family="role"``) by ``cfg.correction`` (``"bh"`` Benjamini-Hochberg,
  ``"by"`` Benjamini-Yekutieli, ``"none"``: ``family="none"``). :func:`apply_family`
  re-adjusts a whole run's table as one family when ``cfg.family == "global"`` (the
  refinement above aims at the family of its call; in a global family a refined p at
  its floor stays a valid, conservative p).
* ``meets_threshold``: ``n >= min_n`` and ``threshold_kind="margin"``: ``margin >=
  threshold`` (default ``cfg.margin``), or ``threshold_kind="absolute"``: ``score >=
  threshold``. ``verdict`` = ``meets_threshold`` and ``p_value < cfg.alpha``, in
  whichever family. Heads with fewer than ``min_n`` items keep their scores.

Values may be missing for some heads/items: pass NaN in the matrix, or a dict
``{(layer, head): 1-D values}``; ``n`` counts each head's own items.

>>> import torch
>>> from headscope.analyses.roles.config import RolesConfig
>>> v = torch.zeros(40, 4); v[:, 1] = 1.0          # layer 0 head 1 always hits
>>> rows = verdict_rows(v, 0.25, n_layers=2, n_heads=2, role="demo", cfg=RolesConfig(n_boot=200, n_perm=200))
>>> [(r["layer"], r["head"], r["score"], r["verdict"]) for r in rows]
[(0, 0, 0.0, False), (0, 1, 1.0, True), (1, 0, 0.0, False), (1, 1, 0.0, False)]
>>> rows[1]["test"], rows[1]["interval"], rows[1]["family"]  # 1/201 is not < alpha/4: 400 draws
('sign-flip permutation (400, refined)', 'bootstrap percentile', 'role')
>>> r = verdict_rows(v, 0.25, n_layers=2, n_heads=2, role="demo", cfg=RolesConfig(), score_kind="hit")[1]
>>> r["test"], r["interval"], round(r["ci_low"], 4), r["p_raw"] == 0.25**40  # 40/(40 + 1.96²); P(40 of 40 | 0.25)
('exact binomial', 'Wilson', 0.9124, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from headscope.analyses.stats.resampling import (
    adjust_p,
    binomial_p,
    bootstrap_ci,
    paired_permutation_p,
    required_p,
    sign_test_p,
    wilson_ci,
)

THRESHOLD_KINDS = ("margin", "absolute")
SCORE_KINDS = ("share", "hit")

if TYPE_CHECKING:  # only for annotations: importing the roles package here would be circular
    from headscope.analyses.roles.config import RolesConfig


def _to_tensor(x, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu()
    if isinstance(x, (np.ndarray, list, tuple, float, int)):
        return torch.as_tensor(np.asarray(x, dtype=np.float64))
    raise TypeError(f"{name} must be a tensor, array, list or number; got {type(x).__name__}")


def _columns_from_dict(values: Mapping, baseline, n_layers: int, n_heads: int):
    """dict {(layer, head): values} -> list of (col, values 1-D, baseline 1-D) per head."""
    cols = []
    for key, v in values.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise TypeError(f"values dict keys must be (layer, head) tuples; got {key!r}")
        layer, head = int(key[0]), int(key[1])
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"values dict key {key} out of range: layers 0..{n_layers - 1}, heads 0..{n_heads - 1}")
        vt = _to_tensor(v, "values").flatten()
        if isinstance(baseline, Mapping):
            if key not in baseline:
                raise ValueError(f"baseline dict lacks head {key}; give a baseline for every head in values")
            bt = _to_tensor(baseline[key], "baseline").flatten()
        else:
            bt = _to_tensor(baseline, "baseline")
            if bt.dim() == 1 and bt.numel() == n_layers * n_heads:
                bt = bt[layer * n_heads + head]
        bt = bt.expand_as(vt) if bt.numel() == 1 else bt
        if bt.shape != vt.shape:
            raise ValueError(f"baseline for head {key} has shape {tuple(bt.shape)}; values have {tuple(vt.shape)}")
        cols.append((layer * n_heads + head, vt, bt))
    return cols


def _columns_from_matrix(values: torch.Tensor, baseline, n_layers: int, n_heads: int):
    h_total = n_layers * n_heads
    if values.dim() != 2 or values.shape[1] != h_total:
        raise ValueError(
            f"values must be [n_items, n_layers*n_heads] = [n, {h_total}]; got shape {tuple(values.shape)}. "
            "Flatten [n, layer, head] with .reshape(n, -1)."
        )
    b = _to_tensor(baseline, "baseline")
    if b.dim() == 0:
        b = b.expand_as(values)
    elif b.dim() == 1 and b.numel() == h_total == values.shape[0]:
        raise ValueError(
            f"a 1-D baseline of length {h_total} is ambiguous here ({h_total} items and {h_total} heads); "
            "pass it as [n_items, 1] (per item) or [1, n_layers*n_heads] (per head)"
        )
    elif b.dim() == 1 and b.numel() == h_total:
        b = b[None].expand_as(values)
    elif b.dim() == 1 and b.numel() == values.shape[0]:
        b = b[:, None].expand_as(values)
    elif b.dim() == 2 and b.shape in ((1, h_total), (values.shape[0], 1)):
        b = b.expand_as(values)
    elif b.shape != values.shape:
        raise ValueError(
            f"baseline must be a scalar, [n_layers*n_heads]={h_total}, [n_items]={values.shape[0]} or the shape of "
            f"values {tuple(values.shape)}; got shape {tuple(b.shape)}"
        )
    return values, b


def tail_p(d: torch.Tensor) -> torch.Tensor:
    """Normal approximation of the one-sided sign-flip p for differences ``d [n, k]``:
    under random signs ``sum(d)`` has mean 0 and variance ``sum(d²)``, so
    ``p ≈ 1 - Φ(sum d / sqrt(sum d²))``, floored at the exact minimum ``2^-n_nonzero``.

    >>> float(tail_p(torch.ones(10, 1))[0]) == 2.0 ** -10
    True
    """
    d = d.double()
    s2 = (d * d).sum(0)
    z = d.sum(0) / s2.clamp_min(1e-300).sqrt()
    p = 0.5 * torch.erfc(z / math.sqrt(2.0))
    floor = torch.pow(torch.tensor(2.0, dtype=torch.float64), -(d != 0).sum(0).double())
    p = torch.maximum(p, floor)
    p = p.clamp_min(torch.finfo(torch.float64).tiny)  # a p-value is never exactly 0
    return torch.where(s2 > 0, p, torch.ones_like(p))


def _perm_label(n_perm: int, refined: bool = False, tail: bool = False) -> str:
    if tail:
        return f"sign-flip permutation ({n_perm}) + normal tail"
    return f"sign-flip permutation ({n_perm}{', refined' if refined else ''})"


class _Block:
    """One group of heads that share their items: ``v``, ``b`` ``[n, k]`` (no NaN) and the
    statistics of each column; ``perm`` marks the columns whose p is a sign-flip
    permutation p (they may need refining once the family size is known)."""

    def __init__(self, cols: list[int], v: torch.Tensor, b: torch.Tensor):
        self.cols, self.v, self.b = cols, v, b
        self.n = int(v.shape[0])


def _block_stats(blk: _Block, cfg: RolesConfig, score_kind: str, role: str) -> None:
    """Score, baseline, interval and raw p of every column of ``blk`` (sets attributes)."""
    v, b = blk.v, blk.b
    k = v.shape[1]
    blk.score, blk.base = v.mean(0), b.mean(0)
    blk.p = torch.full((k,), math.nan, dtype=torch.float64)
    blk.test = [""] * k
    blk.perm = torch.zeros(k, dtype=torch.bool)
    if score_kind == "hit":
        if not bool(((v == 0) | (v == 1)).all()):
            bad = v[(v != 0) & (v != 1)][:3].tolist()
            raise ValueError(f"score_kind='hit' needs 0/1 values; role {role!r} has values such as {bad}")
        hits = v.sum(0)
        blk.lo, blk.hi = wilson_ci(hits, torch.full_like(hits, blk.n), level=cfg.ci_level)
        blk.interval = ["Wilson"] * k
        b01 = ((b == 0) | (b == 1)).all(0)
        const = (b == b[:1]).all(0)
        sign = b01
        binom = ~b01 & const
        if bool(sign.any()):
            n_pos = ((v == 1) & (b == 0))[:, sign].sum(0)
            n_neg = ((v == 0) & (b == 1))[:, sign].sum(0)
            blk.p[sign] = sign_test_p(n_pos, n_neg)
        if bool(binom.any()):
            blk.p[binom] = binomial_p(hits[binom], blk.n, b[0, binom])
        for j in range(k):
            blk.test[j] = "exact sign test" if bool(sign[j]) else "exact binomial" if bool(binom[j]) else ""
        blk.perm = ~(sign | binom)
    else:
        lo, hi = bootstrap_ci(v.float(), n_boot=cfg.n_boot, level=cfg.ci_level, seed=cfg.seed)
        blk.lo, blk.hi = lo.double(), hi.double()
        blk.interval = ["bootstrap percentile"] * k
        blk.perm = torch.ones(k, dtype=torch.bool)
    if bool(blk.perm.any()):
        idx = torch.nonzero(blk.perm).flatten()
        p = paired_permutation_p(v[:, idx].float(), b[:, idx].float(), n_perm=cfg.n_perm, seed=cfg.seed).double()
        blk.p[idx] = p
        for j in idx.tolist():
            blk.test[j] = _perm_label(cfg.n_perm)


def _refine(blk: _Block, cfg: RolesConfig, needed: float) -> dict:
    """Where the Monte-Carlo floor ``1/(n_perm+1)`` is not below ``needed`` (what a raw p
    must beat to survive the correction), the permutation p of a head that could pass
    (below ``cfg.alpha``: an adjusted p is never below its raw p) is too coarse to decide:
    at the floor (no draw reached the observed mean) or a few draws above it (2/2001 where
    the exact p is 1e-4). Those heads only are redrawn with ``ceil(1/needed)``
    permutations (at most ``max(n_perm, n_perm_max)``; the same seed, so the first
    ``n_perm`` draws are the ones already made); only where even that leaves a p at a
    floor that is not below ``needed`` does the normal tail :func:`tail_p` (capped at that
    floor) stand in. Returns counts ``{"floor", "refined", "tail"}`` for this block
    (``floor``: heads at the ``n_perm`` floor)."""
    out = {"floor": 0, "refined": 0, "tail": 0}
    if not bool(blk.perm.any()):
        return out
    floor = 1.0 / (cfg.n_perm + 1)
    at_floor = blk.perm & (blk.p <= floor * (1 + 1e-6))
    out["floor"] = int(at_floor.sum())
    if floor < needed:
        return out
    coarse = blk.perm & ((blk.p < cfg.alpha) | at_floor)  # at_floor: when the floor itself is above alpha
    if not bool(coarse.any()):
        return out
    target = math.ceil(1.0 / needed)
    n_ref = min(target, max(cfg.n_perm, cfg.n_perm_max))
    idx = torch.nonzero(coarse).flatten()
    v, b = blk.v[:, idx], blk.b[:, idx]
    if n_ref > cfg.n_perm:
        p = paired_permutation_p(v.float(), b.float(), n_perm=n_ref, seed=cfg.seed).double()
        out["refined"] = int(idx.numel())
    else:
        p, n_ref = blk.p[idx], cfg.n_perm
    floor_ref = 1.0 / (n_ref + 1)
    use_tail = (p <= floor_ref * (1 + 1e-6)) & (floor_ref >= needed)
    if bool(use_tail.any()):
        p = torch.where(use_tail, torch.minimum(tail_p(v - b), torch.full_like(p, floor_ref)), p)
    blk.p[idx] = p
    for j, t in zip(idx.tolist(), use_tail.tolist()):
        blk.test[j] = _perm_label(n_ref, refined=n_ref > cfg.n_perm, tail=t)
    out["tail"] = int(use_tail.sum())
    return out


def _blocks(values, baseline, n_layers: int, n_heads: int) -> tuple[list[_Block], list[int]]:
    """Group the heads by their items: blocks of columns without NaN, and the columns
    that have no item at all."""
    blocks, empty = [], []
    if isinstance(values, Mapping):
        for col, v, b in _columns_from_dict(values, baseline, n_layers, n_heads):
            ok = ~(torch.isnan(v) | torch.isnan(b))
            if not bool(ok.any()):
                empty.append(col)
            else:
                blocks.append(_Block([col], v[ok][:, None], b[ok][:, None]))
        return blocks, empty
    v = _to_tensor(values, "values")
    v, b = _columns_from_matrix(v, baseline, n_layers, n_heads)
    missing = torch.isnan(v) | torch.isnan(b)
    if not bool(missing.any()):
        return [_Block(list(range(v.shape[1])), v, b)], empty
    groups: dict[bytes, list[int]] = {}  # heads see different items: group columns by their item mask
    for col in range(v.shape[1]):
        groups.setdefault((~missing[:, col]).numpy().tobytes(), []).append(col)
    for cols in groups.values():
        ok = ~missing[:, cols[0]]
        if not bool(ok.any()):
            empty.extend(cols)
        else:
            blocks.append(_Block(cols, v[ok][:, cols], b[ok][:, cols]))
    return blocks, empty


def family_label(cfg: RolesConfig, family: str | None = None) -> str:
    """The ``family`` column: ``"none"`` when ``cfg.correction == "none"`` (p_value is the
    raw p), else the family the correction spans (``"role"`` or ``"global"``)."""
    return "none" if cfg.correction == "none" else (family or "role")


def verdict_rows(
    values,
    baseline,
    *,
    n_layers: int,
    n_heads: int,
    role: str,
    cfg: RolesConfig,
    relation: str = "",
    direction: str = "",
    threshold_kind: str = "margin",
    threshold: float | None = None,
    min_n: int = 1,
    score_kind: str = "share",
    report: dict | None = None,
) -> list[dict]:
    """Rows of ROLE_COLUMNS, one per head, for one role (and relation/direction).

    ``values``: ``[n_items, n_layers*n_heads]`` (column ``layer*n_heads + head``; NaN =
    no value for that item and head), or a dict ``{(layer, head): [n_items_of_head]}``
    (heads absent from the dict get no row).
    ``baseline``: scalar, ``[n_layers*n_heads]`` (per head), ``[n_items]`` (per item),
    the shape of ``values``, or (with dict values) a dict of the same keys.
    ``threshold_kind``: ``"margin"`` (default threshold ``cfg.margin``) or ``"absolute"``
    (``threshold`` required). ``min_n``: heads with fewer items get no verdict.
    ``score_kind``: ``"share"`` (continuous values: bootstrap CI, sign-flip p) or
    ``"hit"`` (0/1 values: Wilson CI, exact tests); see the module doc.
    ``report``: if a dict, counts are added to it: ``floor`` (heads whose permutation p
    sat at its floor), ``refined`` (heads redrawn with more permutations), ``tail`` (heads
    whose p is the normal tail).

    Raises ``ValueError`` on shape mismatches, unknown ``threshold_kind`` or
    ``score_kind``, a missing absolute threshold, or non-0/1 values with
    ``score_kind="hit"``; ``TypeError`` on values of the wrong type.
    """
    threshold = _check_verdict_args(threshold_kind, threshold, score_kind, role, cfg, n_layers, n_heads)
    res = _stats_by_column(values, baseline, n_layers, n_heads, cfg, score_kind, role, report)
    cols = sorted(res)
    raw_p = torch.tensor([res[c][4] for c in cols], dtype=torch.float64)
    adj = adjust_p(raw_p, cfg.correction)
    family = family_label(cfg)
    rows = []
    for c, p in zip(cols, adj.tolist()):
        score, base, lo, hi, p_raw, n, test, interval = res[c]
        margin = score - base
        crit = margin if threshold_kind == "margin" else score
        meets = n >= max(min_n, 1) and not math.isnan(crit) and crit >= threshold - 1e-12
        verdict = meets and not math.isnan(p) and p < cfg.alpha
        rows.append(
            {
                "layer": c // n_heads,
                "head": c % n_heads,
                "role": role,
                "relation": relation,
                "direction": direction,
                "score": score,
                "baseline": base,
                "margin": margin,
                "ci_low": lo,
                "ci_high": hi,
                "p_value": p,
                "n": n,
                "verdict": bool(verdict),
                "p_raw": p_raw,
                "test": test,
                "interval": interval,
                "family": family,
                "meets_threshold": bool(meets),
            }
        )
    return rows


def _check_verdict_args(threshold_kind, threshold, score_kind, role, cfg, n_layers, n_heads) -> float:
    """:func:`verdict_rows`' argument checks -> the threshold (``cfg.margin`` by default)."""
    if threshold_kind not in THRESHOLD_KINDS:
        raise ValueError(f"threshold_kind must be one of {THRESHOLD_KINDS}; got {threshold_kind!r}")
    if score_kind not in SCORE_KINDS:
        raise ValueError(f"score_kind must be one of {SCORE_KINDS}; got {score_kind!r} (role {role!r})")
    if threshold is None:
        if threshold_kind == "absolute":
            raise ValueError("threshold_kind='absolute' needs an explicit threshold (e.g. cfg.positional_threshold)")
        threshold = cfg.margin
    if not all(hasattr(cfg, a) for a in ("alpha", "margin", "n_boot", "n_perm", "correction", "seed")):
        raise TypeError(f"cfg must be a RolesConfig; got {type(cfg).__name__}")
    if n_layers < 1 or n_heads < 1:
        raise ValueError(f"n_layers and n_heads must be >= 1; got {n_layers}, {n_heads}")
    return threshold


def _stats_by_column(values, baseline, n_layers, n_heads, cfg, score_kind, role, report) -> dict[int, tuple]:
    """``{column: (score, baseline, ci_low, ci_high, raw p, n, test, interval)}`` for every
    head of :func:`verdict_rows` (NaN and n = 0 for a head without items); raw p refined
    where the family's correction needs it (counts added to ``report``)."""
    blocks, empty = _blocks(values, baseline, n_layers, n_heads)
    for blk in blocks:
        _block_stats(blk, cfg, score_kind, role)
    m = sum(int((~torch.isnan(blk.p)).sum()) for blk in blocks)  # the family: this call's heads with a p
    needed = required_p(m, cfg.alpha, cfg.correction)
    counts = {"floor": 0, "refined": 0, "tail": 0}
    for blk in blocks:
        for key, c in _refine(blk, cfg, needed).items():
            counts[key] += c
    if report is not None:
        for key, c in counts.items():
            report[key] = report.get(key, 0) + c

    nan = math.nan
    res: dict[int, tuple] = {col: (nan, nan, nan, nan, nan, 0, "", "") for col in empty}
    for blk in blocks:
        for j, col in enumerate(blk.cols):
            res[col] = (
                float(blk.score[j]),
                float(blk.base[j]),
                float(blk.lo[j]),
                float(blk.hi[j]),
                float(blk.p[j]),
                blk.n,
                blk.test[j],
                blk.interval[j],
            )
    return res


def apply_family(frame: pd.DataFrame, cfg: RolesConfig) -> pd.DataFrame:
    """The roles table with its correction family set by ``cfg.family``; pure (returns a
    new frame, or ``frame`` itself when there is nothing to do).

    * ``"role"``: each :func:`verdict_rows` call (one role/relation/direction over the
      heads of a run) already is the family; ``frame`` is returned unchanged.
    * ``"global"``: every row of ``frame`` (all heads × roles × relations × directions of
      one run) is one family: ``p_value`` = ``cfg.correction`` of ``p_raw`` over all rows
      with a p, ``verdict`` = ``meets_threshold`` and ``p_value < cfg.alpha``, ``family``
      = ``"global"`` (``"none"`` when ``cfg.correction == "none"``).

    The permutation refinement in :func:`verdict_rows` aims at the family of its call; a
    p at the permutation floor in a global family is still a valid (conservative) p.

    >>> import pandas as pd
    >>> from headscope.analyses.roles.config import RolesConfig
    >>> f = pd.DataFrame({"p_raw": [0.001, 0.004, 0.5], "p_value": [0.002, 0.004, 0.5],
    ...                   "meets_threshold": [True, True, True], "verdict": [True, True, False], "family": "role"})
    >>> g = apply_family(f, RolesConfig(family="global"))
    >>> [round(x, 6) for x in g["p_value"]], g["verdict"].tolist()
    ([0.003, 0.006, 0.5], [True, True, False])
    """
    if cfg.family == "role":
        return frame
    if cfg.family != "global":
        raise ValueError(f"cfg.family must be 'role' or 'global'; got {cfg.family!r}")
    missing = [c for c in ("p_raw", "meets_threshold") if c not in frame]
    if missing:
        raise ValueError(f"a global family needs the columns {missing} (rows from verdict_rows carry them)")
    out = frame.copy()
    p = adjust_p(torch.tensor(out["p_raw"].to_numpy(dtype=np.float64)), cfg.correction).numpy()
    out["p_value"] = p
    out["verdict"] = out["meets_threshold"].astype(bool).to_numpy() & (np.nan_to_num(p, nan=1.0) < cfg.alpha)
    out["family"] = family_label(cfg, "global")
    return out


def layered_rows(
    values: torch.Tensor, baseline, layers, *, role: str, cfg: RolesConfig, score_kind: str = "share", **kwargs
) -> list[dict]:
    """:func:`verdict_rows` for ``values [n_items, n_layers_captured, n_heads]`` whose
    second axis holds the model layers ``layers``; ``baseline`` is a scalar, ``[n_items]``
    or the shape of ``values``. Row ``layer`` fields are the model's layer numbers;
    ``score_kind`` and ``kwargs`` go to :func:`verdict_rows`."""
    values = _to_tensor(values, "values")
    if values.dim() != 3:
        raise ValueError(f"values must be [n_items, layer, head]; got shape {tuple(values.shape)}")
    n, n_l, n_h = values.shape
    if len(layers) != n_l:
        raise ValueError(f"values hold {n_l} layers but {len(layers)} layer numbers were given")
    b = _to_tensor(baseline, "baseline")
    if b.dim() == 3:
        b = b.reshape(n, n_l * n_h)
    elif b.dim() == 1:
        if b.numel() != n:
            raise ValueError(f"a 1-D baseline must hold one value per item ({n}); got {b.numel()}")
        b = b[:, None].expand(n, n_l * n_h)
    rows = verdict_rows(
        values.reshape(n, n_l * n_h), b, n_layers=n_l, n_heads=n_h, role=role, cfg=cfg, score_kind=score_kind, **kwargs
    )
    for r in rows:
        r["layer"] = int(layers[r["layer"]])
    return rows
