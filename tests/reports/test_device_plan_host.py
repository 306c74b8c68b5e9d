"""The host's share of a ``--device-map auto`` run: a model larger than the host's memory is planned
when the GPUs named in ``--max-memory`` hold it (the host holds the process, the loader's tensors in
flight and the tokenizer: transformers reads each tensor straight to its device), and refused in one
line only when even that share does not fit. A Qwen2 config saved alone (no weights, the meta device)
and a patched memory status stand for the machine."""

from __future__ import annotations

import pytest

MiB = 1 << 20
#: the resident memory the patched status reports for this process
PROCESS = 100 * MiB
ARGV = ["--only", "roles", "--dry-run"]
GPUS = ["--device-map", "auto", "--max-memory", "0=400MiB,1=400MiB"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(
        "qwen2",
        num_hidden_layers=12,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=1024,
        vocab_size=2048,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    out = tmp_path_factory.mktemp("qwen2-host")
    cfg.save_pretrained(out)
    return out


def _host(monkeypatch, available: int) -> None:
    """A machine whose process holds :data:`PROCESS` and that has ``available`` bytes more."""
    monkeypatch.setattr("headscope.probes.budget._status", lambda: {"VmRSS": PROCESS})
    monkeypatch.setattr("headscope.probes.budget._cgroup_headroom", lambda: None)
    monkeypatch.setattr("headscope.probes.models.checkpoints.available_memory_bytes", lambda: available)
    monkeypatch.delenv("HEADSCOPE_MEMORY_LIMIT", raising=False)


def _expected_host(folder) -> int:
    """The host's share from the config alone: the process, 4 tensors in flight of the largest kind
    (here the 2048 x 256 embedding), read and cast (two float32 copies), the loader's extra, the tokenizer."""
    from headscope.probes.budget import LOADER_EXTRA, TOKENIZER_BYTES_PER_ENTRY

    return PROCESS + 4 * 2 * (2048 * 256) * 4 + LOADER_EXTRA + TOKENIZER_BYTES_PER_ENTRY * 2048


def test_a_model_larger_than_the_host_is_planned_when_the_gpus_hold_it(folder, monkeypatch, capsys):
    from headscope.reports.cli.app import main

    _host(monkeypatch, 100 * MiB)  # 200 MiB in all: the whole model's load (~240 MiB) does not fit
    assert main(["report", str(folder), *ARGV]) == 2
    err = capsys.readouterr().err.strip()
    assert "for loading the model" in err and "\n" not in err, err

    assert main(["report", str(folder), *ARGV, *GPUS]) == 0
    out = capsys.readouterr().out.splitlines()
    host = next(line for line in out if line.strip().startswith("host: ~"))
    want = _expected_host(folder)
    assert want < 200 * MiB
    assert f"~{want / MiB:.1f} MiB with the layers on the GPUs (200.0 MiB available)" in host, host
    assert any(line.strip().startswith("cuda:1 ") for line in out)  # the layers went to the GPUs


def test_a_host_too_small_for_its_share_is_refused_in_one_line(folder, monkeypatch, capsys):
    from headscope.reports.cli.app import main

    _host(monkeypatch, 20 * MiB)  # 120 MiB: less than the host's ~157 MiB share
    assert main(["report", str(folder), *ARGV, *GPUS]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--device-map auto: the host needs ~0.15 GiB" in err, err
    assert "with the layers on the GPUs, more than the 0.12 GiB this run may use (MemAvailable)" in err, err


def test_run_json_keeps_the_host_share(folder, monkeypatch):
    """The report's runner records the host's share beside the plan (``memory.host``)."""
    from headscope.reports.budget import plan
    from headscope.reports.device_plan import check_host, plan_run
    from headscope.reports.stages.config import RunConfig
    from headscope.reports.stages.runner import open_context

    _host(monkeypatch, 100 * MiB)
    config = RunConfig(device_map="auto", max_memory={0: 400 * MiB, 1: 400 * MiB})
    ctx, _ = open_context(str(folder), config)
    budget = plan("report", ctx.shape, [], refuse=False)
    placed, _ = plan_run(ctx, budget, config)
    rec = check_host(placed, budget)
    assert rec["estimate_bytes"] == _expected_host(folder) and rec["parts"]["weights on the host"] == 0
    assert budget.record()["host"] == rec
