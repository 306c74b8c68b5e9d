"""Weights read lazily from the checkpoint (#28 part 4): the same matrices as the loaded model,
one tensor at a time, and a peak memory that does not grow with the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from headscope.analyses.circuits.weights.composition import composition_scores
from headscope.analyses.circuits.weights.ov_qk import head_circuits
from headscope.probes.errors import CheckpointError
from headscope.probes.models.inhouse.head_weights import head_weights
from headscope.probes.models.lazy_weights import lazy_weights
from headscope.probes.models.loading import load_model
from headscope.reports.tools.bench.weights_paths import write_random_checkpoint
from tests.tiny_models import tiny_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "probes"))
from gguf_writer import write_tiny_gguf  # noqa: E402


def _assert_same_matrices(a, b):
    assert (a.n_layers, a.d_model, a.d_head, a.vocab_size) == (b.n_layers, b.d_model, b.d_head, b.vocab_size)
    assert (a.folding, a.unembedding, a.positional) == (b.folding, b.unembedding, b.positional)
    for layer in range(a.n_layers):
        la, lb = a.layer(layer), b.layer(layer)
        assert la.heads == lb.heads
        for f in ("kv_index", "W_Q", "W_K", "W_V", "W_O"):
            assert torch.equal(getattr(la, f), getattr(lb, f)), (layer, f)
    assert torch.equal(a.W_E, b.W_E) and torch.equal(a.W_U, b.W_U)
    blocks = list(b.vocab_chunks(7))
    assert torch.equal(torch.cat([e for e, _ in blocks]), a.W_E)
    assert torch.equal(torch.cat([u for _, u in blocks], 1), a.W_U)


# llama: GQA; gpt2: fused Conv1D c_attn, learned positions; phi3: fused qkv_proj; gemma2: (1 + w)
# norms and the embedding scale; bert: an encoder (post-norm, no unembedding)
@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3", "gemma2", "bert"])
def test_lazy_safetensors_equal_the_loaded_model(tmp_path, family):
    folder = tiny_model_dir(tmp_path, family)
    lazy = lazy_weights(str(folder))
    _assert_same_matrices(head_weights(load_model(str(folder), backend="inhouse")), lazy)
    assert lazy.reader.startswith("safetensors, read lazily")
    if family == "gpt2":
        assert torch.equal(lazy.W_pos, head_weights(load_model(str(folder), backend="inhouse")).W_pos)


@pytest.mark.parametrize("family", ["llama", "gemma2"])  # llama.cpp's permuted q/k rows; Gemma's stored 1 + w
def test_lazy_gguf_equals_the_loaded_model(tmp_path, family):
    path, _ = write_tiny_gguf(tmp_path / f"{family}.gguf", family)
    lazy = lazy_weights(str(path))
    _assert_same_matrices(head_weights(load_model(str(path), backend="inhouse")), lazy)
    assert lazy.reader.startswith("GGUF, dequantised one tensor at a time")


def test_weights_command_reads_lazily_and_figures_equal_the_loaded_model(tmp_path):
    from headscope.reports.cli.app import main

    folder = tiny_model_dir(tmp_path / "m", "llama")
    out = tmp_path / "w"
    assert main(["weights", str(folder), "--out", str(out), "--draws", "7", "--null", "9", "--quiet"]) == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["reader"].startswith("safetensors, read lazily") and meta["bytes_read"] > 0
    loaded = head_weights(load_model(str(folder), backend="inhouse"))
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "heads.parquet"), head_circuits(loaded, n_draws=7), check_categorical=False
    )
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "composition.parquet"), composition_scores(loaded, n_null=9), check_categorical=False
    )


def _sharded(tmp_path, **shape):
    return write_random_checkpoint(tmp_path / "ckpt", shard_bytes=16 << 10, **shape)


def test_sharded_checkpoint_refusals_name_the_file_and_tensor(tmp_path):
    folder = _sharded(tmp_path, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_mlp=32, vocab_size=300)
    assert len(list(folder.glob("*.safetensors"))) > 1
    w = lazy_weights(str(folder))
    assert w.reader.endswith("model.safetensors.index.json") and w.layer(1).W_K.shape == (2, 64, 16)
    index = folder / "model.safetensors.index.json"
    table = json.loads(index.read_text())
    shard = table["weight_map"]["model.layers.1.self_attn.k_proj.weight"]
    renamed = folder / (shard + ".moved")
    (folder / shard).rename(renamed)
    with pytest.raises(CheckpointError, match=rf"shard '{shard}' \(holding tensor 'model\.layers\.\d\..*missing"):
        lazy_weights(str(folder))
    renamed.rename(folder / shard)
    # a config whose sizes are not the tensors': the loader's own check, before any tensor is read
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 4}))
    with pytest.raises(
        CheckpointError, match=r"index\.json: tensor 'blocks\.0\.attn\.k_proj\.weight' has shape \(32, 64\)"
    ):
        lazy_weights(str(folder))


def test_lazy_reader_refuses_a_pickle_checkpoint(tmp_path):
    from tests.tiny_models import tiny_hf_model

    model, _ = tiny_hf_model("llama")
    model.config.save_pretrained(tmp_path / "bin")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="no safetensors or GGUF weights to read lazily"):
        lazy_weights(str(tmp_path / "bin"))


_CHILD = r"""
import gc, json, sys
from headscope.analyses.circuits.weights.composition import composition_scores
from headscope.analyses.circuits.weights.ov_qk import head_circuits
from headscope.probes.models.inhouse.head_weights import head_weights
from headscope.probes.models.inhouse.planted import planted_model
from headscope.probes.models.lazy_weights import lazy_weights

def kib(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

w0 = head_weights(planted_model())
head_circuits(w0, n_draws=5), composition_scores(w0, n_null=5)  # every kernel and library loaded first
out = {}
for what in ("heads", "composition"):
    w = lazy_weights(sys.argv[1])
    gc.collect()
    base = kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS: the peak from here on
    if what == "heads":
        head_circuits(w, n_draws=20)
    else:
        composition_scores(w, n_null=20, max_held_bytes=int(sys.argv[2]))
    out[what] = {"grew": kib("VmHWM") - base, "bytes_read": w.source.bytes_read}
print(json.dumps(out))
"""


@pytest.mark.slow  # ~60 s on the loaded 2-core machine: a 118 MB checkpoint written, two analyses in a child
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_peak_memory_of_a_sharded_checkpoint_stays_at_a_few_layers(tmp_path):
    """Peak RSS of the per-head and composition analyses on a sharded bf16 checkpoint, measured in
    a fresh process from its RSS after imports and a warm-up (``/proc/self/clear_refs`` resets the
    peak). glibc keeps freed blocks for reuse (headscope's ``tune_allocator`` even asks it to), which
    would make the peak depend on the allocator's history rather than on what the code holds; the
    child sets ``MALLOC_MMAP_THRESHOLD_`` so every block over 64 KiB is its own mapping, returned on
    free: its peak RSS is then the peak of the memory the analyses hold, on any Linux machine.

    The bound: two layers' attention weights as read (float32), the same again twice over as the
    float64 working copies of one layer's products, two blocks of embedding rows, one block of
    Gaussian draws, and 16 MiB of slack; composition adds its held senders (two layers' worth here,
    and their float64 copy) and its null's three blocks. The whole model in float32 is several
    times larger, and so is any reader that holds every layer or the whole embedding."""
    from headscope.analyses.circuits.weights import composition as C
    from headscope.analyses.circuits.weights import ov_qk as O

    shape = dict(n_layers=8, d_model=1024, n_heads=16, n_kv_heads=4, d_mlp=256, vocab_size=16384)
    folder = write_random_checkpoint(tmp_path / "ckpt", shard_bytes=24 << 20, **shape)
    assert len(list(folder.glob("*.safetensors"))) >= 4
    d, k = shape["d_model"], shape["d_model"] // shape["n_heads"]
    layer = 4 * d * (2 * shape["n_heads"] * k + 2 * shape["n_kv_heads"] * k)  # float32 W_Q, W_K, W_V, W_O
    senders = 2 * 4 * shape["n_heads"] * k * d  # two layers' sender factors, float32
    whole = 4 * (shape["n_layers"] * (layer // 4 + 3 * d * shape["d_mlp"] + 2 * d) + 2 * shape["vocab_size"] * d)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder), str(senders)], capture_output=True, text=True, env=env, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    slack = 16 << 20
    heads_bound = 2 * layer + 2 * 2 * layer + 2 * O.VOCAB_CHUNK_BYTES + O.DRAW_BLOCK_BYTES + slack
    null = 3 * 20 * d * k * 8
    comp_bound = heads_bound + 3 * senders + null
    assert got["heads"]["grew"] <= heads_bound, (got, heads_bound)
    assert got["composition"]["grew"] <= comp_bound, (got, comp_bound)
    assert whole >= 2.5 * heads_bound and whole >= 1.5 * comp_bound  # a reader holding it all would fail
    # what was read: each layer's attention and input norm once, the final norm and both embeddings,
    # never an MLP weight; composition re-reads the later layers once per block of held senders
    emb = 2 * 4 * shape["vocab_size"] * d
    assert got["heads"]["bytes_read"] == shape["n_layers"] * (layer + 4 * d) + 4 * d + emb
    assert got["composition"]["bytes_read"] > shape["n_layers"] * layer
    assert C.NULL_BLOCK_BYTES > 0


def test_lazy_gguf_parses_the_file_once(tmp_path, monkeypatch):
    """The config and the tensors share one parse of the GGUF metadata (SmolLM2's took ~10 s
    twice), and nothing is kept afterwards: a later open parses again."""
    import gguf

    path, _ = write_tiny_gguf(tmp_path / "llama.gguf", "llama")
    parsed = []

    class Counting(gguf.GGUFReader):
        def __init__(self, file, *args, **kwargs):
            parsed.append(str(file))
            super().__init__(file, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    w = lazy_weights(str(path))
    assert parsed == [str(path)]
    assert tuple(w.layer(0).W_Q.shape)[0] == w.cfg.n_heads  # the kept reader reads the tensors
    lazy_weights(str(path))
    assert len(parsed) == 2


@pytest.mark.slow  # a subprocess that imports headscope: ~10 s idle, 36 s at load 9
def test_large_checkpoint_case_on_a_small_shape_records_its_figures(tmp_path):
    """The bench's 8B-shaped case, on a small shape: written, timed in a subprocess, its peak RSS
    measured, and its figures recorded for the README (data/figures/bench_weights.json's format)."""
    from headscope.reports.tools.bench.weights_paths import figures_doc, large_checkpoint_case

    shape = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_mlp=128, vocab_size=300)
    row = large_checkpoint_case(tmp_path / "ckpt", write=True, draws=5, shape=shape)
    assert row["rows"] == 2 * 4 * 4  # layers × heads × statistics (the omitted positional share included)
    assert row["met"] and 0 < row["peak_rss_mb"] <= row["target_mb"]
    doc = figures_doc(row, load_before=[1.0, 1.0, 1.0], load_after=None, shape=shape)
    assert set(doc["quoted"]) == {f"large_checkpoint.{k}" for k in doc["figures"]["large_checkpoint"]}
    assert doc["figures"]["large_checkpoint"]["rows"]["text"] == "32 rows"
