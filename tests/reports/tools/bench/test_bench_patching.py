"""``headscope bench``'s patching paths on a tiny random llama: the plumbing (rows, FLOP
counts, the two targets), never timings."""

from __future__ import annotations

import math

import pytest
from tiny_models import tiny_model_dir

from headscope.reports.tools.bench import harness as B
from headscope.reports.tools.bench import patching_paths
from headscope.reports.tools.bench.config import BenchConfig

PATCH_PATHS = ("patch_attribution", "patch_forward_backward", "patch_activation", "patch_one_forward_per_head")
TARGETS = (
    "attribution patching / forward+backward <= 3",
    "batched activation patching / one forward per head <= 0.5",
)


@pytest.fixture(scope="module")
def patch_bench(tmp_path_factory):
    model = tiny_model_dir(tmp_path_factory.mktemp("tiny"), "llama")
    cfg = BenchConfig(
        model=str(model), n_sentences=4, batch_size=4, repeats=1, peak_seconds=0.05, peak_size=256, paths=PATCH_PATHS
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(patching_paths, "PATCHING", {"items": 4, "seq_len": 6, "n_boot": 20, "n_perm": 50})
        return B.run_bench(cfg)


def test_patching_paths_give_rows_and_counted_flops(patch_bench):
    f = patch_bench.frame.set_index("path")
    assert list(f.index) == list(PATCH_PATHS)
    for p in PATCH_PATHS:
        assert f.loc[p, "status"] == "ok", f.loc[p, "note"]
        assert math.isfinite(f.loc[p, "seconds"]) and f.loc[p, "seconds"] > 0
    # 4 items of 6 + 5 = 11 tokens (the tiny tokenizer puts no BOS in front of a text, so neither
    # does the task); the tiny llama: 2 layers x 4 heads
    assert f.loc["patch_activation", "note"].startswith("4 induction items of 11 tokens, one batch; 8 heads")
    assert f.loc["patch_one_forward_per_head", "note"].endswith("; 8 full forwards")
    one = f.loc["patch_forward_backward", "gflop"] / 2  # one forward of the batch
    assert f.loc["patch_activation", "gflop"] == pytest.approx(10 * one)  # 8 heads + the two runs
    assert f.loc["patch_one_forward_per_head", "gflop"] == pytest.approx(10 * one)
    assert f.loc["patch_attribution", "gflop"] == pytest.approx(4 * one)


def test_the_two_patching_targets_are_rows_of_the_targets_table(patch_bench):
    t = patch_bench.targets.set_index("target")
    for name in TARGETS:
        assert name in t.index
        assert math.isfinite(t.loc[name, "value"]) and t.loc[name, "met"] in (True, False)  # reported, not enforced
    s = patch_bench.frame.set_index("path")["seconds"]
    ratio = t.loc[TARGETS[1], "value"]
    assert ratio == pytest.approx(s["patch_activation"] / s["patch_one_forward_per_head"])  # one round: that ratio
