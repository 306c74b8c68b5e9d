"""The hand-written commands with ``--ray --workers 2``: their stage's parts on two one-thread Ray
workers (:mod:`headscope.reports.stages.command_shards`), merged and finished in the driver, as the
report runs them. Every table the command writes ``DataFrame.equals`` its own run without ``--ray``
(the reference on one torch thread, as each worker runs: gradient sums depend on the thread count),
and its other files (examples, skipped counts) are equal too.

``roles``: the positional group on 12 sentences in batches of 4 (each worker runs every other
batch); ``prune``: gradient importance and two curves (importance, random) to 20 % on 8 items in
batches of 4 (the iterative order a round over the workers per step); ``circuit``: EAP-IG on a
tiny random Llama; ``weights``: its per-head rows by layers; ``kv``: its study's rounds of cache
configurations (the tiny Llama's 4 KV groups), the long-context roles on the first worker. The
cluster is conftest.py's (4 CPUs); MiniLM's pool workers are stopped first (its next user starts
them again), so the command's two workers find two free CPUs whichever pools have started."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("ray")


from headscope.reports.cli.app import main  # noqa: E402

RAY = ["--ray", "--workers", "2", "--worker-threads", "1"]


@pytest.fixture(scope="module")
def room(ray_cluster, minilm_pool):
    """Two of the shared cluster's CPUs free for a command's workers (MiniLM's pool stopped)."""
    minilm_pool.close()


def _tables(out) -> dict[str, pd.DataFrame]:
    tables = {p.name: pd.read_parquet(p) for p in sorted(out.glob("*.parquet"))}
    assert tables, f"no tables in {out}"
    return tables


def _assert_same_files(whole, sharded, jsons=()) -> None:
    a, b = _tables(whole), _tables(sharded)
    assert set(a) == set(b)
    for name, frame in a.items():
        assert b[name].equals(frame), name
    for name in jsons:
        assert json.loads((sharded / name).read_text()) == json.loads((whole / name).read_text()), name


def test_roles_with_ray_writes_the_files_of_its_run_without(room, one_thread, tmp_path):
    text = tmp_path / "text.txt"
    from headscope.analyses.roles.inputs import default_text

    text.write_text("\n".join(default_text().read_text().splitlines()[:12]) + "\n")
    argv = ["roles", "minilm-l6", "--roles", "positional", "--text", str(text), "--batch-size", "4", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), *RAY]) == 0
    _assert_same_files(tmp_path / "whole", tmp_path / "ray", ("examples.json", "skipped.json"))
    roles = _tables(tmp_path / "ray")["roles.parquet"]
    assert roles[roles.role == "positional:previous"].verdict.any() and (roles.n > 0).all()


def test_prune_with_ray_writes_the_files_of_its_run_without(room, one_thread, tmp_path):
    argv = ["prune", "minilm-l6", "--n-items", "8", "--batch-size", "4", "--seeds", "1", "--max-fraction", "0.2"]
    argv += ["--orders", "importance", "random", "--studies", "importance", "curves", "--json"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), *RAY]) == 0
    _assert_same_files(tmp_path / "whole", tmp_path / "ray")
    tables = _tables(tmp_path / "ray")
    assert {"importance.parquet", "curves.parquet", "prunable.parquet"} <= set(tables)
    assert len(tables["importance.parquet"]) == 72 and tables["importance.parquet"]["value"].abs().sum() > 0


def test_circuit_with_ray_writes_the_files_of_its_run_without(room, one_thread, tiny_llama_dir, tmp_path):
    """EAP-IG on a tiny random Llama: 4 induction items in batches of 2 (a batch per worker), 2
    steps, 2 budgets; the edge sums added in batch order and the circuits evaluated on the workers."""
    argv = ["circuit", str(tiny_llama_dir), "--n-items", "4", "--batch-size", "2", "--steps", "2", "--json"]
    argv += ["--budgets", "0.1", "1", "--seeds", "1"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), *RAY]) == 0
    _assert_same_files(tmp_path / "whole", tmp_path / "ray")
    tables = _tables(tmp_path / "ray")
    assert set(tables) == {"edges.parquet", "faithfulness.parquet"} and tables["edges.parquet"]["score"].abs().sum() > 0


def test_weights_with_ray_writes_the_files_of_its_run_without(room, tiny_llama_dir, tmp_path):
    """The per-head rows by layers on the workers (each loads the model); the adjustment, the
    verdicts and the composition scores in the driver, on the weights it reads lazily."""
    argv = ["weights", str(tiny_llama_dir), "--draws", "16", "--null", "16", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), *RAY]) == 0
    _assert_same_files(tmp_path / "whole", tmp_path / "ray")
    heads = _tables(tmp_path / "ray")["heads.parquet"]
    assert sorted(set(heads.layer)) == [0, 1] and heads.p_value.notna().any()


def test_patch_with_ray_writes_the_files_of_its_run_without(room, one_thread, tmp_path, capsys):
    """Activation patching of MiniLM's 72 heads, both directions, 4 induction items in one batch
    and 9 heads a forward (8 patched forwards, every other one on each worker); attribution
    patching, which has no split here, runs in the driver and the command says so."""
    argv = ["patch", "minilm-l6", "--n-items", "4", "--batch-size", "4", "--max-rows", "36", "--json"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "ray"), *RAY]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "patch --ray" in line]
    assert notes == [
        "note: patch --ray: activation patching runs on the Ray workers; attribution run in the driver (no split)"
    ]
    _assert_same_files(tmp_path / "whole", tmp_path / "ray")
    frame = _tables(tmp_path / "ray")["patch.parquet"]
    act = frame[frame.method.astype(str).str.startswith("activation")]
    assert set(act.method.astype(str)) == {"activation_denoising", "activation_noising"}
    assert len(act) == 144 and act.effect.notna().all() and act.effect.abs().sum() > 0


def test_kv_with_ray_writes_the_files_of_its_run_without(room, one_thread, tiny_llama_dir, tmp_path):
    """The study at the command's own settings (64 tokens, sink 2, window 16) on a tiny random
    Llama's 4 KV groups: each worker's unrestricted pass, the long-context roles (BOS pass too) on
    the first, then each round of configurations (each group alone, the greedy's candidates, the
    orders' points) cut over the workers; the greedy choice and the frames in the driver."""
    argv = ["kv", str(tiny_llama_dir), "--tokens", "64", "--sink", "2", "--window", "16", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), *RAY]) == 0
    _assert_same_files(tmp_path / "whole", tmp_path / "ray")
    assert (tmp_path / "ray" / "kv.md").read_text() == (tmp_path / "whole" / "kv.md").read_text()
    tables = _tables(tmp_path / "ray")
    assert {"kv_study.parquet", "kv_curve.parquet", "long_context_roles.parquet"} <= set(tables)
    study = tables["kv_study.parquet"]
    assert set(study.study) == {"single", "greedy", "random"} and study.kv_group.nunique() == 2
    assert tables["long_context_roles.parquet"].bos.notna().any()  # the BOS pass ran on the first worker
