"""Token-level head roles: closed-form units, verdict rows, and figures measured on the
shipped MiniLM-L6 (in-house) and SmolLM2-135M (in-house + transformer-lens bridge)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from headscope.analyses.frames import ROLE_COLUMNS, roles_frame
from headscope.analyses.roles import clustering, induction, positional
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.pattern_stats import allowed_keys, pattern_metrics, query_rows
from headscope.analyses.roles.pipeline import head_roles, run_role
from headscope.analyses.stats.verdicts import tail_p, verdict_rows
from headscope.data import path as data_path

CFG = RolesConfig(n_boot=200, n_perm=500)


# -- closed forms ---------------------------------------------------------------------------
def test_uniform_pattern_entropy_is_log_t():
    T = 7
    p = torch.full((2, 3, T, T), 1 / T)
    m = pattern_metrics(p, allowed_keys(torch.ones(2, T, dtype=torch.bool), causal=False))
    assert torch.allclose(m["entropy"], torch.full((2, 3, T), math.log(T)), atol=1e-5)
    assert torch.allclose(m["kl_from_uniform"], torch.zeros(2, 3, T), atol=1e-5)
    assert torch.allclose(m["confidence"], torch.full((2, 3, T), 1 / T))
    # causal uniform: row q has q + 1 keys
    c = torch.tril(torch.ones(T, T))
    c = (c / c.sum(-1, keepdim=True)).expand(1, 1, T, T)
    mc = pattern_metrics(c, allowed_keys(torch.ones(1, T, dtype=torch.bool), causal=True))
    assert torch.allclose(mc["entropy"][0, 0], torch.log(torch.arange(1, T + 1).float()), atol=1e-5)
    assert torch.allclose(mc["mean_distance"][0, 0], torch.arange(T).float() / 2, atol=1e-5)


def test_entropy_smoothing_mixes_with_uniform():
    p = torch.zeros(1, 1, 1, 4)
    p[..., 0] = 1.0
    a = allowed_keys(torch.ones(1, 4, dtype=torch.bool), causal=False)[:, :1]
    h = pattern_metrics(p, a, smoothing=0.2)["entropy"].item()
    q = torch.tensor([0.85, 0.05, 0.05, 0.05])
    assert h == pytest.approx(float(-(q * q.log()).sum()), abs=1e-6)


def test_shifted_identity_is_previous_token_with_score_one():
    T = 6
    p = torch.zeros(2, 1, T, T)
    p[:, 0, 0, 0] = 1
    p[:, 0, 1:, :-1] = torch.eye(T - 1)
    km = torch.ones(2, T, dtype=torch.bool)
    km[1, -1] = False  # item 1 is padded: its last key and row must be excluded
    p[1, 0, -1] = 0
    p[1, 0, -1, 0] = 1.0  # garbage in the padded row must not count
    special = torch.zeros(2, T, dtype=torch.bool)
    special[:, 0] = True
    v, b = positional.bucket_values(p, allowed_keys(km, causal=True), query_rows(km, special))
    assert v["previous"].flatten().tolist() == [1.0, 1.0]
    assert v["self"].flatten().tolist() == [0.0, 0.0]
    # first: only query 1 (whose previous token is position 0)
    assert v["first"].flatten().tolist() == pytest.approx([1 / 5, 1 / 4])
    # baseline: 1/n_keys for rows 1..T-1 of a causal model
    assert float(b["previous"][0]) == pytest.approx(sum(1 / (q + 1) for q in range(1, T)) / (T - 1))
    score = induction.mul_score(
        p[:1],
        induction.detection_patterns(torch.arange(T)[None], causal=True)["previous-token"],
        allowed_keys(km[:1], True),
    )
    assert float(score) == pytest.approx((T - 1) / T)


def test_uniform_row_ties_share_the_max():
    p = torch.full((1, 1, 3, 3), 1 / 3)
    v, b = positional.bucket_values(
        p, allowed_keys(torch.ones(1, 3, dtype=torch.bool), False), torch.ones(1, 3, dtype=torch.bool)
    )
    for k in v:
        assert float(v[k]) == pytest.approx(float(b[k]))


def test_mul_score_matches_transformer_lens_formula_and_leaves_input_alone():
    from transformer_lens.head_detector import (
        compute_head_attention_similarity_score,
        get_induction_head_detection_pattern,
    )

    g = torch.Generator().manual_seed(0)
    T = 9
    toks = torch.tensor([[3, 4, 5, 6, 4, 5, 6, 3, 4]])
    raw = torch.randn(1, 2, T, T, generator=g).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    p = raw.softmax(-1)
    before = p.clone()
    det = induction.detection_patterns(toks, causal=True)["induction"]
    assert torch.equal(det[0].float(), get_induction_head_detection_pattern(toks))
    valid = allowed_keys(torch.ones(1, T, dtype=torch.bool), True)
    for eb in (False, True):
        for ec in (False, True):
            ours = induction.mul_score(p, det, valid, exclude_bos=eb, exclude_current_token=ec)
            for h in range(2):
                tl = compute_head_attention_similarity_score(
                    p[0, h].clone(), det[0].float(), exclude_bos=eb, exclude_current_token=ec, error_measure="mul"
                )
                assert float(ours[0, h]) == pytest.approx(tl, abs=1e-6)
    assert torch.equal(p, before)


def test_pairwise_js_closed_form():
    a = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    b = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    p = torch.stack([a, a, b])[None]  # 3 heads, 2 rows
    js = clustering.pairwise_js(p, torch.ones(1, 2, dtype=torch.bool))[0]
    assert js[0, 1].item() == pytest.approx(0.0, abs=1e-7)
    assert js[0, 2].item() == pytest.approx(math.log(2) / 2, abs=1e-6)
    assert torch.allclose(js, js.T)
    frame = clustering.embed_and_cluster(js, [(0, 0), (0, 1), (1, 0)], k=2)
    assert frame["cluster"].iloc[0] == frame["cluster"].iloc[1] != frame["cluster"].iloc[2]


def test_pairwise_js_equals_the_definition_on_random_padded_patterns():
    g = torch.Generator().manual_seed(3)
    b, h, n = 3, 5, 7
    p = torch.rand(b, h, n, n, generator=g) ** 4
    lengths = [7, 5, 2]
    rows = torch.zeros(b, n, dtype=torch.bool)
    for i, L in enumerate(lengths):
        p[i, :, :, L:] = 0
        rows[i, :L] = True
    rows[1, 0] = False  # a row left out (e.g. a special token)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
    js = clustering.pairwise_js(p, rows)

    def kl_js(x, y):
        m = (x + y) / 2

        def ent(v):
            return -(v[v > 0] * v[v > 0].log()).sum()

        return float(ent(m) - (ent(x) + ent(y)) / 2)

    for i in range(b):
        sel = rows[i].nonzero().flatten().tolist()
        for a in range(h):
            for c in range(h):
                want = sum(kl_js(p[i, a, q], p[i, c, q]) for q in sel) / len(sel)
                assert js[i, a, c].item() == pytest.approx(want, abs=1e-6)
    # blocks of rows (1 row, 2 rows) give the same matrix as one block
    for max_elements in (1, 100):
        assert torch.allclose(clustering.pairwise_js(p, rows, max_elements=max_elements), js, atol=1e-7)


def test_sampled_js_is_the_same_whatever_the_batching(minilm, sentences):
    from headscope.probes.capture import stream

    texts = (sentences * 3)[:14]
    got = []
    for batch_size in (3, 5, 14):
        red = clustering.JSReducer(rows_per_item=4, seed=1)
        stream(minilm, texts, [red], batch_size=batch_size)
        got.append(red.result()[0])
    assert torch.allclose(got[0], got[1], atol=1e-6) and torch.allclose(got[0], got[2], atol=1e-6)
    full = clustering.JSReducer(rows_per_item=None)
    stream(minilm, texts, [full], batch_size=14)
    assert not torch.allclose(full.result()[0], got[0], atol=1e-6)  # it did sample
    assert torch.corrcoef(torch.stack([full.result()[0].flatten(), got[0].flatten()]))[0, 1] > 0.97
    with pytest.raises(ValueError, match="rows_per_item must be a positive int or None; got 0"):
        clustering.JSReducer(rows_per_item=0)


# -- verdict rows ---------------------------------------------------------------------------------
def test_verdict_rows_on_planted_values():
    g = torch.Generator().manual_seed(1)
    n = 50
    values = torch.rand(n, 6, generator=g) * 0.2  # noise around 0.1 = baseline
    values[:, 4] = 0.95  # layer 1 head 1: a clear role
    values[:, 2] = 0.1 + 0.05  # margin 0.05 < 0.10: significant but too small
    rows = verdict_rows(values, 0.1, n_layers=2, n_heads=3, role="demo", cfg=CFG)
    df = roles_frame(rows)
    assert list(df.columns) == ROLE_COLUMNS
    assert df["verdict"].tolist() == [False, False, False, False, True, False]
    r = df.iloc[4]
    assert (r["layer"], r["head"], r["score"], r["margin"], r["n"]) == (
        1,
        1,
        pytest.approx(0.95),
        pytest.approx(0.85),
        50,
    )
    assert r["ci_low"] == pytest.approx(0.95) and r["p_value"] < CFG.alpha
    # at the 1/601 floor, BH over 6 heads needs more draws: refined, never a silent normal tail
    assert r["test"] == "sign-flip permutation (600, refined)"
    assert df.iloc[2]["p_value"] < 0.01 and not df.iloc[2]["verdict"]
    # absolute threshold, NaN-missing items, BH off
    values[:10, 4] = float("nan")
    rows = verdict_rows(
        values,
        0.1,
        n_layers=2,
        n_heads=3,
        role="demo",
        cfg=RolesConfig(n_boot=50, n_perm=50, correction="none"),
        threshold_kind="absolute",
        threshold=0.9,
    )
    assert [r["n"] for r in rows] == [50, 50, 50, 50, 40, 50] and [r["verdict"] for r in rows] == [False] * 4 + [
        True,
        False,
    ]
    with pytest.raises(ValueError, match="n_layers\\*n_heads"):
        verdict_rows(values[:, :5], 0.1, n_layers=2, n_heads=3, role="x", cfg=CFG)
    with pytest.raises(ValueError, match="explicit threshold"):
        verdict_rows(values, 0.1, n_layers=2, n_heads=3, role="x", cfg=CFG, threshold_kind="absolute")


def test_verdict_rows_dict_and_min_n():
    rows = verdict_rows(
        {(0, 1): [1.0] * 12, (1, 0): [1.0] * 3},
        {(0, 1): 0.0, (1, 0): 0.0},
        n_layers=2,
        n_heads=2,
        role="r",
        cfg=CFG,
        relation="nsubj",
        direction="dep->head",
        min_n=5,
    )
    assert [(r["layer"], r["head"], r["n"], r["verdict"], r["relation"]) for r in rows] == [
        (0, 1, 12, True, "nsubj"),
        (1, 0, 3, False, "nsubj"),
    ]


def test_tail_p_is_the_exact_floor_for_constant_differences():
    assert float(tail_p(torch.full((10, 1), 0.3))[0]) == pytest.approx(2.0**-10)  # floor beats Φ(-√10) = 7.8e-4
    assert float(tail_p(torch.full((20, 1), 0.3))[0]) == pytest.approx(0.5 * math.erfc(math.sqrt(10)), rel=1e-9)
    assert float(tail_p(torch.zeros(5, 1))[0]) == 1.0


# -- MiniLM-L6 (in-house) on the shipped sentences ------------------------------------------------
@pytest.fixture(scope="module")
def texts():
    lines = [l for l in data_path("text/sentences.txt").read_text(encoding="utf-8").splitlines() if l.strip()]
    return lines[:60]


def test_minilm_positional_heads(minilm, texts):
    out = run_role("positional", minilm, texts, CFG)
    f = out.frame
    prev = f[(f["role"] == "positional:previous") & f["verdict"]]
    assert list(zip(prev["layer"], prev["head"])) == [(0, 2)]
    assert float(prev["score"].iloc[0]) == pytest.approx(1.0)
    nxt = f[f["role"] == "positional:next"].sort_values("score")
    assert tuple(nxt.iloc[-1][["layer", "head"]]) == (1, 8)
    assert float(nxt.iloc[-1]["score"]) == pytest.approx(0.770009, abs=1e-4)  # below 0.9: no next-token verdict
    assert not f[(f["role"] == "positional:next")]["verdict"].any()
    first = f[(f["role"] == "positional:first") & f["verdict"]]
    assert len(first) == 20 and {(2, 7), (3, 3), (3, 4), (4, 2)} <= set(zip(first["layer"], first["head"]))


def test_minilm_special_heads(minilm, texts):
    res = head_roles(minilm, text=texts, roles=["special", "summary"], cfg=CFG, examples=False)
    out, stats = res.outputs["special"], res.stats
    f = out.frame
    top = f[f["role"] == "special"].sort_values("score").iloc[-1]
    assert (top["layer"], top["head"]) == (4, 5)
    assert top["score"] == pytest.approx(0.862698, abs=1e-4) and top["baseline"] == pytest.approx(0.140186, abs=1e-4)
    punct = f[(f["role"] == "punctuation") & f["verdict"]]
    assert list(zip(punct["layer"], punct["head"])) == [(3, 11)]
    assert float(punct["score"].iloc[0]) == pytest.approx(0.402941, abs=1e-4)
    ent = stats[(stats["metric"] == "entropy")].sort_values("value").iloc[0]
    assert (ent["layer"], ent["head"]) == (0, 2) and ent["value"] < 0.01  # the previous-token head is nearly one-hot


def test_minilm_bidirectional_induction_family(minilm):
    f = run_role("induction", minilm, cfg=RolesConfig(induction_n_sequences=8, n_boot=100, n_perm=200)).frame
    top = {
        r: f[f["role"] == r].sort_values("score").iloc[-1]
        for r in ("previous-token", "next-token", "duplicate-token", "induction")
    }
    assert (top["previous-token"]["layer"], top["previous-token"]["head"]) == (0, 2)
    assert top["previous-token"]["score"] == pytest.approx(0.973261, abs=1e-4)
    assert (top["next-token"]["layer"], top["next-token"]["head"]) == (1, 8)
    assert (top["duplicate-token"]["layer"], top["duplicate-token"]["head"]) == (2, 9)
    assert top["duplicate-token"]["score"] == pytest.approx(0.544193, abs=1e-4)
    assert top["induction"]["score"] < 0.03  # MiniLM has no induction head


# -- SmolLM2-135M: induction heads and transformer-lens parity ------------------------------------
def test_smollm_induction_heads(smollm):
    f = run_role("induction", smollm, cfg=RolesConfig(induction_n_sequences=4, n_boot=100, n_perm=200)).frame
    ind = f[f["role"] == "induction"].sort_values("score", ascending=False).head(3)
    assert list(zip(ind["layer"], ind["head"])) == [(18, 6), (17, 4), (17, 3)]
    assert ind["score"].tolist() == pytest.approx([0.420087, 0.365529, 0.345051], abs=1e-4)
    assert float(ind["baseline"].iloc[0]) == pytest.approx(0.016038, abs=1e-5)


def test_detect_head_parity_on_smollm_bridge(smollm_bridge, smollm):
    from transformer_lens.head_detector import detect_head

    tok = smollm_bridge.tokenizer
    vocab = tok.get_vocab()
    words = sorted(i for s, i in vocab.items() if re.fullmatch(r"Ġ[a-z]{3,8}", s))[:1500]
    words = [i for i in words if tok(tok.decode([i]), add_special_tokens=False)["input_ids"] == [i]]
    ids, spec = induction.repeated_random_tokens(tok, n_sequences=2, seq_len=20, seed=0, vocab_ids=words)
    prompts = [tok.decode(r[1:].tolist()) for r in ids]
    assert torch.equal(smollm_bridge.bridge.to_tokens(prompts[0])[0].cpu(), ids[0])  # same prompt, BOS included
    cap = induction.capture_ids(smollm_bridge, ids, spec)
    cap_in = induction.capture_ids(smollm, ids, spec)
    names = {
        "induction": "induction_head",
        "duplicate-token": "duplicate_token_head",
        "previous-token": "previous_token_head",
    }
    # one run_with_cache per prompt, then detect_head(cache=...) per pattern; a list of prompts
    # in detect_head is the mean of these per-prompt scores
    caches = [
        smollm_bridge.bridge.run_with_cache(smollm_bridge.bridge.to_tokens(s), remove_batch_dim=True)[1]
        for s in prompts
    ]
    for exclude_bos in (False, True):
        red = induction.InductionReducer(causal=True, exclude_bos=exclude_bos)
        red.update(cap)
        red_in = induction.InductionReducer(causal=True, exclude_bos=exclude_bos)
        red_in.update(cap_in)
        ours, _, _ = red.result()
        ours_in, _, _ = red_in.result()
        for role, name in names.items():
            tl = torch.stack(
                [
                    detect_head(smollm_bridge.bridge, s, name, cache=c, exclude_bos=exclude_bos, error_measure="mul")
                    for s, c in zip(prompts, caches)
                ]
            ).mean(0)
            assert (ours[role].mean(0) - tl.float()).abs().max().item() <= 1e-4
            assert (ours_in[role].mean(0) - tl.float()).abs().max().item() <= 1e-4
    # detect_head must not have altered the cached patterns we compared against
    assert torch.allclose(caches[0]["pattern", 18, "attn"].sum(-1), torch.ones(9, ids.shape[1]), atol=1e-5)


@pytest.mark.parametrize("name", ["minilm-l6", "smollm2-135m"])
def test_batched_token_counts_equal_one_item_at_a_time(name):
    from collections import Counter

    from headscope.analyses.roles.rareword import count_tokens
    from headscope.probes.models.checkpoints import hf_dir, load_tokenizer, resolve
    from headscope.probes.tokens import tokenize_one

    tok = load_tokenizer(hf_dir(resolve(name)))
    texts = data_path("text/sentences.txt").read_text(encoding="utf-8").splitlines()[:120]
    texts += ["", "   ", "caf\u00e9 \u2603 na\u00efve [SEP] <|im_start|> text"]
    want = Counter()
    for t in texts:
        if t.strip():
            item = tokenize_one(tok, text=t)
            want.update(i for i, s in zip(item["ids"], item["special"]) if not s)
    got = count_tokens(tok, texts, chunk=7)
    assert got == want and sum(got.values()) > 1000


def test_item_values_chunks_merge_and_order():
    from headscope.analyses.roles.pattern_stats import ItemValues

    g = torch.Generator().manual_seed(0)
    ids = torch.randperm(100, generator=g).tolist()
    store, ref = ItemValues(consolidate_every=3), {}
    for i in range(0, 100, 7):  # 15 batch parts: joined into chunks of 3, never re-joined
        v = torch.rand(len(ids[i : i + 7]), 2, 3, generator=g)
        store.add("a", ids[i : i + 7], v)
        ref.update(zip(ids[i : i + 7], v))
    assert len(store.parts["a"]) == 5
    other = ItemValues()
    other.add("a", [100, 101], torch.ones(2, 2, 3))
    store.merge(other)
    ref.update({100: torch.ones(2, 3), 101: torch.ones(2, 3)})
    got_ids, got = store.get("a")
    assert got_ids == sorted(ref) and torch.equal(got, torch.stack([ref[i] for i in sorted(ref)]))
    assert len(store.parts["a"]) == 1  # the ordered result replaces the parts
    store.add("a", [102], torch.zeros(1, 2, 3))
    assert store.get("a")[0][-3:] == [100, 101, 102]
