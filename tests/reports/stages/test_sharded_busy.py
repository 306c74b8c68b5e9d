"""A Ray cluster whose CPUs other work holds: the workers (or checkpoint jobs) Ray cannot place are
waited for, but not silently: after ``notice_after`` seconds a warning names how many wait, what
each asks for and what the cluster has free; once the CPUs are freed the run finishes as it would
have. The other work is one actor holding every CPU the session's cluster (conftest.py's
``ray_cluster``) has free, killed once the warning is seen."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from headscope.analyses.run_weights import WeightsConfig  # noqa: E402
from headscope.reports.stages.base import RunContext  # noqa: E402
from headscope.reports.stages.registry import STAGES  # noqa: E402
from headscope.reports.stages.sharded import RayConfig, ShardPool  # noqa: E402

BUSY = RayConfig(workers=1, threads=1, notice_after=1.0)
LOGGER = "headscope.reports.stages.sharded"


@pytest.fixture
def held(ray_cluster):
    """``(actor, CPUs it holds)``: every CPU of the session's cluster that is free, held until the
    test kills the actor (killed after the test in any case)."""
    free = int(ray_cluster.available_resources().get("CPU", 0))
    if free < 1:
        pytest.skip("every CPU of the session's Ray cluster is held by its pools: nothing for this test to hold")

    class Holder:  # defined here: Ray's workers get it by value, not by importing this test module
        def ready(self) -> bool:
            return True

    holder = ray_cluster.remote(num_cpus=free)(Holder).remote()
    assert ray_cluster.get(holder.ready.remote())
    yield holder, free
    ray_cluster.kill(holder)


def _warned(caplog, pattern: str, within: float = 60.0) -> str:
    """The first warning matching ``pattern``, waited for up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        hits = [r.getMessage() for r in caplog.records if re.search(pattern, r.getMessage())]
        if hits:
            return hits[0]
        time.sleep(0.2)
    raise AssertionError(
        f"no warning matching {pattern!r} in {within:.0f} s: {[r.getMessage() for r in caplog.records]}"
    )


def test_a_worker_ray_cannot_place_is_waited_for_with_a_warning(held, ray_cluster, minilm, caplog):
    holder, _ = held
    total = int(ray_cluster.cluster_resources()["CPU"])
    ctx, stage, cfg = RunContext(name="minilm-l6", model=minilm), STAGES["weights"], WeightsConfig(draws=4, null=8)
    load = {"model": "minilm-l6", "backend": "inhouse", "dtype": "fp32", "trust_remote_code": False}
    pool = ShardPool(BUSY, load).connect()
    out = {}
    runner = threading.Thread(target=lambda: out.update(r=pool.run(ctx, stage, cfg, stage.split(ctx, cfg, 1))))
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            runner.start()
            line = _warned(caplog, "Ray cannot place")
            assert not out  # still waiting when it said so
            ray_cluster.kill(holder)  # the other work ends: the worker is placed, loads MiniLM, runs
            runner.join(timeout=300)
    finally:
        pool.close()
    assert re.match(
        rf"Ray cannot place 1 of the 1 workers yet: each asks for 1 CPU; the local Ray cluster has 0 of {total} CPUs",
        line,
    ), line
    assert "other jobs' actors or tasks hold the rest" in line and re.search(r"\(\d+ s so far\)$", line)
    assert "r" in out, "the run did not finish once the CPUs were freed"
    assert out["r"].frames["weights_heads"].equals(stage.run(ctx, cfg).frames["weights_heads"])


def test_checkpoint_jobs_ray_cannot_start_are_waited_for_with_a_warning(
    held, ray_cluster, tiny_llama_dir, tmp_path, caplog
):
    from headscope.reports.checkpoint_inputs import read_checkpoints
    from headscope.reports.checkpoint_jobs import run_jobs
    from headscope.reports.stages.config import RunConfig

    holder, _ = held
    total = int(ray_cluster.cluster_resources()["CPU"])
    cks = read_checkpoints([str(tiny_llama_dir)])
    out = {}
    config = RunConfig(only=("weights",), weights_config=WeightsConfig(draws=4, null=8))
    runner = threading.Thread(target=lambda: out.update(r=run_jobs(cks, config, tmp_path / "o", ray=BUSY)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        runner.start()
        line = _warned(caplog, "Ray cannot start every checkpoint job")
        assert not out
        ray_cluster.kill(holder)
        runner.join(timeout=300)
    assert re.match(
        r"Ray cannot start every checkpoint job yet: each asks for 1 CPU; the local Ray cluster has 0 of", line
    )
    # every CPU is held, the one the unstarted job may already hold not counted as other work's
    assert f"hold at least {total - 1}; 1 job(s) wait or run" in line, line
    assert "r" in out, "the jobs did not finish once the CPUs were freed"
    (job,) = out["r"]
    assert job.ok, job.error
    assert (job.out_dir / "run.json").is_file()
