"""The "Items skipped" section: how many items each analysis skipped, and why (nothing is
dropped silently), with the number of items used.

>>> skipped_section(None, {"roles": 3}).blocks[0].text
'No item was skipped. Items used — roles: 3.'
"""

from __future__ import annotations

import pandas as pd

from headscope.reports.document import Paragraph, Section, Table


def skipped_section(skipped: pd.DataFrame | None, n_items: dict) -> Section:
    """``skipped``: analysis, reason, count; ``n_items``: items used per analysis."""
    s = Section(id="skipped", title="Items skipped")
    used = ", ".join(f"{k}: {v}" for k, v in n_items.items()) if n_items else ""
    if skipped is None or skipped.empty or int(skipped["count"].sum()) == 0:
        s.blocks.append(Paragraph("No item was skipped." + (f" Items used — {used}." if used else "")))
    else:
        s.blocks.append(
            Paragraph(
                f"{int(skipped['count'].sum())} items were skipped, by reason below."
                + (f" Items used — {used}." if used else "")
            )
        )
        s.blocks.append(Table(name="skipped", frame=skipped, caption="Skipped items by analysis and reason"))
    return s
