"""The interactive head view's embedded data (issue #16): one JSON blob in the page with
every head of the model, its roles rows equal to the roles frame (rounded), its example
maps and single-head pruning figures; the Markdown report says where the view is."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from test_report import _meta, synthetic_frames

from headscope.reports.document import HeadView
from headscope.reports.head_view import ROLE_VIEW_COLUMNS, head_view_data, render_head_view
from headscope.reports.html import render_html
from headscope.reports.markdown import render_markdown
from headscope.reports.sections import build_document


@pytest.fixture(scope="module")
def page():
    from headscope.probes.models.card import model_card, render_card

    frames = synthetic_frames()
    card = model_card("minilm-l6")
    doc = build_document(frames, card=card, card_text=render_card(card), meta=_meta())
    return frames, doc, render_html(doc)


def _blob(html: str) -> dict:
    blobs = re.findall(r'<script type="application/json" id="head-view-data">(.*?)</script>', html, re.S)
    assert len(blobs) == 1
    return json.loads(blobs[0])


def test_embedded_json_has_every_head_and_the_roles_frame(page):
    frames, _, html = page
    data = _blob(html)
    roles = frames["roles"]
    assert (data["layers"], data["heads"]) == (6, 12)
    assert set(data["cells"]) == {f"L{l}H{h}" for l in range(6) for h in range(12)}
    assert data["columns"] == ROLE_VIEW_COLUMNS
    col = {c: i for i, c in enumerate(data["columns"])}
    for layer, head in [(1, 3), (3, 7), (5, 11), (0, 0)]:
        cell = data["cells"][f"L{layer}H{head}"]
        mine = roles[(roles["layer"] == layer) & (roles["head"] == head)]
        assert len(cell["rows"]) == len(mine)
        for row in cell["rows"]:
            want = mine[(mine["role"] == row[col["role"]]) & (mine["relation"] == row[col["relation"]])].iloc[0]
            for c in ("score", "baseline", "margin", "ci_low", "ci_high", "p_value"):
                assert row[col[c]] == pytest.approx(float(want[c]), rel=1e-3, abs=1e-12), (layer, head, c)
            assert row[col["n"]] == int(want["n"]) and row[col["verdict"]] == bool(want["verdict"])
        # verdicts first
        v = [r[col["verdict"]] for r in cell["rows"]]
        assert v == sorted(v, reverse=True)
    assert data["cells"]["L1H3"]["held"] == ["positional:previous", "punctuation"]
    assert data["cells"]["L0H0"]["held"] == []
    assert set(data["colours"]) == {"positional:previous", "punctuation", "syntactic"}


def test_cells_are_labelled_buttons(page):
    _, _, html = page
    assert html.count('class="hv-cell"') == 72
    assert 'aria-label="L1H3: positional:previous, punctuation"' in html
    assert 'aria-label="L0H0: no role"' in html
    # the widget is hidden until its script runs: with JavaScript off the static figures stand
    assert '<div class="hv" id="head-view" hidden>' in html and "<noscript>" in html
    assert html.count("<script") == 2 and "src=" not in "".join(re.findall(r"<script[^>]*>", html))


def test_examples_and_pruning_of_a_head(page):
    frames, _, html = page
    cell = _blob(html)["cells"]["L1H3"]
    ex = frames["examples"]
    mine = ex[(ex["layer"] == 1) & (ex["head"] == 3)]
    assert [e["name"] for e in cell["examples"]] == list(dict.fromkeys(mine["example"]))
    e = cell["examples"][0]
    rows = mine[mine["example"] == e["name"]]
    assert len(e["queries"]) == rows["query_index"].nunique() and len(e["w"][0]) == rows["key_index"].nunique()
    r = rows.iloc[0]
    assert e["w"][0][0] == pytest.approx(r["weight"], abs=5e-4)
    assert len(e["gold"]) == int(rows["gold"].astype(bool).sum())
    (label, value, rank, n), *_ = cell["prune"]
    assert "delta_accuracy" in label and value == pytest.approx(-0.3) and rank == 1 and n == 72


def test_json_cannot_close_its_script():
    frames = synthetic_frames()
    ex = frames["examples"].copy()
    ex["sentence"] = "a </script><script>alert(1)</script> <!-- b"
    frames["examples"] = ex
    html = render_head_view(HeadView(head_view_data(frames, 6, 12)))
    # the blob parses whole (a literal </script> would have cut it short) and keeps the text
    assert _blob(html)["cells"]["L1H3"]["examples"][0]["sentence"] == ex["sentence"].iloc[0]


def test_no_roles_gives_empty_heads_and_markdown_has_a_sentence(page):
    data = head_view_data({"roles": pd.DataFrame()}, 2, 3)
    assert set(data["cells"]) == {f"L{l}H{h}" for l in range(2) for h in range(3)}
    assert all(c["rows"] == [] and c["held"] == [] for c in data["cells"].values())
    assert "NaN" not in json.dumps(data)
    _, doc, _ = page
    md, _ = render_markdown(doc)
    assert "interactive head view" in md and "<script" not in md


def test_a_large_roles_frame_is_capped_per_head():
    frames = synthetic_frames()
    roles = frames["roles"]
    data = head_view_data(frames, 6, 12, max_rows=len(roles) - 1)
    cap = (len(roles) - 1) // 72
    cell = data["cells"]["L1H3"]
    assert len(cell["rows"]) == min(cap, cell["n_rows"]) and cell["n_rows"] == int(
        ((roles["layer"] == 1) & (roles["head"] == 3)).sum()
    )
    # the verdict rows come first, so the cap keeps them
    assert [r[-1] for r in cell["rows"]][:2] == [True, True]
    full = head_view_data(frames, 6, 12)
    assert all(c["n_rows"] == len(c["rows"]) for c in full["cells"].values())
