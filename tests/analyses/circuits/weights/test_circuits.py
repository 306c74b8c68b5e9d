"""Weights-only circuits (#28): planted ground truth, GQA = brute force on an MHA-expanded copy,
transformer-lens parity, and the ``weights`` command."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch

from headscope.analyses.circuits.weights import ov_qk
from headscope.analyses.circuits.weights.composition import composition_scores
from headscope.analyses.circuits.weights.ov_qk import copying_score, head_circuits
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.inhouse.head_weights import head_weights
from headscope.probes.models.inhouse.planted import planted_model, writing_induction
from headscope.probes.models.loading import load_model
from tests.tiny_models import tiny_hf_model


@pytest.fixture(scope="module")
def planted_circuits():
    """The planted model with a copying head: (1, 1)'s OV is 4 × identity on the token block."""
    w = head_weights(writing_induction(planted_model()))
    return head_circuits(w, n_draws=200), composition_scores(w, n_null=200)


def test_planted_copying_head_is_found(planted_circuits):
    heads, _ = planted_circuits
    cop = heads[heads.statistic == "ov_copying"].set_index(["layer", "head"])
    assert cop.loc[(1, 1), "value"] >= 0.9
    assert cop.loc[(1, 1), "verdict"] == "above baseline"
    # every other head writes nothing the unembedding reads: its OV circuit is exactly zero
    others = cop.drop(index=(1, 1))
    assert others["value"].isna().all() and (others["verdict"] == "no circuit").all()


def test_planted_qk_positional_share(planted_circuits):
    """Learned positions: the previous-token head reads positions only (share 1), the noun -> det
    head's pure terms are content only (0); the sink (query position -> key token) and the heads
    whose keys read what layer 0 wrote have no pure term (NaN, "no circuit")."""
    heads, _ = planted_circuits
    pos = heads[heads.statistic == "qk_positional_share"].set_index(["layer", "head"])
    assert len(pos) == 8 and set(pos.method) == {"rms pure terms"}
    assert pos.loc[(0, 0), "value"] == 1.0 and pos.loc[(0, 0), "verdict"] == "above baseline"
    assert pos.loc[(0, 2), "value"] == 0.0 and pos.loc[(0, 2), "verdict"] == "not above baseline"
    for h in ((0, 1), (1, 1), (1, 2)):
        assert pd.isna(pos.loc[h, "value"]) and pos.loc[h, "verdict"] == "no circuit", h
        assert "no pure positional or content term" in pos.loc[h, "note"]
    for h in ((0, 3), (1, 0), (1, 3)):  # random heads: about the Gaussian heads' share
        assert abs(pos.loc[h, "value"] - pos.loc[h, "baseline_mean"]) < 4 * pos.loc[h, "baseline_sd"] + 0.05


def test_qk_positional_share_equals_the_full_circuits_on_gpt2():
    """The Gram-matrix route equals the RMS of the explicit [n_pos, n_pos] and [vocab, vocab] circuits."""
    hf, tok = tiny_hf_model("gpt2")
    w = head_weights(load_model(hf, backend="inhouse", tokenizer=tok))
    df = head_circuits(w, n_draws=5).set_index(["statistic", "layer", "head"])
    P, E = w.W_pos.double(), w.W_E.double()
    for lw in w.layers():
        for i, h in enumerate(lw.heads):
            qk = lw.W_Q[i].double() @ lw.W_K[lw.kv_index[i]].double().T
            r_pos = (P @ qk @ P.T).norm() / P.shape[0]
            r_content = (E @ qk @ E.T).norm() / E.shape[0]
            want = float(r_pos / (r_pos + r_content))
            assert df.loc[("qk_positional_share", lw.layer, h), "value"] == pytest.approx(want, abs=1e-6)
    assert df.loc["qk_positional_share", "verdict"].isin(["above baseline", "not above baseline"]).all()


def test_planted_previous_token_to_induction_ranks_first_by_k_composition(planted_circuits):
    _, comp = planted_circuits
    k = comp[(comp["mode"] == "K") & (comp.level == "head")].sort_values("value", ascending=False)
    top = k.iloc[0]
    assert [int(top[c]) for c in ("sender_layer", "sender_head", "receiver_layer", "receiver_head")] == [0, 0, 1, 1]
    assert top.value > k.iloc[1].value + 0.03
    assert top.verdict == "above baseline"


def _expanded_state(hf, n_kv: int, n_heads: int) -> dict[str, torch.Tensor]:
    """The HF state of ``hf`` with K/V projections repeated to one per query head (MHA)."""
    group = n_heads // n_kv
    state = {}
    for name, t in hf.state_dict().items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            t = t.view(n_kv, -1, t.shape[-1]).repeat_interleave(group, 0).reshape(-1, t.shape[-1])
        state[name] = t.double()
    return state


def _brute_force(state: dict, n_layers: int, n_heads: int, d_head: int):
    """Per layer ``{W_Q, W_K, W_V, W_O}`` lists of full ``[d_model, d_head]``/``[d_head, d_model]``
    matrices from an MHA HF Llama state, input norms folded; and ``W_E``, ``W_U``."""
    layers = []
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        ln = state[p + "input_layernorm.weight"]
        sl = [slice(h * d_head, (h + 1) * d_head) for h in range(n_heads)]
        layers.append(
            {
                "W_Q": [ln[:, None] * state[p + "self_attn.q_proj.weight"][s].T for s in sl],
                "W_K": [ln[:, None] * state[p + "self_attn.k_proj.weight"][s].T for s in sl],
                "W_V": [ln[:, None] * state[p + "self_attn.v_proj.weight"][s].T for s in sl],
                "W_O": [state[p + "self_attn.o_proj.weight"][:, s].T for s in sl],
            }
        )
    W_E = state["model.embed_tokens.weight"]
    W_U = state["model.norm.weight"][:, None] * state.get("lm_head.weight", W_E).T
    return layers, W_E, W_U


def _score(A: torch.Tensor, B: torch.Tensor) -> float:
    return float((A @ B).norm() / (A.norm() * B.norm()))


@pytest.fixture(scope="module")
def tiny_gqa():
    hf, tok = tiny_hf_model("llama")  # 4 query heads, 2 KV heads, random norms
    model = load_model(copy.deepcopy(hf), backend="inhouse", tokenizer=tok)
    cfg = hf.config
    d_head = cfg.hidden_size // cfg.num_attention_heads
    state = _expanded_state(hf, cfg.num_key_value_heads, cfg.num_attention_heads)
    return model, _brute_force(state, cfg.num_hidden_layers, cfg.num_attention_heads, d_head), cfg


def test_gqa_composition_equals_brute_force_on_mha_expanded_copy(tiny_gqa):
    model, (layers, _, _), cfg = tiny_gqa
    df = composition_scores(head_weights(model), n_null=20)
    n_heads, group = cfg.num_attention_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    rights = {
        "Q": lambda L, h: L["W_Q"][h] @ L["W_K"][h].T,
        "K": lambda L, h: L["W_K"][h] @ L["W_Q"][h].T,
        "V": lambda L, h: L["W_V"][h] @ L["W_O"][h],
    }
    checked = 0
    for row in df.itertuples():
        A, B = layers[row.sender_layer], layers[row.receiver_layer]
        ov = A["W_V"][row.sender_head] @ A["W_O"][row.sender_head]
        if row.level == "head":
            want = _score(ov, rights[row.mode](B, row.receiver_head))
        else:  # the group's shared input: the same on every query head of the expanded copy
            wants = {
                round(_score(ov, B[f"W_{row.mode}"][h]), 9)
                for h in range(n_heads)
                if h // group == row.receiver_kv_head
            }
            assert len(wants) == 1
            want = wants.pop()
        assert row.value == pytest.approx(want, abs=1e-6)
        checked += 1
    assert checked == 5 * n_heads * n_heads - 2 * n_heads * (n_heads - cfg.num_key_value_heads)


def test_gqa_head_statistics_equal_brute_force(tiny_gqa):
    model, (layers, W_E, W_U), cfg = tiny_gqa
    df = head_circuits(head_weights(model), n_draws=10).set_index(["statistic", "layer", "head"])
    for layer, L in enumerate(layers):
        for h in range(cfg.num_attention_heads):
            full = W_E @ L["W_V"][h] @ L["W_O"][h] @ W_U
            assert df.loc[("ov_copying", layer, h), "value"] == pytest.approx(
                float(copying_score(torch.linalg.eigvals(full))), abs=1e-6
            )
            assert df.loc[("ov_norm", layer, h), "value"] == pytest.approx(
                float((L["W_V"][h] @ L["W_O"][h]).norm()), rel=1e-6
            )
            assert df.loc[("qk_norm", layer, h), "value"] == pytest.approx(
                float((L["W_Q"][h] @ L["W_K"][h].T).norm()), rel=1e-6
            )


def test_copying_factor_and_full_circuit_agree(tiny_gqa, monkeypatch):
    model, _, _ = tiny_gqa
    w = head_weights(model)
    full = head_circuits(w, n_draws=5)
    monkeypatch.setattr(ov_qk, "FULL_VOCAB_MAX", 0)
    factor = head_circuits(w, n_draws=5)
    a, b = (d[d.statistic == "ov_copying"] for d in (full, factor))
    assert set(a.method) == {"full"} and set(b.method) == {"factor W_O W_U W_E W_V"}
    assert torch.allclose(torch.tensor(a.value.to_numpy()), torch.tensor(b.value.to_numpy()), atol=1e-6)


def test_composition_matches_transformer_lens_on_mha():
    """headscope's bridge boots without fold_ln, so parity is on unfolded weights."""
    hf, tok = tiny_hf_model("llama", num_key_value_heads=4)
    ours = composition_scores(
        head_weights(load_model(copy.deepcopy(hf), backend="inhouse", tokenizer=tok), fold_norms=False), n_null=10
    )
    with pytest.warns(UserWarning, match="in place"):
        bridge = load_model(hf, backend="bridge", tokenizer=tok).bridge
    for mode in "QKV":
        scores = bridge.all_composition_scores(mode).scores.detach()
        d = ours[(ours["mode"] == mode) & (ours.level == "head")]
        assert len(d) == 16
        for row in d.itertuples():
            want = float(scores[row.sender_layer, row.sender_head, row.receiver_layer, row.receiver_head])
            assert row.value == pytest.approx(want, abs=1e-6)


def test_head_weights_refuses_other_backends():
    hf, tok = tiny_hf_model("llama")
    with pytest.raises(ModelIncompatibleError, match="backend='inhouse'"):
        head_weights(load_model(hf, backend="hf", tokenizer=tok))


def test_draw_counts_are_checked():
    w = head_weights(planted_model())
    with pytest.raises(ValueError, match="n_draws"):
        head_circuits(w, n_draws=0)
    with pytest.raises(ValueError, match="n_null"):
        composition_scores(w, n_null=0)


def test_weights_command_writes_tables_and_summary(tmp_path, capsys):
    import pandas as pd

    from headscope.reports.cli.app import main
    from tests.tiny_models import tiny_model_dir

    model = tiny_model_dir(tmp_path / "models", "llama")  # GQA: 4 query heads, 2 KV heads
    out = tmp_path / "w"
    assert main(["weights", str(model), "--out", str(out), "--draws", "5", "--null", "20", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "composition.csv",
        "composition.parquet",
        "heads.csv",
        "heads.parquet",
        "run.json",
        "weights.md",
    ]
    comp = pd.read_parquet(out / "composition.parquet")
    assert len(comp) == 64 and set(comp.level) == {"head", "kv_group"}
    assert (comp[comp.level == "kv_group"].receiver_head.isna()).all()
    heads = pd.read_csv(out / "heads.csv")
    assert set(heads.statistic) == {"ov_copying", "ov_norm", "qk_norm", "qk_positional_share"}
    assert "RoPE" in heads[heads.statistic == "qk_positional_share"].note.iloc[0]
    assert "Top K-composition pairs (per KV group)" in (out / "weights.md").read_text()
    # a second run into the same folder replaces it; a folder of someone else's files is refused
    assert main(["weights", str(model), "--out", str(out), "--draws", "5", "--null", "20", "--quiet"]) == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["weights", str(model), "--out", str(other), "--quiet"]) == 2
    assert "headscope: error:" in capsys.readouterr().err
    assert (other / "notes.txt").read_text() == "mine"


def test_r_factors_equal_the_reduced_qr_bit_for_bit(tiny_gqa):
    """The composition's R factors come from ``mode="r"`` QR, once per KV head (speed): the same
    bits as the reduced QR of every query head's expanded copy, so the scores do not move."""
    from headscope.analyses.circuits.weights.composition import _r_factor, sender_factors

    model = tiny_gqa[0]
    lw = head_weights(model).layer(1)
    assert len(set(lw.kv_index.tolist())) < len(lw.kv_index)  # GQA: query heads share KV heads
    for Y in (lw.W_V[lw.kv_index], lw.W_Q, torch.randn(50, 96, 16, generator=torch.Generator().manual_seed(0))):
        assert torch.equal(_r_factor(Y), torch.linalg.qr(Y.double(), mode="reduced").R)
    old = torch.linalg.qr(lw.W_V[lw.kv_index].double(), mode="reduced").R @ lw.W_O.double()
    assert torch.equal(sender_factors(lw), old)
