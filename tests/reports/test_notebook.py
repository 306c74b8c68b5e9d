"""A notebook session, as a user would type it: a model object already in memory — an HF
``PreTrainedModel`` and a transformer-lens ``TransformerBridge`` — goes through
``load_model``, a quick pruning study and the report (roles + pruning), and every run comes
back as pandas frames with ``load_run``."""

from __future__ import annotations

import pandas as pd
import pytest
from tiny_models import tiny_hf_model

from headscope.analyses.pruning.study import PruneConfig, pruning_study
from headscope.analyses.roles.pipeline import default_text
from headscope.probes.models.loading import load_model
from headscope.reports import load_run
from headscope.reports.pipeline import build_report

ROLES = ("positional", "special", "syntactic")
CONLLU = "tests/fixtures/ud_sample.conllu"
QUICK = PruneConfig(quick=True, n_items=6, ablation_modes=("zero",), studies=("ablation", "importance", "curves"))


@pytest.fixture
def texts(tmp_path):
    p = tmp_path / "texts.txt"
    p.write_text("".join(open(default_text(), encoding="utf-8").readlines()[:16]), encoding="utf-8")
    return str(p)


def _session(obj, tokenizer, texts, tmp_path, backend):
    model = load_model(obj, tokenizer=tokenizer) if tokenizer is not None else load_model(obj)
    assert model.backend == backend
    study = pruning_study(model, QUICK, tmp_path / "prune")
    report = build_report(
        model,
        out_dir=tmp_path / "report",
        quiet=True,
        role_groups=ROLES,
        role_inputs={"text": texts, "conllu": CONLLU},
        prune_config=QUICK,
    )
    return model, study, report


def _check_runs(model, study, report, tmp_path):
    spec = model.spec
    pr = load_run(tmp_path / "prune")
    assert pr.kind == "prune" and pr.manifest["backend"] == model.backend
    pd.testing.assert_frame_equal(pr.tables["importance"], study.tables.importance, check_dtype=False)
    assert len(pr.tables["importance"]) == spec.n_layers * spec.n_heads
    rep = load_run(tmp_path / "report")
    assert rep.kind == "report" and rep.manifest["backend"] == model.backend
    got = rep.tables["roles"]
    assert set(got["role"]) >= {"positional:previous", "positional:first", "syntactic"}
    assert len(got[["layer", "head"]].drop_duplicates()) == spec.n_layers * spec.n_heads
    pd.testing.assert_frame_equal(got, report.frames["roles"], check_dtype=False)
    imp = rep.tables["prune_importance"].sort_values(["layer", "head"])["value"].to_numpy()
    ref = study.tables.importance.sort_values(["layer", "head"])["value"].to_numpy()
    assert abs(imp - ref).max() <= 1e-6
    return rep


def test_hf_model_object_in_a_notebook(texts, tmp_path):
    hf, tok = tiny_hf_model("olmo2")  # a family the in-house stack does not cover: auto takes hf
    model, study, report = _session(hf, tok, texts, tmp_path, "hf")
    rep = _check_runs(model, study, report, tmp_path)
    assert "curve:importance" in set(rep.tables["prune_curves"]["study"])


def test_transformer_bridge_object_in_a_notebook(texts, tmp_path):
    from transformer_lens.model_bridge import TransformerBridge

    hf, tok = tiny_hf_model("llama")
    bridge = TransformerBridge.boot_transformers("tiny-llama", hf_model=hf, tokenizer=tok)
    model, study, report = _session(bridge, None, texts, tmp_path, "bridge")
    assert model.bridge is bridge
    rep = _check_runs(model, study, report, tmp_path)
    assert "curve:importance" in set(rep.tables["prune_curves"]["study"])
