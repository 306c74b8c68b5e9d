"""The bench's Ray paths (``--paths roles_stage roles_ray1 roles_ray2``): the roles stage's text
groups on the bench's sentences in one process (``roles_stage``), on one Ray worker
(``roles_ray1``: ``--ray --workers 1``) and sharded over two (``roles_ray2``), every worker and the
process with one thread, so the targets ``roles_ray1 / roles_stage`` (Ray's overhead, the issue's
<= 1.15) and ``roles_stage / roles_ray2`` (the speed-up of two workers on two cores) are measured
in the same run, in interleaved rounds.

Preparing a Ray path starts (once) a local Ray cluster of 3 logical CPUs, so both pools (1 + 2
one-thread workers) live at once (only one computes at a time: the rounds time one path after
another), and the path's workers (each loads the model once; not timed); it runs the stage sharded
once and says in the row's note whether every table ``DataFrame.equals`` the single-process
stage's. The cluster is shut down when the bench process ends. Skipped (the row says why) where Ray
is not installed.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging

from headscope.reports.tools.bench.state import BenchState, PathSkipped, Prepared

__all__ = ["roles_ray1", "roles_ray2", "roles_stage"]

#: Ray CPUs of the bench's local cluster: room for the 1-worker and the 2-worker pool at once
RAY_CPUS = 3
_WHOLE: dict[int, object] = {}  # the single-process stage's result, per bench run


def _stage(bench: BenchState):
    """``(stage, cfg, ctx(sentences))``: the roles stage, its config and a context on the bench's
    in-house model with the text groups."""
    from headscope.analyses.roles import pipeline as roles_pipeline
    from headscope.analyses.roles.config import RolesConfig
    from headscope.reports.stages.base import RunContext
    from headscope.reports.stages.registry import STAGES

    groups = tuple(roles_pipeline.TEXT_GROUPS)

    def ctx(sentences) -> RunContext:
        inputs = {"text": list(sentences)}
        return RunContext(name=bench.cfg.model, model=bench.model("inhouse"), role_groups=groups, inputs=inputs)

    return STAGES["roles"], RolesConfig(batch_size=bench.cfg.batch_size), ctx


def _whole(bench: BenchState):
    if id(bench) not in _WHOLE:
        stage, cfg, ctx = _stage(bench)
        _WHOLE[id(bench)] = stage.run(ctx(bench.sentences), cfg)
    return _WHOLE[id(bench)]


def roles_stage(bench: BenchState) -> Prepared:
    stage, cfg, ctx = _stage(bench)
    groups = ", ".join(ctx([]).role_groups)
    return Prepared(
        lambda: stage.run(ctx(bench.sentences), cfg),
        lambda: stage.run(ctx(bench.sentences[: bench.cfg.batch_size]), cfg),
        None,
        f"the roles stage in this process, 1 thread (OMP_NUM_THREADS=1 in make ray-bench); groups: {groups}",
    )


def _on_ray(bench: BenchState, workers: int) -> Prepared:
    from headscope.reports.stages.sharded import RayConfig, ShardPool, import_ray

    if importlib.util.find_spec("ray") is None:  # the runner imports it, never this module
        raise PathSkipped("needs Ray: pip install 'headscope[ray]'")
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        atexit.register(ray.shutdown)
    stage, cfg, ctx = _stage(bench)
    load = {"model": bench.cfg.model, "backend": "inhouse", "dtype": bench.cfg.dtype, "trust_remote_code": False}
    pool = ShardPool(RayConfig(workers=workers, threads=1), load).connect()
    atexit.register(pool.close)
    pool.pids()  # the workers started and their models loaded: not timed

    def sharded(sentences):
        c = ctx(sentences)
        return pool.run(c, stage, cfg, stage.split(c, cfg, pool.workers))

    whole, got = _whole(bench), sharded(bench.sentences)
    equal = set(got.frames) == set(whole.frames) and all(got.frames[k].equals(f) for k, f in whole.frames.items())
    note = (
        f"{workers} worker(s) x 1 thread on a local cluster of {RAY_CPUS} Ray CPUs; "
        f"tables equal to the single-process stage's: {'yes' if equal else 'NO'}"
    )
    return Prepared(
        lambda: sharded(bench.sentences), lambda: sharded(bench.sentences[: bench.cfg.batch_size]), None, note
    )


def roles_ray1(bench: BenchState) -> Prepared:
    return _on_ray(bench, 1)


def roles_ray2(bench: BenchState) -> Prepared:
    return _on_ray(bench, 2)
