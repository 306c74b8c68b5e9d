"""Stages sharded on Ray workers (:mod:`headscope.reports.stages.sharded`): the weights stage cut
by layers (its head rows), receiver layers (its composition scores) and score families (their
nulls) on a local 2-worker cluster equals the single-process run; a worker killed mid-shard has
its shard run again with the same result; a shard failing twice fails its stage, named.

The local cluster and the pool of two MiniLM workers (``minilm_pool``) (one thread each) are conftest.py's, shared
with the other sharded-stage tests; skipped where Ray is not installed (the ``ray`` extra)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from headscope.analyses.run_weights import WeightsConfig  # noqa: E402
from headscope.reports.stages.base import RunContext  # noqa: E402
from headscope.reports.stages.registry import STAGES  # noqa: E402

#: small nulls: the same code paths as the defaults, a fraction of the time
CFG = WeightsConfig(draws=20, null=50)


@pytest.fixture(scope="module")
def single(minilm):
    """The weights stage of MiniLM in this process."""
    ctx = RunContext(name="minilm-l6", model=minilm)
    return ctx, STAGES["weights"].run(ctx, CFG)


def test_weights_sharded_by_layers_equals_single_process(minilm_pool, single):
    ctx, whole = single
    stage = STAGES["weights"]
    parts = stage.split(ctx, CFG, minilm_pool.workers)
    assert [p.layers for p in parts] == [(0, 1, 2), (3, 4, 5)] and minilm_pool.threads == 1  # 2 workers x 1 thread
    assert sorted(r for p in parts for r in p.receivers) == [1, 2, 3, 4, 5] and all(p.families for p in parts)
    sharded = minilm_pool.run(ctx, stage, CFG, parts)
    assert set(sharded.frames) == set(whole.frames)
    for name, frame in whole.frames.items():  # exact: each head's p-value depends on its layer and the null alone
        assert sharded.frames[name].equals(frame), name
    heads = sharded.frames["weights_heads"]
    assert sorted(heads.layer.unique()) == list(range(6)) and len(heads) == len(whole.frames["weights_heads"]) > 0
    # the adjustment runs after the merge, over every head: one shard's own adjustment would differ
    from headscope.analyses.circuits.weights.ov_qk import head_verdicts
    from headscope.probes.models.weights_provider import model_weights

    rows = stage.run_part(ctx, CFG, parts[0]).frames["head_rows"]
    alone = head_verdicts(model_weights(ctx.model), rows)
    joined = heads.merge(alone, on=["layer", "head", "statistic"], suffixes=("", "_alone"))
    assert joined.p_value.equals(joined.p_value_alone)
    assert not joined.p_adjusted.equals(joined.p_adjusted_alone)


def test_a_worker_killed_mid_shard_has_it_run_again(minilm_pool, single, caplog):
    ctx, whole = single
    stage, cfg = STAGES["weights"], WeightsConfig(draws=400, null=50)  # a shard long enough to be killed in
    expected = stage.run(ctx, cfg).frames["weights_heads"]
    pids = minilm_pool.pids()
    out = {}
    runner = threading.Thread(target=lambda: out.update(r=minilm_pool.run(ctx, stage, cfg, stage.split(ctx, cfg, 2))))
    with caplog.at_level(logging.WARNING, logger="headscope.reports.stages.sharded"):
        runner.start()
        time.sleep(1.5)  # both shards started on their workers
        os.kill(pids[0], signal.SIGKILL)
        runner.join(timeout=300)
    assert "r" in out, "the sharded run did not finish"
    assert any("failed" in r.message and "running it again" in r.message for r in caplog.records)
    assert out["r"].frames["weights_heads"].equals(expected)
    assert minilm_pool.pids()[0] != pids[0]  # Ray restarted the killed worker (it loaded the model again)


def test_a_shard_failing_twice_fails_its_stage_with_the_shard_named(minilm_pool, minilm):
    from headscope.reports.stages.runner import _run_one

    ctx = RunContext(name="minilm-l6", model=minilm, shards=minilm_pool)
    record = {}
    result = _run_one(ctx, STAGES["weights"], WeightsConfig(draws=0), record)  # every shard raises
    assert result is None and record["status"] == "failed" and record["shards"] == 2
    assert (
        "the weights shard (layers 0-2; receivers " in ctx.absent["weights"] and "failed twice" in ctx.absent["weights"]
    )
    assert "n_draws must be >= 1" in ctx.absent["weights"]


def test_each_worker_asks_for_the_memory_of_the_run_plan(ray_cluster, minilm):
    """A worker's memory is the plan's peak (the weights loaded and the largest working set); a
    cluster whose nodes cannot hold one worker is refused in one line, before any actor starts."""
    from headscope.reports.stages.plans import shape_of_model
    from headscope.reports.stages.sharded import RayConfig, ShardPool, worker_memory

    ctx = RunContext(name="minilm-l6", model=minilm, shape=shape_of_model(minilm, "fp32"))
    assert worker_memory(ctx) is None  # no plan yet
    roles = STAGES["roles"]
    ctx.plans["roles"] = roles.plan(ctx, roles.config(ctx))
    need = worker_memory(ctx)
    weights = ctx.shape.n_params * 4  # float32
    assert weights < need < 4 * 2**30
    pool = ShardPool(RayConfig(workers=1), {"model": "minilm-l6"}).connect()  # joins the session's cluster
    with pytest.raises(ValueError, match=r"each Ray worker needs about .* GiB .* the largest node .* has"):
        pool._start_actors(memory=2**50)
    assert pool._actors == []
