"""Tidy tables of a QK attribution: marginals per side and the top pairs.

One row per (layer, head, side, query_component, key_component): ``side`` is ``query`` (a query
part summed over every key part; ``key_component`` empty), ``key`` (the reverse) or ``pair``;
``value`` is the mean contribution to the score difference (score units), ``share`` its fraction
of the mean difference, ``rank`` 1 for the largest ``share`` of its side, ``n`` the items.

>>> import torch
>>> from headscope.analyses.qk.attribution import Attribution
>>> a = Attribution(1, 1, ("embed", "L0H0"), "mean", pairs=[torch.tensor([[0.0, 3.0], [0.0, 1.0]])])
>>> f = qk_frame(a, top_pairs=2)
>>> f[f.side == "key"][["key_component", "share"]].values.tolist()
[['L0H0', 1.0], ['embed', 0.0]]
"""

from __future__ import annotations

import pandas as pd

from headscope.analyses.qk.attribution import Attribution

__all__ = ["QK_COLUMNS", "component_kind", "qk_frame", "qk_summary"]

QK_COLUMNS = [
    "layer",  # the attributed head's layer, 0-based
    "head",  # its query head
    "side",  # "query", "key" or "pair"
    "query_component",  # embed, pos, type, bias, L{l}H{h}, MLP{l}; "" on key-side rows
    "key_component",  # the same names; "" on query-side rows
    "value",  # mean contribution to score(attended) - baseline, in score units
    "share",  # value / mean difference
    "rank",  # 1 = the largest share of its side (the largest value; the most negative where the difference is)
    "n",  # items averaged
]


def component_kind(name: str) -> str:
    """``head``, ``mlp`` or the name itself (embed, pos, type, bias)."""
    if name.startswith("L") and "H" in name:
        return "head"
    return "mlp" if name.startswith("MLP") else name


def _rows(a: Attribution, side: str, values, qn, kn, total: float) -> list[dict]:
    sign = -1.0 if total < 0 else 1.0  # rank by share: what pushes the difference the way it goes
    order = sorted(range(len(values)), key=lambda i: -sign * float(values[i]))
    return [
        {
            "layer": a.layer,
            "head": a.head,
            "side": side,
            "query_component": qn[i],
            "key_component": kn[i],
            "value": float(values[i]),
            "share": float(values[i]) / total if total else float("nan"),
            "rank": r + 1,
            "n": a.n,
        }
        for r, i in enumerate(order)
    ]


def qk_frame(a: Attribution, *, top_pairs: int = 20) -> pd.DataFrame:
    """The tidy frame of ``a`` (columns :data:`QK_COLUMNS`): every query-side and key-side
    marginal, and the ``top_pairs`` pairs of largest contribution."""
    mean = a.mean()  # [q_component, k_component]
    total = float(mean.sum())
    names = list(a.names)
    empty = [""] * len(names)
    rows = _rows(a, "query", mean.sum(1).tolist(), names, empty, total)
    rows += _rows(a, "key", mean.sum(0).tolist(), empty, names, total)
    flat = mean.flatten()
    top = (flat if total >= 0 else -flat).topk(min(top_pairs, flat.numel())).indices.tolist()
    n = len(names)
    rows += _rows(
        a, "pair", [flat[i].item() for i in top], [names[i // n] for i in top], [names[i % n] for i in top], total
    )
    return pd.DataFrame(rows, columns=QK_COLUMNS)


def qk_summary(a: Attribution, frame: pd.DataFrame) -> dict:
    """The figures of one head: the mean difference, the top query-side, key-side and pair
    components with their shares, the items attributed and skipped, the split's largest
    relative error."""
    out = {
        "head": f"{a.layer}.{a.head}",
        "baseline": a.baseline,
        "n_items": a.n,
        "n_skipped": a.skipped,
        "mean_difference": float(a.mean().sum()),
        "max_relative_error": a.max_error,
    }
    for side in ("query", "key", "pair"):
        top = frame[(frame.side == side) & (frame["rank"] == 1)].iloc[0]
        comp = top.query_component if side == "query" else top.key_component
        if side == "pair":
            comp = f"{top.query_component} x {top.key_component}"
        out[f"top_{side}"] = {"component": comp, "value": float(top.value), "share": float(top.share)}
    return out
