"""Pruning impact: planted heads, gradient checks, resumable studies, real-model figures.

The planted model is a 1-layer llama-family transformer with hand-set weights: head 0
attends to the previous token (position one-hots in q/k) and copies its identity into
an output block the unembedding reads; heads 1 and 2 hold small random weights. The
task alternates two words (``w4 w0 w4 w0 …``), so the next token is the previous one.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
import pytest
import torch
from pruning_cases import alternating, planted_copy_model, random_gqa_model, word_tokenizer

from headscope.analyses.frames import IMPACT_COLUMNS, roles_frame
from headscope.analyses.metrics import mean_pool
from headscope.analyses.pruning.ablation import (
    MeanZ,
    all_but_one,
    batching_speedup,
    role_ablation,
    single_head_ablation,
)
from headscope.analyses.pruning.curves import CurveSettings, prunable_fraction, pruning_curve
from headscope.analyses.pruning.decoder_metrics import substitute
from headscope.analyses.pruning.gates import gates_as, replica_masks
from headscope.analyses.pruning.importance import gate_gradients, head_importance
from headscope.analyses.pruning.masks import head_masks
from headscope.analyses.pruning.metrics import CallableMetric, EmbeddingCosine, LMLoss, build_metric
from headscope.analyses.pruning.scoring import evaluate
from headscope.analyses.pruning.study import PruneConfig, pruning_study
from headscope.probes.errors import CheckpointError, ModelIncompatibleError
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.transformer import Transformer
from headscope.probes.models.loading import InHouseModel


@pytest.fixture(autouse=True)
def _one_thread_for_tiny_models(request):
    """Tiny models run ~4x faster on one thread on a shared CPU; real-model tests keep the default."""
    if {"minilm", "smollm"} & set(request.fixturenames):
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module")
def planted():
    m = planted_copy_model()
    return m, LMLoss(m, alternating(16))


# ----------------------------------------------------------------------------- planted ground truth


def test_planted_head_ablation_breaks_copying_and_others_do_not(planted):
    model, metric = planted
    v, w = evaluate(model, metric)
    # 12 predictions per text: 2 have nothing to copy (~log 11 = 2.40), 10 are copied with p ~ 0.76
    assert float(metric.aggregate(v, w)[0]) == pytest.approx(0.6098, abs=2e-3)
    for mode, planted_delta in (("zero", 1.7977), ("mean", None)):
        df = single_head_ablation(model, metric, mode=mode, n_boot=100)
        assert list(df.columns) == IMPACT_COLUMNS
        d = df[df["metric"] == "delta_lm_loss"].set_index("head")["value"]
        assert d[0] > 1.0, mode  # the copying head carries the task
        assert abs(d[1]) < 0.01 and abs(d[2]) < 0.01, mode
        if planted_delta is not None:
            assert d[0] == pytest.approx(planted_delta, abs=5e-3)


def test_planted_all_but_one_keeps_the_copy_head(planted):
    model, metric = planted
    df = all_but_one(model, metric, n_boot=50)
    row = df[df["metric"] == "delta_lm_loss"].iloc[0]
    assert int(row["head"]) == 0 and abs(row["value"]) < 0.01


def test_planted_importance_ranks_the_copy_head_first(planted):
    model, metric = planted
    imp = head_importance(model, metric)
    assert imp.shape == (1, 3)
    assert float(imp[0, 0]) == pytest.approx(0.4388, abs=2e-3)
    assert float(imp[0, 1:].max()) < 0.01
    per_ex = head_importance(model, metric, per_example=True)
    assert torch.all(per_ex >= imp - 1e-6)  # |mean| <= mean |.|
    norm = head_importance(model, metric, normalize=True)
    assert float(norm.norm()) == pytest.approx(1.0, abs=1e-5)
    assert all(b.attn.gate.requires_grad is False and bool((b.attn.gate == 1).all()) for b in model.module.blocks)


def test_batched_replicas_equal_separate_forwards_and_mean_ablation(planted):
    model, metric = planted
    spec = model.spec
    masks = head_masks(n_layers=1, n_heads=3, heads=[(0, 0), (0, 1), (0, 2)])
    batched, _ = evaluate(model, metric, masks, max_rows=1000)
    separate = torch.cat([evaluate(model, metric, masks[r : r + 1])[0] for r in range(3)])
    assert torch.allclose(batched, separate, atol=1e-6)
    # the hook path equals the model's own gate path (z' = g z + (1 - g) a)
    means = torch.randn(1, 3, spec.d_head)
    hooked, w = evaluate(model, metric, masks[:1], ablation=means)
    with gates_as(model.module, masks[0], ablation=means):
        gated, _ = evaluate(model, metric)
    assert torch.allclose(hooked, gated, atol=1e-5)
    speed = batching_speedup(model, metric, layer=0)
    assert speed["max_abs_diff"] < 1e-5 and speed["heads"] == 3


def test_replica_hooks_are_removed_after_an_exception(planted):
    model, _ = planted
    hp = model.module.hook_points["blocks.0.attn.hook_z"]
    with pytest.raises(RuntimeError, match="boom"):
        with replica_masks(model, head_masks(n_layers=1, n_heads=3, heads=[(0, 0)])):
            assert hp.active
            raise RuntimeError("boom")
    assert not hp.active
    with pytest.raises(RuntimeError, match="boom"):
        with gates_as(model.module, torch.zeros(1, 3), requires_grad=True):
            raise RuntimeError("boom")
    gate = model.module.blocks[0].attn.gate
    assert bool((gate == 1).all()) and not gate.requires_grad


def test_mean_z_reducer_merges_exactly(planted):
    model, metric = planted
    from headscope.analyses.pruning.ablation import mean_z

    full = mean_z(model, metric)
    # head 0's z is the previous word's one-hot; BOS and the first word see only BOS (value 0):
    # 11 of 13 positions carry a one-hot, so the mean sums to 11/13, none of it on PAD/UNK/BOS
    assert float(full[0, 0, :3].abs().max()) < 1e-6
    assert float(full[0, 0].sum()) == pytest.approx(11 / 13, abs=1e-3)
    a, b = MeanZ(1, 3, 16), MeanZ(1, 3, 16)
    a.sum += 2.0
    a.count, b.count = 4.0, 4.0
    assert float(a.merge(b).result()[0, 0, 0]) == pytest.approx(0.25)


def test_callable_metric_plugs_in(planted):
    model, metric = planted

    def copy_loss(m) -> float:  # any metric_fn(model) -> float; it runs with the gates set
        v, w = evaluate(m, metric)
        return float(metric.aggregate(v, w)[0])

    cm = CallableMetric(copy_loss, name="copy_loss", higher_is_better=False)
    df = single_head_ablation(model, cm)
    d = df[df["metric"] == "delta_copy_loss"].set_index("head")["value"]
    assert d[0] == pytest.approx(1.7977, abs=5e-3) and abs(d[1]) < 0.01
    assert df["spread"].isna().all()
    with pytest.raises(ValueError, match="differentiable"):
        head_importance(model, cm)
    with pytest.raises(ValueError, match="plain callable"):
        pruning_study(model, PruneConfig(), metric=cm)
    res = pruning_study(
        model,
        PruneConfig(orders=("ablation",), studies=("ablation", "curves"), ablation_modes=("zero",), step=0.34),
        metric=cm,
    )
    curve = res.frames["curves"].query("metric == 'copy_loss'")["value"].tolist()
    assert curve[-1] == pytest.approx(d[0] + curve[0], abs=1e-2)  # the copy head goes last in the ablation order


def test_callable_and_item_metric_take_the_same_path(planted):
    """A plain callable and an ItemMetric computing the same number go through
    pruning_study alike: the same head masks asked of each metric's ``score``, in the same
    order, and the same tables (but the spread over items, which the callable lacks)."""
    model, metric = planted

    def lm_loss(m) -> float:
        v, w = evaluate(m, metric)
        return float(metric.aggregate(v, w)[0])

    plain = CallableMetric(lm_loss, name=metric.name, higher_is_better=metric.higher_is_better)
    cfg = PruneConfig(
        orders=("ablation", "random"),
        n_random_seeds=2,
        studies=("ablation", "curves"),
        ablation_modes=("zero",),
        step=0.34,
        n_boot=20,
    )
    results, asked = {}, {}
    for key, m in (("item", metric), ("callable", plain)):
        calls = asked[key] = []
        score = m.score

        def spy(model_, masks, *, _score=score, _calls=calls, **kw):
            _calls.append(masks.clone())
            return _score(model_, masks, **kw)

        m.score = spy  # evaluate() reaches every metric through its score
        try:
            results[key] = pruning_study(model, cfg, metric=m)
        finally:
            del m.score
    assert len(asked["item"]) == len(asked["callable"]) > 0
    assert all(torch.equal(a, b) for a, b in zip(asked["item"], asked["callable"]))
    item, call = results["item"].tables, results["callable"].tables
    assert set(results["item"].frames) == set(results["callable"].frames)
    for name in ("baseline", "ablation", "curves", "curve_summary"):
        a, b = getattr(item, name), getattr(call, name)
        keys = ["study", "layer", "head", "step", "fraction_pruned", "metric", "seed"]
        pd.testing.assert_frame_equal(a[keys], b[keys], obj=name)
        assert a["value"].to_numpy() == pytest.approx(b["value"].to_numpy(), abs=1e-5), name
    assert call.baseline["spread"].isna().all() and item.baseline["spread"].notna().all()
    pd.testing.assert_frame_equal(item.prunable, call.prunable, atol=1e-5)


def test_role_ablation_against_random_heads(planted):
    model, metric = planted
    roles = roles_frame(
        [
            dict(
                layer=0,
                head=0,
                role="positional:previous",
                score=0.99,
                baseline=0.1,
                margin=0.89,
                ci_low=0.98,
                ci_high=1.0,
                p_value=0.001,
                n=16,
                verdict=True,
            ),
            dict(
                layer=0,
                head=1,
                role="positional:previous",
                score=0.2,
                baseline=0.1,
                margin=0.1,
                ci_low=0.1,
                ci_high=0.3,
                p_value=0.4,
                n=16,
                verdict=False,
            ),
            dict(
                layer=0,
                head=2,
                role="punctuation",
                score=0.7,
                baseline=0.1,
                margin=0.6,
                ci_low=0.6,
                ci_high=0.8,
                p_value=0.01,
                n=16,
                verdict=True,
            ),
        ]
    )
    df = role_ablation(model, metric, roles, k=1, n_draws=6, seed=0)
    prev = df.set_index("role").loc["positional:previous"]
    assert prev["k"] == 1 and prev["n_draws"] == 6
    assert prev["value_role"] == pytest.approx(1.7977, abs=5e-3)
    assert abs(prev["value_random_mean"]) < 0.01  # random draws from heads 1 and 2 barely matter
    punct = df.set_index("role").loc["punctuation"]
    assert abs(punct["value_role"]) < 0.01 and punct["value_random_mean"] > 0.5  # random draws hit head 0 at times


# ----------------------------------------------------------------------------- gradients


def _gradients_and_differences(model, metric, mask, eps):
    """``(analytic, finite difference)`` gradients of the loss w.r.t. each gate, ``[layer, head]``
    each: the gate gradients and the central difference quotient with step ``eps``."""
    g, _ = gate_gradients(model, metric, mask=mask)
    unit = metric.units[0]

    def loss_at(m):
        with gates_as(model.module, m), torch.no_grad():
            return float(metric.loss(model.module(unit.batch.input_ids, unit.batch.attention_mask), unit))

    fd = torch.zeros(mask.shape, dtype=torch.float64)
    for l in range(mask.shape[0]):
        for h in range(mask.shape[1]):
            up, down = mask.clone(), mask.clone()
            up[l, h] += eps
            down[l, h] -= eps
            fd[l, h] = (loss_at(up) - loss_at(down)) / (2 * eps)
    return g[0].double(), fd


def test_gate_gradient_matches_finite_difference():
    # float64 BERT-family model: every op runs in float64, so the check holds to 1e-4 relative
    cfg = ModelConfig(
        family="bert", n_layers=2, d_model=32, n_heads=4, vocab_size=11, max_positions=16, name="random-bert"
    )
    net = Transformer(cfg)
    net.init_weights(std=0.3, seed=2)
    model = InHouseModel(net.to(torch.float64), word_tokenizer(), name="random-bert")
    metric = EmbeddingCosine(model, alternating(6, length=9, seed=3), batch_size=6, temperature=0.5)
    assert len(metric.units) == 1
    mask = torch.ones(2, 4, dtype=torch.float64)
    mask[1, 2] = 0.0  # gradients at a partly pruned point too
    g, fd = _gradients_and_differences(model, metric, mask, eps=1e-6)
    assert g.flatten().tolist() == pytest.approx(fd.flatten().tolist(), rel=1e-4, abs=1e-9)
    assert float(g.abs().max()) > 1e-3  # not a trivially zero gradient


def test_gate_gradient_matches_finite_difference_gqa_decoder():
    # llama RMSNorm computes in float32 (as HF does) even in a float64 model: the loss carries ~1e-7
    # relative noise, so a wider step and an absolute floor of 2e-4 on the difference quotient
    model = random_gqa_model(torch.float64)
    metric = LMLoss(model, alternating(6, length=9, seed=3), batch_size=6)
    mask = torch.ones(2, 4, dtype=torch.float64)
    mask[0, 1] = 0.0
    g, fd = _gradients_and_differences(model, metric, mask, eps=1e-3)
    assert g.flatten().tolist() == pytest.approx(fd.flatten().tolist(), rel=2e-3, abs=2e-4)
    assert float(g.abs().max()) > 1e-3  # not a trivially zero gradient


# ----------------------------------------------------------------------------- curves, GQA, resume


def test_kv_group_curve_counts_query_and_kv_heads():
    model = random_gqa_model()
    metric = LMLoss(model, alternating(6, seed=1))
    df = pruning_curve(model, metric, "importance", CurveSettings(step_fraction=0.25, unit="kv_group", n_boot=20))
    wide = df.pivot_table(index="step", columns="metric", values="value")
    # 4 groups (2 layers x 2 KV heads): one group = 2 query heads per step
    assert wide["query_heads_pruned"].tolist() == [0, 2, 4, 6, 8]
    assert wide["kv_heads_pruned"].tolist() == [0, 1, 2, 3, 4]
    assert wide["kv_cache_bytes_saved_per_token"].tolist() == [2 * kv * 8 * 4 for kv in range(5)]
    assert df[df["metric"] == "lm_loss"]["fraction_pruned"].tolist() == [0, 0.25, 0.5, 0.75, 1.0]
    # head-level random pruning frees a KV head only when both of its query heads are gone
    heads = pruning_curve(model, metric, "random", CurveSettings(step_fraction=0.125, n_boot=20), seed=0)
    hw = heads.pivot_table(index="step", columns="metric", values="value")
    assert (hw["kv_heads_pruned"] <= hw["query_heads_pruned"] // 2).all() and hw["kv_heads_pruned"].iloc[-1] == 4


def test_prunable_fraction_and_config_errors():
    assert prunable_fraction([0, 0.1, 0.2], [0.8, 0.796, 0.7], higher_is_better=True, tolerance=0.01) == 0.1
    assert prunable_fraction([0, 0.1, 0.2], [0.8, 0.7, 0.8], higher_is_better=True, tolerance=0.05) == 0.0
    with pytest.raises(ValueError, match="'orders'"):
        PruneConfig(orders=("largest",))
    with pytest.raises(ValueError, match="'metric'"):
        PruneConfig(metric="bleu")
    with pytest.raises(ValueError, match="valid metrics"):
        build_metric("bleu", None)


def test_resumed_study_equals_uninterrupted_run(tmp_path, planted):
    model, _ = planted
    cfg = PruneConfig(metric="lm_loss", step=0.34, n_random_seeds=2, n_boot=20)
    metric = LMLoss(model, alternating(8, seed=2))
    calls = []
    full = pruning_study(model, cfg, tmp_path / "full", metric=metric, progress=lambda *a: calls.append(a))
    assert full.complete and (tmp_path / "full" / "curves.parquet").exists()
    # baseline, 2 ablation modes, all-but-one, importance, 5 curves (2 random seeds); the
    # frames below equal runs without progress: it changes no figure
    assert calls == [("pruning", i, 10) for i in range(11)]
    out = tmp_path / "split"
    first = pruning_study(model, cfg, out, metric=metric, step_limit=2)
    assert not first.complete and "prunable" not in first.frames
    second = pruning_study(model, cfg, out, metric=metric, step_limit=3)
    assert not second.complete
    third = pruning_study(model, cfg, out, metric=metric)
    assert third.complete
    assert (
        set(third.frames)
        == set(full.frames)
        == {"baseline", "ablation", "all_but_one", "importance", "curves", "curve_summary", "prunable"}
    )
    for name, df in full.frames.items():
        pd.testing.assert_frame_equal(third.frames[name], df, check_exact=True, obj=name)
        pd.testing.assert_frame_equal(pd.read_parquet(out / f"{name}.parquet"), df, check_exact=True, obj=name)
    # 3 query heads, step 0.34 -> one head per step: the importance order removes the copy head last
    curves = full.frames["curves"]
    imp = curves[(curves["study"] == "curve:importance") & (curves["metric"] == "lm_loss")]["value"].tolist()
    rev = curves[(curves["study"] == "curve:reverse_importance") & (curves["metric"] == "lm_loss")]["value"].tolist()
    assert imp[2] < 1.0 < rev[1]
    with pytest.raises(CheckpointError, match="different config"):
        pruning_study(model, PruneConfig(metric="lm_loss", step=0.5, n_boot=20), out, metric=metric)


def test_study_needs_a_loaded_model():
    class Bridge:
        class spec:
            backend = "bridge"

    with pytest.raises(ModelIncompatibleError, match=r"need a loaded model \(load_model"):
        pruning_study(Bridge(), PruneConfig())


def test_coref_substitution():
    words, after = substitute("The boat passed the bridge because it was fast .".split(), 6, (0, 2))
    assert " ".join(words) == "The boat passed the bridge because the boat was fast ." and after == 8


# ----------------------------------------------------------------------------- real models


def test_minilm_mean_pooling_matches_sentence_transformers(minilm, sentences):
    from sentence_transformers import SentenceTransformer

    from headscope.probes.models.checkpoints import hf_dir, resolve

    st = SentenceTransformer(str(hf_dir(resolve("minilm-l6"))), device="cpu")
    ref = torch.as_tensor(st.encode(sentences, convert_to_numpy=True, normalize_embeddings=False))
    batch = minilm.encode(texts=sentences)
    with torch.inference_mode():
        ours = mean_pool(minilm.module(batch.input_ids, batch.attention_mask), batch.attention_mask)
    assert float((ours - ref).abs().max()) <= 1e-5


def test_minilm_single_head_ablation_figures(minilm):
    metric = build_metric("cosine_to_unpruned", minilm, n_items=16)
    # measured by a full single-head zero ablation on these 16 sentences: L5H11 harms most, L1H9 least
    masks = head_masks(n_layers=6, n_heads=12, heads=[(5, 11), (1, 9)])
    v, w = evaluate(minilm, metric, masks)
    delta = metric.aggregate(v, w) - 1.0
    assert float(delta[0]) == pytest.approx(-0.0464, abs=2e-3)
    assert float(delta[1]) == pytest.approx(-0.00041, abs=1e-4)
    assert isinstance(metric, EmbeddingCosine) and metric.higher_is_better


def test_shared_prefix_ablation_equals_the_gated_full_forward(minilm):
    """Masks touching layers 3.. only: layers 0-2 run once and are shared by the replicas."""
    metric = build_metric("cosine_to_unpruned", minilm, n_items=8)
    masks = head_masks(n_layers=6, n_heads=12, heads=[(3, 0), (4, 5), (5, 11)])
    masks[2, 4, 7] = 0  # one replica removes two heads in two layers
    shared, w = evaluate(minilm, metric, masks)
    for r in range(3):
        with gates_as(minilm.module, masks[r]):
            full, _ = evaluate(minilm, metric)
        assert torch.allclose(shared[r], full[0], atol=1e-5), r
    assert float(metric.aggregate(shared, w)[2]) < float(metric.aggregate(shared, w)[1]) < 1.0


def test_smollm2_heldout_perplexity(smollm):
    metric = build_metric("perplexity", smollm, n_items=24)
    v, w = evaluate(smollm, metric)
    assert int(w.sum()) == 345
    assert float(metric.aggregate(v, w)[0]) == pytest.approx(81.73, rel=2e-3)


def test_cli_prune_writes_frames_and_summary(minilm, tmp_path, capsys):
    import json

    from headscope.reports.cli.app import main

    out = tmp_path / "prune"
    rc = main(
        [
            "prune",
            "minilm-l6",
            "--studies",
            "curves",
            "--orders",
            "random",
            "--seeds",
            "1",
            "--n-items",
            "8",
            "--step",
            "0.1",
            "--max-fraction",
            "0.2",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["metric"] == "cosine_to_unpruned" and summary["base_value"] == pytest.approx(1.0, abs=1e-6)
    curves = pd.read_csv(out / "curves.csv")
    q = curves[curves["metric"] == "query_heads_pruned"]["value"].tolist()
    assert q == [0, 7, 14]  # 72 heads, 10% = 7 per step, up to 20%
    assert (out / "prunable.parquet").exists() and (out / "run.json").exists()
    prunable = {(r["order"], r["tolerance"]): r["fraction_pruned"] for r in summary["prunable"]}
    assert set(prunable) == {("random", 0.01), ("random", 0.05)}
    assert 0.0 <= prunable["random", 0.05] <= 0.2
    assert main(["prune", "minilm-l6", "--step", "0"]) == 2
    assert "'step' parameter of PruneConfig must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_full_heldout_perplexity(smollm):
    metric = build_metric("perplexity", smollm)
    v, w = evaluate(smollm, metric)
    assert metric.n_items == 168 and int(w.sum()) == 2073
    assert float(metric.aggregate(v, w)[0]) == pytest.approx(89.37, rel=2e-3)


@pytest.mark.slow
def test_smollm2_importance_order_beats_random_at_30_percent(smollm):
    cfg = PruneConfig(
        metric="lm_loss",
        step=0.1,
        max_fraction=0.3,
        orders=("importance", "random"),
        n_random_seeds=3,
        n_items=8,
        studies=("curves",),
        n_boot=20,
    )
    res = pruning_study(smollm, cfg)
    c = res.frames["curves"]
    at30 = c[(c["metric"] == "lm_loss") & (c["step"] == 3)]
    assert at30["fraction_pruned"].tolist() == pytest.approx([81 / 270] * 4)
    imp = float(at30[at30["study"] == "curve:importance"]["value"].iloc[0])
    rand = at30[at30["study"] == "curve:random"]["value"]
    base = float(res.frames["baseline"]["value"].iloc[0])
    # measured: unpruned 3.983; importance order 4.584; random seeds 0, 1, 2: 5.878, 9.130, 5.302
    assert base == pytest.approx(3.983, abs=0.01) and imp == pytest.approx(4.584, abs=0.02)
    assert rand.tolist() == pytest.approx([5.878, 9.130, 5.302], abs=0.05)
    assert imp < float(rand.min())


@pytest.mark.slow
def test_smollm2_coref_accuracy_by_lm_scoring(smollm):
    metric = build_metric("coref_accuracy", smollm, n_items=40)  # first 40 winograd/number items, partial scoring
    v, w = evaluate(smollm, metric)
    assert metric.n_items == 40 and float(metric.aggregate(v, w)[0]) == pytest.approx(30 / 40)


# ----------------------------------------------------------------------------- shared work, same figures


def random_deep_model() -> InHouseModel:
    cfg = ModelConfig(
        family="llama",
        n_layers=4,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=11,
        max_positions=16,
        name="random-deep",
    )
    net = Transformer(cfg)
    net.init_weights(std=0.3, seed=4)
    return InHouseModel(net, word_tokenizer(), name="random-deep")


def _stand_in_roles(n_layers, n_heads):
    rows = []
    for i, (l, h) in enumerate([(0, 1), (2, 3), (3, 0), (1, 2), (3, 3)]):
        if l < n_layers and h < n_heads:
            rows.append(dict(layer=l, head=h, role=f"role{i % 2}", score=1.0 - i / 10, verdict=True))
    return pd.DataFrame(rows)


@contextlib.contextmanager
def own_gates(model, mask, ablation=None, requires_grad=False):
    """The reference: the in-house Attention's own gates (``z' = g z + (1 - g) a``) set to
    ``mask [layer, head]`` by hand, no engine code; restored on exit."""
    gates = model.gates
    try:
        for l, g in enumerate(gates):
            g.data.copy_(mask[l])
            g.requires_grad_(requires_grad)
            if ablation is not None:
                model.module.blocks[l].attn.ablation_value.copy_(ablation[l])
        yield gates
    finally:
        for l, g in enumerate(gates):
            g.data.fill_(1.0)
            g.requires_grad_(False)
            g.grad = None
            model.module.blocks[l].attn.ablation_value.zero_()


def plain_values(model, metric, mask, ablation=None):
    """Per-item values ``[n_items]`` and weights of ``metric`` under ``mask``: one plain full
    forward per unit (every layer, every logit) under the model's own gates."""
    values, weights = torch.zeros(metric.n_items), torch.zeros(metric.n_items)
    with own_gates(model, mask, ablation), torch.no_grad():
        for u in metric.units:
            v, w = metric.item_values(model.forward(u.batch.input_ids, u.batch.attention_mask), u)
            values[u.items], weights[u.items] = v[0].float(), w.float()
    return values, weights


def plain_text_loss(model, texts, mask):
    """Mean next-token cross-entropy of each text alone under ``mask``, computed here with
    ``F.cross_entropy`` (no metric code): ``[n_texts]``."""
    out = []
    with own_gates(model, mask), torch.no_grad():
        for t in texts:
            ids = torch.tensor([model.tokenizer(t)["input_ids"]])
            logits = model.forward(ids, torch.ones_like(ids))
            out.append(float(torch.nn.functional.cross_entropy(logits[0, :-1].double(), ids[0, 1:])))
    return torch.tensor(out, dtype=torch.float64)


def test_staggered_replicas_equal_plain_forwards():
    """Replicas joining the unablated stream at their first changed layer, the logits at the
    read positions only, any number of replicas per forward: bit for bit the values of a
    plain forward per mask under the model's own gates; and the per-text losses agree with
    ``F.cross_entropy`` on each text alone."""
    from headscope.analyses.pruning.masks import first_changed

    model = random_deep_model()
    texts = alternating(10, length=9, seed=5) + alternating(3, length=13, seed=6)
    metric = LMLoss(model, texts, batch_size=4)
    g = torch.Generator().manual_seed(0)
    masks = (torch.rand(9, 4, 4, generator=g) > 0.4).float()
    masks[0] = 1.0  # untouched
    masks[1] = 1.0
    masks[1, 3, 2] = 0.0  # last layer only
    masks[2] = 1.0
    masks[2, 0, 0] = 0.0
    assert first_changed(masks[:3]).tolist() == [3, 3, 0]
    plain = [plain_values(model, metric, m) for m in masks]
    ref = torch.stack([v for v, _ in plain])
    for max_rows in (4, 8, 64):  # one replica per forward, some, all
        v, w = evaluate(model, metric, masks, max_rows=max_rows)
        assert torch.equal(v, ref) and torch.equal(w, plain[0][1])  # bit for bit
    for r in (0, 1, 5):
        assert v[r].double().tolist() == pytest.approx(plain_text_loss(model, texts, masks[r]).tolist(), abs=1e-5)


def test_read_positions_give_the_same_loss_and_gradients():
    """Gate gradients from the logits the loss reads equal those of a full forward under the
    model's own gates (every logit), the loss computed here with ``F.cross_entropy``."""
    model = random_deep_model()
    texts = alternating(5, length=9, seed=5) + alternating(3, length=12, seed=7)
    metric = LMLoss(model, texts, batch_size=8)
    mask = torch.ones(4, 4)
    mask[1, 2] = 0.0
    g_new, items = gate_gradients(model, metric, mask=mask)
    assert items.tolist() == [8.0]  # one unit
    (u,) = metric.units
    ids, am = u.batch.input_ids, u.batch.attention_mask
    with own_gates(model, mask, requires_grad=True) as gates, torch.enable_grad():
        logits = model.forward(ids, am)  # [batch, pos, vocab], every logit
        tok = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        keep = am[:, 1:].float()
        ref = torch.stack(torch.autograd.grad((tok * keep).sum() / keep.sum(), gates))
    assert g_new.shape == (1, 4, 4)
    assert torch.allclose(g_new[0], ref, rtol=1e-5, atol=1e-7)
    assert bool(g_new[0, 1, 2] != 0) and bool((g_new != 0).sum() > 8)  # real gradients, not zeros


def test_study_tables_equal_plain_forwards_per_mask(tmp_path):
    """A whole study (every mask in shared calls, the memo, curves advancing in rounds) gives
    the figures of a plain forward per mask under the model's own gates: the baseline, every
    single-head ablation (zero and mean), all-but-one, the roles' own masks and the random and
    ablation curves; resumed in pieces, it writes the uninterrupted run's tables."""
    from headscope.analyses.pruning.ablation import mean_z

    model = random_deep_model()
    metric = LMLoss(model, alternating(8, length=9, seed=8), batch_size=4)
    roles = _stand_in_roles(4, 4)
    cfg = PruneConfig(metric="lm_loss", step=0.2, max_fraction=0.6, n_random_seeds=2, n_boot=20, role_k=2, role_draws=3)
    new = pruning_study(model, cfg, metric=metric, roles=roles)
    assert set(new.frames) == {"baseline", "ablation", "all_but_one", "importance", "roles", "curves"} | {
        "curve_summary",
        "prunable",
    }
    n_l, n_h = 4, 4

    def agg(mask, ablation=None):
        v, w = plain_values(model, metric, mask, ablation)
        return float(metric.aggregate(v[None], w)[0])

    ones = torch.ones(n_l, n_h)
    base = agg(ones)
    assert new.frames["baseline"]["value"].tolist() == [base]
    abl = new.frames["ablation"]
    means = mean_z(model, metric)
    for mode, a in (("zero", None), ("mean", means)):
        rows = abl[(abl["study"] == f"ablation:{mode}") & (abl["metric"] == "lm_loss")]
        assert len(rows) == n_l * n_h
        for l, h, value in zip(rows["layer"], rows["head"], rows["value"]):
            m = ones.clone()
            m[l, h] = 0.0
            assert value == agg(m, a), (mode, l, h)
    abo = new.frames["all_but_one"]
    abo = abo[abo["metric"] == "lm_loss"]
    for l, h, value in zip(abo["layer"], abo["head"], abo["value"]):
        keep_only = []
        for k in range(n_h):
            m = ones.clone()
            m[l] = 0.0
            m[l, k] = 1.0
            keep_only.append(agg(m))
        assert int(h) == min(range(n_h), key=lambda k: (keep_only[k], k)) and value == keep_only[int(h)]
    by_role = roles.sort_values("score", ascending=False).groupby("role")
    for role, row in new.frames["roles"].set_index("role").iterrows():
        heads = list(zip(by_role.get_group(role)["layer"], by_role.get_group(role)["head"]))[: cfg.role_k]
        m = ones.clone()
        for l, h in heads:
            m[l, h] = 0.0
        assert row["value_role"] == agg(m) - base
    curves = new.frames["curves"]
    curves = curves[curves["metric"] == "lm_loss"]
    n_units, k = n_l * n_h, round(cfg.step * n_l * n_h)
    total = round(cfg.max_fraction * n_units)  # 3 units a step, 10 in all: 3, 6, 9, 10
    zero = abl[(abl["study"] == "ablation:zero") & (abl["metric"] == "delta_lm_loss")]
    harms = dict(zip(zip(zero["layer"], zero["head"]), zero["value"]))
    orders = {("random", s): [int(x) for x in np.random.default_rng(s).permutation(n_units)] for s in (0, 1)}
    orders[("ablation", None)] = sorted(range(n_units), key=lambda u: (harms[(u // n_h, u % n_h)], u))
    for (order, seed), units in orders.items():
        c = curves[
            (curves["study"] == f"curve:{order}") & (curves["seed"].isna() if seed is None else curves["seed"] == seed)
        ]
        assert c["step"].tolist() == [0, 1, 2, 3, 4]
        for step, value in zip(c["step"], c["value"]):
            m = ones.clone().flatten()
            m[units[: min(step * k, total)]] = 0.0
            assert value == agg(m.view(n_l, n_h)), (order, seed, step)
    # resumed in pieces: curves advance in rounds, the tables are the uninterrupted run's
    out = tmp_path / "split"
    for limit in (1, 4, 5):
        part = pruning_study(model, cfg, out, metric=metric, roles=roles, step_limit=limit)
        assert not part.complete
    last = pruning_study(model, cfg, out, metric=metric, roles=roles)
    assert last.complete and last.summary == new.summary
    for name, df in new.frames.items():
        pd.testing.assert_frame_equal(last.frames[name], df, check_exact=True, obj=name)
        pd.testing.assert_frame_equal(pd.read_parquet(out / f"{name}.parquet"), df, check_exact=True, obj=name)


def test_a_study_scores_each_distinct_mask_once(monkeypatch):
    """With ``role_k=1`` every role mask and every one-head random draw is a single-head
    ablation mask the study already scored: the role stage adds no forward, same tables."""
    from headscope.analyses.pruning import scoring
    from headscope.analyses.pruning import study as st

    model = random_deep_model()
    metric = LMLoss(model, alternating(8, length=9, seed=8), batch_size=4)
    roles = _stand_in_roles(4, 4)
    cfg = PruneConfig(metric="lm_loss", studies=("ablation",), ablation_modes=("zero",), n_boot=20, role_k=1)
    scored = []
    plain = scoring._staggered_scores

    def counting(model, metric, masks, **kw):
        scored.append(masks.shape[0])
        return plain(model, metric, masks, **kw)

    monkeypatch.setattr(scoring, "_staggered_scores", counting)
    kept = pruning_study(model, cfg, metric=metric, roles=roles)
    # unpruned 1 + single heads 16; the role stage: 2 roles x (1 + 5 draws) masks, all known
    assert scored == [1, 16]
    scored.clear()
    monkeypatch.setattr(st, "remembered_scores", contextlib.nullcontext)
    every = pruning_study(model, cfg, metric=metric, roles=roles)
    assert scored == [1, 16, 12]
    for name, df in every.frames.items():
        pd.testing.assert_frame_equal(kept.frames[name], df, check_exact=True, obj=name)
