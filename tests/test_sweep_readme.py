"""The docs' supported-models table is the committed sweep's (``make sweep``): rendered from
``data/sweep/sweep.csv`` by :func:`headscope.reports.tools.sweep.table.render`, it must stand between the
sweep-table markers of docs/guide/models.md as it is; a sweep that changes an outcome fails here until
the page says so. Like ``tests/test_readme_figures.py`` for the figures."""

from __future__ import annotations

from pathlib import Path

from headscope.reports.tools.sweep.run import CHECKS, read_sweep
from headscope.reports.tools.sweep.table import counts, readme_block, render

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guide" / "models.md"
SWEEP = ROOT / "data" / "sweep" / "sweep.csv"


def test_the_supported_models_table_is_the_committed_sweeps():
    rows = read_sweep(SWEEP)
    assert readme_block(PAGE.read_text(encoding="utf-8")) == render(rows), (
        "docs/guide/models.md's table: run make sweep"
    )


def test_sweep_md_is_the_committed_sweeps():
    assert (SWEEP.parent / "sweep.md").read_text(encoding="utf-8") == render(read_sweep(SWEEP))


def test_the_rendering_names_every_built_family_once_with_its_outcome():
    rows = read_sweep(SWEEP)
    table = render(rows)
    n, m, k = counts(rows)
    assert f"{n} model types of the registry swept, {m} text families built from a tiny config, {k} running" in table
    for r in rows:
        if r["built"] == "ok":
            assert table.count(f"`{r['family']}`") == (1 if all(r[s] == "ok" for s in CHECKS) else 2), r["family"]
