"""The documentation's figures against the JSON the code that measures them writes (``make figures``).

Each JSON under ``data/figures/`` names its figures and the text the docs print for each; every
text must stand in the page of the user guide (``docs/guide/``) the JSON belongs to (these pages
were the README's sections of the same names). A figure that changes when ``make figures``
regenerates it then fails here until the page says the new value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headscope.data import path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide"
#: JSON file -> the guide page whose text quotes it, and the page's title
SECTIONS = {
    "figures/patching.json": "patching.md: # Causal evidence by patching",
    "figures/atp.json": "patching.md: # Causal evidence by patching",
    "figures/report_minilm.json": "findings.md: # What the default report finds",
    "figures/report_smollm2.json": "findings.md: # What the default report finds",
    "figures/weights_minilm.json": "weights.md: # From the weights",
    "figures/weights_smollm2.json": "weights.md: # From the weights",
    "figures/hf_lazy_weights.json": "weights.md: # From the weights",
    "figures/kv_smollm2.json": "long-context.md: # Long context and the KV cache",
    "figures/bench_weights.json": "bench.md: # Benchmark (`headscope bench`)",
    "figures/bench_smollm2_weights.json": "bench.md: # Benchmark (`headscope bench`)",
    "figures/context_minilm.json": "context.md: # From static to contextual",
    "figures/context_smollm2.json": "context.md: # From static to contextual",
    "figures/qk_smollm2.json": "qk.md: # Why a head attends where it does (QK attribution)",
}


def _section(where: str) -> str:
    """The text of the guide page ``where`` names (``"page.md: # Title"``), from its title on."""
    page, heading = where.split(": ", 1)
    text = (GUIDE / page).read_text(encoding="utf-8")
    return text[text.index(heading) :]


def _texts(doc: dict):
    for group, figures in doc["figures"].items():
        for name, fig in figures.items():
            yield f"{group}.{name}", fig["text"]


@pytest.mark.parametrize("rel, heading", sorted(SECTIONS.items()))
def test_every_figure_the_readme_quotes_is_the_regenerated_one(rel, heading):
    doc = json.loads(path(rel).read_text(encoding="utf-8"))
    section = _section(heading)
    quoted = {name: text for name, text in _texts(doc) if name in doc.get("quoted", ())}
    assert quoted, f"{rel} names no figure the docs quote"
    missing = {name: text for name, text in quoted.items() if text not in section}
    assert not missing, f"docs/guide/{heading!r} lacks these regenerated figures (run make figures): {missing}"


@pytest.mark.parametrize("rel", sorted(SECTIONS))
def test_no_quoted_figure_is_left_out(rel):
    """A figure the source of ``make figures`` could not give (e.g. an unfinished prune folder
    under ``--from``) is listed under ``missing``: reported here as a skip, never dropped."""
    doc = json.loads(path(rel).read_text(encoding="utf-8"))
    missing = doc.get("missing", [])
    given = {name for name, _ in _texts(doc)}
    dropped = set(doc.get("quoted", ())) - given - set(missing)
    assert not dropped, f"{rel}: quoted figures neither regenerated nor listed as missing: {sorted(dropped)}"
    if missing:
        pytest.skip(f"{rel}: not regenerated (run make figures): {', '.join(missing)}")


def test_a_figure_that_changes_is_caught():
    """The check above can fail: a figure whose text the section does not hold is reported."""
    doc = {"figures": {"g": {"x": {"value": 1.0, "text": "123.456789"}}}, "quoted": ["g.x"]}
    section = _section(SECTIONS["figures/patching.json"])
    assert [t for n, t in _texts(doc) if t not in section] == ["123.456789"]
