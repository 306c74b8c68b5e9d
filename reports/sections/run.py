"""The "Run" section: configuration, versions and timings, and where the tables are.

>>> run_section({"model": "m", "seed": 0}).blocks[0].frame.iloc[:3].values.tolist()
[['model', 'm'], ['backend', None], ['mode', 'quick']]
"""

from __future__ import annotations

import pandas as pd

from headscope.reports.document import Paragraph, Section, Table


def run_section(meta: dict) -> Section:
    """``meta``: model, backend(_choice), full, seed, sha256, trust_remote_code, versions, timings;
    ``quick["leaves_out"]``: what quick mode left out of ``--full`` (a row after ``mode``)."""
    s = Section(id="run", title="Run")
    rows = [
        ("model", meta.get("model")),
        ("backend", meta.get("backend_choice") or meta.get("backend")),
        ("mode", "full" if meta.get("full") else "quick"),
        *[("quick mode leaves out", lo) for lo in [(meta.get("quick") or {}).get("leaves_out")] if lo],
        ("seed", meta.get("seed")),
        ("model file SHA-256", meta.get("sha256") or "—"),
        ("trust_remote_code", "true" if meta.get("trust_remote_code") else "false"),
    ]
    rows += [(f"version: {k}", v) for k, v in (meta.get("versions") or {}).items()]
    rows += [(f"time: {k}", f"{v:.1f} s") for k, v in (meta.get("timings") or {}).items()]
    s.blocks.append(
        Table(
            name="run",
            frame=pd.DataFrame(rows, columns=["field", "value"]),
            caption="Configuration, versions and timings",
        )
    )
    s.blocks.append(
        Paragraph(
            "Tables are in tables/ (CSV and Parquet, tidy: one observation per row); the full configuration is in run.json."
        )
    )
    return s
