"""The successor role's weights score (headscope.analyses.roles.successor_ov, rows ``successor:ov``):
the planted successor head is the one verdict; a random-weight model gets none; the hf backend reads
the same values as the in-house one on a random Llama; SmolLM2's figures are quoted in the guide."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from headscope.analyses.roles import successor_ov as ov
from headscope.analyses.roles.base import RoleContext
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.pipeline import run_role
from headscope.analyses.roles.successor import probe_items
from headscope.probes.models.inhouse.planted import RANDOM_HEADS, WORD_CLASSES, planted_model, writing_successor
from headscope.probes.ov_inputs import extended_embeddings, ov_values
from headscope.reports.tools.experiments.successor_ov import OUT, summary

NOUNS = WORD_CLASSES["noun"]
CFG = RolesConfig(n_boot=200, n_perm=500, induction_n_sequences=8, batch_size=8)
DOC = Path(__file__).resolve().parents[3] / "docs" / "guide" / "roles.md"


def _ov(out):
    return out.frame[out.frame.role == ov.ROLE].set_index(["layer", "head"])


def test_the_planted_successor_head_is_the_one_verdict_by_the_weights():
    model = writing_successor(planted_model(), NOUNS)
    out = run_role("successor", model, None, CFG, sets={"nouns": NOUNS})
    f = _ov(out)
    assert set(f.index[f.verdict]) == {(1, 2)} and len(f) == 8 and out.extra["notes"] == []
    # every noun but the last has a successor: all of them map to it, against 1 / 10 by chance
    assert f.score[(1, 2)] == 1.0 and f.n[(1, 2)] == len(NOUNS) - 1 and f.baseline[(1, 2)] == pytest.approx(0.1)
    assert not any(f.verdict[h] for h in RANDOM_HEADS) and f.drop((1, 2)).score.max() == 0.0
    # given items: the chains they show
    ctx = RoleContext(model, CFG, options={"sets": {"nouns": NOUNS}})
    given = run_role("successor", model, probe_items(ctx), CFG)
    assert set(_ov(given).index[_ov(given).verdict]) == {(1, 2)}


def test_no_head_of_a_random_weight_model_is_labelled_by_the_weights():
    model = planted_model()
    model.module.init_weights(std=0.3, seed=3)
    f = _ov(run_role("successor", model, None, CFG, sets={"nouns": NOUNS}))
    assert len(f) == 8 and not f.verdict.any() and f.score.max() < 0.5


def test_the_hf_backend_reads_the_in_house_values_on_a_random_llama(tmp_path):
    """The extended embeddings and each head's value of them agree across backends (the hf one finds
    the norm before each layer's value projection on a forward), and the role runs on both, with no
    verdict on random weights."""
    from headscope.probes.models.loading import load_model
    from tests.tiny_models import tiny_model_dir

    folder = tiny_model_dir(tmp_path, "llama")
    hf, inhouse = load_model(str(folder), "hf"), load_model(str(folder), "inhouse")
    ids = [i for i in range(5, 25)]
    e_hf, e_in = extended_embeddings(hf, ids), extended_embeddings(inhouse, ids)
    torch.testing.assert_close(e_hf.cpu(), e_in.cpu(), atol=1e-5, rtol=1e-4)
    v_hf, v_in = ov_values(hf, e_hf, [0, 1]), ov_values(inhouse, e_in, [0, 1])
    for layer in (0, 1):
        assert v_hf[layer].shape == (4, len(ids), 16)
        torch.testing.assert_close(v_hf[layer], v_in[layer], atol=1e-5, rtol=1e-4)
    for model in (hf, inhouse):
        out = run_role("successor", model, None, CFG)
        f = _ov(out)
        assert len(f) == 8 and not f.verdict.any(), out.extra


@pytest.fixture(scope="module")
def data():
    return json.loads(OUT.read_text())


def test_smollm2s_figures_hold_together_and_the_guide_quotes_them(data):
    for backend in ("inhouse", "hf"):
        d = data[backend]
        scores = [t["score"] for t in d["top_ov"]]
        assert scores == sorted(scores, reverse=True) and d["notes"] == []
        assert d["tokens"] == sum(s["tokens"] for s in d["per_set"].values())
        assert d["verdicts"]["successor:ov"] == 0 or d["top_ov"][0]["verdict"]
    assert summary(data) in " ".join(DOC.read_text().split())
