"""``headscope circuit``: tables written on a tiny GQA Llama, bad budgets refused in one line,
items of unequal lengths skipped and counted."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from headscope.analyses.circuits.edges.evaluate import FAITHFULNESS_COLUMNS
from headscope.analyses.circuits.edges.study import STUDY_EDGE_COLUMNS
from headscope.reports.cli.app import main
from tests.tiny_models import tiny_model_dir


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("models"), "llama")


def test_circuit_writes_edges_and_faithfulness(llama_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["circuit", str(llama_dir), "--task", "induction", "--n-items", "4", "--seq-len", "4"]
    args += ["--budgets", "1", "0.1", "--steps", "2", "--seeds", "2", "--out", str(out)]
    assert main(args) == 0
    edges = pd.read_parquet(out / "edges.parquet")
    faith = pd.read_csv(out / "faithfulness.csv")
    assert list(edges.columns) == list(STUDY_EDGE_COLUMNS) and list(faith.columns) == list(FAITHFULNESS_COLUMNS)
    # 2 layers, 4 query heads, 2 KV heads: 8 attention receivers per layer
    assert len(edges) == 8 + 5 + 8 * 6 + 10 + 11 and edges["rank"].tolist() == list(range(1, len(edges) + 1))
    assert set(edges["via"]) == {"q", "k", "v", "mlp", "logits"}
    assert faith["budget"].tolist() == [0.1, 1.0]
    assert faith.loc[1, "faithfulness"] == pytest.approx(1.0, abs=1e-5)
    run = json.loads((out / "run.json").read_text())
    assert run["method"] == "eap-ig" and run["steps"] == 2 and run["n_edges_total"] == len(edges)
    assert "CPR" in capsys.readouterr().out


@pytest.mark.parametrize("budget", ["1.5", "-0.1"])
def test_a_budget_outside_0_1_is_refused_in_one_line(budget, capsys):
    assert main(["circuit", "no-such-model", "--budgets", budget]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "budget" in err[0] and budget in err[0]


def test_items_of_unequal_lengths_are_skipped_and_counted(llama_dir, tmp_path, capsys):
    rows = [
        {"clean_ids": [1, 5, 6, 5, 9], "corrupted_ids": [1, 7, 8, 5, 9], "answer_id": 6},
        {"clean_ids": [1, 5, 6, 5], "corrupted_ids": [1, 7, 8, 5, 9], "answer_id": 6},
        {"clean_ids": [1, 11, 12, 11], "corrupted_ids": [1, 13, 14, 11], "answer_id": 12},
    ]
    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["circuit", str(llama_dir), "--task", str(task), "--method", "eap", "--budgets", "0.5", "--seeds", "0"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "item 1 (line 2) skipped: clean has 4 tokens, corrupted 5" in err
    assert "1 items skipped (length_mismatch 1), 2 used" in err


def test_a_model_too_large_for_one_gradient_per_receiver_is_refused_before_loading(tmp_path, monkeypatch, capsys):
    """A config with no weights (48 layers of 64 heads, d_model 512: 3,121 senders, 9,265 receivers): its
    weights fit, one item's gradients and sender outputs do not; refused from the plan, nothing loaded."""
    from headscope.probes.budget import rss_bytes

    cfg = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 48,
        "hidden_size": 512,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "head_dim": 8,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
    }
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("HEADSCOPE_MEMORY_LIMIT", str(rss_bytes() + (2 << 30)))  # 2 GiB over what the process holds
    out = tmp_path / "run"
    assert main(["circuit", str(tmp_path / "big"), "--n-items", "8", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "circuit needs ~" in err[0] and "circuit scores forward passes at batch size 1" in err[0]
    # one item: (3 x 3,121 + 9 x 9,265) values x 22 tokens x 512 x 4 bytes = 3.89 GiB of the plan's "cache"
    assert "cache 3.89 GiB" in err[0] and "one gradient per receiver input" in err[0]
    assert not out.exists()
