"""Patching, second part: zero/mean/resample ablation, per-position patching, the
coreference and duplicate-token tasks, encoders (pooled-embedding cosine) and the HF and
bridge backends.

Planted model as in test_patching.py (:func:`writing_induction`: (0, 0) writes each token's
previous token, (1, 1) copies the token after the query's earlier occurrence; every other
head writes nothing, so its effect is exactly 0).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from patching_cases import CFG, effects, gap_items, significant

from headscope.analyses.metrics import METRICS
from headscope.analyses.patching import ablation_patching, activation_patching, attribution_patching
from headscope.analyses.patching.ablation import derangement, mean_z, pooled_mean_z, resample_sources
from headscope.analyses.patching.activation import PatchConfig
from headscope.analyses.patching.frames import PATCH_COLUMNS, top_heads
from headscope.analyses.patching.generated import duplicate_token_task, induction_task
from headscope.analyses.patching.items import PairItem, Task
from headscope.analyses.patching.sentence_tasks import coreference_rows
from headscope.analyses.patching.study import StudyConfig, patching_study
from headscope.analyses.patching.tasks import TASKS, load_task
from headscope.probes.models.inhouse.planted import planted_model

OTHERS = [(l, h) for l in range(2) for h in range(4) if (l, h) not in {(0, 0), (1, 1)}]


@pytest.fixture(scope="module")
def duplicate(planted):
    return duplicate_token_task(planted.tokenizer, n_items=12, seq_len=8, seed=0)


def at(frame, method, layer, head, position):
    f = frame[
        (frame["method"] == method)
        & (frame["layer"] == layer)
        & (frame["head"] == head)
        & (frame["position"] == position)
    ]
    assert len(f) == 1
    return float(f["effect"].iloc[0])


# ----------------------------------------------------------------------------- ablation
def test_zero_mean_resample_ablation_break_only_the_induction_pair(planted, induction):
    kinds = ("zero", "mean", "mean_position", "resample")
    frame, run = ablation_patching(planted, induction, dataclasses.replace(CFG, ablations=kinds))
    assert frame.columns[: len(PATCH_COLUMNS)].tolist() == PATCH_COLUMNS
    assert list(dict.fromkeys(frame["method"])) == [f"ablation_{k}" for k in kinds]
    # effect = fraction of the clean - corrupted gap lost (0: the clean metric is untouched)
    measured = {
        "zero": {(0, 0): 0.9013, (1, 1): 0.9735},
        # one vector per head (every token's mean): (0, 0)'s previous tokens are gone
        "mean": {(0, 0): 0.9012, (1, 1): 0.8328},
        "mean_position": {(0, 0): 0.3326, (1, 1): 0.6547},
        "resample": {(0, 0): 0.9677, (1, 1): 1.4208},  # another item's answer is copied: below corrupted
    }
    for kind, pair in measured.items():
        eff = effects(frame, f"ablation_{kind}")
        assert {h: round(eff[h], 4) for h in pair} == pytest.approx(pair, abs=2e-4), kind
        assert all(eff[h] == 0.0 for h in OTHERS), kind  # exactly the clean metric
        # the per-position mean leaves (0, 0) the average previous token at each position: a
        # partial match that varies by item (effect 0.33, not significant over 12 items)
        want = {(1, 1)} if kind == "mean_position" else {(0, 0), (1, 1)}
        assert significant(frame, f"ablation_{kind}") == want, kind
        assert set(frame[frame["method"] == f"ablation_{kind}"]["n"]) == {12}


def test_mean_is_per_position_aligned_from_the_end():
    model = planted_model()
    bos = model.tokenizer.bos_token_id
    items = [PairItem((bos, 5, 6), (bos, 7, 6), 6), PairItem((bos, 8, 9, 10), (bos, 11, 9, 10), 6)]
    task = Task(name="t", items=items, metric="logprob")
    means = mean_z(model, task, batch_size=4)
    _, z3 = __import__("headscope.analyses.patching.activation", fromlist=["x"]).capture_z(
        model, torch.tensor([items[0].clean])
    )
    _, z4 = __import__("headscope.analyses.patching.activation", fromlist=["x"]).capture_z(
        model, torch.tensor([items[1].clean])
    )
    assert means[0].shape == (4, 4, 64)
    torch.testing.assert_close(means[0][:, 0], z4[0][0, :, 0])  # only the longer input has position -4
    torch.testing.assert_close(means[0][:, 1:], (z3[0][0] + z4[0][0, :, 1:]) / 2)
    # "mean": every token of both inputs (3 + 4) in one vector per head
    pooled = pooled_mean_z(task, means)
    assert pooled[0].shape == (4, 64)
    torch.testing.assert_close(pooled[0], (z3[0][0].sum(1) + z4[0][0].sum(1)) / 7)


def test_resample_sources_are_a_seeded_derangement_within_a_length():
    d = derangement(6, torch.Generator().manual_seed(3))
    assert sorted(d) == list(range(6)) and all(d[i] != i for i in range(6))
    items = [PairItem((1, 2, 3), (1, 4, 3), 3)] * 3 + [PairItem((1, 2), (1, 4), 3)]
    src = resample_sources(Task(name="t", items=items, metric="logprob"), seed=0)
    assert src[3] is None and {src[0], src[1], src[2]} == {0, 1, 2} and all(src[i] != i for i in range(3))
    assert src == resample_sources(Task(name="t", items=items, metric="logprob"), seed=0)


def test_bad_ablation_kind_is_refused():
    with pytest.raises(ValueError, match="ablations must be a non-empty subset"):
        PatchConfig(ablations=("gaussian",))


# ----------------------------------------------------------------------------- per position
def test_per_position_induction_sits_at_the_read_positions(planted, induction):
    """Inputs ``[BOS] + S + S[:-1]``, 16 tokens. (1, 1) writes the answer at the last
    position (-1). Its query ``S[-2]`` matches the key whose previous token is ``S[-2]``:
    ``S[-1]`` at index 8 = position 8 - 16 = -8, where (0, 0) wrote ``S[-2]``."""
    # BH over 8 heads × 16 positions: 12 items need the exact-ish sign-flip p (10,000 flips)
    frame, _ = activation_patching(planted, induction, dataclasses.replace(CFG, per_position=True, n_perm=10000))
    assert "position" in frame and sorted(set(frame["position"])) == list(range(-16, 0))
    assert len(frame) == 2 * 8 * 16 and set(frame["n"]) == {12}
    for method, prev in (("activation_noising", 0.8754), ("activation_denoising", -0.5364)):
        f = frame[frame["method"] == method]
        moved = {(int(r.layer), int(r.head), int(r.position)) for r in f[f["effect"] != 0].itertuples()}
        assert moved == {(1, 1, -1), (0, 0, -8)}, method
        assert at(frame, method, 1, 1, -1) == pytest.approx(1.0, abs=1e-4)
        assert at(frame, method, 0, 0, -8) == pytest.approx(prev, abs=2e-3)  # as much as the whole head
        assert significant(frame, method) == {(0, 0), (1, 1)}


def test_per_position_aligns_items_of_different_lengths_from_the_end(planted):
    a = induction_task(planted.tokenizer, n_items=4, seq_len=6, seed=1).items
    b = induction_task(planted.tokenizer, n_items=4, seq_len=8, seed=2).items
    task = Task(name="mixed", items=[*a, *b], metric="logprob")
    cfg = dataclasses.replace(CFG, per_position=True, directions=("noising",))
    frame, _ = activation_patching(planted, task, cfg)
    n = frame.groupby("position")["n"].first()
    assert n.loc[-12:].eq(8).all() and n.loc[:-13].eq(4).all() and n.index.min() == -16
    assert at(frame, "activation_noising", 1, 1, -1) == pytest.approx(1.0, abs=1e-4)
    # (0, 0) matters at -6 for the short items and -8 for the long ones
    assert at(frame, "activation_noising", 0, 0, -6) > 0.3 and at(frame, "activation_noising", 0, 0, -8) > 0.3


# ----------------------------------------------------------------------------- tasks
def test_duplicate_token_is_carried_by_the_previous_token_head(planted, duplicate):
    """``[BOS] + A + [x, y] + B + [x]``, x at index 4, y at 5 (position 5 - 10 = -5)."""
    it = duplicate.items[0]
    assert len(it.clean) == 10 and it.clean[4] == it.clean[9] and it.answer == it.clean[5]
    assert it.corrupted[4] not in it.clean and it.corrupted[:4] + it.corrupted[5:] == it.clean[:4] + it.clean[5:]
    frame, run = activation_patching(planted, duplicate, CFG)
    assert float(run.clean.mean()) == pytest.approx(-0.0014, abs=2e-4)
    assert float(run.corrupted.mean()) == pytest.approx(-4.9607, abs=2e-3)
    den, noi = effects(frame, "activation_denoising"), effects(frame, "activation_noising")
    # clean previous tokens alone restore the clean run: (0, 0) carries the repetition
    assert den[(0, 0)] == pytest.approx(1.0, abs=1e-4) and den[(1, 1)] == pytest.approx(1.0, abs=1e-4)
    # noising (0, 0): nothing matches, and the extra x in the context lowers p(y) below corrupted
    assert noi[(0, 0)] == pytest.approx(1.2555, abs=2e-3) and noi[(1, 1)] == pytest.approx(1.0, abs=1e-4)
    assert all(den[h] == 0.0 and noi[h] == 0.0 for h in OTHERS)
    pp, _ = activation_patching(planted, duplicate, dataclasses.replace(CFG, per_position=True))
    f = pp[(pp["method"] == "activation_denoising") & (pp["effect"] != 0)]
    assert {(int(r.layer), int(r.head), int(r.position)) for r in f.itertuples()} == {(0, 0, -5), (1, 1, -1)}


def test_coreference_rows_from_the_shipped_items():
    rows, unusable = coreference_rows()
    assert len(rows) == 170 and len(unusable) == 50  # 220 items; 50 gender items name 3 or 4 people
    reasons = [u["reason"] for u in unusable]
    assert reasons.count("3 candidates (needs 2)") == 40 and reasons.count("4 candidates (needs 2)") == 10
    line, r = next((ln, r) for ln, r in rows if ln == 1)
    assert r == {
        "clean": 'The cat didn\'t climb on the table because it was too tired. "it" refers to the',
        "corrupted": 'The cat didn\'t climb on the table because it was too tall. "it" refers to the',
        "answer": " cat",
        "wrong": " table",
    }


def test_every_shipped_task_is_registered_and_documented():
    from headscope.data import path

    readme = path("tasks/README.md").read_text()
    assert set(TASKS) == {"induction", "agreement", "coreference", "duplicate_token", "ioi", "greater_than"}
    assert all(f"`{name}`" in readme for name in TASKS)


@pytest.mark.slow
def test_coreference_on_smollm(smollm):
    """SmolLM2-135M: 104 of the 220 items usable (50 have 3-4 candidates; 59 candidates are
    not single tokens, mostly names; 7 pairs tokenise to different lengths); on the first 32
    the clean prompt favours its antecedent over the other candidate more than the partner
    prompt does, by 0.30 in logit difference (in 75% of items): a small gap."""
    task = load_task(smollm, "coreference", n_items=32)
    assert task.metric == "logit_diff" and len(task.items) == 32 and task.n_unusable == 116
    reasons = [u["reason"] for u in task.unusable]
    assert sum("not a single token" in r for r in reasons) == 59 and sum("tokens, corrupted" in r for r in reasons) == 7
    frame, run = attribution_patching(smollm, task, PatchConfig(directions=("denoising",), n_perm=200, n_boot=50))
    assert float(run.clean.mean()) == pytest.approx(-0.1462, abs=0.005)
    assert float(run.corrupted.mean()) == pytest.approx(-0.4462, abs=0.005)
    assert float((run.gap > 0).float().mean()) == 0.75
    assert top_heads(frame, 2) == [(19, 1), (25, 1)]  # total gradient; with later heads cut (25, 1) led


# ----------------------------------------------------------------------------- encoders
def test_minilm_agreement_is_measured_by_embedding_cosine(minilm):
    task = load_task(minilm, "agreement", n_items=16)
    assert task.metric == "embedding_cosine" and len(task.items) == 16
    res = patching_study(minilm, task, StudyConfig(methods=("activation",), patch=CFG))
    s = res.summary
    assert s["measures"].startswith(METRICS["embedding_cosine"].definition)
    assert (
        "embedding: mean pooling, Normalize (the model's sentence-transformers modules)" in s["measures"]
    )  # modules.json
    assert s["metric_clean"] == pytest.approx(1.0, abs=1e-6)
    assert s["metric_corrupted"] == pytest.approx(0.925958, rel=1e-4)
    f = res.frame
    assert np.isfinite(f["effect"]).all() and len(f) == 2 * 6 * 12
    den = f[f["method"] == "activation_denoising"]
    assert top_heads(den, 2) == [(5, 8), (3, 1)]
    assert effects(f, "activation_denoising")[(5, 8)] == pytest.approx(0.37217, rel=1e-3)
    assert effects(f, "activation_noising")[(5, 8)] == pytest.approx(0.15307, rel=1e-3)


def test_cli_on_an_encoder_writes_what_is_measured(planted, tmp_path, monkeypatch, capsys):
    import headscope.probes.models.loading as loading
    from headscope.reports.cli.app import main

    enc = planted_model(causal=False)
    enc.backend_choice = "inhouse (test)"
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: enc)
    out = tmp_path / "patch"
    args = ["patch", "planted", "--task", "induction", "--n-items", "6", "--seq-len", "5", "--out", str(out)]
    assert main([*args, "--method", "ablation", "--ablation", "zero"]) == 0
    text = capsys.readouterr().out
    assert "measures: cosine similarity of the run's sentence embedding (the model's own pooling and Dense" in text
    manifest = json.loads((out / "run.json").read_text())
    assert (
        manifest["measures"].startswith(METRICS["embedding_cosine"].definition)
        and "embedding: mean pooling, Normalize (assumed: the folder has no modules.json)" in manifest["measures"]
        and manifest["task"]["metric"] == "embedding_cosine"
    )


def _st_pooling_folder(folder, mode):
    """A sentence-transformers folder's modules.json and Pooling config (``pooling_mode`` ``mode``)."""
    (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 8, "pooling_mode": mode}))
    return folder


def test_an_encoder_is_pooled_as_its_sentence_transformers_config_says(tmp_path):
    """A sentence-transformers folder whose Pooling config says cls: the metric reads the [CLS]
    position's hidden state (not the mean) and the summary says so."""
    from headscope.analyses.patching.activation import measures, readout
    from headscope.probes.errors import CheckpointError
    from headscope.probes.models.checkpoints import ModelSource

    enc = planted_model(causal=False)
    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    hidden = enc.forward(ids, torch.ones_like(ids)).float()
    torch.testing.assert_close(readout(enc, ids), hidden.mean(1), rtol=0, atol=0)  # no modules.json: mean
    folder = _st_pooling_folder(tmp_path / "cls", "cls")
    enc.source = ModelSource(name="st", kind="hf-dir", path=folder, st_folder=folder)
    torch.testing.assert_close(readout(enc, ids), hidden[:, 0], rtol=0, atol=0)
    text = measures(enc, "embedding_cosine")
    assert "embedding: cls pooling (the model's sentence-transformers modules)" in text
    assert "mean pooling" not in text
    folder = _st_pooling_folder(tmp_path / "bogus", "bogus")
    enc.source = ModelSource(name="st", kind="hf-dir", path=folder, st_folder=folder)
    with pytest.raises(CheckpointError, match="pooling mode 'bogus' is not one of"):
        readout(enc, ids)


def test_cli_per_position_and_new_tasks(planted, tmp_path, monkeypatch, capsys):
    import headscope.probes.models.loading as loading
    from headscope.reports import load_run
    from headscope.reports.cli.app import main

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: planted)
    planted.backend_choice = "inhouse (test)"
    out = tmp_path / "patch"
    args = ["patch", "planted", "--task", "duplicate_token", "--n-items", "8", "--seq-len", "8", "--out", str(out)]
    assert main([*args, "--method", "activation", "--per-position", "--direction", "denoising", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["top_heads"]["activation_denoising"][:2] == ["L0H0@-5", "L1H1@-1"]
    run = load_run(out)
    assert run.kind == "patch" and "position" in run.tables["patch"]
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["activation_denoising.png"]


# ----------------------------------------------------------------------------- backends
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from tiny_models import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), "llama")


@pytest.mark.parametrize("unit", ["head", "kv_group"])
def test_backends_give_the_same_frame(tiny_llama, unit):
    """A tiny random Llama with GQA (4 query heads, 2 KV heads): activation and attribution
    patching through the in-house, HF and bridge backends (their own head hooks)."""
    from headscope.probes.models.loading import load_model

    models = {b: load_model(str(tiny_llama), b) for b in ("inhouse", "hf", "bridge")}
    assert {m.backend for m in models.values()} == {"inhouse", "hf", "bridge"}
    assert models["hf"].spec.n_kv_heads == 2 and models["hf"].spec.n_heads == 4
    task = Task(name="random", items=gap_items(models["inhouse"], 8, 9, seed=0), metric="logit_diff")
    assert len(task.items) >= 6
    cfg = PatchConfig(unit=unit, n_perm=200, n_boot=50)
    frames = {}
    for b, m in models.items():
        act, run = activation_patching(m, task, cfg)
        att, _ = attribution_patching(m, task, cfg)
        frames[b] = (act, att, run)
    ref_act, ref_att, ref_run = frames["inhouse"]
    assert float(ref_run.gap.mean()) > 0.1
    assert ref_act["effect"].abs().max() > 0.05 and ref_att["effect"].abs().max() > 0.05  # real values compared
    if unit == "kv_group":
        e = effects(ref_act, "activation_denoising")
        assert e[(0, 0)] == e[(0, 1)] and e[(1, 2)] == e[(1, 3)]
    for b in ("hf", "bridge"):
        act, att, run = frames[b]
        for ours, theirs in ((ref_act, act), (ref_att, att)):
            assert ours[["layer", "head", "method"]].equals(theirs[["layer", "head", "method"]])
            assert np.abs(ours["effect"].to_numpy() - theirs["effect"].to_numpy()).max() <= 1e-4, b
        assert torch.allclose(run.clean, ref_run.clean, atol=1e-4)


def test_per_position_kv_groups_and_every_row_of_a_group_alike(tiny_llama):
    from headscope.probes.models.loading import load_model

    model = load_model(str(tiny_llama), "inhouse")
    task = Task(name="random", items=gap_items(model, 8, 9, seed=0), metric="logit_diff")
    cfg = PatchConfig(unit="kv_group", per_position=True, directions=("denoising",), n_perm=200, n_boot=50)
    frame, _ = activation_patching(model, task, cfg)
    assert len(frame) == 2 * 4 * 9 and sorted(set(frame["position"])) == list(range(-9, 0))
    g = frame.set_index(["layer", "head", "position"])["p_value"]
    assert (g.xs(0, level="head") == g.xs(1, level="head")).all()  # one test per group and position
    # a layer-1 group's z only reaches the metric at the last position (no later layer reads it)
    last = frame[(frame["layer"] == 1) & (frame["position"] != -1)]
    assert (last["effect"] == 0).all() and (frame[frame["position"] == -1]["effect"] != 0).any()


def test_per_position_attribution_sums_to_the_whole_head_estimate(planted, induction):
    """Attribution is linear in z: a head's per-position estimates add up to its estimate over
    the whole sequence; heads that write nothing are 0 at every position; agreement with
    per-position activation patching is taken over (head, position) cells."""
    cfg = dataclasses.replace(CFG, directions=("denoising",))
    whole, _ = attribution_patching(planted, induction, cfg)
    per, _ = attribution_patching(planted, induction, dataclasses.replace(cfg, per_position=True))
    assert sorted(per["position"].unique()) == list(range(-len(induction.items[0].clean), 0))
    summed = per.groupby(["layer", "head"])["effect"].sum()
    for r in whole.itertuples():
        assert summed[(r.layer, r.head)] == pytest.approx(r.effect, abs=1e-5)
    quiet = per[[(l, h) in OTHERS for l, h in zip(per["layer"], per["head"])]]
    assert (quiet["effect"] == 0).all()
    res = patching_study(
        planted,
        induction,
        StudyConfig(methods=("activation", "attribution"), patch=dataclasses.replace(cfg, per_position=True)),
    )
    agree = res.summary["agreement"]["denoising"]
    assert agree["n_heads"] == 8 * len(induction.items[0].clean)
    f = res.frame[res.frame["effect"].abs() > 1e-6]
    moved = {(m, l, h, p) for m, l, h, p in zip(f["method"], f["layer"], f["head"], f["position"])}
    # the induction head at the read position in both; the previous-token head's effect at the
    # earlier copy (-8: activation -0.536) reaches the gradient through (1, 1)'s keys, most of
    # it at -8 (0.244 of its 0.272) and a little at every position (1, 1) can attend to
    n = len(induction.items[0].clean)
    assert {c for c in moved if c[0] == "activation_denoising"} == {
        ("activation_denoising", 1, 1, -1),
        ("activation_denoising", 0, 0, -8),
    }
    att = {c for c in moved if c[0] == "attribution_denoising"}
    assert ("attribution_denoising", 1, 1, -1) in att and {c[1:3] for c in att} == {(1, 1), (0, 0)}
    prev = per[(per["layer"] == 0) & (per["head"] == 0)].set_index("position")["effect"]
    assert prev.idxmax() == -8 and prev[-8] == pytest.approx(0.244, abs=0.005) and len(prev) == n
