"""The SmolLM2 IOI figures of docs/guide/roles.md against data/figures/ioi_smollm2.json (``make
ioi-roles``): every quoted figure stands in the page, and the figures hold together (verdicts at
half the items or more, the clean difference above the ABC one, S-inhibition patched into name
movers that hold a verdict). Reads JSON only: no model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headscope.data import path

PAGE = Path(__file__).resolve().parents[3] / "docs" / "guide" / "roles.md"


@pytest.fixture(scope="module")
def doc():
    return json.loads(path("figures/ioi_smollm2.json").read_text(encoding="utf-8"))


def test_every_quoted_figure_stands_in_the_page(doc):
    from headscope.reports.tools.experiments.ioi_figures import QUOTED

    page = PAGE.read_text(encoding="utf-8")
    assert doc["missing"] == []
    figures = {f"{g}.{n}": f["text"] for g, d in doc["figures"].items() for n, f in d.items()}
    assert set(QUOTED) <= set(figures), (
        f"figures missing from the JSON (run make ioi-roles): {set(QUOTED) - set(figures)}"
    )
    absent = {q: figures[q] for q in QUOTED if figures[q] not in page}
    assert not absent, f"docs/guide/roles.md lacks these regenerated figures (run make ioi-roles): {absent}"


def test_the_figures_hold_together(doc):
    f = doc["figures"]["ioi"]
    clean, corrupted, n = f["logit_diff"]["value"]
    assert clean > 0 > corrupted and n == 32
    for name in ("name_movers", "negative_name_movers", "s_inhibition"):
        rows = f[name]["value"]
        assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
        for _head, score, _base, p, verdict in rows:
            assert not verdict or (score >= 0.5 and p < 0.01)
    movers = {h for h, *_rest, v in f["name_movers"]["value"] if v}
    assert {f"L{r.replace('.', 'H')}" for r in f["receivers"]["value"]} <= movers
    plain, full = f["cost"]["value"]
    assert full > plain > 0  # the path patching is the cost of --s-inhibition
    drivers = doc["figures"]["qk"]["drivers"]["value"]
    assert {d["role"] for d in drivers} >= {"ioi:name-mover", "induction"}
    l18 = [d for d in drivers if d["role"] == "induction" and d["side"] == "key" and d["rank"] == 1]
    assert l18 and (l18[0]["layer"], l18[0]["head"], l18[0]["component"]) == (18, 6, "L16H0")
