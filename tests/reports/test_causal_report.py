"""The report's patching stage and its "Causal evidence" section.

The planted model (probes/models/inhouse/planted.py, with the induction head given an output by
``writing_induction``) holds a previous-token head (0, 0) and an induction head (1, 1):
the roles label them by attention, and activation patching on the induction and the
duplicate-token tasks must single out the same heads, which the section must say.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from headscope.analyses import run_patching as RP
from headscope.analyses.run_patching import CausalConfig
from headscope.reports import pipeline as P
from headscope.reports.sections import build_document
from headscope.reports.sections.causal import causal_comparison, causal_sentence

CFG = CausalConfig(n_items=12, top_k=2, n_perm=2000, n_boot=200)
CARD = {"name": "planted", "layers": 2, "heads": 4, "kv_heads": 4}


@pytest.fixture(scope="module")
def planted():
    from headscope.probes.models.inhouse.planted import planted_model, writing_induction

    return writing_induction(planted_model())


@pytest.fixture(scope="module")
def planted_roles(planted):
    from headscope.analyses.roles.pipeline import head_roles

    return head_roles(planted, roles=["induction"]).frame


@pytest.fixture(scope="module")
def planted_patching(planted, planted_roles):
    return RP.run_patching(planted, planted_roles, CFG, full=False)


def _meta(summary, absent=None):
    return {"model": "planted", "backend": "inhouse", "seed": 0, "absent": absent or {}, "patching_summary": summary}


def test_roles_map_to_registered_tasks(planted_roles):
    got = RP.causal_roles(planted_roles)
    assert got.to_dict("records") == [
        {"label": "duplicate-token", "role": "duplicate-token", "relation": "", "task": "duplicate_token"},
        {"label": "induction", "role": "induction", "relation": "", "task": "induction"},
        {"label": "previous-token", "role": "previous-token", "relation": "", "task": "duplicate_token"},
    ]
    assert RP.task_for_role("syntactic", "nsubj") == "agreement" and RP.task_for_role("syntactic", "amod") is None
    assert RP.task_for_role("coreference:winograd") == "coreference" and RP.task_for_role("rare-word") is None


def test_patching_stage_finds_the_planted_heads(planted_patching):
    frame, summary = planted_patching
    assert summary["n_items"] == 12 and summary["refused"] == {} and summary["unit"] == "head"
    assert sorted(summary["tasks"]) == ["duplicate_token", "induction"]
    act = frame[frame["method"] == "activation_denoising"].set_index(["task", "layer", "head"])["effect"]
    assert act[("induction", 1, 1)] == pytest.approx(1.0, abs=1e-4)  # the induction head restores the whole gap
    # the previous-token head, patched alone, moves the induction head's keys away from the corrupted run's
    # match: measured -0.546 of the gap; every other head writes nothing: exactly 0
    assert act[("induction", 0, 0)] == pytest.approx(-0.546, abs=1e-3)
    assert act.loc["induction"].drop([(0, 0), (1, 1)]).abs().max() < 1e-6
    dup = act.loc["duplicate_token"]
    # the duplicate-token task needs both heads of the circuit: each alone restores the whole gap
    assert dup[(0, 0)] == pytest.approx(1.0, abs=1e-4) and dup[(1, 1)] == pytest.approx(1.0, abs=1e-4)
    assert dup.drop([(0, 0), (1, 1)]).abs().max() < 1e-6
    assert summary["tasks"]["induction"]["top_heads"]["activation_denoising"][0] == "L1H1"
    assert summary["tasks"]["duplicate_token"]["top_heads"]["activation_denoising"][0] == "L0H0"
    assert set(frame["method"]) == {"activation_denoising", "attribution_denoising"}


def test_causal_section_places_attention_next_to_patching(planted_roles, planted_patching, tmp_path):
    frame, summary = planted_patching
    frames = {"roles": planted_roles, "patching": frame}
    paths = P.write_report(frames, card=CARD, card_text="planted", meta=_meta(summary), out_dir=tmp_path / "r")
    html, md = paths["html"].read_text(), paths["markdown"].read_text()
    for title in ("Causal evidence", "Causal evidence: induction", "Causal evidence: previous-token"):
        assert f">{title}</h" in html and title in md
    assert (
        "1 of 1 head labelled induction by attention (L1H1) is among the 2 heads with the largest patching effect "
        "(of 8); its effect is significant." in md
    )
    assert "1 of 1 head labelled previous-token by attention (L0H0) is among the 2 heads" in md
    assert "Roles without a patching task" not in md  # the induction group's three roles all have one
    assert "Task duplicate_token: the same run as in the subsection on duplicate-token." in md
    assert "log p(answer) at the last position" in md  # what the task's metric measures
    assert (tmp_path / "r" / "figures" / "patching_induction.png").is_file()
    table = pd.read_csv(tmp_path / "r" / "tables" / "patching.csv")
    assert set(table["task"]) == {"induction", "duplicate_token"} and len(table) == 2 * 2 * 8
    run = json.loads(paths["run_json"].read_text())
    assert run["patching_summary"]["tasks"]["induction"]["gap"] == pytest.approx(summary["tasks"]["induction"]["gap"])
    terminal = P.run_summary(frames, _meta(summary), tmp_path / "r")["patching"]
    assert terminal["induction"] == {
        "task": "induction",
        "by_attention": ["L1H1"],
        "by_patching": ["L1H1", "L0H1"],
        "overlap": 1,
    }
    doc = build_document(frames, card=CARD, card_text="planted", meta=_meta(summary))
    t = next(t for t in doc.tables() if t.name == "causal_induction").frame
    assert t[["by attention", "by patching", "in both"]].iloc[0].tolist() == ["L1H1", "L1H1", "yes"]
    assert t["by patching"].tolist() == ["L1H1", "L0H1"]  # then the lowest (layer, head) of the zero effects


def test_a_refused_task_is_recorded_not_raised(planted, planted_roles, monkeypatch):
    from headscope.analyses.patching import tasks as T
    from headscope.probes.errors import ModelIncompatibleError

    real = T.load_task

    def refuse_duplicates(model, task, **kw):
        if task == "duplicate_token":
            raise ModelIncompatibleError("duplicate_token: not on this model")
        return real(model, task, **kw)

    monkeypatch.setattr(T, "load_task", refuse_duplicates)
    frame, summary = RP.run_patching(planted, planted_roles, CFG, full=False)
    assert summary["refused"] == {"duplicate_token": "duplicate_token: not on this model"}
    assert set(frame["task"]) == {"induction"}
    assert RP.patching_blocker(planted) is None  # one task still runs
    doc = build_document({"roles": planted_roles, "patching": frame}, card=CARD, card_text="", meta=_meta(summary))
    sec = next(s for s in doc.sections if s.title == "Causal evidence: previous-token")
    assert sec.blocks[0].text == "Task duplicate_token was refused on this model: duplicate_token: not on this model."


def test_a_model_patching_refuses_is_absent_with_the_reason(planted, monkeypatch):
    from headscope.analyses.patching import tasks as T
    from headscope.probes.errors import ModelIncompatibleError

    def refuse(model, task, **kw):
        raise ModelIncompatibleError("no task for this model")

    monkeypatch.setattr(T, "load_task", refuse)
    assert RP.patching_blocker(planted) == "no task for this model"
    doc = build_document({}, card=CARD, card_text="", meta=_meta({}, {"patching": "no task for this model"}))
    sec = next(s for s in doc.sections if s.id == "causal")
    assert [b.text for b in sec.blocks] == ["No patching on this model: no task for this model."]


def test_no_causal_section_without_a_patching_stage():
    doc = build_document({}, card=CARD, card_text="", meta={"model": "planted"})
    assert "causal" not in [s.id for s in doc.sections]


def test_comparison_and_sentence_closed_form():
    att = pd.DataFrame({"layer": [3, 0], "head": [1, 2], "score": [0.9, 0.5]})
    pat = pd.DataFrame(
        {
            "layer": [0, 3, 2],
            "head": [2, 0, 2],
            "effect": [0.4, 0.3, 0.1],
            "ci_low": [0.3, 0.1, 0.0],
            "ci_high": [0.5, 0.4, 0.2],
            "significant": [True, False, False],
        }
    )
    t = causal_comparison(att, pat)
    assert t[["by attention", "by patching", "in both"]].values.tolist() == [
        ["L3H1", "L0H2", "yes"],
        ["L0H2", "L3H0", "yes"],
        ["", "L2H2", ""],
    ]
    assert causal_sentence("x", att, pat, k=3, n_heads=16) == (
        "1 of 2 heads labelled x by attention (L0H2) is among the 3 heads with the largest patching effect (of 16); "
        "its effect is significant."
    )
    assert causal_sentence("x", att.iloc[:1], pat, k=3, n_heads=16).endswith(
        "patching does not single out the heads attention labels for this task."
    )


def test_config_is_validated_and_bounds_the_items():
    assert CausalConfig().items_per_task(n_heads=270, n_tasks=4, full=False) == 4  # the floor
    assert CausalConfig().items_per_task(n_heads=72, n_tasks=4, full=False) == 5
    assert CausalConfig().items_per_task(n_heads=8, n_tasks=1, full=False) == 64  # the ceiling
    assert CausalConfig(n_items=5).items_per_task(n_heads=270, n_tasks=4, full=True) == 5
    with pytest.raises(ValueError, match="'n_items' parameter of CausalConfig"):
        CausalConfig(n_items=1)
    with pytest.raises(ValueError, match="'top_k' parameter of CausalConfig"):
        CausalConfig(top_k=0)
    with pytest.raises(ValueError, match="'unit' parameter of CausalConfig"):
        CausalConfig(unit="layer")


def test_quick_mode_patches_gqa_groups_and_full_mode_heads():
    from headscope.probes.models.backends.protocol import ModelSpec

    kw = dict(name="m", family="llama", n_layers=2, d_head=8, d_model=32, causal=True, max_positions=64)
    gqa = ModelSpec(n_heads=9, n_kv_heads=3, backend="inhouse", **kw)
    mha = ModelSpec(n_heads=4, n_kv_heads=4, backend="inhouse", **kw)
    cfg = CausalConfig()
    assert [cfg.unit_for(gqa, full=False), cfg.unit_for(gqa, full=True), cfg.unit_for(mha, full=False)] == [
        "kv_group",
        "head",
        "head",
    ]
    assert CausalConfig(unit="head").unit_for(gqa, full=False) == "head"


def test_cli_flag():
    from headscope.reports.cli.app import build_parser
    from headscope.reports.cli.report import stage_selection

    parser = build_parser()
    assert "patching" not in stage_selection(parser.parse_args(["report"]))["off"]
    assert stage_selection(parser.parse_args(["report", "--no-patching"]))["off"] == ("patching",)


@pytest.mark.slow
def test_minilm_report_runs_patching_with_the_encoder_metric(tmp_path_factory):
    """The MiniLM report (test_report's session run): an encoder has no LM head; every task is
    measured by the pooled-embedding cosine, and the report says so."""
    from test_report import real_report_dir

    out = real_report_dir(tmp_path_factory)
    run = json.loads((out / "run.json").read_text())
    assert "patching" not in run["absent"] and run["timings"]["patching"] > 0
    summ = run["patching_summary"]
    assert summ["refused"] == {} and summ["n_items"] == 5 and summ["unit"] == "head"
    assert sorted(summ["tasks"]) == ["agreement", "coreference", "duplicate_token", "induction"]
    ind = summ["tasks"]["induction"]
    assert ind["task"]["metric"] == "embedding_cosine" and ind["metric_clean"] == pytest.approx(1.0, abs=1e-5)
    assert ind["metric_corrupted"] == pytest.approx(0.6402, abs=1e-3)
    md = (out / "report.md").read_text()
    assert "cosine similarity of the run's sentence embedding (the model's own pooling and Dense layers)" in md
    assert "### Causal evidence: induction" in md and "### Causal evidence: syntactic:nsubj" in md
    assert set(pd.read_parquet(out / "tables" / "patching.parquet")["task"]) == set(summ["tasks"])
