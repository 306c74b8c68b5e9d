"""What a GGUF file says that transformers' GGUF reader does not read, read by headscope.

transformers builds a Gemma 2/3 model from a GGUF with its config class's defaults for the
soft-caps and the query scale (50, 30, 256), and every family without its scaled RoPE (Gemma 3's
linear scaling on the global layers; yarn; Llama 3's, which llama.cpp stores only as a ``rope_freqs``
tensor of per-frequency factors). A model so built computes other logits than the one the file
holds. headscope reads these from the metadata (the query scale as llama.cpp derives it: d_model
/ heads on the 27B models, d_head on the others) and writes them into the cached ``config.json``
that every backend loads.

Each case is a tiny random model from transformers' own config class, written as a GGUF the way
llama.cpp's converter writes it (:mod:`gguf_writer`). Figures asserted: the cached model's
logits equal the source model's (≤ 1e-4; 0.0 measured), while transformers' own reading of the
same file is off by more than 0.05 (0.27 to 9.5 measured): if a transformers release reads these
fields itself, that assertion says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("gguf")

from gguf_writer import write_tiny_gguf  # noqa: E402

from headscope.probes.errors import ModelIncompatibleError  # noqa: E402
from headscope.probes.models.arch import arch_from_hf_config  # noqa: E402
from headscope.probes.models.gguf import gguf_as_hf_dir, gguf_hf_config  # noqa: E402

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}
GEMMA3_LINEAR = {
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
}
QWEN_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "rope_theta": 10000.0}
#: name -> (writer family, config overrides, what the cached config must say)
CASES = {
    # 2 layers, caps 20/15, query scale = d_head (16): the shape of Gemma 2 2B/9B
    "gemma2": (
        "gemma2",
        {},
        {"attn_logit_softcapping": 20.0, "final_logit_softcapping": 15.0, "query_pre_attn_scalar": 16},
    ),
    # 6 layers (5 sliding, 1 global) with linear RoPE scaling ×8 on the global one: Gemma 3 4B and up
    "gemma3-4b": (
        "gemma3",
        {"num_hidden_layers": 6, "rope_parameters": GEMMA3_LINEAR},
        {"query_pre_attn_scalar": 16, "rope_parameters": GEMMA3_LINEAR},
    ),
    # yarn ×4 from an original context of 512 (Qwen2.5's long-context setting, scaled down)
    "qwen2-yarn": (
        "qwen2",
        {"rope_parameters": QWEN_YARN, "max_position_embeddings": 2048},
        {"rope_parameters": QWEN_YARN},
    ),
    # Llama 3.1's RoPE, which the file holds only as rope_freqs (d_head 16: 4 factors of 1, 1 between, 3 of 8)
    "llama3.1": (
        "llama",
        {"rope_parameters": LLAMA3, "max_position_embeddings": 16384},
        {"rope_parameters": LLAMA3},
    ),
}
#: llama.cpp's 27B models by layer count: queries scaled by d_model / heads (64 / 4 = 16), not d_head (32)
LARGE = {"gemma2": 46, "gemma3": 62}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> (GGUF path, source model); one HEADSCOPE_CACHE for the module."""
    root = tmp_path_factory.mktemp("gguf-metadata")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADSCOPE_CACHE", str(root / "cache"))
        out = {name: write_tiny_gguf(root / f"{name}.gguf", fam, **over) for name, (fam, over, _) in CASES.items()}
        yield out


@pytest.fixture(scope="module")
def ids():
    return torch.randint(5, 250, (2, 40), generator=torch.Generator().manual_seed(0))


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cached_model_is_the_one_the_file_holds(files, ids, name, monkeypatch):
    from transformers import AutoModelForCausalLM

    path, src = files[name]
    monkeypatch.setenv("HEADSCOPE_CACHE", str(path.parent / "cache"))
    folder = gguf_as_hf_dir(path)
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in CASES[name][2].items():
        assert cfg[key] == value, key
    ours = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    assert (_logits(ours, ids) - _logits(src, ids)).abs().max().item() <= 1e-4
    raw = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )
    assert (_logits(raw, ids) - _logits(src, ids)).abs().max().item() > 0.05  # what transformers alone builds


@pytest.mark.parametrize("name", sorted(CASES))
def test_metadata_alone_says_it(files, name):
    """The card's reader (no tensor dequantised) gives the same values."""
    path, src = files[name]
    hf = gguf_hf_config(path)
    for key, value in CASES[name][2].items():
        assert hf[key] == value, key
    arch = arch_from_hf_config(hf)
    expected = {"gemma2": "default", "gemma3-4b": "linear", "qwen2-yarn": "yarn", "llama3.1": "llama3"}
    assert arch.rope_type == expected[name]


@pytest.mark.parametrize("family", sorted(LARGE))
def test_the_27b_query_scale_as_llama_cpp_derives_it(family, tmp_path):
    """The file does not store the query scale; llama.cpp takes d_model / heads on the 27B
    models (told by their layer count) and d_head on the others: so does headscope, from the
    metadata alone (the cached config gets it through the same override as the cases above)."""
    path, src = write_tiny_gguf(
        tmp_path / "large.gguf", family, num_hidden_layers=LARGE[family], head_dim=32, query_pre_attn_scalar=16
    )
    assert gguf_hf_config(path)["query_pre_attn_scalar"] == src.config.query_pre_attn_scalar == 16
    path, src = write_tiny_gguf(tmp_path / "small.gguf", family, num_hidden_layers=LARGE[family] - 1, head_dim=32)
    assert gguf_hf_config(path)["query_pre_attn_scalar"] == 32


def test_the_card_says_the_scaled_rope_and_the_query_scale(files):
    from headscope.probes.models.card import model_card, render_card

    lines = {name: render_card(model_card(str(files[name][0]))).splitlines() for name in CASES}
    assert "RoPE            θ 500000, llama3 scaling ×8" in lines["llama3.1"]
    assert "RoPE            θ 10000, yarn scaling ×4" in lines["qwen2-yarn"]
    assert (
        "RoPE            θ 1e+06, linear scaling ×8 on the global layers; sliding layers θ 10000, unscaled"
        in lines["gemma3-4b"]
    )
    assert "soft-capping    attention logits capped at ±20 (cap·tanh(x/cap)); final logits at ±15" in lines["gemma2"]
    assert not any(line.startswith(("RoPE", "query scale")) for line in lines["gemma2"])


def test_default_backend_runs_the_file_right(files, ids, monkeypatch):
    """auto: the in-house stack takes Gemma's query scale and caps, and Llama 3's and Gemma 3's
    scaled RoPE; yarn goes to hf. Either way the logits are the source model's."""
    from headscope.probes.models.loading import load_model

    runs = (("gemma2", "inhouse"), ("gemma3-4b", "inhouse"), ("llama3.1", "inhouse"), ("qwen2-yarn", "hf"))
    for name, backend in runs:
        path, src = files[name]
        monkeypatch.setenv("HEADSCOPE_CACHE", str(path.parent / "cache"))
        model = load_model(str(path))
        assert model.backend == backend
        logits = model.forward(ids, torch.ones_like(ids))
        assert (logits - _logits(src, ids)).abs().max().item() <= 1e-4


def test_an_older_cache_is_brought_up_to_date(files, ids, tmp_path, monkeypatch):
    """A folder dequantised before headscope read these keys holds transformers' values: the
    next load puts the metadata's in, and says so in a sidecar that spares later loads the
    metadata."""
    from headscope.probes.models.gguf import cache

    path, _ = files["gemma2"]
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    config = gguf_as_hf_dir(path) / "config.json"
    sidecar = config.parent / cache.SETTLED_FILE
    caps = ["attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"]
    assert json.loads(sidecar.read_text())["from_metadata"] == caps
    cfg = json.loads(config.read_text())
    cfg.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=256)
    config.write_text(json.dumps(cfg))
    sidecar.unlink()  # what a folder cached by an earlier headscope looks like
    assert gguf_as_hf_dir(path) / "config.json" == config
    cfg = json.loads(config.read_text())
    assert [cfg[k] for k in caps] == [20.0, 15.0, 16]
    assert json.loads(sidecar.read_text())["from_metadata"] == caps
    monkeypatch.setattr(cache, "gguf_meta_config", lambda p: pytest.fail("metadata read again"))
    assert gguf_as_hf_dir(path) / "config.json" == config  # settled: the metadata is not read again


def test_rope_factors_that_are_not_llama3s_are_refused(tmp_path, monkeypatch):
    """A rope_freqs tensor whose factors no Llama 3 band reproduces (here low_freq_factor 2):
    never loaded with plain RoPE. Loading (and every command that loads) refuses it by name,
    in one line; the card, which reads sizes only, shows them and says why it cannot load."""
    odd = dict(LLAMA3, low_freq_factor=2.0)
    path, _ = write_tiny_gguf(tmp_path / "odd.gguf", "llama", rope_parameters=odd, max_position_embeddings=16384)
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelIncompatibleError, match="rope_freqs tensor .* is not Llama 3's RoPE scaling"):
        gguf_as_hf_dir(path)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HEADSCOPE_CACHE=str(tmp_path / "cache"))

    def cli(*argv):
        cmd = [sys.executable, "-m", "headscope.reports.cli", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)

    card = cli("card", str(path))
    assert card.returncode == 0, card.stderr
    assert "layers          2" in card.stdout
    assert "not loadable    its rope_freqs tensor (8 factors for d_rot 16) is not Llama 3's RoPE scaling" in card.stdout
    roles = cli("roles", str(path), "--out", str(tmp_path / "roles"), "--quiet")
    assert roles.returncode != 0
    last = roles.stderr.strip().splitlines()[-1]
    assert str(path) in last and "rope_freqs" in last
    assert not (tmp_path / "roles").exists()
