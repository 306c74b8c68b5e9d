"""Are the KV groups that must keep their full cache the ones holding the retrieval heads?

:func:`retrieval_join` puts, per KV group, its place in the greedy order (0: the first group
given its full cache back, the one the model needs most) beside the best retrieval score of its
query heads (:mod:`~headscope.analyses.longctx.roles`' ``retrieval`` rows of a roles frame), and
summarises: Spearman's rank correlation between need (``-greedy_rank``) and retrieval score,
and the overlap of the groups kept full at the 1 % point with the groups holding the top 5 % of
heads by retrieval score.

Frame columns: ``layer``, ``kv_group``, ``greedy_rank``, ``kept_full`` (bool), ``retrieval_score``
(max over the group's heads), ``retrieval_heads`` (its heads among the top 5 %).
"""

from __future__ import annotations

import math

import pandas as pd

#: the share of heads called retrieval heads for the overlap (Wu et al.: fewer than 5 %)
TOP_SHARE = 0.05


def _retrieval_rows(roles: pd.DataFrame | None) -> pd.DataFrame | None:
    if roles is None or roles.empty or "role" not in roles.columns:
        return None
    d = roles[roles["role"].astype(str).str.startswith("retrieval")]
    return None if d.empty else d.drop_duplicates(["layer", "head"])


def retrieval_join(summary: dict, roles: pd.DataFrame | None, spec) -> tuple[pd.DataFrame | None, dict | None]:
    """``(frame, summary)``, or ``(None, None)`` when ``roles`` holds no retrieval score."""
    from scipy.stats import spearmanr

    d = _retrieval_rows(roles)
    if d is None:
        return None, None
    order = [tuple(g) for g in summary["greedy_order"]]
    at = summary.get("savings_at_tolerance")
    kept = set(order[: at["full_groups"]]) if at else set(order)
    n_top = max(1, math.ceil(TOP_SHARE * spec.n_layers * spec.n_heads))
    top = d.nlargest(n_top, "score")
    group = spec.n_heads // spec.n_kv_heads
    rows = []
    for rank, (l, g) in enumerate(order):
        same = (d["layer"] == l) & ((d["head"] // group == g) if g is not None else True)
        heads = d[same]
        rows.append(
            {
                "layer": l,
                "kv_group": g,
                "greedy_rank": rank,
                "kept_full": (l, g) in kept,
                "retrieval_score": float(heads["score"].max()) if len(heads) else float("nan"),
                "retrieval_heads": int(
                    ((top["layer"] == l) & ((top["head"] // group == g) if g is not None else True)).sum()
                ),
            }
        )
    frame = pd.DataFrame(rows)
    ok = frame.dropna(subset=["retrieval_score"])
    rho = float(spearmanr(-ok["greedy_rank"], ok["retrieval_score"]).statistic) if len(ok) > 2 else float("nan")
    holding = {(r.layer, r.kv_group) for r in frame.itertuples() if r.retrieval_heads > 0}
    return frame, {
        "spearman_need_vs_retrieval": None if math.isnan(rho) else round(rho, 4),
        "top_retrieval_heads": int(n_top),
        "groups_holding_top_retrieval": sorted([list(g) for g in holding], key=str),
        "groups_kept_full": len(kept),
        "overlap": len(kept & holding),
    }
