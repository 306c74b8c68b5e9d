"""Stages sharded on Ray workers for SmolLM2-135M (a GQA decoder: 30 layers, 9 query heads on 3 KV
heads), as test_sharded*.py shard them for MiniLM: each stage's tables with 2 workers
``DataFrame.equals`` the single-process run. The workers are conftest.py's ``smollm_pool`` (two
one-thread workers, each loading the shipped GGUF once), which lives in the same Ray cluster as
``minilm_pool``; the single-process runs use the session's ``smollm``."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from headscope.analyses.run_weights import WeightsConfig  # noqa: E402
from headscope.reports.stages.base import RunContext  # noqa: E402
from headscope.reports.stages.registry import STAGES  # noqa: E402


def test_smollm_and_minilm_pools_live_in_one_cluster(minilm_pool, smollm_pool, ray_cluster):
    """Both pools' four workers alive at once, one Ray CPU each: neither waits on the other."""
    pids = minilm_pool.pids() + smollm_pool.pids()
    assert len(set(pids)) == 4
    assert minilm_pool.threads == smollm_pool.threads == 1 and smollm_pool.workers == 2
    assert ray_cluster.available_resources().get("CPU", 0) == 0  # the 4 CPUs held, 2 by each pool


def test_weights_sharded_by_layers_equals_single_process(smollm_pool, smollm):
    ctx, stage, cfg = RunContext(name="smollm2-135m", model=smollm), STAGES["weights"], WeightsConfig(draws=4, null=8)
    whole = stage.run(ctx, cfg)
    parts = stage.split(ctx, cfg, smollm_pool.workers)
    assert parts == [tuple(range(15)), tuple(range(15, 30))]
    sharded = smollm_pool.run(ctx, stage, cfg, parts)
    assert set(sharded.frames) == set(whole.frames)
    for name, frame in whole.frames.items():
        assert sharded.frames[name].equals(frame), name
    heads = sharded.frames["weights_heads"]
    assert sorted(heads.layer.unique()) == list(range(30)) and set(heads["head"]) == set(range(9))
