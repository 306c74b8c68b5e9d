"""Reliability: broken checkpoints, hostile pickles, bad inputs, numbers, memory guard,
reproducible outputs, crash-safe writes, hook hygiene and the CLI's error lines."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from headscope.probes.capture import capture, stream
from headscope.probes.errors import (
    CheckpointError,
    HeadscopeError,
    MemoryBudgetError,
    ModelIncompatibleError,
    NumericalError,
)
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.checkpoints import resolve
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.hooks import hooks
from headscope.probes.models.inhouse.transformer import Transformer
from headscope.probes.models.loading import load_model
from headscope.probes.outputs.atomic import write_frame
from headscope.reports.tools.bench.reducers import AttentionMassReducer

# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def minilm_parts(tmp_path_factory):
    """MiniLM's directory without its weights (config, tokenizer) and its state dict."""
    from safetensors.torch import load_file

    src = resolve("minilm-l6").path
    template = tmp_path_factory.mktemp("minilm_template")
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, template / f.name)
    return template, load_file(str(src / "model.safetensors"))


def _model_dir(parts, tmp_path, state=None, config_changes=None) -> Path:
    from safetensors.torch import save_file

    template, original = parts
    d = tmp_path / "model"
    shutil.copytree(template, d)
    save_file(original if state is None else state, str(d / "model.safetensors"))
    if config_changes:
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(config_changes)
        (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_intact_copy_loads_and_matches_the_shipped_model(minilm_parts, tmp_path, minilm, sentences):
    m = load_model(str(_model_dir(minilm_parts, tmp_path)))
    a = capture(m, sentences[:2])["pattern", 3]
    b = capture(minilm, sentences[:2])["pattern", 3]
    assert torch.equal(a, b)


def test_missing_tensor_is_named(minilm_parts, tmp_path):
    state = dict(minilm_parts[1])
    del state["encoder.layer.3.attention.self.key.weight"]
    with pytest.raises(
        CheckpointError, match=r"tensor 'blocks\.3\.attn\.k_proj\.weight' missing from checkpoint \(1 missing\)"
    ):
        load_model(str(_model_dir(minilm_parts, tmp_path, state)))


def test_extra_tensor_is_named(minilm_parts, tmp_path):
    state = dict(minilm_parts[1])
    state["encoder.layer.0.attention.self.rotary.weight"] = torch.zeros(3)
    # named after the in-house renaming of the HF prefixes it recognised
    with pytest.raises(
        CheckpointError,
        match=r"unexpected tensor 'blocks\.0\.attention\.self\.rotary\.weight' in checkpoint \(1 extra\)",
    ):
        load_model(str(_model_dir(minilm_parts, tmp_path, state)))


def test_config_shape_mismatch_names_first_tensor_and_both_shapes(minilm_parts, tmp_path):
    d = _model_dir(minilm_parts, tmp_path, config_changes={"intermediate_size": 1024})
    with pytest.raises(
        CheckpointError,
        match=r"'blocks\.0\.mlp\.down\.weight' has shape \(384, 1536\); the config implies \(384, 1024\)",
    ):
        load_model(str(d))


def test_truncated_safetensors_is_a_checkpoint_error(minilm_parts, tmp_path):
    d = _model_dir(minilm_parts, tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated safetensors"):
        load_model(str(d))


@pytest.mark.parametrize("keep", [0, 5, 40, 200, -1])
def test_safetensors_cut_anywhere_is_a_checkpoint_error(tmp_path, keep):
    """Empty file, inside the length prefix, inside the JSON header, inside the data, one byte short."""
    from safetensors.torch import save_file

    from headscope.probes.models.checkpoints import read_state_dict

    save_file(
        {"a.weight": torch.arange(64.0).reshape(8, 8), "b.bias": torch.ones(8)}, str(tmp_path / "model.safetensors")
    )
    data = (tmp_path / "model.safetensors").read_bytes()
    assert len(data) > 300
    (tmp_path / "model.safetensors").write_bytes(data[:keep])
    with pytest.raises(CheckpointError, match="model.safetensors: corrupt or truncated safetensors"):
        read_state_dict(tmp_path)


class _Payload:
    """Unpickling this would create a directory: proof that code ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_pickled_code_in_pytorch_model_bin_is_refused_and_never_runs(minilm_parts, tmp_path):
    d = _model_dir(minilm_parts, tmp_path)
    (d / "model.safetensors").unlink()
    marker = tmp_path / "code_ran"
    torch.save({"embeddings.word_embeddings.weight": _Payload(str(marker))}, d / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="only weights-only checkpoints are loaded"):
        load_model(str(d))
    assert not marker.exists()
    # the payload is live: a plain unpickle runs it
    pickle.loads(pickle.dumps(_Payload(str(marker))))
    assert marker.exists()


def test_directory_without_config_is_one_line(tmp_path, capsys):
    from headscope.reports.cli import app as cli

    (tmp_path / "weights.bin").write_bytes(b"\0")
    assert cli.main(["card", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("headscope: error: ") and "no config.json" in err


def test_unsupported_family_with_inhouse_backend_names_the_bridge(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "opt", "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8})
    )
    with pytest.raises(ModelIncompatibleError, match="bridge"):
        load_model(str(tmp_path), "inhouse")


# ----------------------------------------------------------------------------- inputs


def test_text_past_the_context_names_length_and_limit(minilm):
    with pytest.raises(ValueError, match=r"text 1 has 60\d tokens; the model's context is 512"):
        capture(minilm, ["Fine.", "word " * 600])


def test_empty_input_is_a_clear_error(minilm):
    with pytest.raises(ValueError, match="empty input"):
        capture(minilm, [])
    with pytest.raises(ValueError, match="empty text"):
        capture(minilm, ["   "])


# ----------------------------------------------------------------------------- numbers


def _check_rows(model, sentences):
    cap = capture(model, sentences)
    mask = cap.key_mask  # [batch, key_pos]
    n = mask.shape[1]
    allowed = mask[:, None, None, :].expand(-1, 1, n, n)
    if model.spec.causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    worst_sum, masked_max = 0.0, 0.0
    for layer in cap.layers:
        p = cap["pattern", layer]  # [batch, head, query_pos, key_pos]
        sums = (p * allowed).double().sum(-1)
        real_rows = mask[:, None, :].expand_as(sums)
        worst_sum = max(worst_sum, float((sums[real_rows] - 1).abs().max()))
        masked_max = max(masked_max, float(p.masked_select(~allowed.expand_as(p)).abs().max()))
    return cap, worst_sum, masked_max


def test_minilm_patterns_sum_to_one_and_padding_gets_zero(minilm, sentences):
    cap, worst_sum, masked_max = _check_rows(minilm, sentences)
    assert cap.tokens.lengths == [17, 9, 30, 4, 23]  # lengths of the padded batch (MiniLM WordPiece)
    assert worst_sum < 1e-5
    assert masked_max == 0.0


def test_smollm_causal_patterns_sum_to_one_and_future_and_padding_get_zero(smollm, sentences):
    cap, worst_sum, masked_max = _check_rows(smollm, sentences)
    assert max(cap.tokens.lengths) > 2 * min(cap.tokens.lengths)  # a genuinely padded batch
    assert worst_sum < 1e-5
    assert masked_max == 0.0


def test_nan_weight_is_reported_with_layer_and_head(minilm):
    cfg = ModelConfig(family="bert", n_layers=2, d_model=32, n_heads=4, vocab_size=minilm.cfg.vocab_size)
    module = Transformer(cfg)
    module.init_weights(seed=0)
    tiny = InHouseModel(module, minilm.tokenizer, name="tiny")
    assert capture(tiny, ["A clean run."])["pattern", 1].isfinite().all()
    with torch.no_grad():
        module.blocks[1].attn.q_proj.weight[2 * 8 + 3, 5] = float("nan")  # a row of head 2 in layer 1
    with pytest.raises(NumericalError, match=r"layer 1, head 2\b"):
        capture(tiny, ["A clean run."])


def test_memory_budget_refuses_before_running(minilm, sentences):
    calls = []
    hp = minilm.module.hook_points["blocks.0.hook_resid_pre"]
    with hooks([(hp, lambda t, name: calls.append(name))]):
        with pytest.raises(MemoryBudgetError, match=r"over the budget"):
            capture(minilm, sentences, memory_budget=1 << 16)
        assert calls == []
        capture(minilm, sentences[:1], memory_budget=1 << 26)
    assert calls == ["blocks.0.hook_resid_pre"]


# ----------------------------------------------------------------------------- outputs


def test_same_inputs_give_byte_identical_csv(minilm, sentences, tmp_path):
    paths = []
    for run in range(2):
        torch.manual_seed(run)  # nothing in the pipeline may depend on the global RNG
        r = AttentionMassReducer()
        stream(minilm, sentences[:3], [r], batch_size=3)
        csv, _ = write_frame(r.result(), tmp_path / f"run{run}")
        paths.append(csv)
    a, b = paths[0].read_bytes(), paths[1].read_bytes()
    assert a == b
    assert len(a.splitlines()) == 1 + 6 * 12 * 2  # header + (layer, head, metric) rows


_WRITER = """
import sys, numpy as np, pandas as pd
from headscope.probes.outputs.atomic import write_frame
rng = np.random.default_rng(0)
df = pd.DataFrame({c: rng.random(3_000_000) for c in "abcd"})
print("writing", flush=True)
write_frame(df, sys.argv[1])
print("done", flush=True)
"""


def test_killed_writer_leaves_the_previous_complete_file(tmp_path):
    stem = tmp_path / "frame"
    previous = pd.DataFrame({"a": [1.5, 2.5], "b": ["x", "y"]})
    write_frame(previous, stem)
    before = (tmp_path / "frame.csv").read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(stem)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        deadline = time.time() + 60
        while not list(tmp_path.glob(".frame.csv.*.tmp")) and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        partial = list(tmp_path.glob(".frame.csv.*.tmp"))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert partial, "the writer was not caught mid-write"
    assert (tmp_path / "frame.csv").read_bytes() == before
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "frame.parquet"), previous)


def test_killed_writer_with_no_previous_file_leaves_none(tmp_path):
    stem = tmp_path / "frame"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(stem)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    visible = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert visible in ([], ["frame.csv"], ["frame.csv", "frame.parquet"])
    if visible:  # the write won the race: then the file is complete
        assert len(pd.read_csv(tmp_path / "frame.csv")) == 3_000_000


def _cli(*args: str) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen(
        [sys.executable, "-m", "headscope.reports.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def _readable_tables(folder: Path) -> dict[str, int]:
    """Rows of every visible table in ``folder``; CSV and Parquet of one frame must agree."""
    rows = {}
    for csv in sorted(folder.glob("*.csv")):
        n = len(pd.read_csv(csv))
        assert len(pd.read_parquet(csv.with_suffix(".parquet"))) == n, csv
        rows[csv.stem] = n
    return rows


@pytest.mark.slow
def test_pruning_run_killed_mid_curve_resumes_to_the_uninterrupted_tables(minilm, tmp_path):
    from headscope.analyses.pruning.study import PruneConfig, pruning_study

    out = tmp_path / "killed"
    args = [
        "prune",
        "minilm-l6",
        "--quick",
        "--studies",
        "curves",
        "--orders",
        "random",
        "--seeds",
        "1",
        "--step",
        "0.02",
        "--out",
        str(out),
    ]
    proc = _cli(*args)
    try:
        deadline = time.time() + 300
        rows = 0
        while rows < 12 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
            try:
                rows = json.loads((out / "state.json").read_text())["rows"].get("curves", 0)
            except (OSError, ValueError, KeyError):
                pass  # not written yet (a reader never sees half a file: it is renamed into place)
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it was killed: {proc.stderr.read()[-500:]}"
    state = json.loads((out / "state.json").read_text())
    assert not state["complete"] and state["rows"]["curves"] >= 12
    tables = _readable_tables(out)
    assert tables["curves"] >= state["rows"]["curves"]  # rows past the committed count are dropped on resume
    assert not (out / "run.json").exists()  # a finished run's marker, absent

    cfg = PruneConfig(step=0.02, orders=("random",), n_random_seeds=1, quick=True, studies=("curves",))
    resumed = pruning_study(minilm, cfg, out)
    fresh = pruning_study(minilm, cfg, tmp_path / "fresh")
    assert resumed.complete and fresh.complete
    for name in ("curves", "curve_summary", "prunable", "baseline"):
        assert (out / f"{name}.csv").read_bytes() == (tmp_path / "fresh" / f"{name}.csv").read_bytes(), name
    assert len(resumed.frames["curves"]) > state["rows"]["curves"]


@pytest.mark.slow
def test_report_killed_mid_stage_leaves_the_previous_report_untouched(tmp_path):
    out = tmp_path / "report"
    (out / "tables").mkdir(parents=True)
    (out / "run.json").write_text('{"output": {"kind": "report", "format": 1}, "model": "previous"}')
    (out / "report.html").write_text("<p>previous complete report</p>")
    write_frame(pd.DataFrame({"a": [1]}), out / "tables" / "roles")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = _cli("report", "minilm-l6", "--out", str(out))
    lines = []
    try:
        for line in proc.stderr:  # not a terminal: one plain line per stage
            lines.append(line.strip())
            if line.startswith("headscope: text started"):  # the first roles stage
                time.sleep(3)
                break
    finally:
        _kill(proc)
    assert lines[-1] == "headscope: text started" and "headscope: load done" in " ".join(lines), lines
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    # the killed run's lock file may stay; its lock died with the process: the next claim takes it and removes it
    assert sorted(p.name for p in tmp_path.iterdir()) in (["report"], [".report.lock", "report"])
    from headscope.probes.outputs.folder import claim_output

    with claim_output(out, "report"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_stale_folders_of_killed_report_runs_are_recovered(tmp_path):
    from headscope.reports.pipeline import recover_out

    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(proc.stdout)  # a pid that has exited
    out = tmp_path / "report"
    old = tmp_path / f"report.old-{dead}"  # killed between moving the old report aside and renaming the new one in
    old.mkdir()
    (old / "run.json").write_text('{"output": {"kind": "report", "format": 2}}')  # an earlier report
    half = tmp_path / f"report.tmp-{dead}"  # killed while writing: carries the staging marker headscope writes
    (half / "tables").mkdir(parents=True)
    marker = {"headscope": "staging", "kind": "report", "out": "report", "pid": dead}
    (half / ".headscope-staging").write_text(json.dumps(marker))
    mine = tmp_path / f"report.tmp-{os.getpid()}"  # a live run's folder is left alone
    mine.mkdir()
    done = recover_out(out)
    assert (out / "run.json").exists() and not old.exists() and not half.exists() and mine.exists()
    assert len(done) == 2 and done[0].startswith(f"restored the previous output {out}")
    assert recover_out(out) == []


# ----------------------------------------------------------------------------- hooks


def test_no_hook_survives_an_exception_inside_a_hook(minilm, sentences):
    def boom(t, name):
        raise RuntimeError(f"hook failed at {name}")

    hp = minilm.module.hook_points["blocks.2.attn.hook_pattern"]
    with pytest.raises(RuntimeError, match="blocks.2.attn.hook_pattern"):
        with hooks([(hp, boom), (minilm.module.hook_points["blocks.4.attn.hook_z"], lambda t, n: None)]):
            minilm.run(minilm.encode(texts=sentences[:2]), ["pattern"])
    assert not any(h.active for h in minilm.module.hook_points.values())

    class Failing:
        def update(self, cap):
            raise RuntimeError("reducer failed")

    with pytest.raises(RuntimeError, match="reducer failed"):
        stream(minilm, sentences, [Failing()], quantities=["pattern", "z"])
    assert not any(h.active for h in minilm.module.hook_points.values())
    # and the model still computes the same patterns afterwards
    fresh = capture(minilm, sentences[:1])["pattern", 2]
    assert fresh.isfinite().all() and float(fresh.sum(-1).min()) > 0.99999


# ----------------------------------------------------------------------------- CLI


def test_cli_unknown_model_is_one_line_naming_the_known_models(capsys):
    from headscope.reports.cli import app as cli

    assert cli.main(["card", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("headscope: error: unknown model 'nope'")
    assert "minilm-l6" in err and "smollm2-135m" in err
    with pytest.raises(
        HeadscopeError, match="unknown model 'nope'"
    ):  # --debug: the exception (traceback) comes through
        cli.main(["--debug", "card", "nope"])
