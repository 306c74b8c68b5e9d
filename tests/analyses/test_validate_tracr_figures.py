"""The committed validation against compiled truth (``make validate`` -> data/figures/validate_tracr.json):
its tables follow from its per-head rows by the code that scores them, every program loaded equal to
tracr's forward, and docs/guide/compiled.md quotes its figures as they are."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from headscope.analyses.validation.tracr import auroc_scores, role_scores
from headscope.data import path
from headscope.probes.models.compiled.programs import PROGRAMS, settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "compiled.md"


@pytest.fixture(scope="module")
def doc():
    return json.loads(path("figures/validate_tracr.json").read_text(encoding="utf-8"))


def _same(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return a == pytest.approx(b, abs=1e-9)


def test_every_program_loads_equal_to_tracr(doc):
    labels = {c["program"] for c in doc["loader"]}
    assert labels == {s.label for n in PROGRAMS for s in settings(n)}
    for c in doc["loader"]:
        assert c["max_error"] <= 1e-5 and c["decoded_equal"], c
    used = {c["program"]: (c["heads_used"], c["mlps_used"]) for c in doc["loader"]}
    assert used["shift_by-v3-n5"][0] == ["L0H0 shift_by(1)_1"] and not used["shift_by-v3-n5"][1]
    assert len(used["hist-v3-n5"][1]) == 1  # SelectorWidth's MLP
    causal = {c["program"]: c["causal"] for c in doc["loader"]}
    assert causal["shift_by-v3-n5"] and not causal["hist-v3-n5"]


def test_the_scores_follow_from_the_head_rows(doc):
    heads = pd.DataFrame(doc["heads"])
    heads["verdicts"] = heads["verdicts"].fillna("")
    heads = heads.fillna({c: float("nan") for c in heads.columns if c.startswith("effect:")})
    roles = role_scores(heads).to_dict("records")
    for got, want in zip(roles, doc["roles"], strict=True):
        assert got["verdict"] == want["verdict"] and (got["tp"], got["fp"], got["fn"]) == (
            want["tp"],
            want["fp"],
            want["fn"],
        )
        assert _same(want["precision"], got["precision"]) and _same(want["recall"], got["recall"])
    aurocs = {(r["program"], r["method"]): r["auroc"] for r in auroc_scores(heads).to_dict("records")}
    assert set(aurocs) == {(r["program"], r["method"]) for r in doc["auroc"]} and aurocs
    for want in doc["auroc"]:
        assert _same(want["auroc"], aurocs[(want["program"], want["method"])])
    # every compiled head is used by the output; no empty slot or distractor is
    assert (
        heads.loc[heads["kind"] == "compiled", "used"].all()
        and not heads.loc[heads["kind"] != "compiled", "used"].any()
    )


def test_the_docs_quote_the_figures(doc):
    page = PAGE.read_text(encoding="utf-8")
    texts = [fig["text"] for group in doc["figures"].values() for fig in group.values()]
    missing = [t for t in texts if t not in page]
    assert texts and not missing, f"docs/guide/compiled.md lacks (run make validate, then quote): {missing}"


def test_the_roles_caveat_says_how_often_each_verdict_is_right(doc):
    from headscope.reports.sections.known_truth import known_truth_sentence

    sentence = known_truth_sentence()
    assert "docs/guide/compiled.md" in sentence
    for r in doc["roles"]:
        if r["tp"] + r["fn"]:
            assert f"{r['verdict']} right in {r['tp']} of {r['tp'] + r['fp']} claims" in sentence
