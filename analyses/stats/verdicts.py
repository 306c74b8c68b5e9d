"""Per-item values of a role -> ROLE_COLUMNS rows (score, baseline, CI, p, verdict).

Every role analysis ends the same way: for each head it has one value per item (a 0/1
hit, an attention mass, a share of max-attention) and a baseline value per item (what
uniform attention, or a positional rule, would score on the same item). This module
turns those into rows of :data:`~headscope.analyses.frames.ROLE_COLUMNS`:

* ``score`` = mean value over items; ``baseline`` = mean baseline; ``margin`` = difference;
* ``ci_low``/``ci_high`` = percentile bootstrap CI of the score over items
  (:func:`~headscope.analyses.stats.resampling.bootstrap_ci`, seeded with ``cfg.seed``);
* ``p_value`` = one-sided paired sign-flip permutation p that score > baseline
  (:func:`~headscope.analyses.stats.resampling.paired_permutation_p`), Benjamini-Hochberg adjusted
  over the heads of this call (one role / relation / direction) when
  ``cfg.correction == "bh"``. The column holds the ADJUSTED p. Where no permutation
  reaches the observed mean, the p below the Monte-Carlo floor ``1/(n_perm+1)`` comes
  from the normal approximation of the same sign-flip null (:func:`tail_p`);
* ``verdict``: ``threshold_kind="margin"``: ``margin >= threshold`` (default ``cfg.margin``)
  and adjusted ``p < cfg.alpha``; ``threshold_kind="absolute"``: ``score >= threshold`` and
  adjusted ``p < cfg.alpha``. Heads with fewer than ``min_n`` items get ``verdict=False``
  (their scores are still reported).

Values may be missing for some heads/items: pass NaN in the matrix, or a dict
``{(layer, head): 1-D values}``; ``n`` counts each head's own items.

>>> import torch
>>> from headscope.analyses.roles.config import RolesConfig
>>> v = torch.zeros(40, 4); v[:, 1] = 1.0          # layer 0 head 1 always hits
>>> rows = verdict_rows(v, 0.25, n_layers=2, n_heads=2, role="demo", cfg=RolesConfig(n_boot=200, n_perm=200))
>>> [(r["layer"], r["head"], r["score"], r["verdict"]) for r in rows]
[(0, 0, 0.0, False), (0, 1, 1.0, True), (1, 0, 0.0, False), (1, 1, 0.0, False)]
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.stats.resampling import benjamini_hochberg, bootstrap_ci, paired_permutation_p

THRESHOLD_KINDS = ("margin", "absolute")


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


def _stats(v: torch.Tensor, b: torch.Tensor, cfg: RolesConfig):
    """v, b [n, k] without NaN -> score, baseline, lo, hi, p (raw) each [k].

    The Monte-Carlo permutation p cannot go below ``1/(n_perm+1)``, which after BH over
    hundreds of heads would forbid any verdict; where no permutation reached the
    observed mean (p at that floor) the normal-approximation tail :func:`tail_p` (never
    above the floor) is used instead.
    """
    lo, hi = bootstrap_ci(v.float(), n_boot=cfg.n_boot, level=cfg.ci_level, seed=cfg.seed)
    p = paired_permutation_p(v.float(), b.float(), n_perm=cfg.n_perm, seed=cfg.seed).double()
    floor = 1.0 / (cfg.n_perm + 1)
    at_floor = p <= floor * (1 + 1e-6)
    if bool(at_floor.any()):
        p = torch.where(at_floor, torch.minimum(tail_p(v - b), torch.full_like(p, floor)), p)
    return v.mean(0), b.mean(0), lo.double(), hi.double(), p


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
) -> list[dict]:
    """Rows of ROLE_COLUMNS, one per head, for one role (and relation/direction).

    ``values``: ``[n_items, n_layers*n_heads]`` (column ``layer*n_heads + head``; NaN =
    no value for that item and head), or a dict ``{(layer, head): [n_items_of_head]}``
    (heads absent from the dict get no row).
    ``baseline``: scalar, ``[n_layers*n_heads]`` (per head), ``[n_items]`` (per item),
    the shape of ``values``, or (with dict values) a dict of the same keys.
    ``threshold_kind``: ``"margin"`` (default threshold ``cfg.margin``) or ``"absolute"``
    (``threshold`` required). ``min_n``: heads with fewer items get no verdict.

    Raises ``ValueError`` on shape mismatches, unknown ``threshold_kind`` or a missing
    absolute threshold; ``TypeError`` on values of the wrong type.
    """
    if threshold_kind not in THRESHOLD_KINDS:
        raise ValueError(f"threshold_kind must be one of {THRESHOLD_KINDS}; got {threshold_kind!r}")
    if threshold is None:
        if threshold_kind == "absolute":
            raise ValueError("threshold_kind='absolute' needs an explicit threshold (e.g. cfg.positional_threshold)")
        threshold = cfg.margin
    if not all(hasattr(cfg, a) for a in ("alpha", "margin", "n_boot", "n_perm", "correction", "seed")):
        raise TypeError(f"cfg must be a RolesConfig; got {type(cfg).__name__}")
    if n_layers < 1 or n_heads < 1:
        raise ValueError(f"n_layers and n_heads must be >= 1; got {n_layers}, {n_heads}")

    # per-head results, keyed by column
    res: dict[int, tuple] = {}
    if isinstance(values, Mapping):
        for col, v, b in _columns_from_dict(values, baseline, n_layers, n_heads):
            ok = ~(torch.isnan(v) | torch.isnan(b))
            v, b = v[ok], b[ok]
            if v.numel() == 0:
                res[col] = (math.nan, math.nan, math.nan, math.nan, math.nan, 0)
                continue
            s, bl, lo, hi, p = _stats(v[:, None], b[:, None], cfg)
            res[col] = (float(s[0]), float(bl[0]), float(lo[0]), float(hi[0]), float(p[0]), int(v.numel()))
    else:
        v = _to_tensor(values, "values")
        v, b = _columns_from_matrix(v, baseline, n_layers, n_heads)
        missing = torch.isnan(v) | torch.isnan(b)
        if not bool(missing.any()):
            s, bl, lo, hi, p = _stats(v, b, cfg)
            for col in range(v.shape[1]):
                res[col] = (float(s[col]), float(bl[col]), float(lo[col]), float(hi[col]), float(p[col]), v.shape[0])
        else:  # heads see different items: group columns by their item mask
            groups: dict[bytes, list[int]] = {}
            for col in range(v.shape[1]):
                groups.setdefault((~missing[:, col]).numpy().tobytes(), []).append(col)
            for cols in groups.values():
                ok = ~missing[:, cols[0]]
                n = int(ok.sum())
                if n == 0:
                    for col in cols:
                        res[col] = (math.nan, math.nan, math.nan, math.nan, math.nan, 0)
                    continue
                s, bl, lo, hi, p = _stats(v[ok][:, cols], b[ok][:, cols], cfg)
                for j, col in enumerate(cols):
                    res[col] = (float(s[j]), float(bl[j]), float(lo[j]), float(hi[j]), float(p[j]), n)

    cols = sorted(res)
    raw_p = torch.tensor([res[c][4] for c in cols], dtype=torch.float64)
    adj = raw_p.clone()
    finite = ~torch.isnan(raw_p)
    if cfg.correction == "bh" and bool(finite.any()):
        adj[finite] = benjamini_hochberg(raw_p[finite]).double()
    rows = []
    for c, p in zip(cols, adj.tolist()):
        score, base, lo, hi, _, n = res[c]
        margin = score - base
        if n < max(min_n, 1) or math.isnan(p):
            verdict = False
        elif threshold_kind == "margin":
            verdict = margin >= threshold - 1e-12 and p < cfg.alpha
        else:
            verdict = score >= threshold - 1e-12 and p < cfg.alpha
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
            }
        )
    return rows


def layered_rows(values: torch.Tensor, baseline, layers, *, role: str, cfg: RolesConfig, **kwargs) -> list[dict]:
    """:func:`verdict_rows` for ``values [n_items, n_layers_captured, n_heads]`` whose
    second axis holds the model layers ``layers``; ``baseline`` is a scalar, ``[n_items]``
    or the shape of ``values``. Row ``layer`` fields are the model's layer numbers."""
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
    rows = verdict_rows(values.reshape(n, n_l * n_h), b, n_layers=n_l, n_heads=n_h, role=role, cfg=cfg, **kwargs)
    for r in rows:
        r["layer"] = int(layers[r["layer"]])
    return rows
