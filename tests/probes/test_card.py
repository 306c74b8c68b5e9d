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
