"""A role's example attention maps: the items the analyses kept for its top heads, each drawn
as a word- or token-level heatmap with the expected (gold) links outlined and alt text that
names the strongest links.

>>> ex = pd.DataFrame({"role": ["a", "a", "b"], "example": ["x", "y", "z"]})
>>> [e["example"].tolist() for e in role_examples(ex, "a", max_n=1)]
[['x']]
"""

from __future__ import annotations

import pandas as pd

from headscope.reports import figures as F
from headscope.reports.document import Figure, head_name, slug


def role_examples(examples: pd.DataFrame | None, role: str, max_n: int = 3) -> list[pd.DataFrame]:
    """Up to ``max_n`` examples of ``role`` (EXAMPLE_COLUMNS rows, one frame each), in
    the order the analyses gave them (their best first)."""
    if examples is None or examples.empty:
        return []
    d = examples[examples["role"].astype(str) == role]
    keys = list(dict.fromkeys(d["example"]))[:max_n]
    return [d[d["example"] == k] for k in keys]


def _example_alt(ex: pd.DataFrame) -> str:
    layer, head = int(ex["layer"].iloc[0]), int(ex["head"].iloc[0])
    sentence = str(ex["sentence"].iloc[0])
    strongest = ex.sort_values("weight", ascending=False, kind="stable").drop_duplicates("query_index").head(3)
    links = ", ".join(f"'{r.query_word}'→'{r.key_word}' ({r.weight:.2f})" for r in strongest.itertuples())
    gold = ex[ex["gold"].astype(bool)] if "gold" in ex else ex.iloc[:0]
    g = (
        (
            "; expected links: "
            + ", ".join(f"'{r.query_word}'→'{r.key_word}' ({r.weight:.2f})" for r in gold.itertuples())
        )
        if len(gold)
        else ""
    )
    level = str(ex["level"].iloc[0]) if "level" in ex else "word"
    return (
        f'Heatmap of the {level}-level attention of head {head_name(layer, head)} on "{sentence}"; '
        f"strongest links: {links}{g}."
    )


def example_block(ex: pd.DataFrame) -> Figure:
    r = ex.iloc[0]
    what = str(r["role"]) + (f" {r['relation']} ({r['direction']})" if str(r["relation"]) else "")
    head = head_name(r["layer"], r["head"])
    gold = " Red outlines: the links the role expects (gold)." if ex["gold"].astype(bool).any() else ""
    if str(r.get("level", "word")) == "token":
        how = (
            "rows are query tokens, columns the tokens they attend to (token level, special tokens included: the "
            "item has no words, or most of this head's attention goes to special tokens, which belong to no word)."
        )
    else:
        how = (
            "on a real sentence; rows are query words, columns the words they attend to (sub-word pieces summed "
            "over keys, averaged over queries; attention to special tokens left out)."
        )
    return Figure(
        name=f"example_{slug(r['example'])}",
        png=F.png_bytes(F.example_figure(ex, title=f"{what}: {head}")),
        alt=_example_alt(ex),
        caption=f"{head}, a top head for {what}; {how}{gold}",
    )
