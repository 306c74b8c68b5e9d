"""What the registry sweep found on hybrid models (attention layers among recurrent or
linear-attention ones: OLMo-Hybrid, Qwen3-Next, Zamba2, Jamba, RecurrentGemma) and on configs whose
sizes the tiny config missed:

* the hf backend looked for an attention output projection in *every* block, found none in the
  recurrent ones and refused ("cannot find the attention output projection of each of its 2
  layers"); auto then took the bridge, whose attention hooks do not exist there, and every stage
  failed. Now the hf backend analyses the attention layers alone and says which blocks hold none;
* an attention module named without "attn" (RecurrentGemma's ``temporal_block``) was not searched;
* a tiny Jamba (attention every 8th layer from the 5th) or RecurrentGemma (every 3rd) had no
  attention layer at 2 layers; a Laguna kept 48 heads per layer (``num_attention_heads_per_layer``);
  Inkling's sliding layers kept their own 64 heads of 128 (``swa_num_attention_heads``,
  ``swa_head_dim``); CPM-Ant its ``dim_head`` of 128; MobileBERT its 128-wide bottleneck."""

from __future__ import annotations

import pytest
import torch
import transformers

from headscope.probes.models.loading import load_model
from headscope.reports.tools.sweep.tiny_config import TinyBuildError, save_tiny, tiny_config


@pytest.fixture(scope="module")
def olmo_hybrid(tmp_path_factory):
    return save_tiny("olmo_hybrid", tmp_path_factory.mktemp("olmo_hybrid") / "m")[1]


def test_a_hybrid_runs_on_hf_with_its_attention_layers_alone(olmo_hybrid):
    model = load_model(str(olmo_hybrid))
    assert model.backend == "hf"
    assert model.spec.n_layers == 1  # block 0 is gated-delta linear attention, block 1 softmax attention
    rec = model.head_modules
    assert rec["attention_blocks"] == [1] and rec["blocks_without_attention"] == [0]
    assert rec["attn_out"] == "model.layers.{layer}.self_attn.o_proj" and rec["check"].startswith("pattern×V")
    batch = model.encode(["The cat sat on the mat.", "Heads."])
    ours = model.run(batch, ("pattern", "z"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(olmo_hybrid), attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = hf(**{k: getattr(batch, k) for k in ("input_ids", "attention_mask")}, output_attentions=True)
    rows = batch.attention_mask.bool()
    assert float((ours["pattern", 0] - theirs.attentions[0]).abs().permute(0, 2, 1, 3)[rows].max()) <= 1e-5
    # layer 0 resumes at its block (1): the recurrent block 0 runs before the stop, not again after
    whole = model.forward(batch.input_ids, batch.attention_mask)
    resid = model.forward(batch.input_ids, batch.attention_mask, stop_at_layer=0)
    again = model.forward(batch.input_ids, batch.attention_mask, start_at_layer=0, resid=resid)
    assert torch.allclose(again, whole, atol=1e-5, rtol=0)


def test_an_attention_module_is_found_by_its_class_whatever_its_name(tmp_path):
    model = load_model(str(save_tiny("recurrent_gemma", tmp_path / "m")[1]))
    assert model.backend == "hf"
    rec = model.head_modules
    assert rec["attn_out"] == "model.layers.{layer}.temporal_block.o_proj" and rec["check"].startswith("pattern×V")
    assert rec["attention_blocks"] == [2] and rec["blocks_without_attention"] == [0, 1]


@pytest.mark.slow  # ~26 s on 2 loaded cores: Bamba's six depths tried on the reference Mamba kernels
def test_the_tiny_depth_grows_until_an_attention_layer_is_there(tmp_path):
    kind, folder = save_tiny("jamba", tmp_path / "m")
    cfg = transformers.AutoConfig.from_pretrained(str(folder))
    assert cfg.num_hidden_layers == 5  # attn_layer_offset 4: the 5th layer is the first with attention
    with pytest.raises(TinyBuildError, match="no attention layer: at up to 8 layers"):
        save_tiny("bamba", tmp_path / "b")  # its default config is Mamba layers only


@pytest.mark.parametrize(
    "mtype, sizes",
    [
        ("laguna", {"num_attention_heads_per_layer": [4, 4]}),
        ("inkling_text", {"swa_num_attention_heads": 4, "swa_head_dim": 16, "swa_num_key_value_heads": 2}),
        ("cpmant", {"dim_head": 16, "dim_ff": 128}),
        ("mobilebert", {"intra_bottleneck_size": 64}),
        ("kimi_linear", {"linear_num_heads": 4, "linear_head_dim": 16}),  # its report timed out at 32 × 128
    ],
)
def test_sizes_of_their_own_are_shrunk(mtype, sizes):
    cfg = tiny_config(mtype, vocab_size=600, specials={"pad_token_id": 0})
    assert {k: getattr(cfg, k) for k in sizes} == sizes


def test_latent_attention_is_checked_through_its_kv_b_proj(tmp_path):
    """MLA (MiniCPM3, DeepSeek-V3 and kin): ``kv_b_proj`` runs on the latent viewed as ``[batch, 1, pos,
    features]``; V was not read from that shape, so the pattern × V check failed (err ~1.4) and hf refused."""
    model = load_model(str(save_tiny("minicpm3", tmp_path / "m")[1]))
    assert model.backend == "hf" and model.head_modules["check"].startswith("pattern×V max err")


def test_the_blocks_transformers_records_attentions_from_are_the_attention_layers(tmp_path):
    """Bailing's linear-attention layers have an ``o_proj`` of the same shape as its softmax layers'; the
    attention layers are the blocks holding the class its ``_can_record_outputs['attentions']`` names."""
    model = load_model(str(save_tiny("bailing_hybrid", tmp_path / "m")[1]))
    assert model.backend == "hf" and model.spec.n_layers == 1
    assert model.head_modules["attention_blocks"] == [1]
    assert "keeps pattern × V's signs" in model.head_modules["check"]  # its per-head output gate (g_proj)


def test_moe_sizes_under_the_configs_own_keys():
    bailing = tiny_config("bailing_hybrid", vocab_size=600, specials={"pad_token_id": 0})
    assert (bailing.num_expert_group, bailing.num_experts, bailing.num_experts_per_token) == (1, 4, 2)
    deepseek = tiny_config("deepseek_v2", vocab_size=600, specials={"pad_token_id": 0})
    assert deepseek.num_experts_per_tok == 2  # None by default: its router's topk cannot run


def test_the_kv_stage_off_the_inhouse_backend_or_on_an_encoder_is_left_out_by_design():
    from headscope.reports.tools.sweep.run import by_design

    why = "the KV-cache study restricts caches inside the in-house attention; backend hf"
    assert by_design("kv", why, "hf") and not by_design("kv", why, "inhouse")
    assert by_design("kv", "m is an encoder: the KV cache is a decoder's (it caches past keys)", "inhouse")
    assert not by_design("kv", "out of memory", "hf") and not by_design("roles", why, "hf")


def test_a_family_whose_forward_needs_a_non_text_input_is_not_a_text_family(tmp_path):
    """BROS (layout boxes) and LXMERT (visual features) were counted as text families whose every
    stage failed; they are left out, the input they need named."""
    with pytest.raises(TinyBuildError, match=r"not a text-only model: its forward needs 'bbox'"):
        save_tiny("bros", tmp_path / "b")


def test_a_default_left_unset_takes_the_first_option_listed():
    """X-MOD's forward refuses to run without ``default_language``; its config lists ``languages``."""
    cfg = tiny_config("xmod", vocab_size=600, specials={"pad_token_id": 0})
    assert cfg.default_language == cfg.languages[0]


def test_attention_of_another_size_in_the_other_blocks_is_no_hybrid():
    """Gemma 4's global layers have heads of their own size (``global_head_dim``: 512 by default; 32
    here): only its sliding blocks hold an output projection of the spec's size, yet HF returns a
    pattern for every block. Read as a hybrid, roles, prune and report ran on half its layers."""
    from headscope.probes.models.hf_layout import attention_blocks

    cfg = tiny_config("gemma4_unified_text", vocab_size=600, specials={"pad_token_id": 0})
    d = cfg.to_dict()
    d["per_layer_config"] = {"01": {"head_dim": 32}}  # layer 1 (full attention): heads of 32
    cfg = type(cfg).from_dict(d)
    cfg._attn_implementation = "eager"
    hf = transformers.AutoModelForCausalLM.from_config(cfg)
    assert tuple(hf.model.layers[1].self_attn.o_proj.weight.shape) == (64, 128)
    spec = type("Spec", (), {"n_heads": 4, "d_head": 16, "d_model": 64})
    assert attention_blocks(hf, spec, 2) is None
    assert attention_blocks(hf.model, spec, 2) is None


def test_a_per_layer_override_takes_the_tiny_sizes(tmp_path):
    """Gemma 4's ``per_layer_config`` is built at creation from ``global_head_dim`` (a kwarg no attribute
    keeps): its full-attention layers kept heads of 512, the tiny model had no output projection of the
    spec's size there and hf refused it. The override now takes the tiny ``head_dim``."""
    cfg = tiny_config("gemma4_unified_text", vocab_size=600, specials={"pad_token_id": 0})
    assert cfg.layer_types == ["sliding_attention", "full_attention"]
    model = load_model(str(save_tiny("gemma4_unified_text", tmp_path / "m")[1]))
    assert model.backend == "hf" and model.spec.n_layers == 2
    assert model.head_modules["check"].startswith("pattern×V max err")


@pytest.mark.parametrize("mtype", ["xlm", "flaubert"])
def test_layers_held_in_parallel_lists_have_their_attention_modules_as_blocks(mtype, tmp_path):
    """XLM and FlauBERT have no block module: ``attentions``, ``ffns`` and two norms are parallel lists of
    one module per layer, and hf refused them (no single ModuleList of 2 blocks). The list of attention
    modules is their blocks' list; ``out_lin``'s input is pattern × V; a block's output is no resid_post."""
    model = load_model(str(save_tiny(mtype, tmp_path / "m")[1]))
    assert model.backend == "hf"
    rec = model.head_modules
    assert rec["attn_out"] == "attentions.{layer}.out_lin" and rec["check"].startswith("pattern×V max err")
    batch = model.encode(["The cat sat on the mat.", "Heads."])
    assert model.run(batch, ("pattern", "z"))["z", 1].shape[1] == 4
    with pytest.raises(ValueError, match="no block module"):
        model.run(batch, ("resid_post",))


def test_a_bias_added_to_v_after_a_fused_projection_is_read_with_v(tmp_path):
    """DeBERTa (v1) adds ``v_bias`` after its bias-free fused ``in_proj``: V read from ``in_proj`` alone
    missed it, the pattern × V check failed (err 6.9e-2) and hf refused the model."""
    model = load_model(str(save_tiny("deberta", tmp_path / "m")[1]))
    assert model.backend == "hf"
    assert model.head_modules["check"].startswith("pattern×V max err")
