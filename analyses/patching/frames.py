"""The patching frame and its statistics: normalised effects, intervals, p-values, agreement.

One row per (layer, head, method) — :data:`PATCH_COLUMNS` (+ ``position`` for
per-position runs, + ``receiver`` for path patching):

* ``method``: ``"activation_denoising"``, ``"activation_noising"``,
  ``"attribution_denoising"``, ``"attribution_noising"`` (``attribution_bypass_heads_*``,
  ``attribution_qk_fix_*``, ``attribution_graddrop_*``, ``attribution_qk_fix_graddrop_*`` for the
  other gradients and AtP*'s corrections), ``"path_{q,k,v}_{direction}"``,
  ``"ablation_zero"``, ``"ablation_mean"``, ``"ablation_resample"``;
* ``effect``: the normalised effect, the share of the clean − corrupted gap of the
  metric the patch moves: denoising (clean into the corrupted run)
  ``(m_patched - m_corrupted) / gap``, so 0 = the corrupted run, 1 = the clean run;
  noising (corrupted into the clean run) ``(m_clean - m_patched) / gap``, so 0 = the
  clean run, 1 = fully corrupted; ablation (on the clean run, like noising: the fraction
  of the gap lost) ``(m_clean - m_ablated) / gap``, so 0 = the clean run, 1 = as low as
  the corrupted run; ``gap = mean(m_clean - m_corrupted)`` over items;
* ``position`` (per-position activation patching only; absent otherwise): the patched
  position counted from the end of the input, ``-1`` = the last token;
* ``ci_low``, ``ci_high``: percentile bootstrap over items of the per-item values
  ``delta_i / gap`` (the gap held fixed);
* ``p_value``: two-sided sign-flip permutation p that the effect is 0, BH-adjusted
  over the units of one method (``p_raw`` before adjustment); ``significant``:
  ``p_value < alpha``; ``n``: items (per position: the items that have the position;
  resample ablation: the items that have a donor). Per position, BH runs over every
  (unit, position) of the method.

>>> import torch
>>> f = effect_frame(torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]), torch.ones(4),
...     [[(0, 0)], [(0, 1)]], method="activation_denoising", n_perm=200)
>>> f["effect"].tolist(), f["significant"].tolist(), f["n"].tolist()
([1.0, 0.0], [False, False], [4, 4])
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import torch

from headscope.analyses.stats.resampling import adjust_p, bootstrap_ci, paired_permutation_p

PATCH_COLUMNS = [
    "layer",  # int, 0-based
    "head",  # int, 0-based query head (a KV-group unit gives one row per query head of the group)
    "method",  # category: activation_/attribution_{denoising,noising}, path_{q,k,v}_{direction}, ablation_{kind}
    "effect",  # normalised effect (see module docstring)
    "ci_low",  # bootstrap interval of effect
    "ci_high",
    "p_value",  # two-sided sign-flip p of effect == 0, BH-adjusted over the method's units
    "significant",  # bool: p_value < alpha
    "n",  # items
]
"""Columns of a patching frame (``position`` added for per-position runs, ``receiver``
(``"L.H"``) and ``receiver_reads`` for path patching; ``p_raw`` and ``unit``
(``"head"``/``"kv_group"``) follow, and ``definition``, what the method computed in one
sentence (:func:`definition`), closes every row)."""


_RUNS = {"denoising": ("corrupted", "clean"), "noising": ("clean", "corrupted")}  # (run patched, source)
_ABLATED = {
    "zero": "set to 0",
    "mean": "set to its mean over every token of the task's clean inputs (one d_head vector per head, "
    "the same for every item and position; the ablated item included)",
    "mean_position": "set to its mean over the task's clean inputs at the same position counted from the end "
    "(the ablated item included)",
    "resample": "taken from the clean run of another item of the same token length (a seeded derangement)",
}


def definition(method: str, receiver_reads: str | None = None) -> str:
    """What a frame's ``method`` computed, in one sentence (the frame's ``definition`` column).

    >>> definition("activation_noising")
    "the clean run with the unit's z replaced by the corrupted run's"
    >>> definition("path_k_noising", "head")
    "the clean run where only the receiver's own read of its k input sees the sender's z from the corrupted run"
    """
    kind, _, direction = method.rpartition("_")
    if kind == "ablation" or method.startswith("ablation_"):
        return f"the clean run with the unit's z {_ABLATED[method.removeprefix('ablation_')]}"
    target, source = _RUNS[direction]
    if kind == "activation":
        return f"the {target} run with the unit's z replaced by the {source} run's"
    if kind.startswith("attribution"):
        through = "with later heads cut" if kind == "attribution_bypass_heads" else "through every later path"
        text = (
            f"first-order estimate of activation_{direction}: (z_{source} − z_{target}) · ∂m/∂z at the {target} "
            f"run, ∂m/∂z {through}"
        )
        if "qk_fix" in kind:
            text += "; AtP* QK-fix: later layers' attention patterns changed exactly by the unit's write W_O Δz"
        if "graddrop" in kind:
            text += "; AtP* GradDrop: mean over the other layers of |estimate| with that layer's gradient dropped"
        return text
    if kind.startswith("path_"):
        via = kind.removeprefix("path_")
        whose = "its KV group's read" if receiver_reads == "kv_group" else "the receiver's own read"
        return f"the {target} run where only {whose} of its {via} input sees the sender's z from the {source} run"
    raise ValueError(f"no definition for method {method!r}")


def two_sided_p(values: torch.Tensor, *, n_perm: int, seed: int) -> torch.Tensor:
    """Two-sided sign-flip p that the mean of ``values [n_items, n_units]`` is 0:
    ``min(1, 2 min(p_greater, p_less))``; 1 where every value is 0."""
    greater = paired_permutation_p(values, 0.0, n_perm=n_perm, seed=seed)
    less = paired_permutation_p(-values, 0.0, n_perm=n_perm, seed=seed)
    p = torch.clamp(2 * torch.minimum(greater, less), max=1.0)
    return torch.where((values == 0).all(0), torch.ones_like(p), p)


def normalised_values(delta: torch.Tensor, gap: torch.Tensor) -> torch.Tensor:
    """Per-item ``delta [n_items, n_units]`` / ``mean(gap [n_items])``: their mean over items
    is the normalised effect. A gap that is not positive makes no sense to normalise by
    (the clean run is not better than the corrupted one on this task): a warning, NaN.

    >>> normalised_values(torch.tensor([[2.0], [0.0]]), torch.tensor([2.0, 2.0])).tolist()
    [[1.0], [0.0]]
    """
    g = float(gap.float().mean())
    if not np.isfinite(g) or g <= 1e-6:
        warnings.warn(
            f"the clean - corrupted gap of the metric is {g:.3g} (should be > 0): the task does not separate "
            "clean from corrupted on this model; effects are NaN",
            stacklevel=2,
        )
        return torch.full_like(delta.float(), float("nan"))
    return delta.float() / g


def effect_frame(
    delta: torch.Tensor,
    gap: torch.Tensor,
    units: list[list[tuple[int, int]]],
    *,
    method: str,
    alpha: float = 0.05,
    n_boot: int = 1000,
    n_perm: int = 10000,
    seed: int = 0,
    unit: str = "head",
    extra: dict | None = None,
) -> pd.DataFrame:
    """The :data:`PATCH_COLUMNS` frame of per-item changes ``delta [n_items, n_units]``
    (in the direction of the method's effect, see the module docstring) and per-item
    ``gap [n_items]`` (``m_clean - m_corrupted``); ``units[u]`` the heads of unit ``u``
    (one row each). ``extra``: constant columns added (e.g. ``{"receiver": "1.1"}``)."""
    what = definition(method, (extra or {}).get("receiver_reads"))
    if "position" in (extra or {}):
        what += ", at the row's position only"
    values = normalised_values(delta, gap)
    n = values.shape[0]
    effect = values.mean(0)
    if torch.isnan(effect).all():
        lo = hi = p_raw = torch.full_like(effect, float("nan"))
    else:
        lo, hi = bootstrap_ci(values, n_boot=n_boot, seed=seed)
        p_raw = two_sided_p(values, n_perm=n_perm, seed=seed)
    p = adjust_p(p_raw, "bh")
    rows = []
    for u, heads in enumerate(units):
        for layer, head in heads:
            rows.append(
                {
                    "layer": int(layer),
                    "head": int(head),
                    "method": method,
                    "effect": float(effect[u]),
                    "ci_low": float(lo[u]),
                    "ci_high": float(hi[u]),
                    "p_value": float(p[u]),
                    "significant": bool(p[u] < alpha),
                    "n": int(n),
                    "p_raw": float(p_raw[u]),
                    "unit": unit,
                    **(extra or {}),
                    "definition": what,
                }
            )
    return pd.DataFrame(rows, columns=[*PATCH_COLUMNS, "p_raw", "unit", *(extra or {}), "definition"])


def agreement(a: pd.DataFrame, b: pd.DataFrame, *, k: int = 10) -> dict:
    """How two patching frames rank the heads: ``{"spearman", "top_k_overlap", "k", "n_heads"}``
    (Spearman over the heads both hold; top-k overlap = shared heads among the ``k``
    largest effects of each, divided by ``k``). Rows are matched on (layer, head), and on
    ``position`` too where both frames have one (per-position frames: ``n_heads`` then
    counts (head, position) cells).

    >>> a = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "effect": [0.9, 0.1, 0.5]})
    >>> b = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "effect": [0.8, 0.0, 0.6]})
    >>> agreement(a, b, k=2)
    {'spearman': 1.0, 'top_k_overlap': 1.0, 'k': 2, 'n_heads': 3}
    """
    from scipy.stats import spearmanr

    key = ["layer", "head"] + (["position"] if "position" in a and "position" in b else [])
    m = a[[*key, "effect"]].merge(b[[*key, "effect"]], on=key, suffixes=("_a", "_b"))
    m = m.dropna()
    k = min(k, len(m))
    if len(m) < 2:
        return {"spearman": float("nan"), "top_k_overlap": float("nan"), "k": k, "n_heads": len(m)}
    rho = spearmanr(m["effect_a"], m["effect_b"]).statistic
    top_a = set(map(tuple, m.nlargest(k, "effect_a")[key].values.tolist()))
    top_b = set(map(tuple, m.nlargest(k, "effect_b")[key].values.tolist()))
    return {
        "spearman": float(rho),
        "top_k_overlap": len(top_a & top_b) / k if k else float("nan"),
        "k": int(k),
        "n_heads": int(len(m)),
    }


def top_heads(frame: pd.DataFrame, k: int = 5) -> list[tuple[int, int]]:
    """The ``k`` (layer, head) with the largest ``effect`` (ties: lower layer, head first)."""
    f = frame.dropna(subset=["effect"]).sort_values(["effect", "layer", "head"], ascending=[False, True, True])
    return [(int(r.layer), int(r.head)) for r in f.head(k).itertuples()]
