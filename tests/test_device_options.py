"""--device / --dtype / --device-map, batch sizes bounded by device memory, Ray GPU options,
and the GPU check's dry run — everything of issue 17 that a machine without a GPU can test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from headscope.probes import capture as capture_mod
from headscope.probes.capture import WORK_ACTIVATIONS, WORK_CELLS, buckets, max_batch, stream
from headscope.probes.errors import MemoryBudgetError
from headscope.probes.models.backends.protocol import placement
from headscope.probes.models.loading import load_model
from headscope.reports.cli.app import main
from headscope.reports.cli.argtypes import resolve_device
from tests.tiny_models import tiny_hf_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def llama():
    hf, tok = tiny_hf_model("llama")
    return hf, tok


# ----------------------------------------------------------------------------- --device


def test_resolve_device_auto_is_the_cpu_without_cuda():
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "cpu:1", "", "mps"])
def test_resolve_device_names_what_it_expects(bad):
    with pytest.raises(ValueError, match="--device must be auto, cpu, cuda or cuda:N"):
        resolve_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("cmd", ["roles", "prune", "report", "capture", "bench"])
def test_cuda_asked_without_cuda_is_one_line_and_exit_2(cmd, capsys, tmp_path):
    argv = [cmd, "minilm-l6", "--device", "cuda"]
    if cmd in ("roles", "prune", "report"):
        argv += ["--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "CUDA is not available on this machine" in err, err
    assert not (tmp_path / "o").exists()


def test_every_model_command_takes_device_and_dtype(capsys):
    for cmd in ("roles", "prune", "report", "capture", "bench"):
        assert main([cmd, "--help"]) == 0
        text = capsys.readouterr().out
        assert "--device" in text and "--dtype" in text, cmd
    for cmd in ("roles", "prune", "report"):
        assert main([cmd, "--help"]) == 0
        assert "--device-map" in capsys.readouterr().out, cmd


def test_bad_dtype_is_refused_by_argparse(capsys):
    assert main(["roles", "--dtype", "fp8"]) == 2
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- load_model


@pytest.mark.parametrize(
    ("dtype", "torch_dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_load_model_places_inhouse_in_the_dtype(llama, dtype, torch_dtype):
    hf, tok = llama
    m = load_model(hf, "inhouse", tokenizer=tok, dtype=dtype, device="cpu")
    assert {p.dtype for p in m.module.parameters()} == {torch_dtype}
    assert placement(m) == {"device": "cpu", "dtype": dtype}
    out = m.run(m.encode(["The cat sat on the mat."]), ("pattern",), [0])
    pattern = out["pattern", 0]
    assert pattern.dtype == torch_dtype
    # softmax runs in fp32 and is cast once: every row still sums to 1 within the dtype's rounding
    tol = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 2e-3}[dtype]
    assert (pattern.float().sum(-1) - 1).abs().max() < tol


def test_hf_backend_takes_the_dtype_from_a_checkpoint(tmp_path, llama):
    from tests.tiny_models import tiny_model_dir

    folder = tiny_model_dir(tmp_path, "llama")
    m = load_model(str(folder), "hf", dtype="bf16")
    assert next(m.hf.parameters()).dtype == torch.bfloat16 and placement(m)["dtype"] == "bf16"
    ref = load_model(str(folder), "hf")
    batch = ref.encode(["The cat sat on the mat."])
    a, b = ref.run(batch, ("pattern",), [1])["pattern", 1], m.run(batch, ("pattern",), [1])["pattern", 1]
    gap = float((a - b.float()).abs().max())
    assert 0 < gap < 0.05, gap


def test_bridge_refuses_a_16_bit_dtype(tmp_path):
    from tests.tiny_models import tiny_model_dir

    with pytest.raises(ValueError, match="bridge backend runs in float32"):
        load_model(str(tiny_model_dir(tmp_path, "llama")), "bridge", dtype="bf16")


def test_device_map_needs_the_hf_backend_and_a_known_map(llama):
    hf, tok = llama
    with pytest.raises(ValueError, match="device_map='balanced' .*|device_map must be 'auto'"):
        load_model("minilm-l6", "hf", device_map="balanced")
    with pytest.raises(ValueError, match="needs the hf backend"):
        load_model("minilm-l6", "inhouse", device_map="auto")
    with pytest.raises(ValueError, match="not both"):
        load_model("minilm-l6", "hf", device_map="auto", device="cpu")


def test_device_map_without_accelerate_names_the_package(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_accelerate(name, *a, **kw):
        if name == "accelerate":
            raise ImportError("No module named 'accelerate'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_accelerate)
    with pytest.raises(ImportError, match="needs the accelerate package.*pip install accelerate"):
        load_model("minilm-l6", "hf", device_map="auto")


def test_roles_run_json_records_device_and_dtype(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["roles", "minilm-l6", "--roles", "positional", "--device", "cpu", "--out", str(out), "--quiet"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert (run["device"], run["dtype"], run["device_map"]) == ("cpu", "fp32", None)


# ----------------------------------------------------------------------------- memory-bounded batches


def test_max_batch_is_the_largest_batch_that_fits():
    kw = dict(n_heads=8, d_model=64, kept_layers=2, bytes_per=2)
    per_item = 2 * (8 * 100 * 100 * (2 + WORK_CELLS) + WORK_ACTIVATIONS * 100 * 64)
    free = 10 * per_item + per_item // 2
    n = max_batch(100, free_bytes=free, headroom=1.0, **kw)
    assert n == 10
    assert max_batch(100, free_bytes=per_item, headroom=1.0, **kw) == 1
    with pytest.raises(MemoryBudgetError, match="one item of 100 tokens needs"):
        max_batch(100, free_bytes=per_item - 1, headroom=1.0, **kw)
    with pytest.raises(ValueError, match="n_pos must be a positive int"):
        max_batch(0, free_bytes=free, **kw)


def test_stream_on_a_gpu_sizes_batches_by_free_memory_and_on_cpu_by_count(llama, monkeypatch):
    hf, tok = llama
    model = load_model(hf, "inhouse", tokenizer=tok)
    texts = ["The cat sat on the mat."] * 40
    assert stream(model, texts, [], batch_size=8).n_batches == 5  # the CPU: the fixed count, as before
    # a device with room for 3 items of this length per forward (the CPU stands in for it)
    n = len(tok("The cat sat on the mat.")["input_ids"])
    spec = model.spec
    per_item = 4 * (spec.n_heads * n * n * (spec.n_layers + WORK_CELLS) + WORK_ACTIVATIONS * n * spec.d_model)
    monkeypatch.setattr(capture_mod, "device_free_bytes", lambda device: int(3.5 * per_item / 0.8))
    rep = stream(model, texts, [], batch_size=8)
    assert rep.n_batches > 5  # memory, not the count of 8, bounds each batch
    assert rep.n_used == 40
    monkeypatch.setattr(capture_mod, "device_free_bytes", lambda device: per_item // 2)
    with pytest.raises(MemoryBudgetError, match="one item of"):
        stream(model, texts, [], batch_size=8)


def test_buckets_keep_the_cpu_defaults():
    assert buckets([5, 2, 9, 3, 2], max_batch=2) == [[1, 4], [3, 0], [2]]


def test_oom_item_is_one_line_on_the_cli(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(capture_mod, "device_free_bytes", lambda device: 1024)
    code = main(["roles", "minilm-l6", "--roles", "positional", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("headscope: error: one item of") and "\n" not in err


# ----------------------------------------------------------------------------- the GPU check


def test_gpu_check_dry_run_runs_every_step_on_the_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    proc = subprocess.run(
        [str(ROOT / ".ci" / "gpu-check"), "--dry-run"], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gpu-check: done" in proc.stdout
    result = json.loads((tmp_path / "gpu_bench.json").read_text())
    paths = {r["path"]: r for r in result["paths"]}
    assert set(paths) == {"forward", "capture", "grad_forward", "gate_grad", "capture_text", "roles_text"}
    assert all(r["seconds"] > 0 and r["tokens_per_s"] > 0 for r in paths.values())
    assert [t["target"] for t in result["targets"]] == [
        "forward >= 50% of bf16 peak",
        "capture / plain forward <= 1.1",
        "roles / capture from text <= 1.3",
        "gate-grad importance / forward <= 3",
    ]
    assert result["info"]["shapes"]["num_hidden_layers"] == 2 and result["info"]["device"] == "cpu"
    tests = (tmp_path / "gpu_tests.xml").read_text()
    assert 'skipped="' in tests and "needs CUDA" in tests  # the gpu tests ran and skipped with the reason
    plan = json.loads((tmp_path / "device_map_check.json").read_text())  # the device plan step, planned, no load
    assert [r["n_layers"] for r in plan["plan"]["devices"]] == [4, 4] and plan["equal"] is None


def test_gpu_check_refuses_an_unknown_flag():
    proc = subprocess.run([str(ROOT / ".ci" / "gpu-check"), "--fast"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown argument '--fast'" in proc.stderr
