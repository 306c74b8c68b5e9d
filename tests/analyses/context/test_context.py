"""The contextualisation measurements on real models and on planted truth (issue #41)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from headscope.analyses.context import ContextConfig, run_context
from headscope.analyses.context import attention as A
from headscope.analyses.context.measures import HEAD_METRICS, head_stats, pooled, target_positions
from headscope.analyses.context.senses import loo_centroid_accuracy, permutation_baseline
from headscope.analyses.context.similarity import self_similarity
from headscope.analyses.context.trend import distance_trend
from headscope.probes.corpora.senses import read_senses
from headscope.probes.models.inhouse.planted import planted_sentences
from headscope.probes.models.inhouse.planted_depth import depth_planted_model
from headscope.probes.states import batch_states, sentence_states

BAT = ["At dusk a bat flew out of the old barn.", "He swung the bat hard.", "The bat slept all day."]


def test_static_self_similarity_is_one_and_context_lowers_it(minilm):
    reps = []
    for s in BAT:
        st = sentence_states(minilm, s)
        static, states = pooled(st, target_positions(st, s.index("bat"), s.index("bat") + 3), "mean")
        reps.append(torch.cat([static[None], states]))
    reps = torch.stack(reps)  # [occurrence, depth, d_model]
    assert self_similarity(reps[:, 0]).item() == pytest.approx(1.0, abs=1e-6)
    # position embeddings alone already move it; the last layer moves it further
    assert self_similarity(reps[:, -1]).item() < self_similarity(reps[:, 1]).item() < 1.0


@pytest.mark.parametrize("name", ["minilm", "smollm"])
def test_norm_decomposition_equals_head_output(name, request):
    model = request.getfixturevalue(name)
    st = sentence_states(model, "The cat didn't climb on the table because it was too tired.")
    for l, pattern in enumerate(st.pattern):
        parts = A.head_outputs(pattern, st.v[l], st.W_O[l])  # [head, query_pos, d_model]
        total = parts.sum(0) + (st.o_bias[l] if st.o_bias[l] is not None else 0)
        # 1e-5 absolute, and relative where SmolLM2's massive activations (|out| ~ 200) make a
        # float32 sum in another order differ by a few ulps
        torch.testing.assert_close(total, st.out[l], atol=1e-5, rtol=1e-5)
        # and the norm of each part is α times the value norm (Kobayashi's factorisation)
        norms = torch.linalg.vector_norm(
            torch.einsum("hqk,hkm->hqkm", pattern, torch.einsum("hkd,hdm->hkm", st.v[l], st.W_O[l])), dim=-1
        )
        torch.testing.assert_close(
            norms, A.norm_attention(pattern, A.value_norms(st.v[l], st.W_O[l])), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("name", ["minilm", "smollm"])
def test_states_equal_transformers_hidden_states(name, request):
    model, ref = request.getfixturevalue(name), request.getfixturevalue(f"{name}_hf")
    st = sentence_states(model, "Grouped-query attention lets three query heads share one key-value head.")
    ids = st.tokens.input_ids
    with torch.inference_mode():
        hs = ref.network(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True).hidden_states
    last = len(hs) - 1
    for d in range(last):
        torch.testing.assert_close(st.states[d], hs[d][0].float(), atol=1e-5, rtol=1e-5)
    final = st.states[last]
    if st.causal:  # transformers' last state is after the final norm; ours is before it
        final = model.network.ln_final(final[None])[0]
    torch.testing.assert_close(final, hs[last][0].float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("local_first, direction", [(True, "more global"), (False, "more local")])
def test_planted_depth_trend(local_first, direction):
    model = depth_planted_model(local_first=local_first)
    per = torch.stack([head_stats(sentence_states(model, s)) for s in planted_sentences(8)])
    for metric in ("distance_raw", "distance_norm"):
        trend = distance_trend(per[..., HEAD_METRICS.index(metric)], n_boot=200)
        assert trend["direction"] == direction, trend["verdict"]
        assert trend["verdict"].startswith(f"this model's attention becomes {direction} with depth")
    # local heads read the previous token: distance 1/i, averaged over queries i >= 1
    local_layer = 0 if local_first else 3
    n = len(planted_sentences(8)[0].split()) + 1
    expected = float(torch.tensor([1.0 / i for i in range(1, n)]).mean())
    dist0 = per[0, local_layer, :, HEAD_METRICS.index("distance_raw")]
    torch.testing.assert_close(dist0, torch.full_like(dist0, expected), atol=1e-4, rtol=0)


def test_scale_keeps_ranking_and_changes_saturation(minilm):
    st = sentence_states(minilm, BAT[0])
    allowed = A.allowed_keys(st.n_pos, st.causal)
    for l, raw in enumerate(st.raw):
        assert A.ranking_reversals(raw, st.scale[l], allowed) == 0
        # the actual pattern is the softmax of the scaled raw scores
        torch.testing.assert_close(A.masked_softmax(raw * st.scale[l], allowed), st.pattern[l], atol=1e-5, rtol=0)
    ent = head_stats(st)[..., [HEAD_METRICS.index("entropy_actual"), HEAD_METRICS.index("entropy_scale1")]]
    assert (ent[..., 1] < ent[..., 0]).float().mean() > 0.9  # no division: a sharper softmax almost everywhere


def test_sense_reader_skips_bad_words(tmp_path):
    lines = [
        {"sentence": "The bat flew.", "word": "bat", "sense": "animal"},
        {"sentence": "A bat hung there.", "word": "bat", "sense": "animal"},
        {"sentence": "He swung the bat.", "word": "bat", "sense": "club"},
        {"sentence": "The bat cracked.", "word": "bat", "sense": "club"},
        {"sentence": "It is cold.", "word": "cold", "sense": "temperature"},
        {"sentence": "It is freezing.", "word": "cold", "sense": "temperature"},
        {"sentence": "A cold reply.", "word": "cold", "sense": "manner"},
        {"sentence": "The bank closed.", "word": "bank", "sense": "money"},
        {"sentence": "The bank opened.", "word": "bank", "sense": "money"},
        {"sentence": "The river bank.", "word": "bank", "sense": "river"},
        {"sentence": "On the bank we sat.", "word": "bank", "sense": "river"},
    ]
    p = tmp_path / "senses.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.warns(UserWarning) as rec:
        s = read_senses(p)
    msgs = [str(r.message) for r in rec]
    assert any(m.startswith(f"{p}:6:") and "'freezing'" not in m and "cold" in m for m in msgs), msgs
    assert any(f"{p}:7:" in m and "fewer than 2" in m for m in msgs) or any("cold" in m for m in msgs)
    assert s.words() == ["bank", "bat"]
    assert sum(s.skipped.values()) == 1


def test_run_context_minilm_small(minilm):
    cfg = ContextConfig(max_words=3, max_per_sense=4, attention_sentences=4, n_boot=100, n_perm=10)
    frames, summary = run_context(minilm, cfg)
    sim = frames["similarity"].set_index(["depth", "metric"])["value"]
    assert sim[(-1, "self_similarity")] == pytest.approx(1.0, abs=1e-6)
    assert sim[(6, "self_similarity")] < sim[(0, "self_similarity")]
    assert set(frames["heads"]["metric"]) == set(HEAD_METRICS)
    assert int(frames["layers"]["reversals"].sum()) == 0
    assert summary["distance_trend"]["raw"]["direction"] in ("more global", "more local", "no clear trend")
    assert summary["words"] == ["bank", "bark", "bat"]


def test_word_not_in_sentence_lists_words_and_pieces(minilm):
    from headscope.analyses.context.contributions import contributions_frame

    with pytest.raises(ValueError, match=r"word 'cave' is not in the sentence; its words: \['He', 'swung'"):
        contributions_frame(minilm, "He swung the bat hard.", "cave", "mean", None, None)


def test_contributions_rank_context_words(minilm):
    from headscope.analyses.context.contributions import contributions_frame

    c = contributions_frame(minilm, "At dusk a bat flew out of the old barn.", "bat", "mean", None, None)
    for (_layer, _method), g in c.groupby(["layer", "method"]):
        assert g["value"].sum() == pytest.approx(1.0, abs=1e-5)  # shares of the target's row
        assert list(g.sort_values("rank")["value"]) == sorted(g["value"], reverse=True)
    assert set(c["context"]) >= {"dusk", "barn", "[CLS]", "[SEP]"}


def test_batched_forwards_equal_one_sentence_at_a_time(minilm):
    """Padded batches change no figure: every frame equals the one-sentence-per-forward run."""
    small = dict(max_words=2, max_per_sense=3, attention_sentences=4, n_boot=50, n_perm=10)
    one, s_one = run_context(minilm, ContextConfig(batch_size=1, **small))
    many, s_many = run_context(minilm, ContextConfig(batch_size=64, **small))
    assert s_one["n_sentences"] == s_many["n_sentences"] >= 12
    for name, frame in one.items():
        pd.testing.assert_frame_equal(frame, many[name], check_exact=False, atol=1e-6, rtol=0)
    for view, trend in s_one["distance_trend"].items():
        for key in ("rho", "ci_low", "ci_high"):
            assert trend[key] == pytest.approx(s_many["distance_trend"][view][key], abs=1e-6)


def test_batch_states_cut_each_sentence_to_its_tokens(minilm):
    short, long_ = BAT[1], BAT[0]
    alone = sentence_states(minilm, short)
    padded = batch_states(minilm, [long_, short])[1]  # right-padded to the longer sentence
    assert padded.n_pos == alone.n_pos < batch_states(minilm, [long_])[0].n_pos
    torch.testing.assert_close(padded.states, alone.states, atol=1e-5, rtol=1e-5)
    for l in range(len(alone.pattern)):
        torch.testing.assert_close(padded.pattern[l], alone.pattern[l], atol=1e-6, rtol=0)
        assert padded.pattern[l].sum(-1).sub(1).abs().max() < 1e-5  # no weight left on a padded key


def test_sense_accuracy_vectorised_over_depths_and_labellings():
    gen = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 1] * 6)
    reps = torch.randn(3, 12, 8, generator=gen) + 2.0 * labels[:, None].float()  # [depth, n, d]
    perms = torch.stack([labels[torch.randperm(12, generator=gen)] for _ in range(4)])
    both = loo_centroid_accuracy(reps, perms)  # [labelling, depth]
    for p in range(4):
        for d in range(3):
            assert both[p, d] == loo_centroid_accuracy(reps[d], perms[p])
    assert (
        loo_centroid_accuracy(reps, labels).tolist()
        == both.new_tensor([_loo_reference(reps[d], labels) for d in range(3)]).tolist()
    )
    # one vector for every occurrence (a static row): every prediction ties, nothing separates
    same = torch.ones(12, 8)
    assert loo_centroid_accuracy(same, labels).item() == 0.5
    assert permutation_baseline(same, labels, n_perm=10)[0].item() == 0.5


def _loo_reference(reps, labels) -> float:
    """Leave-one-out nearest centroid, item by item."""
    u = torch.nn.functional.normalize(reps, dim=-1)
    hits = 0
    for i in range(len(labels)):
        rest = torch.arange(len(labels)) != i
        cents = torch.stack([u[rest & (labels == c)].mean(0) for c in labels.unique()])
        hits += int(torch.nn.functional.cosine_similarity(u[i][None], cents).argmax() == labels[i])
    return hits / len(labels)


def test_context_plan_is_one_padded_forward_linear_in_length_beside_its_patterns():
    from headscope.probes.budget import Shape, estimate
    from headscope.reports.stages.base import RunContext
    from headscope.reports.stages.context import STAGE, context_working_set

    shape = Shape(n_layers=6, n_heads=12, d_model=384, d_head=32, d_mlp=1536, vocab_size=30522, n_params=22_000_000)
    ctx = RunContext(name="m", shape=shape)
    cfg = STAGE.config(ctx)
    (ws,) = STAGE.plan(ctx, cfg)
    assert (ws.name, ws.batch_size, ws.kept_layers, ws.logits) == ("context", cfg.batch_size, 12, "none")
    assert ws.longest >= max(len(s.encode()) for s in ["He swung the bat hard."])  # bytes + 2 without a tokenizer
    one, two = (context_working_set(shape, cfg, 100, t) for t in (20, 40))
    assert two.cache_per_row == 2 * one.cache_per_row  # linear in length
    parts = [estimate(shape, [w]).parts["context"] for w in (one, two)]
    assert parts[1]["patterns"] == 4 * parts[0]["patterns"]  # the patterns themselves: quadratic
    assert STAGE.fitted(cfg, {"context": 8}).batch_size == 8
    assert STAGE.fitted(cfg, {"context": 999}) is cfg


def _sense_lines(word, sense, sentences):
    return [{"sentence": s, "word": word, "sense": sense} for s in sentences]


def test_bad_sense_lines_skip_their_word_count_it_and_the_others_run(minilm, tmp_path):
    good = _sense_lines("bat", "animal", ["The bat flew.", "A bat hung there."])
    good += _sense_lines("bat", "club", ["He swung the bat.", "The bat cracked."])
    good += _sense_lines("bank", "money", ["The bank closed.", "The bank lent money."])
    good += _sense_lines("bank", "river", ["The river bank flooded.", "On the bank we sat."])
    missing = _sense_lines("cold", "temperature", ["It is cold.", "It is freezing."])  # line 10: no 'cold'
    missing += _sense_lines("cold", "manner", ["A cold reply.", "She was cold to him."])
    thin = _sense_lines("bark", "dog", ["The dog's bark woke us.", "A loud bark."])
    thin += _sense_lines("bark", "tree", ["The bark of the oak."])  # line 15: one sentence only
    p = tmp_path / "senses.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in good + missing + thin) + "\n")
    with pytest.warns(UserWarning) as rec:
        frames, summary = run_context(minilm, ContextConfig(senses=str(p), attention_sentences=2, n_boot=20, n_perm=5))
    lines = [str(r.message) for r in rec]
    assert any(m.startswith(f"{p}:10: target 'cold' is not in its sentence") and "\n" not in m for m in lines), lines
    assert any(m.startswith(f"{p}:15: sense 'tree' of 'bark' has 1 sentence(s)") and "\n" not in m for m in lines)
    assert summary["skipped_words"] == {"target not in sentence": 1, "sense with fewer than 2 sentences": 1}
    assert summary["words"] == ["bank", "bat"] and summary["n_sentences"] == 8
    assert frames["senses"]["n"].eq(2).all()


def test_describe_ranks_the_context_words_per_layer_and_by_rollout(minilm):
    from headscope.analyses.context.contributions import contributions_frame
    from headscope.reports.sections.context import describe_context

    sentence = "At dusk a bat flew out of the old barn."
    c = contributions_frame(minilm, sentence, "bat", "mean", None, None)
    text = describe_context({"context_contributions": c}, {"config": {"sentence": sentence, "word": "bat"}})
    rows = text.splitlines()
    assert rows[0].startswith("Context words of 'bat' in 'At dusk a bat flew out of the old barn.'")
    assert len(rows) == 2 + 6  # title, header, a line per layer
    for layer, row in enumerate(rows[2:]):
        best = {m: g.sort_values("rank") for m, g in c[c.layer == layer].groupby("method")}
        cells = row.split(None, 1)[1]
        for m in ("norm", "rollout_norm", "rollout_raw"):
            top = best[m].iloc[0]
            assert f"{top.context} {top.value:.2f}" in cells, (m, row)


def test_context_command_refuses_a_word_not_in_the_sentence(tmp_path, capsys):
    from headscope.reports.cli.app import main

    code = main(
        ["context", "minilm-l6", "--sentence", "He swung the bat hard.", "--word", "cave"]
        + ["--out", str(tmp_path / "out"), "--quiet"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1] == (
        "headscope: error: word 'cave' is not in the sentence; its words: ['He', 'swung', 'the', 'bat', 'hard', '.']; "
        "its pieces: ['he', 'swung', 'the', 'bat', 'hard', '.']"
    )
    assert not (tmp_path / "out" / "run.json").exists()


@pytest.mark.slow  # a context-only report of MiniLM: ~10 s alone, ~50 s on a loaded machine
def test_context_command_prints_the_ranked_words_and_writes_the_tables(tmp_path, capsys):
    from headscope.reports.cli.app import main

    small = [
        "--max-words",
        "2",
        "--max-per-sense",
        "2",
        "--attention-sentences",
        "2",
        "--n-boot",
        "10",
        "--n-perm",
        "2",
    ]
    out = tmp_path / "bat"
    args = ["context", "minilm-l6", "--sentence", "At dusk a bat flew out of the old barn.", "--word", "bat"]
    assert main([*args, *small, "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("Context words of 'bat'") and len(printed) == 8
    table = pd.read_csv(out / "tables" / "context_contributions.csv")
    top = table[(table.method == "norm") & (table["rank"] == 1)].sort_values("layer")
    for row, (_, t) in zip(printed[2:], top.iterrows()):
        assert row.split()[1] == t.context


@pytest.mark.parametrize("name", ["context_minilm.json", "context_smollm2.json"])
def test_committed_context_verdicts_hold_together(name):
    """``make context``'s JSON: every quoted figure present, each text says its values, and the
    values are what the claims read (the guide's quoting: tests/test_readme_figures.py)."""
    from headscope.data import path
    from headscope.reports.tools.experiments.context_figures import MODELS, QUOTED

    doc = json.loads(path(f"figures/{name}").read_text(encoding="utf-8"))
    assert MODELS[doc["model"]] == name and doc["missing"] == [] and doc["quoted"] == list(QUOTED)
    fig = {f"{g}.{n}": v for g, d in doc["figures"].items() for n, v in d.items()}
    assert set(QUOTED) <= set(fig)
    static, last = fig["similarity.static"]["value"], fig["similarity.last"]["value"]
    assert last[1] <= last[0] <= last[2] < static[0] <= 1 + 1e-6
    if doc["model"] == "minilm-l6":  # uncased WordPiece: one row per word (SmolLM2: "Spring" and " spring")
        assert static[0] == pytest.approx(1.0, abs=1e-5)
    assert f"self-similarity {last[0]:.3f} [{last[1]:.3f}, {last[2]:.3f}]" in fig["similarity.last"]["text"]
    actual, scale1, *_, reversals = fig["saturation.rows"]["value"]
    assert actual < scale1 and reversals == 0
    assert f"{actual:.0%} of a head's rows at the model's scale" in fig["saturation.rows"]["text"]
    for view in ("raw", "norm"):
        rho, low, high, n = fig[f"distance.{view}"]["value"]
        assert low <= rho <= high and n >= 2
        assert f"ρ = {rho:.2f}, 95% CI [{low:.2f}, {high:.2f}] over {n} sentences" in fig[f"distance.{view}"]["text"]


def test_a_byte_level_bpe_word_is_found_without_its_space(smollm):
    """SmolLM2's pieces carry the space before a word ("Ġbat"): the word is still "bat"."""
    from headscope.analyses.context.contributions import check_target, contributions_frame

    sentence = "At dusk a bat flew out of the old barn."
    check_target(smollm.tokenizer, sentence, "bat")
    with pytest.raises(ValueError, match=r"its words: \['At', 'dusk', 'a', 'bat', 'flew'"):
        check_target(smollm.tokenizer, sentence, "cave")
    c = contributions_frame(smollm, sentence, "bat", "mean", None, None)
    assert {"dusk", "barn"} <= set(c["context"]) and c.layer.nunique() == 30
