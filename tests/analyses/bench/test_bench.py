"""``headscope bench``: the plumbing (batches, FLOP counts, ratios, skips, output), never timings."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from headscope.analyses.bench import harness as B
from headscope.analyses.bench import pruning_paths, registry, results
from headscope.analyses.bench.config import BenchConfig
from headscope.analyses.bench.counts import model_gflop, padding_ratio
from headscope.analyses.bench.state import PathSkipped, Prepared
from headscope.probes.capture import pattern_bytes
from headscope.probes.corpora.bench_sentences import generate_sentences
from headscope.probes.tokens import tokenize_one

SKIP_NOTE = "roles cannot run here"
# the plumbing runs on a tiny BERT folder (tests/tiny_models: 2 layers x 4 heads, d_model 64,
# d_mlp 128), read by name like a user's checkpoint; the bench's figures on the shipped models
# come from `headscope bench`, never from a test
TINY_LINEAR = 65_536  # 2 layers x (4 x 64^2 + 2 x 64 x 128) weights of nn.Linear
TINY_LAYERS, TINY_HEADS, TINY_D = 2, 4, 64


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    from tests.tiny_models import tiny_model_dir

    return str(tiny_model_dir(tmp_path_factory.mktemp("bench-tiny"), "bert"))


def test_generated_sentences_are_seeded_and_within_length():
    a = generate_sentences(200, seed=3)
    assert a == generate_sentences(200, seed=3)
    assert a != generate_sentences(200, seed=4)
    n_words = [len(s.split()) for s in a]
    assert min(n_words) == 12 and max(n_words) == 40  # the whole range is used
    assert all(s[0].isupper() and s.endswith(".") for s in a)
    with pytest.raises(ValueError, match="positive int"):
        generate_sentences(0)


def test_closed_form_counts():
    # 2 x 1e6 x 30 tokens + 4 x 2 x 8 x (100 + 400)
    assert model_gflop(linear=1_000_000, n_layers=2, d_model=8, lengths=[10, 20]) == pytest.approx(0.06 + 0.000032)
    assert padding_ratio([2, 4, 4], [[0, 1], [2]]) == pytest.approx(0.2)
    assert padding_ratio([3, 3], [[0, 1]]) == 0.0


def test_config_validation():
    with pytest.raises(ValueError, match="unknown bench path 'nope'"):
        BenchConfig(paths=("nope",))
    with pytest.raises(ValueError, match="'dtype'"):
        BenchConfig(dtype="fp16")
    with pytest.raises(ValueError, match="'repeats'"):
        BenchConfig(repeats=0)


def _quick(paths, n_sentences=4, **kw):
    """A bench of a few sentences, one round, a short matmul peak: the plumbing, not the speed."""
    return BenchConfig(
        n_sentences=n_sentences, batch_size=4, repeats=1, peak_seconds=0.05, peak_size=256, paths=paths, **kw
    )


@pytest.fixture(scope="module")
def small_bench(tiny_bert):
    cfg = _quick(("hf_sdpa", "capture_patterns", "gate_grad", "roles"), n_sentences=8, model=tiny_bert)

    def cannot_run(bench):
        raise PathSkipped(SKIP_NOTE)

    with pytest.MonkeyPatch.context() as mp:  # a path that cannot run here (as bf16 without native bf16)
        mp.setitem(registry.PATHS, "roles", registry.BenchPath(registry.PATHS["roles"].description, cannot_run))
        return B.run_bench(cfg)


def test_bench_frame_ratios_and_flops(small_bench, tiny_bert):
    f = small_bench.frame.set_index("path")
    info = small_bench.info
    assert list(small_bench.frame.columns) == results.BENCH_COLUMNS
    assert small_bench.frame["description"].tolist() == [registry.PATHS[p].description for p in f.index]
    assert list(f.index) == ["hf_sdpa", "capture_patterns", "gate_grad", "roles"]
    assert f.loc["hf_sdpa", "ratio"] == 1.0
    for p in ("capture_patterns", "gate_grad"):
        assert f.loc[p, "status"] == "ok" and f.loc[p, "seconds"] > 0
        assert f.loc[p, "ratio"] == pytest.approx(f.loc[p, "seconds"] / f.loc["hf_sdpa", "seconds"])
    # FLOPs from the real token lengths of the 8 generated sentences
    lengths = [len(tokenize_one(_tok(tiny_bert), text=s)["ids"]) for s in generate_sentences(8, seed=0)]
    assert info["real_tokens"] == sum(lengths)
    assert info["linear_params"] == TINY_LINEAR
    fwd = model_gflop(linear=TINY_LINEAR, n_layers=TINY_LAYERS, d_model=TINY_D, lengths=lengths)
    assert f.loc["capture_patterns", "gflop"] == pytest.approx(fwd)
    assert f.loc["gate_grad", "gflop"] == pytest.approx(2 * fwd)
    # a path that cannot run is a skipped row with a note, not a crash
    assert f.loc["roles", "status"] == "skipped" and f.loc["roles", "note"] == SKIP_NOTE
    assert math.isnan(f.loc["roles", "seconds"])


def test_bench_padding_and_pattern_memory(small_bench, tiny_bert):
    info = small_bench.info
    assert info["batches"] == 2
    assert 0 <= info["padding_ratio_bucketed"] < info["padding_ratio_unsorted"]
    lengths = sorted(len(tokenize_one(_tok(tiny_bert), text=s)["ids"]) for s in generate_sentences(8, seed=0))
    per_batch = [pattern_bytes(4, max(lengths[i : i + 4]), TINY_HEADS, TINY_LAYERS) for i in (0, 4)]
    assert info["pattern_bytes_store_all"] == sum(per_batch)
    assert info["pattern_bytes_streaming"] == max(per_batch)


def test_targets_follow_the_frame(small_bench):
    t = small_bench.targets.set_index("target")
    f = small_bench.frame.set_index("path")
    row = t.loc["capture / plain forward <= 1.1"]
    assert row["value"] == pytest.approx(f.loc["capture_patterns", "seconds"] / f.loc["hf_sdpa", "seconds"])
    assert row["met"] == (row["value"] <= 1.1)
    assert t.loc["roles / capture from text <= 1.5", "met"] is None  # not measured: reported as such
    assert "roles" in t.loc["roles / capture from text <= 1.5", "note"]


def test_cli_json_and_table(small_bench, monkeypatch, capsys):
    from headscope.reports.cli import app as cli
    from headscope.reports.cli import bench as cmd_bench

    monkeypatch.setattr(B, "run_bench", lambda cfg, progress=None: small_bench)
    assert cli.main(["bench", "--sentences", "8", "--batch", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["path"] for p in out["paths"]] == ["hf_sdpa", "capture_patterns", "gate_grad", "roles"]
    assert out["info"]["linear_params"] == TINY_LINEAR
    text = cmd_bench.render(small_bench)
    assert "capture_patterns" in text and "skipped" in text and "targets (reported, not enforced)" in text


def test_cli_rejects_bad_memory_sizes(capsys):
    from headscope.reports.cli import app as cli

    assert cli.main(["bench", "--memory", "--memory-sizes", "10"]) == 2
    assert "at least two positive sizes" in capsys.readouterr().err


def test_memory_mode_runs_each_size_in_a_subprocess(tiny_bert):
    frame, ratio = B.memory_scaling(tiny_bert, (4, 12), batch_size=4, reducer="mass", timeout=300)
    assert frame["n_sentences"].tolist() == [4, 12]
    assert frame["n_batches"].tolist() == [1, 3]
    assert ratio == pytest.approx(frame["peak_rss_mb"].iloc[1] / frame["peak_rss_mb"].iloc[0])
    assert (frame["stream_growth_mb"] >= 0).all() and (frame["rss_after_load_mb"] > 50).all()
    assert frame["padding_ratio"].between(0, 1).all()


def test_memory_mode_runs_the_text_roles(tiny_bert):
    # the body of one --memory subprocess, here in-process (the subprocess plumbing is the test above)
    from headscope.analyses.bench.memory import MEMORY_COLUMNS, memory_child

    row = memory_child(tiny_bert, 8, "roles", 8, 0)
    assert list(row) == MEMORY_COLUMNS and row["reducer"] == "roles" and row["n_sentences"] == 8
    # every head gets a row for each of positional (per offset bucket), special, rare-word...
    assert row["role_rows"] >= TINY_LAYERS * TINY_HEADS * 3


def _tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_cli_help_lists_every_path():
    from headscope.reports.cli.app import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    paths_help = next(a.help for a in sub.choices["bench"]._actions if a.dest == "paths")
    assert paths_help.split(": ", 1)[1].split() == list(registry.PATHS)


def test_targets_pair_interleaved_rounds():
    import pandas as pd

    # capture had one lucky round (3.0) that roles did not share: paired rounds say 1.25,
    # the two fastest rounds 5.0 / 3.0 = 1.67
    rounds = {"capture_stream": [4.0, 3.0, 4.4], "roles": [5.0, 5.0, 5.5]}
    frame = pd.DataFrame([{"path": p, "status": "ok", "seconds": min(t)} for p, t in rounds.items()])
    row = results.targets_frame(frame, rounds=rounds).set_index("target").loc["roles / capture from text <= 1.5"]
    assert row["value"] == pytest.approx(1.25) and row["met"]
    assert "median of 3 paired rounds (fastest rounds: 1.67)" in row["note"]
    fastest = results.targets_frame(frame).set_index("target").loc["roles / capture from text <= 1.5"]
    assert fastest["value"] == pytest.approx(5.0 / 3.0) and not fastest["met"]


def test_targets_come_from_the_targets_table(monkeypatch):
    import pandas as pd

    from headscope.analyses.bench import targets as T

    frame = pd.DataFrame(
        [{"path": "hf_sdpa", "status": "ok", "seconds": 2.0}, {"path": "x", "status": "ok", "seconds": 1.0}]
    )
    got = results.targets_frame(frame)
    assert got["target"].tolist() == [t.name for t in T.RATIO_TARGETS]
    assert got["threshold"].tolist() == [t.threshold for t in T.RATIO_TARGETS]
    mine = T.RatioTarget("x / hf_sdpa <= 0.4", "x", "hf_sdpa", 0.4, False, "time ratio")
    monkeypatch.setattr(results, "RATIO_TARGETS", (mine,))
    row = results.targets_frame(frame).iloc[0]
    assert row["target"] == mine.name and row["value"] == 0.5 and not row["met"]


def test_gate_and_quick_pruning_paths_give_finite_rows(monkeypatch, tiny_bert):
    # the plumbing only: a smaller study than the report's (one random curve, one stand-in role)
    small = {"quick": True, "ablation_modes": ("zero",), "studies": ("curves",), "orders": ("random",)}
    monkeypatch.setattr(pruning_paths, "QUICK_PRUNING", {**small, "n_random_seeds": 1, "max_fraction": 0.2})
    stand_in = pruning_paths.stand_in_roles
    monkeypatch.setattr(pruning_paths, "stand_in_roles", lambda spec, seed=0: stand_in(spec, n_roles=1, seed=seed))
    cfg = _quick(("hook_gates", "inhouse_gates", "quick_pruning"), prune_items=2, model=tiny_bert)
    result = B.run_bench(cfg)
    f = result.frame.set_index("path")
    assert list(f.index) == list(cfg.paths)
    for p in cfg.paths:
        assert f.loc[p, "status"] == "ok", f.loc[p, "note"]
        assert math.isfinite(f.loc[p, "seconds"]) and f.loc[p, "seconds"] > 0
    assert f.loc["hook_gates", "gflop"] == f.loc["inhouse_gates", "gflop"] > 0
    t = result.targets.set_index("target")
    for name in ("hook gates / in-house gates <= 1.1",):
        assert math.isfinite(t.loc[name, "value"]) and t.loc[name, "met"] in (True, False)  # reported, never enforced
    with pytest.raises(ValueError, match="'prune_items'"):
        BenchConfig(prune_items=1)


def test_hf_ablation_paths_give_finite_rows(tiny_bert):
    """The hf backend's ablation paths (resumed and whole) run and pair with the in-house one."""
    cfg = _quick(("ablation_batched", "ablation_hf_whole", "ablation_hf"), model=tiny_bert)
    result = B.run_bench(cfg)
    f = result.frame.set_index("path")
    for p in cfg.paths:
        assert f.loc[p, "status"] == "ok", f.loc[p, "note"]
        assert math.isfinite(f.loc[p, "seconds"]) and f.loc[p, "seconds"] > 0
    assert f.loc["ablation_hf", "gflop"] == f.loc["ablation_batched", "gflop"] > 0
    row = result.targets.set_index("target").loc["hf ablation / in-house ablation <= 1.25"]
    assert math.isfinite(row["value"]) and row["met"] in (True, False)


def test_stand_in_roles_are_seeded():
    from types import SimpleNamespace

    spec = SimpleNamespace(n_layers=6, n_heads=12)
    a = pruning_paths.stand_in_roles(spec, seed=1)
    assert a.equals(pruning_paths.stand_in_roles(spec, seed=1)) and not a.equals(
        pruning_paths.stand_in_roles(spec, seed=2)
    )
    assert a.groupby("role").size().tolist() == [3] * 9


def test_help_lists_every_path_with_its_description(capsys):
    from headscope.reports.cli.app import main

    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    listed = [
        line.split(None, 1) for line in out.split("paths (--paths; default all, in this order):\n", 1)[1].splitlines()
    ]
    assert listed == [[name, p.description] for name, p in registry.PATHS.items()]


def test_run_bench_runs_the_paths_of_the_registry(tiny_bert):
    """A path registered under a new name is run through the registry: warmed once, then
    timed once per round, its description, GFLOP and note in its row."""
    calls = {"warm": 0, "pass": 0}

    def planted(bench):
        def one_pass():
            calls["pass"] += 1

        def warm():
            calls["warm"] += 1

        return Prepared(one_pass, warm, 2.5 * len(bench.batches), f"{len(bench.sentences)} sentences")

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry.PATHS, "planted", registry.BenchPath("a planted path", planted))
        result = B.run_bench(dataclasses.replace(_quick(("planted",), model=tiny_bert), repeats=3))
    row = result.frame.set_index("path").loc["planted"]
    assert calls == {"warm": 1, "pass": 3}
    assert (row["description"], row["status"], row["repeats"], row["note"]) == (
        "a planted path",
        "ok",
        3,
        "4 sentences",
    )
    assert row["gflop"] == 2.5 * result.info["batches"] and len(result.info["round_seconds"]["planted"]) == 3
    assert math.isnan(row["ratio"])  # no reference run
    with pytest.raises(ValueError, match="unknown bench path 'planted'; valid paths: hf_sdpa, "):
        BenchConfig(paths=("planted",))  # gone from the registry, gone from the bench


def test_report_and_bench_share_one_quick_pruning_definition():
    from headscope.analyses.pruning.study import PruneConfig
    from headscope.reports.stages import quick as quick_settings
    from headscope.reports.stages.base import RunContext
    from headscope.reports.stages.registry import STAGES

    # the report's quick stage (the run's default pruning settings) is what it was before the settings moved
    before = PruneConfig(quick=True, seed=5, ablation_modes=("zero",), studies=("ablation", "importance", "curves"))
    assert STAGES["pruning"].config(RunContext(name="m", seed=5)) == before
    assert PruneConfig(**pruning_paths.QUICK_PRUNING, seed=5) == before  # what the bench's quick_pruning times
    assert pruning_paths.QUICK_PRUNING is quick_settings.QUICK_PRUNING
    assert quick_settings.QUICK_PRUNING["studies"] is quick_settings.QUICK_STUDIES


@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_gate_grad_step_differentiates_the_loss_on_decoders_too(causal):
    """The gate_grad path times a backward on every model: on a decoder its step once computed
    the loss and returned without it. Its gradients match a central difference of the loss."""
    import torch

    from headscope.analyses.bench.capture_paths import bench_loss_gate_grads
    from headscope.probes.models.config import ModelConfig
    from headscope.probes.models.inhouse.transformer import Transformer

    # float64 throughout (gpt2's and bert's LayerNorm; llama's RMSNorm would compute in float32)
    cfg = ModelConfig(family="gpt2" if causal else "bert", n_layers=2, d_model=16, n_heads=4, vocab_size=13)
    net = Transformer(cfg).double()
    net.init_weights(std=0.3, seed=1)
    ids = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    grads = bench_loss_gate_grads(net, net.gates, ids, mask, causal)
    assert len(grads) == 2 and all(not g.requires_grad for g in net.gates)

    def loss_at(value: float) -> float:
        with torch.no_grad():
            net.gates[1][2] = value
            out = net(ids, mask)
            net.gates[1][2] = 1.0
        if causal:
            target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            logits = out[:, :-1]
            return float(
                torch.nn.functional.cross_entropy(logits.reshape(-1, 13), target.reshape(-1), ignore_index=-100)
            )
        return float((out**2 * mask[..., None]).sum() / mask.sum())

    eps = 1e-4
    fd = (loss_at(1 + eps) - loss_at(1 - eps)) / (2 * eps)
    # the step's loss is float32 (out.float()): its gradient is right to float32's precision
    assert float(grads[1][2]) == pytest.approx(fd, rel=1e-2, abs=1e-9)
    assert abs(fd) > 1e-6  # a gradient worth checking


def test_weights_all_bench_json_is_recorded_for_the_readme(tiny_bert, tmp_path, capsys):
    """The README's weights-only figure comes from a real ``bench --json`` run's weights_all row,
    through ``weights_paths --from-bench``; a file without that row is a one-line error, exit 2."""
    from headscope.analyses.bench import weights_paths
    from headscope.reports.cli import app as cli

    args = ["bench", tiny_bert, "--paths", "weights_all", "--sentences", "4", "--batch", "4", "--repeats", "2"]
    assert cli.main([*args, "--json"]) == 0
    bench = tmp_path / "bench.json"
    bench.write_text(capsys.readouterr().out, encoding="utf-8")
    row = next(p for p in json.loads(bench.read_text())["paths"] if p["path"] == "weights_all")
    assert row["status"] == "ok" and row["repeats"] == 2
    record = tmp_path / "fig.json"
    assert weights_paths.main(["--from-bench", str(bench), "--record", str(record)]) == 0
    fig = json.loads(record.read_text())["figures"]["smollm2_weights_all"]
    assert fig["seconds"]["value"] == row["seconds"] and fig["peak_rss"]["value"] == row["peak_rss_mb"]
    assert fig["seconds"]["text"].endswith("target < 60 s: met)")
    capsys.readouterr()
    (tmp_path / "bad.json").write_text('{"paths": []}')
    assert weights_paths.main(["--from-bench", str(tmp_path / "bad.json")]) == 2
    assert "no weights_all path" in capsys.readouterr().err
