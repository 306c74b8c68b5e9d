"""Patching (analyses/patching): planted ground truth, tasks and their errors, statistics, CLI.

The planted model (probes/models/inhouse/planted.py) has an induction pair: (0, 0) writes each
token's previous token into the residual, (1, 1) matches a query token against that
(through K). As shipped, only (0, 0) writes to the residual, so no head can move the
logits; :func:`writing_induction` gives (1, 1) an output: it copies the attended token
into the token block, which the tied unembedding reads. Every other head writes nothing,
so its patching effect is exactly 0.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from patching_cases import CFG, effects, significant

from headscope.analyses.metrics import logprob_metric
from headscope.analyses.patching import PatchConfig, activation_patching, agreement, attribution_patching, path_patching
from headscope.analyses.patching.activation import capture_z, patch_units, patched_metrics
from headscope.analyses.patching.frames import PATCH_COLUMNS, effect_frame, normalised_values, top_heads
from headscope.analyses.patching.generated import induction_task
from headscope.analyses.patching.items import PairItem, Task
from headscope.analyses.patching.sentence_tasks import agreement_rows
from headscope.analyses.patching.study import StudyConfig, patching_study
from headscope.analyses.patching.task_files import read_task_jsonl, tokenize_rows
from headscope.analyses.patching.tasks import load_task
from headscope.probes.errors import InputFileError, ModelIncompatibleError
from headscope.probes.models.inhouse.planted import VOCAB, planted_model


@pytest.fixture(scope="module")
def activation(planted, induction):
    return activation_patching(planted, induction, CFG)


# ----------------------------------------------------------------------------- planted truth
def test_induction_items_are_minimal_pairs(planted, induction):
    bos = planted.tokenizer.bos_token_id
    for it in induction.items:
        s = it.clean[1:9]
        assert it.clean == (bos, *s, *s[:-1]) and it.answer == s[-1]
        assert it.corrupted[9:] == it.clean[9:] and not set(it.corrupted[1:9]) & set(s)
        assert len(set(s)) == 8


def test_noising_singles_out_exactly_the_induction_pair(activation):
    frame, run = activation
    assert frame.columns[: len(PATCH_COLUMNS)].tolist() == PATCH_COLUMNS
    assert float(run.clean.mean()) > -0.01 and float(run.corrupted.mean()) < -5  # the task separates the runs
    eff = effects(frame, "activation_noising")
    assert significant(frame, "activation_noising") == {(0, 0), (1, 1)}
    assert eff[(1, 1)] == pytest.approx(1.0, abs=1e-4)  # the head's corrupted output is the corrupted run's
    assert eff[(0, 0)] == pytest.approx(0.875, abs=0.02)  # without previous tokens (1, 1) finds nothing to copy
    assert all(v == 0.0 for h, v in eff.items() if h not in {(0, 0), (1, 1)})


def test_denoising_restores_through_the_induction_head_only(activation):
    frame, _ = activation
    eff = effects(frame, "activation_denoising")
    assert eff[(1, 1)] == pytest.approx(1.0, abs=1e-4)
    # clean previous tokens alone point (1, 1) at the corrupted token after S[-2]: worse than corrupted
    assert eff[(0, 0)] < -0.3
    assert significant(frame, "activation_denoising") == {(0, 0), (1, 1)}
    assert top_heads(frame[frame["method"] == "activation_denoising"], 1) == [(1, 1)]
    assert all(v == 0.0 for h, v in eff.items() if h not in {(0, 0), (1, 1)})


@pytest.mark.parametrize("via, expected", [("k", {(0, 0)}), ("q", set()), ("v", set())])
def test_path_patching_finds_previous_to_induction_through_k_only(planted, induction, via, expected):
    frame, _ = path_patching(planted, induction, receiver=(1, 1), via=via, cfg=CFG)
    assert set(frame["receiver"]) == {"1.1"} and frame["method"].iloc[0] == f"path_{via}_noising"
    assert significant(frame, f"path_{via}_noising") == expected
    eff = effects(frame, f"path_{via}_noising")
    if via == "k":
        assert eff[(0, 0)] == pytest.approx(0.875, abs=0.02)  # the whole of (0, 0)'s effect goes through K
    assert all(v == 0.0 for h, v in eff.items() if h not in expected)


def test_path_patching_refuses_bad_heads(planted, induction):
    with pytest.raises(ValueError, match="below the receiver"):
        path_patching(planted, induction, receiver=(1, 1), senders=[(1, 0)], cfg=CFG)
    with pytest.raises(ValueError, match="via must be"):
        path_patching(planted, induction, receiver=(1, 1), via="o", cfg=CFG)


def test_attribution_agrees_on_the_output_head_and_linearises_the_saturated_one(planted, induction, activation):
    act, _ = activation
    att, _ = attribution_patching(planted, induction, CFG)
    for d in ("denoising", "noising"):
        a = agreement(act[act["method"] == f"activation_{d}"], att[att["method"] == f"attribution_{d}"], k=1)
        assert a["top_k_overlap"] == 1.0 and a["n_heads"] == 8  # (1, 1) leads both
    # (0, 0) reaches the metric only through (1, 1)'s keys, whose pattern is saturated (q·k gap
    # 30): the total gradient sees it (denoising 0.272) but, being first order, with the sign
    # of a small step, where patching all of (0, 0)'s clean output moves the metric by -0.536;
    # at the clean run (noising) the saturated softmax leaves the gradient < 1e-3 although
    # noising (0, 0) removes 0.875 of the gap
    att_den, act_den = effects(att, "attribution_denoising"), effects(act, "activation_denoising")
    assert att_den[(0, 0)] == pytest.approx(0.272, abs=0.005) and act_den[(0, 0)] < -0.3
    att_noise = effects(att, "attribution_noising")
    assert abs(att_noise[(0, 0)]) < 1e-3 < effects(act, "activation_noising")[(0, 0)]
    assert all(v == 0.0 for h, v in att_den.items() if h not in {(0, 0), (1, 1)})


def test_effect_is_0_at_the_corrupted_run_and_1_at_the_clean_run(planted, induction):
    clean, corrupted, answer, wrong, _ = next(induction.batches(12))
    logits_c, z_c = capture_z(planted, clean)
    logits_x, z_x = capture_z(planted, corrupted)
    m_c, m_x = logprob_metric(logits_c, answer), logprob_metric(logits_x, answer)
    every = [[(l, h) for l in range(2) for h in range(4)]]
    patched = patched_metrics(planted, corrupted, z_c, every, logprob_metric, answer, wrong, 144)
    values = normalised_values(torch.stack([patched[:, 0] - m_x, torch.zeros_like(m_x)], 1), m_c - m_x)
    assert values.mean(0).tolist() == pytest.approx([1.0, 0.0], abs=1e-5)


def test_no_hook_survives_an_exception(planted, induction):
    clean, corrupted, answer, wrong, _ = next(induction.batches(4))
    _, z_c = capture_z(planted, clean)

    def broken(*args):
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError, match="metric failed"):
        patched_metrics(planted, corrupted, z_c, patch_units(planted.spec), broken, answer, wrong, 16)
    assert not any(hp.active for hp in planted.module.hook_points.values())


def test_study_summary_and_figures(planted, induction):
    from headscope.reports.cli.patch import figures, render_summary

    res = patching_study(
        planted,
        induction,
        StudyConfig(methods=("activation", "attribution", "path"), receiver=(1, 1), vias=("k",), patch=CFG, top_k=2),
    )
    s = res.summary
    assert s["significant_heads"]["activation_noising"] == ["L0H0", "L1H1"]
    assert s["significant_heads"]["path_k_noising"] == ["L0H0"]
    assert set(s["agreement"]) == {"denoising", "noising"}
    assert "Spearman" in render_summary({"model": "planted", **s})
    pngs = figures(res.frame, planted.spec)
    assert sorted(pngs) == [f"figures/{m}.png" for m in sorted(set(res.frame["method"]))]
    assert all(p[:4] == b"\x89PNG" for p in pngs.values())


# ----------------------------------------------------------------------------- statistics
def test_effect_frame_literal():
    delta = torch.tensor([[2.0, 0.0, -1.0], [2.0, 0.0, -1.0], [2.0, 0.0, -1.0], [2.0, 0.0, -1.0], [2.0, 0.0, -1.0]])
    f = effect_frame(
        delta,
        torch.full((5,), 2.0),
        [[(0, 0)], [(0, 1), (0, 2)], [(1, 0)]],
        method="activation_denoising",
        n_perm=999,
        n_boot=50,
    )
    expected = pd.DataFrame(
        {
            "layer": [0, 0, 0, 1],
            "head": [0, 1, 2, 0],
            "method": ["activation_denoising"] * 4,
            "effect": [1.0, 0.0, 0.0, -0.5],
            "ci_low": [1.0, 0.0, 0.0, -0.5],
            "ci_high": [1.0, 0.0, 0.0, -0.5],
            # 5 items of one sign: two-sided 2/32, BH over 3 units: × 3/2 = 0.094 (Monte-Carlo, 999 flips)
            "p_value": [0.094, 1.0, 1.0, 0.094],
            "significant": [False, False, False, False],
            "n": [5] * 4,
        }
    )
    pd.testing.assert_frame_equal(f[PATCH_COLUMNS], expected, atol=0.04)
    assert f.columns[-1] == "definition"
    assert set(f["definition"]) == {"the corrupted run with the unit's z replaced by the clean run's"}


def test_a_task_without_a_gap_gives_nan_effects_and_a_warning():
    with pytest.warns(UserWarning, match="gap"):
        f = effect_frame(torch.ones(4, 1), torch.zeros(4), [[(0, 0)]], method="activation_noising", n_perm=100)
    assert f["effect"].isna().all() and not f["significant"].any()


def test_agreement_numbers():
    a = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "effect": [0.9, 0.1, 0.5, 0.0]})
    b = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "effect": [0.1, 0.8, 0.6, 0.0]})
    got = agreement(a, b, k=2)
    assert got == {"spearman": pytest.approx(0.2), "top_k_overlap": 0.5, "k": 2, "n_heads": 4}


# ----------------------------------------------------------------------------- tasks and files
def write(tmp_path, lines, name="task.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize(
    "lines, where, match",
    [
        (['{"clean": "the cat", "corrupted": "a cat", "answer": "sat"}', "{not json"], ":2:2:", "not valid JSON"),
        (['{"clean": "the cat", "corrupted": "a cat"}'], ":1:1:", "missing key 'answer'"),
        (["# a comment", "", '{"clean": "the cat", "corrupted": 3, "answer": "sat"}'], ":3:", "'corrupted' must be"),
        (["[1, 2]"], ":1:1:", "JSON object"),
        (['  {"clean": "a",'], ":1:17:", "not valid JSON"),
        (['{"clean_ids": [1, true], "corrupted_ids": [1, 2], "answer_id": 4}'], ":1:2:", "'clean_ids' must be"),
        (
            [
                '{"clean": "the cat", "corrupted": "a cat", "answer": "sat", "wrong": "ran"}',
                '{"clean": "the dog", "corrupted": "a dog", "answer": "sat"}',
            ],
            ":2:1:",
            "like the first item",
        ),
        (['{"clean_ids": [1, 2], "corrupted_ids": [1, -3], "answer_id": 4}'], ":1:", "'corrupted_ids' must be"),
    ],
)
def test_bad_task_lines_name_file_line_and_column(tmp_path, lines, where, match):
    p = write(tmp_path, lines)
    with pytest.raises(InputFileError, match=match) as e:
        read_task_jsonl(p)
    assert f"task.jsonl{where}" in str(e.value)


def test_unusable_items_are_counted_not_dropped(planted, tmp_path):
    p = write(
        tmp_path,
        [
            '{"clean": "the cat sat", "corrupted": "a dog sat", "answer": "on"}',
            '{"clean": "the cat sat", "corrupted": "the big cat sat", "answer": "on"}',  # 4 vs 5 tokens
            '{"clean": "the cat sat", "corrupted": "a dog sat", "answer": "on the"}',  # two tokens
            '{"clean_ids": [1, 5, 6], "corrupted_ids": [1, 7, 6], "answer_id": 9999}',  # past the vocabulary
        ],
    )
    with pytest.warns(UserWarning, match="3 of 4 items unusable"):
        task = tokenize_rows(planted, read_task_jsonl(p), name="t", source=str(p))
    assert len(task.items) == 1 and task.n_unusable == 3
    assert [u["line"] for u in task.unusable] == [2, 3, 4]
    assert "4 tokens, corrupted 5" in task.unusable[0]["reason"]
    assert "not a single token" in task.unusable[1]["reason"] and "vocab" in task.unusable[2]["reason"]
    assert task.summary()["n_unusable"] == 3 and task.metric == "logprob"


def test_a_file_of_only_unusable_items_is_refused(planted, tmp_path):
    p = write(tmp_path, ['{"clean": "the cat sat", "corrupted": "the big cat sat", "answer": "on"}'])
    with pytest.raises(InputFileError, match="no usable items"), pytest.warns(UserWarning):
        tokenize_rows(planted, read_task_jsonl(p), name="t", source=str(p))


def test_user_task_with_wrong_tokens_uses_logit_diff(planted, tmp_path):
    p = write(tmp_path, ['{"clean": "the cat sat", "corrupted": "a dog sat", "answer": "on", "wrong": "in"}'] * 3)
    task = load_task(planted, str(p))
    assert task.metric == "logit_diff" and len(task.items) == 3 and task.items[0].wrong == VOCAB.index("in")


def test_unknown_task_is_refused_and_an_encoder_gets_the_embedding_metric(planted):
    with pytest.raises(ValueError, match="valid tasks: induction, agreement, coreference, duplicate_token"):
        load_task(planted, "no-such-task")
    task = load_task(planted_model(causal=False), "induction", n_items=3)
    assert task.metric == "embedding_cosine" and {it.answer for it in task.items} == {0}


def test_logit_metrics_refuse_an_encoder_with_the_reason(minilm):
    from headscope.analyses.patching.tasks import check_decoder

    with pytest.raises(
        ModelIncompatibleError,
        match=r"'minilm-l6' is an embedding model \(bidirectional attention \(an encoder family\)\)",
    ):
        check_decoder(minilm)
    task = Task(name="t", items=[PairItem((101, 2003, 102), (101, 2024, 102), 2003)], metric="logprob")
    with pytest.raises(ModelIncompatibleError, match="embedding_cosine"):
        activation_patching(minilm, task, CFG)


def test_task_needs_wrong_tokens_for_logit_diff(induction):
    with pytest.raises(ValueError, match="wrong token"):
        Task(name="x", items=induction.items, metric="logit_diff")
    with pytest.raises(ValueError, match="valid metrics"):
        Task(name="x", items=induction.items, metric="accuracy")


def test_shipped_agreement_file_is_what_the_generator_writes():
    from headscope.data import path

    lines = path("tasks/agreement.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == agreement_rows()


def test_cli_reports_a_bad_task_file_in_one_line_before_loading(tmp_path, capsys):
    from headscope.reports.cli.app import main

    p = write(tmp_path, ['{"clean": "a", "corrupted": "b", "answer": "c"}', '{"clean": "a"'])
    assert main(["patch", "no-such-model", "--task", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("headscope: error: ") and "task.jsonl:2:" in err and len(err.splitlines()) == 1


# ----------------------------------------------------------------------------- SmolLM2
@pytest.mark.slow
def test_smollm_induction_heads_by_patching(smollm):
    """SmolLM2-135M (in-house), 8 induction items of 8 + 7 tokens (no BOS: SmolLM2's tokenizer
    adds none to a text), denoising. The study over all 270 heads (``make figures``, ~5 min on 2
    cores) is committed in data/figures/patching.json: top-10 by activation patching L29H1, L23H7,
    L23H2, L18H6, L23H1, L20H6, L1H5, L23H0, L17H5, L0H8 — of the roles' induction heads (L18H6,
    L17H4, L17H3) L18H6 rank 4 (effect 0.100), L17H3 rank 13 (0.040), L17H4 rank 75 (0.006);
    attribution (total gradient) vs activation: Spearman 0.825 over 270 heads, top-10 overlap 0.8.
    Here the heads it names are patched again live (``PatchConfig.heads``) and must give the
    committed effects, and attribution patching over every head must rank them as it did."""
    from headscope.data import path as data_path

    fig = json.loads(data_path("figures/patching.json").read_text())["figures"]["induction8"]
    assert [fig[f"activation_denoising_rank_{h}"]["value"] for h in ("L18H6", "L17H3", "L17H4")] == [4, 13, 75]
    assert fig["total_denoising_spearman"]["value"] == pytest.approx(0.825, abs=0.04)
    assert fig["total_denoising_top10"]["value"] >= 7
    task = induction_task(smollm.tokenizer, n_items=8, seq_len=8, seed=0)
    assert len(task.items[0].clean) == fig["tokens"]["value"] == 15
    heads = ((29, 1), (23, 7), (18, 6), (17, 3), (17, 4))
    cfg = PatchConfig(directions=("denoising",), n_perm=2000, n_boot=200, max_rows=64, heads=heads)
    act, run = activation_patching(smollm, task, cfg)
    assert len(act) == len(heads)
    assert float(run.clean.mean()) == pytest.approx(fig["clean"]["value"], abs=1e-3)
    assert float(run.corrupted.mean()) == pytest.approx(fig["corrupted"]["value"], abs=1e-3)
    eff = effects(act, "activation_denoising")
    assert eff[(29, 1)] == pytest.approx(fig["activation_denoising_L29H1"]["value"], abs=1e-3)
    assert eff[(23, 7)] == pytest.approx(fig["activation_denoising_L23H7"]["value"], abs=1e-3)
    assert eff[(18, 6)] == pytest.approx(0.100, abs=0.01) and eff[(17, 3)] == pytest.approx(0.040, abs=0.01)
    assert abs(eff[(17, 4)]) < 0.03
    att, _ = attribution_patching(smollm, task, cfg)
    assert len(att) == 270  # one backward scores every head, whatever cfg.heads says
    estimate = effects(att, "attribution_denoising")
    ranked = sorted(estimate, key=estimate.get, reverse=True)
    assert {(29, 1), (23, 7), (18, 6)} <= set(ranked[:10]) and ranked.index((17, 4)) > 30


def test_patching_a_chosen_set_of_heads_gives_their_rows_of_the_full_run(planted, induction):
    """``PatchConfig.heads``: the same effects as the run over every head, for those heads only;
    a head outside the model is refused with the model's shape."""
    cfg = PatchConfig(directions=("denoising", "noising"), n_perm=200, n_boot=50)
    full, _ = activation_patching(planted, induction, cfg)
    chosen = ((1, 1), (0, 0))
    part, _ = activation_patching(planted, induction, PatchConfig(**{**cfg.__dict__, "heads": chosen}))
    for method in ("activation_denoising", "activation_noising"):
        f, p = effects(full, method), effects(part, method)
        assert set(p) == set(chosen)
        assert all(p[h] == pytest.approx(f[h], abs=1e-6) for h in chosen)
    with pytest.raises(ValueError, match=r"outside the model \(2 layers of"):
        activation_patching(planted, induction, PatchConfig(heads=((9, 0),)))
    with pytest.raises(ValueError, match="non-empty tuple of"):
        PatchConfig(heads=())


# ----------------------------------------------------------------------------- GQA, CLI output
def test_kv_group_unit_patches_a_group_together():
    from headscope.probes.models.config import ModelConfig
    from headscope.probes.models.inhouse.transformer import Transformer
    from headscope.probes.models.loading import InHouseModel

    torch.manual_seed(0)
    module = Transformer(ModelConfig(family="llama", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, vocab_size=50))
    module.init_weights(std=0.3, seed=0)
    model = InHouseModel(module, None, name="tiny-gqa")
    gen = torch.Generator().manual_seed(1)
    items = [
        PairItem(tuple(c), tuple(x), int(a))
        for c, x, a in zip(
            torch.randint(0, 50, (6, 7), generator=gen).tolist(),
            torch.randint(0, 50, (6, 7), generator=gen).tolist(),
            torch.randint(0, 50, (6,), generator=gen).tolist(),
        )
    ]
    task = Task(name="random", items=items, metric="logprob")
    cfg = PatchConfig(unit="kv_group", directions=("denoising",), n_perm=200, n_boot=50)
    grouped, run = activation_patching(model, task, cfg)
    assert len(grouped) == 8 and set(grouped["unit"]) == {"kv_group"}
    eff = effects(grouped, "activation_denoising")
    assert eff[(0, 0)] == eff[(0, 1)] and eff[(1, 2)] == eff[(1, 3)] and eff[(0, 0)] != eff[(0, 2)]
    # a group's attribution is the sum of its heads' (first order is linear)
    per_head, _ = attribution_patching(model, task, PatchConfig(directions=("denoising",), n_perm=200, n_boot=50))
    per_group, _ = attribution_patching(model, task, cfg)
    h, g = effects(per_head, "attribution_denoising"), effects(per_group, "attribution_denoising")
    assert g[(1, 2)] == pytest.approx(h[(1, 2)] + h[(1, 3)], abs=1e-5)


def test_cli_writes_one_frame_run_json_and_heatmaps(planted, tmp_path, monkeypatch, capsys):
    import headscope.probes.models.loading as loading
    from headscope.reports.cli.app import main
    from headscope.reports.runs import read_frame

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: planted)
    planted.backend_choice = "inhouse (test)"
    out = tmp_path / "patch"
    args = ["patch", "planted", "--task", "induction", "--n-items", "10", "--seq-len", "6", "--out", str(out)]
    assert main([*args, "--method", "activation", "path", "--receiver", "1.1", "--via", "k", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["significant_heads"]["path_k_noising"] == ["L0H0"]
    frame = read_frame(out / "patch.parquet")
    assert frame.columns[: len(PATCH_COLUMNS)].tolist() == PATCH_COLUMNS
    assert set(frame["method"]) == {"activation_denoising", "activation_noising", "path_k_noising"}
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["output"]["kind"] == "patch" and manifest["task"]["n_items"] == 10
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "activation_denoising.png",
        "activation_noising.png",
        "path_k_noising.png",
    ]
    from headscope.reports import load_run

    run = load_run(out)  # back into pandas like every other run
    assert run.kind == "patch" and run.tables["patch"].equals(frame)
    assert main(args) == 0  # an earlier patch output is replaced
    (out / "mine.txt").write_text("x")
    assert main(args) == 2 and "mine.txt" in capsys.readouterr().err
