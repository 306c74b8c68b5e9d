"""``headscope card FILE.gguf``: the card from GGUF metadata alone, for every architecture
transformers reads from GGUF (tiny metadata-only files written with ``gguf.GGUFWriter``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from headscope.probes.errors import CheckpointError, ModelIncompatibleError
from headscope.probes.models.card import card_from_hf_config, render_card
from headscope.probes.models.families import GGUF_RECORDS
from headscope.probes.models.gguf import GGUF_ARCHITECTURES, arch_from_gguf, gguf_hf_config

gguf = pytest.importorskip("gguf")


def write_gguf(path, arch: str, *, name: str = "tiny", tensors: bool = False, **meta) -> str:
    """A GGUF file holding ``general.architecture`` = ``arch`` and ``<arch>.KEY`` = value for each
    ``meta`` item (``__`` in a keyword stands for ``.``: ``attention__head_count``)."""
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    for key, value in meta.items():
        key = f"{arch}.{key.replace('__', '.')}"
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_string(key, value)
    w.add_token_list([f"t{i}" for i in range(100)])
    if tensors:
        w.add_tensor("token_embd.weight", np.zeros((100, meta["embedding_length"]), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


BASE = dict(context_length=8192, block_count=6, embedding_length=64, feed_forward_length=128)


def card_of(path, **kw):
    return card_from_hf_config(gguf_hf_config(path), name="t", **kw)


def test_llama(tmp_path):
    p = write_gguf(
        tmp_path / "l.gguf",
        "llama",
        tensors=True,
        **BASE,
        attention__head_count=4,
        attention__head_count_kv=2,
        rope__dimension_count=16,
        rope__freq_base=500000.0,
    )
    hf = gguf_hf_config(p)
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["model_type"] == "llama"
    assert hf["vocab_size"] == 100 and hf["tie_word_embeddings"]  # no output.weight: tied
    c = card_of(p)
    assert (c["layers"], c["heads"], c["kv_heads"], c["d_head"], c["attention"]) == (6, 4, 2, 16, "GQA")
    assert c["sliding_layers"] == 0 and c["max_context"] == 8192
    assert arch_from_gguf(p).rope_theta == 500000.0


def test_mistral_is_llama_in_gguf(tmp_path):
    p = write_gguf(
        tmp_path / "m.gguf",
        "llama",
        name="Mistral 7B Instruct",
        **BASE,
        attention__head_count=4,
        attention__head_count_kv=1,
    )
    hf = gguf_hf_config(p)
    assert (hf["model_type"], hf["architectures"]) == ("mistral", ["MistralForCausalLM"])
    assert hf["sliding_window"] is None  # the file says none: not MistralConfig's 4096
    c = card_of(p)
    assert (c["attention"], c["kv_heads"], c["group_size"], c["sliding_layers"]) == ("MQA", 1, 4, 0)
    # with a window in the file every layer slides
    p = write_gguf(
        tmp_path / "m2.gguf",
        "llama",
        name="mistral-7b-v0.1",
        **BASE,
        attention__head_count=4,
        attention__head_count_kv=1,
        attention__sliding_window=4096,
    )
    c = card_of(p, dtype="bf16")
    assert (c["sliding_layers"], c["global_layers"], c["sliding_window"]) == (6, 0, 4096)
    assert c["kv_cache_bytes_at_context"] == 2 * 6 * 4096 * 1 * 16 * 2


def test_qwen2(tmp_path):
    p = write_gguf(tmp_path / "q.gguf", "qwen2", **BASE, attention__head_count=8, attention__head_count_kv=2)
    hf = gguf_hf_config(p)
    assert hf["architectures"] == ["Qwen2ForCausalLM"] and hf["use_sliding_window"] is False
    c = card_of(p)
    assert (c["heads"], c["kv_heads"], c["d_head"], c["group_size"], c["sliding_layers"]) == (8, 2, 8, 4, 0)


def test_qwen3_has_qk_norm_and_its_own_head_dim(tmp_path):
    p = write_gguf(
        tmp_path / "q3.gguf",
        "qwen3",
        **BASE,
        attention__head_count=4,
        attention__head_count_kv=2,
        attention__key_length=32,
    )
    c = card_of(p)
    assert gguf_hf_config(p)["architectures"] == ["Qwen3ForCausalLM"]
    assert (c["d_head"], c["heads_x_d_head_equals_d_model"], c["qk_norm"]) == (32, False, True)
    assert "QK-norm" in render_card(c) and "4 heads × 32 = 128 ≠ d_model 64" in render_card(c)


def test_gemma3_sliding_and_global_layers(tmp_path):
    p = write_gguf(
        tmp_path / "g3.gguf",
        "gemma3",
        **dict(BASE, block_count=12, context_length=32768),
        attention__head_count=4,
        attention__head_count_kv=1,
        attention__key_length=32,
        attention__sliding_window=512,
    )
    hf = gguf_hf_config(p)
    assert (hf["model_type"], hf["architectures"]) == ("gemma3_text", ["Gemma3ForCausalLM"])
    c = card_of(p, dtype="bf16")
    assert (c["layers"], c["heads"], c["kv_heads"], c["d_head"]) == (12, 4, 1, 32)
    assert (c["sliding_layers"], c["global_layers"], c["sliding_window"]) == (10, 2, 512)  # every 6th is global
    assert c["sliding_layer_indices"] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert c["kv_cache_bytes_at_context"] == (2 * 32768 + 10 * 512) * 2 * 1 * 32 * 2
    assert c["qk_norm"]
    # the per-layer pattern in the file wins over Gemma 3's default of 6
    p = write_gguf(
        tmp_path / "g3b.gguf",
        "gemma3",
        **dict(BASE, block_count=4),
        attention__head_count=4,
        attention__head_count_kv=1,
        attention__key_length=32,
        attention__sliding_window=512,
        attention__sliding_window_pattern=[True, False, True, False],
    )
    assert card_of(p)["sliding_layer_indices"] == [0, 2]


def test_gemma2_alternates_and_soft_caps(tmp_path):
    p = write_gguf(
        tmp_path / "g2.gguf",
        "gemma2",
        **BASE,
        attention__head_count=4,
        attention__head_count_kv=2,
        attention__key_length=32,
        attention__sliding_window=4096,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
    )
    hf = gguf_hf_config(p)
    assert hf["architectures"] == ["Gemma2ForCausalLM"]
    c = card_of(p)
    assert (c["sliding_layers"], c["global_layers"], c["sliding_layer_indices"]) == (3, 3, [0, 2, 4])
    assert (c["attn_logit_softcapping"], c["final_logit_softcapping"], c["qk_norm"]) == (50.0, 30.0, False)
    assert "soft-capping    attention logits capped at ±50" in render_card(c)


def test_phi3(tmp_path):
    p = write_gguf(
        tmp_path / "p.gguf",
        "phi3",
        **BASE,
        attention__head_count=4,
        attention__head_count_kv=4,
        attention__sliding_window=2047,
    )
    hf = gguf_hf_config(p)
    assert (hf["model_type"], hf["architectures"]) == ("phi3", ["Phi3ForCausalLM"])
    c = card_of(p)
    assert (c["attention"], c["heads"], c["d_head"], c["sliding_layers"], c["sliding_window"]) == (
        "MHA",
        4,
        16,
        6,
        2047,
    )


@pytest.mark.parametrize("arch", sorted(GGUF_ARCHITECTURES))
def test_every_architecture_transformers_reads(tmp_path, arch):
    """Each one gives a config its HF class can be built from (nothing downloaded)."""
    from transformers import CONFIG_MAPPING, AutoConfig

    meta = dict(BASE)
    if arch != "mamba":
        meta.update(attention__head_count=4, attention__head_count_kv=2)
    hf = gguf_hf_config(write_gguf(tmp_path / f"{arch}.gguf", arch, **meta))
    model_type, cls = GGUF_ARCHITECTURES[arch]
    assert (hf["model_type"], hf["architectures"]) == (model_type, [cls])
    assert hf["num_hidden_layers"] == 6 and hf["hidden_size"] == 64
    if model_type in CONFIG_MAPPING:  # deci is remote code
        cfg = AutoConfig.for_model(**{k: v for k, v in hf.items() if k != "_name_or_path"})
        assert cfg.num_hidden_layers == 6 and cfg.architectures == [cls]
    if arch == "mamba":
        with pytest.raises(ModelIncompatibleError):
            card_from_hf_config(hf, name=arch)
    else:
        from headscope.probes.models.arch import arch_from_hf_config

        c = card_from_hf_config(hf, name=arch)
        kv = 4 if arch_from_hf_config(hf).encoder else 2  # an encoder (T5's since 0ba3cd7) is MHA whatever it says
        assert (c["layers"], c["heads"], c["kv_heads"]) == (6, 4, kv)


@pytest.mark.parametrize(
    ("under", "named", "model_type", "cls"),
    [
        (under, rec.named, rec.model_type, rec.hf_class)
        for rec in GGUF_RECORDS
        if rec.named
        for under in rec.files_under
    ],
)
def test_a_file_claimed_by_its_name(tmp_path, under, named, model_type, cls):
    """A record that claims files of another architecture by their ``general.name`` (llama.cpp's
    Mistral under ``llama``, UMT5 under ``t5`` / ``t5encoder``) reads them as its own; files of
    that architecture named otherwise stay its own."""
    meta = dict(BASE, attention__head_count=4, attention__head_count_kv=2)
    hf = gguf_hf_config(write_gguf(tmp_path / "a.gguf", under, name=f"Some {named.upper()} model", **meta))
    assert (hf["model_type"], hf["architectures"]) == (model_type, [cls])
    hf = gguf_hf_config(write_gguf(tmp_path / "b.gguf", under, name="tiny", **meta))
    assert (hf["model_type"], hf["architectures"]) == (GGUF_ARCHITECTURES[under][0], [GGUF_ARCHITECTURES[under][1]])


def test_the_table_covers_transformers_gguf_architectures():
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    theirs = set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer", "umt5"}  # umt5: a t5 file named so
    ours = {GGUF_ARCHITECTURES[a][0].removesuffix("_text") for a in GGUF_ARCHITECTURES}
    assert theirs <= ours


def test_unknown_architecture_and_missing_sizes(tmp_path):
    with pytest.raises(ModelIncompatibleError, match="GGUF architecture 'rwkv6' is not one transformers reads"):
        gguf_hf_config(write_gguf(tmp_path / "r.gguf", "rwkv6", **BASE))
    with pytest.raises(CheckpointError, match="qwen2.attention.head_count is missing"):
        gguf_hf_config(write_gguf(tmp_path / "q.gguf", "qwen2", **BASE))


def test_cli_card_of_a_gguf_file(tmp_path):
    import os

    p = write_gguf(
        tmp_path / "g3.gguf",
        "gemma3",
        **dict(BASE, block_count=6, context_length=4096),
        attention__head_count=4,
        attention__head_count_kv=1,
        attention__key_length=32,
        attention__sliding_window=512,
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HEADSCOPE_CACHE=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-m", "headscope.reports.cli", "card", p, "--dtype", "bf16"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "(gemma3_text, decoder)" in out.stdout
    assert "sliding window  5 of 6 layers attend to the last 512 tokens only; 1 global layer sees" in out.stdout
    # the card reads metadata only: nothing is dequantised
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").rglob("*.safetensors"))
