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


def test_the_weights_column_is_the_committed_weights_study():
    """Each row's per-head weights cell counts its families that pass the committed weights study
    (``make weights-families``), and every built family without weights is listed with its reason."""
    from headscope.reports.tools.sweep.table import weights_study

    rows, study = read_sweep(SWEEP), weights_study()
    table = render(rows)
    inhouse = [r["family"] for r in rows if r["backend"] == "inhouse" and all(r[s] == "ok" for s in CHECKS)]
    passing = sum(study[f]["status"] == "pass" for f in inhouse if f in study)
    checked = sum(f in study for f in inhouse)
    assert f"| in-house | all: {', '.join(CHECKS)} | {passing} of {checked} |" in table
    for r in rows:
        f = r["family"]
        if r["built"] == "ok" and f in study and study[f]["status"] != "pass":
            assert f"| {f} | {study[f]['status']} | " in table, f
    assert "| llama | " not in table  # a family with weights is not in the list of those without
    assert render(rows, weights={}).count("per-head weights") == 1  # no study: the column says "-"


def test_the_committed_sweeps_weights_count_is_the_studys_and_at_least_185():
    """The table's per-head weights count (its line and its column summed) is the built families of the
    committed sweep that pass the committed weights study, counted here from the CSV and the JSON; at least
    185 (issue 39); every row of the sweep and the study ran on one transformers version (a sweep rerun in
    parts on another lists the rows it left, see below)."""
    import json
    import re

    study = json.loads((ROOT / "data" / "figures" / "hf_weights_families.json").read_text(encoding="utf-8"))
    rows = read_sweep(SWEEP)
    built = [r["family"] for r in rows if r["built"] == "ok"]
    passing = sum(study["families"].get(f, {}).get("status") == "pass" for f in built)
    table = render(rows)
    assert f"{passing} of these {len(built)} text families have per-head weights" in table
    cells = re.findall(r"^\| [^|]+ \| [^|]+ \| (\d+) of (\d+) \| ", table, flags=re.M)
    assert sum(int(p) for p, _ in cells) == passing and sum(int(n) for _, n in cells) <= len(built)
    assert passing >= 185
    assert {r["transformers"] for r in rows} == {study["transformers"]}  # one transformers: no row left behind
    assert "not rerun" not in table and "hf_weights_families.json, `make weights-families`" in table


def test_a_sweep_of_two_transformers_versions_says_which_rows_are_whose():
    from headscope.reports.tools.sweep.table import summary, weights_line

    row = dict(family="llama", kind="decoder", built="ok", backend="inhouse", rejected="")
    row.update(dict.fromkeys(CHECKS, "ok"))
    rows = [{**row, "transformers": "5.25.0"}, {**row, "family": "bert", "transformers": "5.24.0"}]
    rows.append({**row, "family": "gpt2", "transformers": "5.25.0"})
    assert summary(rows).startswith("transformers 5.25.0 (2 rows) and 5.24.0 (1 rows): 3 model types")
    weights = {"llama": {"status": "pass"}, "bert": {"status": "refused", "reason": "x"}}
    line = weights_line(rows, weights, "5.25.0")
    assert line.startswith("1 of these 3 text families") and "(transformers 5.25.0)" in line
    assert "(transformers" not in weights_line(rows[:1], weights, "5.25.0")
    table = render(rows, weights=weights)
    assert "1 rows swept on transformers 5.24.0, not rerun on 5.25.0" in table and "\n`bert`\n" in table
    assert "not rerun" not in render(rows[:1], weights=weights)
