"""``headscope bench``'s EAP-IG paths on a tiny random llama: the rows, their FLOP counts and the
target's row (never timings)."""

from __future__ import annotations

import math

import pytest
from tiny_models import tiny_model_dir

from headscope.reports.tools.bench import harness as B
from headscope.reports.tools.bench import patching_paths
from headscope.reports.tools.bench.config import BenchConfig

PATHS = ("eap_ig", "eap_ig_forward_backward")
TARGET = "EAP-IG(5) / 6 x (forward+backward) <= 1.3"


def _bench(model):
    cfg = BenchConfig(
        model=str(model), n_sentences=4, batch_size=4, repeats=1, peak_seconds=0.05, peak_size=256, paths=PATHS
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(patching_paths, "PATCHING", {"items": 4, "seq_len": 6, "n_boot": 20, "n_perm": 50})
        return B.run_bench(cfg)


def test_eap_ig_is_priced_against_six_forward_backward_passes(tmp_path):
    result = _bench(tiny_model_dir(tmp_path, "llama"))
    f = result.frame.set_index("path")
    for p in PATHS:
        assert f.loc[p, "status"] == "ok", f.loc[p, "note"]
        assert math.isfinite(f.loc[p, "seconds"]) and f.loc[p, "seconds"] > 0
    one = f.loc["eap_ig_forward_backward", "gflop"] / 12  # 6 x (forward + a backward counted as a forward)
    assert f.loc["eap_ig", "gflop"] == pytest.approx(12 * one)  # 2 plain forwards + 5 x (forward + backward)
    assert f.loc["eap_ig", "note"].startswith("4 induction items of 11 tokens, one batch; 8 heads; 5 steps")
    t = result.targets.set_index("target")
    assert t.loc[TARGET, "value"] == pytest.approx(
        f.loc["eap_ig", "seconds"] / f.loc["eap_ig_forward_backward", "seconds"]
    )
    assert t.loc[TARGET, "met"] in (True, False)  # reported, not enforced
