"""How often the role verdicts are right on known truth, for the roles section's caveat: read from the
committed validation against compiled transformers (``make validate`` -> ``data/figures/validate_tracr.json``;
docs/guide/compiled.md holds the table).

>>> "docs/guide/compiled.md" in known_truth_sentence() or known_truth_sentence() == ""
True
"""

from __future__ import annotations

import json

from headscope.data import path

FIGURES = "figures/validate_tracr.json"


def known_truth_sentence() -> str:
    """One sentence: per verdict role with a compiled head of its role, how many of its claims were right
    and how many of those heads it found; "" where the validation file is absent or unreadable."""
    try:
        doc = json.loads(path(FIGURES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    parts = [
        f"{r['verdict']} right in {r['tp']} of {r['tp'] + r['fp']} claims, finding {r['tp']} of {r['tp'] + r['fn']} heads"
        for r in doc.get("roles", [])
        if r["tp"] + r["fn"] > 0
    ]
    if not parts:
        return ""
    n = len(doc.get("loader", []))
    return (
        f"On {n} compiled transformers whose heads are known (tracr programs with distractor heads; the table per "
        f"head: docs/guide/compiled.md, data/{FIGURES}): " + "; ".join(parts) + "."
    )
