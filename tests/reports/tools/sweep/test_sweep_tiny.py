"""Families the sweep left out because of its own shrinking, not of the family: transformers builds
each from a correct tiny config, the tiny config did not give it one (a size left None that the model
needs, a vocabulary or width of its own kept at its full size, a sub-config of its own parts called
"not text-only", a depth held in a list of layer kinds). Each case builds the family's tiny config with
its Auto class and checks it is small; the families without attention heads are listed as such."""

from __future__ import annotations

import pytest
import transformers

from headscope.reports.tools.sweep.tiny_config import (
    KINDS,
    MAX_PARAMS,
    TinyBuildError,
    save_tiny,
    text_families,
    tiny_config,
)

SPECIALS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _build(mtype: str, n_layers: int = 2):
    kind = text_families()[mtype][0]
    cfg = tiny_config(mtype, vocab_size=600, specials=SPECIALS, encoder=kind == "encoder", n_layers=n_layers)
    model = getattr(transformers, KINDS[kind]).from_config(cfg, attn_implementation="eager")
    assert sum(p.numel() for p in model.parameters()) <= MAX_PARAMS
    return cfg, model


@pytest.mark.parametrize(
    "mtype, sizes",
    [
        ("hunyuan_v1_dense", {"head_dim": 16}),  # head_dim None: its attention computed None ** -0.5
        ("ministral", {"head_dim": 16}),
        ("nemotron", {"num_key_value_heads": 2}),  # None: heads // None
        ("lfm2_moe", {"layer_types": ["full_attention", "full_attention"]}),  # None: its model indexes it
        ("dots1", {"n_routed_experts": 4, "n_shared_experts": 1}),  # None: torch.empty(None, …)
        ("squeezebert", {"embedding_size": 64}),  # equal to the hidden size by default: it cannot run them apart
        ("gemma3n_text", {"intermediate_size": [128, 128], "num_kv_shared_layers": 0}),  # 15 layers shared of 2
        ("gemma4_text", {"vocab_size_per_layer_input": 600}),  # 134.8M: 262,144 per-layer input embeddings
        ("luke", {"entity_vocab_size": 600}),  # 128.2M: 500,000 entities
        ("roc_bert", {"shape_vocab_size": 600, "pronunciation_vocab_size": 600}),
        ("inkling2_text", {"unpadded_vocab_size": 600}),  # its LM head kept 200,058 outputs
        ("reformer", {"axial_pos_embds_dim": (16, 48)}),  # must sum to d_model
        ("funnel", {"d_head": 16, "d_inner": 128, "architectures": []}),  # None: AutoModel could not pick its class
        ("qwen4_exp_text", {"indexer_head_dim": 16, "indexer_kv_heads": 1}),  # its indexed layers' sizes: None
        # its Mamba-2 mixers kept 128 heads of 64 and a 128-wide state: its report timed out (403 s)
        ("nemotron_h", {"mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 1}),
    ],
)
def test_a_size_the_family_needs_is_given_at_the_tiny_scale(mtype, sizes):
    cfg, _ = _build(mtype)
    assert {k: getattr(cfg, k) for k in sizes} == sizes


def test_per_layer_rotary_settings_are_given_to_each_layer_kind():
    """Cohere Compass's rotary embedding reads rope_parameters[layer kind]; its default has none (KeyError)."""
    cfg, _ = _build("cohere_compass_text")
    assert set(cfg.rope_parameters) == {"full_attention"}


def test_an_mla_layer_override_keeps_its_head_the_sum_of_its_parts():
    """Dots3's sliding layers: head_dim = qk_nope_head_dim + qk_rope_head_dim, else its config refuses."""
    cfg, model = _build("dots3_note_text")
    sliding = cfg.per_layer_config["sliding_attention"]
    assert sliding.head_dim == sliding.qk_nope_head_dim + sliding.qk_rope_head_dim == 32


def test_a_shared_attention_block_has_two_layers_to_share_it():
    """Zamba ties its shared attention block from its first hybrid layer into the others: one alone refused."""
    cfg, model = _build("zamba", n_layers=3)
    assert cfg.layers_block_type == ["linear_attention", "hybrid", "hybrid"]


@pytest.mark.parametrize(
    "mtype, part, sizes",
    [
        ("dbrx", "attn_config", {"kv_n_heads": 1}),  # MQA stays MQA
        ("dbrx", "ffn_config", {"ffn_hidden_size": 128, "moe_num_experts": 4, "hidden_size": 64}),
        ("t5gemma", "encoder", {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16}),
        ("t5gemma", "decoder", {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}),
    ],
)
def test_the_sub_configs_of_a_text_models_own_parts_are_shrunk(mtype, part, sizes):
    """DBRX and MPT keep their attention (and FFN) settings in sub-configs, T5Gemma its encoder and
    decoder: text models, once called "composite config: not a text-only model"."""
    cfg, _ = _build(mtype)
    sub = getattr(cfg, part)
    assert {k: getattr(sub, k) for k in sizes} == sizes


def test_a_sub_config_left_unset_is_no_part_of_the_model():
    """ESM's esmfold_config is None by default (ESMFold's alone): ESM is a masked LM of token ids."""
    cfg, _ = _build("esm")
    assert cfg.esmfold_config is None and cfg.num_attention_heads == 4


def test_mpt_is_shrunk_through_its_attention_sub_config():
    cfg, _ = _build("mpt")
    assert (cfg.d_model, cfg.n_heads, cfg.n_layers) == (64, 4, 2) and cfg.attn_config.alibi


def test_a_depth_held_in_a_list_of_layer_kinds_is_cut():
    """Nemotron-H has no layer count: its layers_block_type lists them (Mamba, MoE, attention, MLP)."""
    cfg, model = _build("nemotron_h", n_layers=3)
    assert cfg.layers_block_type == ["linear_attention", "moe", "full_attention"]
    assert any("Attention" in type(m).__name__ for m in model.modules())


@pytest.mark.parametrize(
    "mtype, why",
    [
        ("mamba", "its config has no attention heads"),
        ("rwkv", "its config has no attention heads"),
        ("fnet", "its config has no attention heads"),
        ("mamba2", "at up to 8 layers its default config has none"),
    ],
)
def test_a_family_without_attention_heads_is_said_to_have_no_attention_layer(mtype, why, tmp_path):
    """Mamba, RWKV (its "attention" is a per-channel time mixing: no pattern) and FNet (Fourier mixing)
    have no heads key; they were "cannot shrink: no config key for heads". Mamba-2's heads are its SSM's,
    spanning hidden_size * expand: its config refused the tiny sizes until expand followed them."""
    with pytest.raises(TinyBuildError, match=f"no attention layer: {why}"):
        save_tiny(mtype, tmp_path / "m")


@pytest.mark.parametrize(
    "mtype, layers",
    [
        # intermediate_size per layer: "must be a positive integer; got [128, 128]" (~15 s on 2 loaded cores)
        pytest.param("gemma3n_text", 2, marks=pytest.mark.slow),
        ("nemotron_h", 1),  # no layer count, its layers_block_type lists 3: "no layer/head/hidden-size fields"
        ("t5gemma", 2),  # sizes in its encoder sub-config; T5GemmaEncoderModel refused is_encoder_decoder
        ("roc_bert", 2),  # an encoder that also has a causal-LM class: loaded as one, its MLM head "missing"
        ("reformer", 2),  # likewise: ReformerModelWithLMHead refused is_decoder=False
    ],
)
def test_a_config_the_reader_refused_loads_on_hf(mtype, layers, tmp_path):
    from headscope.probes.models.loading import load_model

    model = load_model(str(save_tiny(mtype, tmp_path / "m")[1]))
    assert model.backend == "hf" and model.spec.n_layers == layers
    assert model.head_modules["check"].startswith("pattern×V")


def test_a_byte_level_text_model_of_four_transformers_is_left_out_as_such():
    """BLT was "composite config (patch_size): not a text-only model": its patches are of bytes."""
    with pytest.raises(TinyBuildError, match="cannot shrink: a byte-level text model of four transformers"):
        tiny_config("blt", vocab_size=600, specials=SPECIALS)


def test_an_encoder_whose_output_is_wider_than_d_model_is_pruned(tmp_path, capsys):
    """Reformer's output concatenates its two reversible streams (2 × d_model): the encoder metric's
    reference was sized d_model ("shape mismatch: value tensor of shape [8, 128] ... [8, 64]")."""
    from headscope.reports.cli.app import main

    folder = save_tiny("reformer", tmp_path / "m")[1]
    argv = ["prune", str(folder), "--quick", "--n-items", "4", "--seeds", "1", "--studies", "ablation"]
    assert main([*argv, "--out", str(tmp_path / "p"), "--json"]) == 0


def test_a_config_without_a_layer_count_says_which_size_it_lacks():
    """Funnel builds now; its layers sit in pooling blocks (block_sizes) with no count: the reader's
    refusal names the missing size, not only "no layer/head/hidden-size fields", and why it has none."""
    from headscope.probes.errors import ModelIncompatibleError
    from headscope.probes.models.arch import arch_from_hf_config

    cfg, _ = _build("funnel")
    lacks = r"no layer count \(num_hidden_layers, n_layer, n_layers, …\); Funnel .* mean-pooled by 2"
    with pytest.raises(ModelIncompatibleError, match=lacks):
        arch_from_hf_config(cfg.to_dict(), "funnel/config.json")


@pytest.mark.parametrize("mtype", ["gemma4_assistant", "gemma4_unified_assistant"])
def test_a_drafter_is_no_text_model_of_its_own(mtype):
    """Gemma 4's assistants were "default config fails" and "composite config (text_config)": their
    forward raises without their target model's inputs_embeds and shared_kv_states."""
    with pytest.raises(TinyBuildError, match="not a text-only model: a speculative-decoding drafter"):
        tiny_config(mtype, vocab_size=600, specials=SPECIALS)
