"""A BERT-family checkpoint with ``position_embedding_type`` relative_key / relative_key_query:
transformers 5 no longer implements them and builds absolute positions instead, without a
word. Every backend that goes through transformers would then analyse another model than
the checkpoint, with exit 0. headscope refuses such a folder in one line that blames
config.json, on every backend and under auto."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import tiny_model_dir

from headscope.reports.cli.app import main


def _relative(root, kind: str, *, with_tensor: bool):
    """A tiny BERT folder whose config says ``kind``; ``with_tensor`` adds the per-layer
    ``distance_embedding`` that a checkpoint saved by transformers 4 with that option holds."""
    folder = tiny_model_dir(root / f"{kind}-{with_tensor}", "bert")
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["position_embedding_type"] = kind
    cfg_path.write_text(json.dumps(cfg))
    if with_tensor:
        weights = folder / "model.safetensors"
        state = load_file(weights)
        for l in range(cfg["num_hidden_layers"]):
            state[f"encoder.layer.{l}.attention.self.distance_embedding.weight"] = torch.randn(
                2 * cfg["max_position_embeddings"] - 1, cfg["hidden_size"] // cfg["num_attention_heads"]
            )
        save_file(state, weights, metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("kind, with_tensor", [("relative_key", False), ("relative_key_query", True)])
@pytest.mark.parametrize("backend", ["auto", "hf", "bridge", "inhouse"])
def test_relative_positions_are_refused_by_name(tmp_path_factory, capsys, kind, with_tensor, backend):
    folder = _relative(tmp_path_factory.mktemp("rel"), kind, with_tensor=with_tensor)
    capsys.readouterr()  # what saving the folder printed
    code = main(["capture", str(folder), "The cat sat.", "--backend", backend])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "internal error" not in err
    if backend == "inhouse":  # refused for its own reason before transformers is asked
        assert "position_embedding_type='relative'" in err, err
    else:
        assert kind in err and "config.json" in err and "absolute positions instead" in err, err


def test_absolute_positions_still_load(tmp_path, capsys):
    folder = tiny_model_dir(tmp_path, "bert")
    capsys.readouterr()
    assert main(["capture", str(folder), "The cat sat.", "--backend", "hf"]) == 0, capsys.readouterr().err
