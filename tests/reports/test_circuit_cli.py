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
    args += ["--mib", str(tmp_path / "mib.json"), "--mib-budget", "0.1"]
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
    _check_mib_export(tmp_path / "mib.json", edges, run)


def _check_mib_export(path, edges, run):
    """The MIB file read back by a reader written from MIB's format (names, grammar, counts): q, MLP
    and logits edges carry headscope's scores; each KV head's k/v edge became one edge per query head
    of its group (2 here), whose scores sum to it; in_graph marks the 0.1 circuit."""
    from headscope.analyses.circuits.edges.mib import mib_edge_count, read_mib

    cfg, nodes, mib = read_mib(json.loads(path.read_text()))
    assert cfg == {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": False, "d_model": cfg["d_model"]}
    # layer 0: 12 q/k/v inputs x 1 sender, MLP0 5; layer 1: 12 x 6, MLP1 10; the logits 11
    assert len(mib) == mib_edge_count(2, 4) == 12 * 1 + 5 + 12 * 6 + 10 + 11
    assert run["mib"]["in_graph_budget"] == 0.1 and run["mib"]["n_edges"] == len(mib)

    def mib_name(name):
        return name.replace("MLP", "m") if name.startswith("MLP") else "a{}.h{}".format(*name[1:].split("H"))

    kept = 0
    for e in edges.itertuples():
        src = e.sender if e.sender == "input" else mib_name(e.sender)
        if e.via in ("k", "v"):
            layer, g = (int(x) for x in e.receiver[1:].split("KV"))
            copies = [f"{src}->a{layer}.h{h}<{e.via}>" for h in (2 * g, 2 * g + 1)]
        else:
            dst = e.receiver if e.via == "logits" else mib_name(e.receiver)
            copies = [f"{src}->{dst}" + ("<q>" if e.via == "q" else "")]
        assert sum(mib[c][0] for c in copies) == pytest.approx(e.score, rel=1e-6, abs=1e-12)
        assert all(mib[c][1] == (e.kept_at <= 0.1) for c in copies)
        kept += len(copies) * bool(e.kept_at <= 0.1)
    assert sum(v[1] for v in mib.values()) == kept and nodes["input"] and set(nodes) >= {"a1.h3", "m1", "logits"}


def test_the_mib_reader_refuses_a_broken_document():
    from headscope.analyses.circuits.edges.mib import read_mib

    cfg = {"n_layers": 1, "n_heads": 1, "parallel_attn_mlp": False, "d_model": 4}
    nodes = {n: {"in_graph": True} for n in ("input", "a0.h0", "m0", "logits")}
    good = ["input->a0.h0<q>", "input->a0.h0<k>", "input->a0.h0<v>", "input->m0", "a0.h0->m0"]
    good += ["input->logits", "a0.h0->logits", "m0->logits"]
    doc = {"cfg": cfg, "nodes": nodes, "edges": {e: {"score": 0.0, "in_graph": True} for e in good}}
    assert len(read_mib(doc)[2]) == 8
    for bad, match in (
        ("a0.h0->input", "does not read"),
        ("m0->a0.h0<q>", "not upstream"),
        ("a0.h0->m0<q>", "does not"),
    ):
        broken = {**doc, "edges": {**doc["edges"], bad: {"score": 0.0, "in_graph": False}}}
        with pytest.raises(ValueError, match=match):
            read_mib(broken)
    with pytest.raises(ValueError, match="has 8 edges; got 7"):
        read_mib({**doc, "edges": dict(list(doc["edges"].items())[:7])})


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
    # 1.25 GiB over what the process holds: the weights load, the circuit scores' cache does not fit
    monkeypatch.setenv("HEADSCOPE_MEMORY_LIMIT", str(rss_bytes() + (5 << 28)))
    out = tmp_path / "run"
    assert main(["circuit", str(tmp_path / "big"), "--n-items", "8", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "circuit needs ~" in err[0] and "circuit scores forward passes at batch size 1" in err[0]
    # one item: (2 x 3,121 + 2 x 9,265) values x 22 tokens x 512 x 4 bytes = 1.04 GiB of the plan's "cache"
    assert "cache 1.04 GiB" in err[0] and "one gradient per receiver input" in err[0]
    assert not out.exists()
