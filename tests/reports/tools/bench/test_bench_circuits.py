"""``headscope bench``'s EAP-IG paths on a tiny random llama: the rows, their FLOP counts and the
target's row (never timings)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tiny_models import tiny_model_dir

from headscope.reports.tools.bench import circuit_paths, patching_paths
from headscope.reports.tools.bench import harness as B
from headscope.reports.tools.bench.config import BenchConfig

PATHS = ("eap_ig", "eap_ig_forward_backward")
TARGET = "EAP-IG(5) / 6 x (forward+backward) <= 1.3"
ROOT = Path(__file__).resolve().parents[4]
FIGURE = ROOT / "data" / "figures" / "bench_smollm2_eap_ig.json"
DOC = ROOT / "docs" / "guide" / "circuits.md"


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
    assert f.loc["eap_ig", "gflop"] == pytest.approx(11 * one)  # 1 plain forward + 5 x (forward + backward)
    assert f.loc["eap_ig", "note"].startswith("4 induction items of 11 tokens, one batch; 8 heads; 5 steps")
    t = result.targets.set_index("target")
    assert t.loc[TARGET, "value"] == pytest.approx(
        f.loc["eap_ig", "seconds"] / f.loc["eap_ig_forward_backward", "seconds"]
    )
    assert t.loc[TARGET, "threshold"] == 1.3 and t.loc[TARGET, "met"] == (t.loc[TARGET, "value"] <= 1.3)


def test_the_committed_price_of_eap_ig_on_smollm2_meets_the_target():
    """``make circuit-bench`` (data/figures/bench_smollm2_eap_ig.json): two bench runs on SmolLM2-135M,
    each EAP-IG(5) at most 1.3 x its 6 forward + backward passes (the target row's median of paired
    rounds), and docs/guide/circuits.md quotes both."""
    doc = json.loads(FIGURE.read_text(encoding="utf-8"))
    assert doc["model"] == "smollm2-135m" and doc["target_row"] == TARGET == circuit_paths.TARGET
    assert doc["target"] == 1.3 and len(doc["runs"]) >= 2
    guide = " ".join(DOC.read_text(encoding="utf-8").split())
    for run in doc["runs"]:
        assert run["ratio"] <= doc["target"] and run["met"] is True, run
        assert run["ratio"] == pytest.approx(run["eap_ig_seconds"] / run["forward_backward_seconds"], rel=0.5)
        assert f"{run['ratio']:.2f} (fastest rounds {run['fastest_ratio']:.2f})" in guide
