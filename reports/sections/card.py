"""The "Model" section: the model card, and the GQA groups where key-value heads are shared.

>>> s = card_section({"heads": 4, "kv_heads": 4}, "card text")
>>> [type(b).__name__ for b in s.blocks]
['Pre', 'Paragraph']
"""

from __future__ import annotations

import pandas as pd

from headscope.reports import figures as F
from headscope.reports.document import Figure, Paragraph, Pre, Section, Table


def card_section(card: dict, card_text: str) -> Section:
    """``card``: :func:`headscope.probes.models.card.model_card`'s dict (``heads``, ``kv_heads``);
    ``card_text`` its rendering, shown as it is."""
    s = Section(id="model", title="Model")
    s.blocks.append(Pre(card_text))
    n, kv = int(card.get("heads", 0)), int(card.get("kv_heads", 0) or card.get("heads", 0))
    if kv and kv < n:
        g = n // kv
        fig = F.gqa_figure(n, kv)
        s.blocks.append(
            Figure(
                name="gqa_groups",
                png=F.png_bytes(fig),
                alt=f"Diagram of grouped-query attention: {n} query heads joined to {kv} key-value heads; "
                + "; ".join(f"KV head {k} is read by query heads {k * g}–{k * g + g - 1}" for k in range(kv))
                + ".",
                caption=f"GQA groups: each KV head is shared by {g} query heads (the same grouping in every layer). "
                "Heads in a group see the same keys and values and differ only in their queries.",
            )
        )
        groups = pd.DataFrame(
            [{"kv_head": k, "query_heads": ", ".join(str(h) for h in range(k * g, (k + 1) * g))} for k in range(kv)]
        )
        s.blocks.append(Table(name="gqa_groups", frame=groups, caption="Query heads sharing each KV head"))
    else:
        s.blocks.append(Paragraph("Multi-head attention: every query head has its own key-value head (no GQA groups)."))
    return s
