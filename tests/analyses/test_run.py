"""One run of the analyses (analyses/run.py): its MODEL is resolved once, and the card, the
weights' hash and the load all take that source."""

from __future__ import annotations

from headscope.analyses.run import RunConfig, open_model
from headscope.probes.models import checkpoints


def test_a_run_resolves_its_model_once(monkeypatch):
    calls = []
    real = checkpoints._package_path

    def counted(name):
        calls.append(name)
        return real(name)

    monkeypatch.setattr(checkpoints, "_package_path", counted)
    opened = open_model("minilm-l6", RunConfig())
    assert calls == ["minilm-l6"]  # card, hash and load share one resolved source (was 3 lookups)
    assert opened.card["layers"] == 6 and opened.model_file["name"] == "model.safetensors"
    assert len(opened.model_file["sha256"]) == 64
    assert opened.model.spec.n_heads == 12
