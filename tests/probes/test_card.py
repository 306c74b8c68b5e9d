"""``headscope card``: the spec sheet from config alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from headscope.probes.models.card import model_card


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "headscope.reports.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_smollm2_card_reports_gqa():
    c = model_card("smollm2-135m")
    assert (c["heads"], c["d_head"], c["heads_x_d_head"], c["kv_heads"]) == (9, 64, 576, 3)
    assert c["attention"] == "GQA" and c["group_size"] == 3
    assert c["kv_cache_bytes_per_token"] == 2 * 30 * 3 * 64 * 4
    assert round(c["total_params"] / 1e6, 1) == 134.5


def test_minilm_card_and_context():
    c = model_card("minilm-l6", context=128, dtype="bf16")
    assert (c["layers"], c["heads"], c["d_head"], c["attention"]) == (6, 12, 32, "MHA")
    assert c["kv_cache_bytes_at_context"] == 2 * 6 * 12 * 32 * 2 * 128
    assert c["heads_x_d_head_equals_d_model"]


def test_card_from_a_config_json_alone(tmp_path):
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "head_dim": 128,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    out = cli("card", str(p), "--context", "8192", "--dtype", "bf16")
    assert out.returncode == 0, out.stderr
    # Llama 3.1 8B shape: 128 KiB per token in bf16, 1 GiB at 8k context
    assert "128.0 KiB per token (bf16); 1.0 GiB at context 8,192" in out.stdout
    assert "GQA, 8 KV heads shared by groups of 4 query heads" in out.stdout


def test_card_says_when_heads_times_dhead_differs(tmp_path):
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 512,
        "num_attention_heads": 4,
        "head_dim": 64,
        "intermediate_size": 1024,
        "vocab_size": 100,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    out = cli("card", str(p))
    assert "4 heads × 64 = 256 ≠ d_model 512" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["card", "gpt-17"], "unknown model 'gpt-17': not a shipped model (minilm-l6, smollm2-135m)"),
        (["card", "/"], "directory has no config.json"),
        (["card", "/nope/model.gguf"], "no such GGUF file"),
    ],
)
def test_card_bad_input_is_one_line_exit_2(args, message):
    out = cli(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_hub_id_offline_is_a_clear_error():
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-m", "headscope.reports.cli", "card", "someorg/somemodel"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2
    assert "needs network access" in out.stderr


def test_trust_remote_code_is_a_parameter_not_the_environment(monkeypatch, tmp_path):
    """``--trust-remote-code`` reaches ``load_model`` as an argument (off unless asked), never
    through an environment variable, and the loaded model records it."""
    import os

    from headscope.probes.models import loading
    from headscope.reports.cli.app import main

    seen = []

    def fake_load(model, backend=None, **kw):
        seen.append(kw.get("trust_remote_code"))
        raise loading.HeadscopeError("stop here")

    monkeypatch.setattr(loading, "load_model", fake_load)
    assert main(["capture", "minilm-l6", "the cat"]) == 2
    assert main(["--trust-remote-code", "capture", "minilm-l6", "the cat"]) == 2
    assert seen == [False, True]
    assert not any("TRUST_REMOTE" in k for k in os.environ)


# ----------------------------------------------------------------------------- attention kinds (issue #14, item 4)


def tiny(model_type: str, **kw) -> dict:
    """A tiny config built by transformers' own config class (nothing downloaded)."""
    from transformers import AutoConfig

    base = dict(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, intermediate_size=128, vocab_size=100)
    return AutoConfig.for_model(model_type, **{**base, **kw}).to_dict()


def kv_by_hand(global_layers, sliding_layers, window, context, kv_heads, d_head, nbytes):
    return (global_layers * context + sliding_layers * min(window, context)) * 2 * kv_heads * d_head * nbytes


def test_gemma3_sliding_global_kv_cache_qk_norm_and_soft_caps():
    from headscope.probes.models.card import card_from_hf_config, render_card

    hf = tiny(
        "gemma3_text",
        num_key_value_heads=2,
        head_dim=32,
        sliding_window=512,
        sliding_window_pattern=3,
        max_position_embeddings=32768,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        query_pre_attn_scalar=24,
    )
    c = card_from_hf_config(hf, name="g3", dtype="bf16")
    assert (c["sliding_layers"], c["global_layers"], c["sliding_window"]) == (4, 2, 512)
    assert c["sliding_layer_indices"] == [0, 1, 3, 4]  # every 3rd layer is global
    assert c["kv_cache_bytes_at_context"] == kv_by_hand(2, 4, 512, 32768, 2, 32, 2) == 17301504
    assert c["kv_cache_bytes_at_context_without_sliding"] == 6 * 32768 * 2 * 2 * 32 * 2
    assert c["kv_cache_16bit_bytes_by_context"] == {
        str(n): kv_by_hand(2, 4, 512, n, 2, 32, 2) for n in (1024, 4096, 32768)
    }
    assert (c["qk_norm"], c["attn_logit_softcapping"], c["final_logit_softcapping"]) == (True, 50.0, 30.0)
    assert (c["heads_x_d_head"], c["heads_x_d_head_equals_d_model"]) == (128, False)
    text = render_card(c)
    for line in (
        "4 heads × 32 = 128 ≠ d_model 64",
        "sliding window  4 of 6 layers attend to the last 512 tokens only; 2 global layers see the whole context",
        "QK-norm         queries and keys are RMS-normalised per head before the dot product",
        "soft-capping    attention logits capped at ±50 (cap·tanh(x/cap)); final logits at ±30",
        "query scale     1/√24 (query_pre_attn_scalar), not 1/√d_head = 1/√32",
        "16.5 MiB at context 32,768 (48.0 MiB if no layer slid)",
        "KV cache 16-bit 1,024: 1.0 MiB; 4,096: 2.5 MiB; 32,768 (max): 16.5 MiB (fp16/bf16)",
    ):
        assert line in text, (line, text)


def test_gemma3_default_pattern_of_six():
    from headscope.probes.models.card import card_from_hf_config

    c = card_from_hf_config(tiny("gemma3_text", num_hidden_layers=12, sliding_window=1024), name="g3")
    assert (c["sliding_layers"], c["global_layers"], c["sliding_layer_indices"][-1]) == (10, 2, 10)
    # a hub config.json written before layer_types: the pattern alone
    raw = {k: v for k, v in tiny("gemma3_text", num_hidden_layers=12).items() if k != "layer_types"}
    assert card_from_hf_config({**raw, "sliding_window_pattern": 4}, name="g3")["global_layers"] == 3


def test_gemma2_alternates_and_caps():
    from headscope.probes.models.card import card_from_hf_config, render_card

    c = card_from_hf_config(tiny("gemma2", num_key_value_heads=1, head_dim=16), name="g2", context=8192)
    assert (c["sliding_layers"], c["global_layers"], c["sliding_layer_indices"]) == (3, 3, [0, 2, 4])
    assert c["kv_cache_bytes_at_context"] == kv_by_hand(3, 3, 4096, 8192, 1, 16, 4)
    assert (c["attn_logit_softcapping"], c["final_logit_softcapping"], c["qk_norm"]) == (50.0, 30.0, False)
    assert c["attention"] == "MQA" and "MQA, one KV head shared by all 4 query heads" in render_card(c)
    assert "query scale     1/√256 (query_pre_attn_scalar), not 1/√d_head = 1/√16" in render_card(c)
    assert "query scale" not in render_card(card_from_hf_config(tiny("gemma2"), name="g2"))  # 256 = its d_head
    raw = {k: v for k, v in tiny("gemma2").items() if k != "layer_types"}  # older config.json: alternating
    assert card_from_hf_config(raw, name="g2")["sliding_layer_indices"] == [0, 2, 4]


def test_mistral_every_layer_slides():
    from headscope.probes.models.card import card_from_hf_config, render_card

    c = card_from_hf_config(tiny("mistral", num_key_value_heads=2), name="m", dtype="fp16", context=16384)
    assert (c["sliding_layers"], c["global_layers"], c["sliding_window"]) == (6, 0, 4096)
    assert c["kv_cache_bytes_at_context"] == kv_by_hand(0, 6, 4096, 16384, 2, 16, 2)
    assert "sliding window  all 6 layers attend to the last 4,096 tokens only" in render_card(c)
    assert (
        card_from_hf_config(tiny("mistral", num_key_value_heads=2, sliding_window=None), name="m")["sliding_layers"]
        == 0
    )


def test_qwen2_sliding_only_when_used_and_from_max_window_layers():
    from headscope.probes.models.card import card_from_hf_config

    off = card_from_hf_config(tiny("qwen2", num_key_value_heads=2), name="q")
    assert (off["sliding_layers"], off["sliding_window"], off["qk_norm"]) == (0, None, False)
    on = card_from_hf_config(
        tiny("qwen2", num_key_value_heads=2, use_sliding_window=True, sliding_window=256, max_window_layers=4),
        name="q",
        context=1024,
    )
    assert (on["sliding_layer_indices"], on["global_layers"]) == ([4, 5], 4)
    assert on["kv_cache_bytes_at_context"] == kv_by_hand(4, 2, 256, 1024, 2, 16, 4)
    # without layer_types (a hub config.json): the same from max_window_layers
    raw = {**tiny("qwen2", num_key_value_heads=2), "use_sliding_window": True, "sliding_window": 256}
    raw.pop("layer_types", None)
    assert card_from_hf_config({**raw, "max_window_layers": 4}, name="q")["sliding_layer_indices"] == [4, 5]


def test_qwen3_qk_norm_and_gqa_groups():
    from headscope.probes.models.card import card_from_hf_config, render_card

    c = card_from_hf_config(tiny("qwen3", num_attention_heads=8, num_key_value_heads=2, head_dim=32), name="q3")
    assert (c["qk_norm"], c["attention"], c["group_size"], c["sliding_layers"]) == (True, "GQA", 4, 0)
    text = render_card(c)
    assert "GQA, 2 KV heads shared by groups of 4 query heads" in text and "QK-norm" in text
    assert "8 heads × 32 = 256 ≠ d_model 64" in text and "soft-capping" not in text


def test_shipped_cards_keep_their_lines():
    """The two shipped models' cards: the old lines, unchanged; new lines only where true."""
    from headscope.probes.models.card import render_card

    mini = render_card(model_card("minilm-l6"))
    assert mini.splitlines()[-2:] == [
        "KV cache        18.0 KiB per token (fp32); 9.0 MiB at context 512",
        "                (an encoder keeps no cache when it runs; the figure is what one would hold)",
    ]
    assert not any(w in mini for w in ("sliding", "QK-norm", "soft-capping", "16-bit"))
    smol = model_card("smollm2-135m")
    assert (smol["sliding_layers"], smol["qk_norm"], smol["kv_cache_bytes_at_context"]) == (0, False, 377487360)
    assert render_card(smol).splitlines()[-2:] == [
        "KV cache        45.0 KiB per token (fp32); 360.0 MiB at context 8,192 (0.33× an MHA model of the same shape)",
        "KV cache 16-bit 1,024: 22.5 MiB; 4,096: 90.0 MiB; 8,192 (max): 180.0 MiB (fp16/bf16)",
    ]
