"""Small real report runs the stage tests share: MiniLM-L6 with every stage's settings cut down
(the same frames, columns and dtypes as the default run, a fraction of its time), and a tiny
random Llama, whose KV-cache stage runs (MiniLM, an encoder, has none). Each runs once a session.
The sharded-stage tests share one local Ray cluster (``num_cpus=2``) and one pool of two MiniLM
workers (``minilm_pool``), started on first use and shut down at the session's end."""

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


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 2 CPUs (skipped where Ray, the ``ray`` extra, is not installed);
    one a session, shut down after it (a cluster the process had already started is kept)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def minilm_pool(ray_cluster):
    """A :class:`~headscope.reports.stages.sharded.ShardPool` of two workers (one thread each),
    each loading MiniLM once, for every sharded-stage test of the session."""
    from headscope.reports.stages.sharded import RayConfig, ShardPool

    load = {"model": "minilm-l6", "backend": "inhouse", "dtype": "fp32", "trust_remote_code": False}
    p = ShardPool(RayConfig(workers=2), load).connect()
    yield p
    p.close()
