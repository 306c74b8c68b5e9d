"""The SmolLM2 finding of docs/guide/qk.md against data/figures/qk_smollm2.json (``make qk``): every
quoted figure stands in the page, and the figures hold together (the split exact, L16H0 and L17H8
ranked as their shares say, the key-side kinds summing to the whole difference)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headscope.data import path

PAGE = Path(__file__).resolve().parents[3] / "docs" / "guide" / "qk.md"


@pytest.fixture(scope="module")
def doc():
    return json.loads(path("figures/qk_smollm2.json").read_text(encoding="utf-8"))


def test_every_quoted_figure_stands_in_the_page(doc):
    page = PAGE.read_text(encoding="utf-8")
    assert doc["missing"] == [] and doc["quoted"]
    figures = {f"{g}.{n}": f["text"] for g, d in doc["figures"].items() for n, f in d.items()}
    absent = {q: figures[q] for q in doc["quoted"] if figures[q] not in page}
    assert not absent, f"docs/guide/qk.md lacks these regenerated figures (run make qk): {absent}"


def test_the_figures_hold_together(doc):
    f = doc["figures"]["l18h6"]
    assert f["error"]["value"] <= 1e-5
    (l16, r16), (l17, r17) = f["L16H0"]["value"], f["L17H8"]["value"]
    assert (r16 < r17) == (l16 > l17)
    top = f["key_top"]["value"]
    assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)
    assert sum(f["key_kinds"]["value"].values()) == pytest.approx(1.0, abs=1e-3)
    diff, n, skipped = f["difference"]["value"]
    assert diff > 0 and n == 32 and skipped == 0
    forwards = f["cost"]["value"][0]
    assert forwards <= n  # one forward per batch of items, never one per item and head
