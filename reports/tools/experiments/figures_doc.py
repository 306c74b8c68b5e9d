"""The JSON document every README figures generator writes (data/figures/*.json): which model,
which command made it, from what, the figures, and which quoted figures the source gave or not."""

from __future__ import annotations

import json
from pathlib import Path


def write_figures(out: Path, figures: dict, *, model: str, generated_by: str, source: str, quoted) -> None:
    """Write ``figures`` (``{group: {name: value}}``) to ``out``; a ``quoted`` name
    (``"group.name"``) the figures lack goes under ``missing``."""
    given = {f"{g}.{n}" for g, d in figures.items() for n in d}
    doc = {
        "model": model,
        "generated_by": generated_by,
        "source": source,
        "quoted": [q for q in quoted if q in given],
        "missing": [q for q in quoted if q not in given],
        "figures": figures,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
