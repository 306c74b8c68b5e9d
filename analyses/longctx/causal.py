"""The causal check of the retrieval heads (Wu et al. 2024): masking the top retrieval heads
should hurt copying on the needle task more than masking as many random heads.

:func:`causal_check` ranks the heads by their ``retrieval`` score (:mod:`.roles`), masks the
top ``causal_share`` of them (5%, at least one) with zero ablation through the pruning
studies' head gates (:func:`~headscope.analyses.pruning.gates.head_gates`, any backend), then
``causal_draws`` (5) seeded sets of as many heads drawn among the others (as
:func:`~headscope.analyses.pruning.ablation.role_ablation` draws them), and measures copy
accuracy (:func:`~headscope.analyses.longctx.needle.copy_accuracy`) on needle items for each.

Frame (:data:`CAUSAL_COLUMNS`), one row per condition, draw and item: ``condition``
(``"unmasked"``, ``"top"``, ``"random"``), ``draw`` (the random set's index; NA otherwise),
``item``, ``depth``, ``heads`` (the masked heads, ``"L1H2 L3H0"``), ``n_masked``,
``copy_accuracy`` (the item's share of answer tokens copied), ``damage`` (unmasked accuracy of
the item minus this one). Summary dict: the heads, accuracies, the mean damages, ``ratio`` =
top damage / mean random damage (``inf`` when random masks do no harm, NaN when neither
does), ``ratio_per_draw``, and ``ratio_ci``: a percentile bootstrap over items at the
roles' ``ci_level`` (``n_boot`` resamples, seeded), with the count of resamples whose random
damage was 0.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from headscope.analyses.longctx.config import LongContextConfig
from headscope.analyses.longctx.needle import copy_hits, item_logits
from headscope.analyses.longctx.roles import long_context_roles, long_items
from headscope.analyses.pruning.gates import head_gates

log = logging.getLogger(__name__)

CAUSAL_COLUMNS = ["condition", "draw", "item", "depth", "heads", "n_masked", "copy_accuracy", "damage"]


def _label(heads) -> str:
    return " ".join(f"L{l}H{h}" for l, h in heads)


def top_retrieval_heads(roles: pd.DataFrame, k: int) -> list[tuple[int, int]]:
    """The ``k`` heads of highest ``retrieval`` score (ties: lower layer, then head first)."""
    r = roles[roles["role"] == "retrieval"]
    if r.empty:
        raise ValueError("the roles frame has no retrieval row; run long_context_roles first")
    r = r.sort_values(["score", "layer", "head"], ascending=[False, True, True], kind="stable")
    return [(int(l), int(h)) for l, h in zip(r["layer"][:k], r["head"][:k])]


def n_masked(n_heads: int, share: float) -> int:
    """``share`` of ``n_heads``, rounded half up, at least 1."""
    return max(1, math.floor(share * n_heads + 0.5))


def _accuracies(model, items, heads) -> list[float]:
    spec = model.spec
    mask = torch.ones(spec.n_layers, spec.n_heads)
    for l, h in heads:
        mask[l, h] = 0.0
    with head_gates(model, mask):
        return [float(copy_hits(item_logits(model, it), it).float().mean()) for it in items]


def causal_check(
    model, config: LongContextConfig | None = None, *, roles: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, dict]:
    """The check of the module docstring; ``roles``: a :func:`long_context_roles` frame (run
    here, without the second sink pass, when not given). Raises ``ValueError`` for an encoder
    (the needle task needs a causal decoder)."""
    cfg = config or LongContextConfig()
    spec = model.spec
    if not spec.causal:
        raise ValueError(f"the causal check needs a causal decoder; {spec.name} is an encoder")
    if roles is None:
        roles = long_context_roles(model, replace(cfg, sink_bos_pass=False))
    total = spec.n_layers * spec.n_heads
    k = n_masked(total, cfg.causal_share)
    top = top_retrieval_heads(roles, k)
    pool = [(l, h) for l in range(spec.n_layers) for h in range(spec.n_heads) if (l, h) not in top]
    rng = np.random.default_rng(cfg.seed)
    draws = [
        [pool[i] for i in sorted(rng.choice(len(pool), size=min(k, len(pool)), replace=False))]
        for _ in range(cfg.causal_draws)
    ]
    items = long_items(model, cfg, n_items=cfg.causal_items or cfg.n_items)
    base = _accuracies(model, items, [])
    rows = []
    for cond, d, heads in [("unmasked", None, []), ("top", None, top)] + [
        ("random", i, s) for i, s in enumerate(draws)
    ]:
        acc = base if cond == "unmasked" else _accuracies(model, items, heads)
        log.info("causal check: %s%s: copy accuracy %.3f", cond, "" if d is None else f" {d}", sum(acc) / len(acc))
        for j, (it, a) in enumerate(zip(items, acc)):
            rows.append(
                dict(
                    condition=cond,
                    draw=d,
                    item=j,
                    depth=it.depth,
                    heads=_label(heads),
                    n_masked=len(heads),
                    copy_accuracy=a,
                    damage=base[j] - a,
                )
            )
    frame = pd.DataFrame(rows, columns=CAUSAL_COLUMNS).astype({"draw": "Int64"})
    return frame, summarise(frame, cfg, top=top, n_heads=total, n_tokens=len(items[0].input_ids))


def _ratio(top: float, rand: float) -> float:
    if rand == 0:
        return float("nan") if top == 0 else math.copysign(float("inf"), top)
    return top / rand


def summarise(frame: pd.DataFrame, cfg: LongContextConfig, *, top, n_heads: int, n_tokens: int) -> dict:
    """The summary dict of :func:`causal_check` from its frame (module docstring)."""
    dmg_top = frame[frame["condition"] == "top"].sort_values("item")["damage"].to_numpy()
    rand = frame[frame["condition"] == "random"]
    dmg_rand = (
        rand.pivot(index="item", columns="draw", values="damage").sort_index().to_numpy(dtype=float)
    )  # [item, draw]
    by_cond = frame.groupby(["condition"])["copy_accuracy"].mean()
    per_draw = dmg_rand.mean(0)
    out = {
        "k": len(top),
        "n_heads": n_heads,
        "share": cfg.causal_share,
        "top_heads": [list(h) for h in top],
        "n_items": int(frame["item"].nunique()),
        "n_tokens": n_tokens,
        "n_draws": int(dmg_rand.shape[1]),
        "accuracy_unmasked": float(by_cond.get("unmasked", float("nan"))),
        "accuracy_top": float(by_cond.get("top", float("nan"))),
        "accuracy_random_per_draw": [float(x) for x in rand.groupby("draw")["copy_accuracy"].mean()],
        "damage_top": float(dmg_top.mean()),
        "damage_random_mean": float(per_draw.mean()),
        "damage_random_std": float(per_draw.std(ddof=1)) if len(per_draw) > 1 else float("nan"),
        "damage_random_per_draw": [float(x) for x in per_draw],
        "ratio": _ratio(float(dmg_top.mean()), float(per_draw.mean())),
        "ratio_per_draw": [_ratio(float(dmg_top.mean()), float(x)) for x in per_draw],
    }
    out.update(_ratio_ci(dmg_top, dmg_rand, cfg))
    return out


def _ratio_ci(dmg_top: np.ndarray, dmg_rand: np.ndarray, cfg: LongContextConfig) -> dict:
    """Percentile bootstrap over items of the ratio of mean damages."""
    n = len(dmg_top)
    rng = np.random.default_rng(cfg.stats.seed)
    idx = rng.integers(0, n, size=(cfg.stats.n_boot, n))
    t = dmg_top[idx].mean(1)
    r = dmg_rand[idx].mean((1, 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(r == 0, np.where(t == 0, np.nan, np.sign(t) * np.inf), t / np.where(r == 0, 1, r))
    ok = ratios[~np.isnan(ratios)]
    a = (1 - cfg.stats.ci_level) / 2
    lo, hi = np.quantile(ok, [a, 1 - a], method="inverted_cdf") if len(ok) else (np.nan, np.nan)
    return {
        "ratio_ci": [float(lo), float(hi)],
        "ci_level": cfg.stats.ci_level,
        "n_boot": cfg.stats.n_boot,
        "boot_random_damage_zero": int((r == 0).sum()),
    }
