"""Small real report runs the stage tests share: MiniLM-L6 with every stage's settings cut down
(the same frames, columns and dtypes as the default run, a fraction of its time), and a tiny
random Llama, whose KV-cache stage runs (MiniLM, an encoder, has none). Each runs once a session.
The sharded-stage tests share one local Ray cluster (``ray_cluster``: 4 logical CPUs) and two pools
of two one-thread workers each, MiniLM's (``minilm_pool``) and SmolLM2's (``smollm_pool``), started
on first use and shut down at the session's end."""

from __future__ import annotations

import json
import logging

import pytest
from stage_cases import small_config
from tiny_models import tiny_model_dir


def _report(model, out, **kw):
    from headscope.reports.pipeline import build_report

    result = build_report(model, small_config(**kw), out_dir=out, quiet=True)
    return result, json.loads(result.paths["run_json"].read_text())


@pytest.fixture(scope="session")
def minilm_report(tmp_path_factory):
    """``(ReportResult, run.json)`` of MiniLM-L6 with every stage (its KV stage blocked: an encoder)."""
    return _report("minilm-l6", tmp_path_factory.mktemp("stages") / "minilm")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), "llama")


@pytest.fixture(scope="session")
def llama_report(tiny_llama_dir, tmp_path_factory):
    """``(ReportResult, run.json)`` of a tiny random Llama with every stage (its KV stage runs)."""
    return _report(tiny_llama_dir, tmp_path_factory.mktemp("stages") / "llama")


#: Ray CPUs of the test cluster: room for both pools' workers at once (2 pools x 2 workers x 1 thread)
RAY_CPUS = 4


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of ``RAY_CPUS`` (4) logical CPUs (skipped where Ray, the ``ray`` extra,
    is not installed); one a session, shut down after it (a cluster the process had already
    started is kept).

    Each Ray worker asks for as many CPUs as it runs torch threads and holds them while it lives
    (a pool's actors live the whole session), so a cluster of 2 CPUs held by ``minilm_pool``'s two
    workers could never place ``smollm_pool``'s: its first test would wait for ever. Ray's CPUs are
    a count it schedules by, not the machine's cores: 4 of them, with every pool's workers pinned
    to one thread (``RayConfig(threads=1)``), host both pools at once. The tests run one at a time,
    so only one pool computes at once and the 2 cores are not oversubscribed. (Pools that gave
    their CPUs back between tests would each load their model again per test: minutes.)"""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    yield ray
    if started:
        ray.shutdown()


def _pool(model: str):
    from headscope.reports.stages.sharded import RayConfig, ShardPool

    load = {"model": model, "backend": "inhouse", "dtype": "fp32", "trust_remote_code": False}
    return ShardPool(RayConfig(workers=2, threads=1), load).connect()


@pytest.fixture(scope="session")
def minilm_pool(ray_cluster):
    """A :class:`~headscope.reports.stages.sharded.ShardPool` of two workers (one thread and one
    Ray CPU each), each loading MiniLM once, for every sharded-stage test of the session."""
    p = _pool("minilm-l6")
    yield p
    p.close()


@pytest.fixture(scope="session")
def smollm_pool(ray_cluster):
    """A :class:`~headscope.reports.stages.sharded.ShardPool` of two workers (one thread and one
    Ray CPU each), each loading SmolLM2-135M (the shipped GGUF, dequantised once into the cache)
    once, for every sharded-stage test of the session; it holds the two Ray CPUs ``minilm_pool``
    leaves free (see ``ray_cluster``), so both live in one session."""
    p = _pool("smollm2-135m")
    yield p
    p.close()


@pytest.fixture
def one_thread():
    """torch on one thread for the test, as each pool worker runs (``RayConfig(threads=1)``), then
    back: a single-process reference compared exactly with the workers' must run on as many threads
    as they do (EAP-IG's gradient reductions, for one, depend on the thread count). Under ``make
    test`` a 2-core machine's xdist workers already run one thread each; ``-n 0``, or more cores,
    do not."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
