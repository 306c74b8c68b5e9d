"""The bench's Ray path (``--paths roles,roles_ray2``): the roles stage on the bench's sentences
sharded over two Ray workers (:mod:`headscope.reports.stages.sharded`), each with one thread,
beside ``roles`` in one process.

Preparing it starts a local Ray cluster of 2 CPUs and two workers (each loads the model once; not
timed), runs the stage once in this process and once sharded, and says in the row's note whether
every table ``DataFrame.equals`` and the single-process stage's seconds, so the row's time divided
by that is the speed-up of two workers on this machine. The cluster is shut down when the bench
process ends. Skipped (the row says why) where Ray is not installed.
"""

from __future__ import annotations

import atexit
import importlib.util
import time

from headscope.reports.tools.bench.state import BenchState, PathSkipped, Prepared

__all__ = ["roles_ray2"]


def roles_ray2(bench: BenchState) -> Prepared:
    from headscope.analyses.roles import pipeline as roles_pipeline
    from headscope.analyses.roles.config import RolesConfig
    from headscope.reports.stages.base import RunContext
    from headscope.reports.stages.registry import STAGES
    from headscope.reports.stages.sharded import RayConfig, ShardPool

    if importlib.util.find_spec("ray") is None:  # the runner imports it, never this module
        raise PathSkipped("needs Ray: pip install 'headscope[ray]'")
    stage, cfg = STAGES["roles"], RolesConfig(batch_size=bench.cfg.batch_size)
    groups = tuple(roles_pipeline.TEXT_GROUPS)
    load = {"model": bench.cfg.model, "backend": "inhouse", "dtype": bench.cfg.dtype, "trust_remote_code": False}
    pool = ShardPool(RayConfig(workers=2), load).connect()
    atexit.register(pool.close)
    pool.pids()  # the workers started and their models loaded: not timed

    def ctx(sentences) -> RunContext:
        inputs = {"text": list(sentences)}
        return RunContext(name=bench.cfg.model, model=bench.model("inhouse"), role_groups=groups, inputs=inputs)

    def sharded(sentences):
        c = ctx(sentences)
        return pool.run(c, stage, cfg, stage.split(c, cfg, pool.workers))

    t0 = time.perf_counter()
    whole = stage.run(ctx(bench.sentences), cfg)
    single = time.perf_counter() - t0
    got = sharded(bench.sentences)
    equal = set(got.frames) == set(whole.frames) and all(got.frames[k].equals(f) for k, f in whole.frames.items())
    note = (
        f"2 workers x {pool.threads} thread(s); the stage in one process: {single:.2f} s "
        f"(speed-up = that / this row's time); tables equal to it: {'yes' if equal else 'NO'}; groups: {', '.join(groups)}"
    )
    return Prepared(
        lambda: sharded(bench.sentences), lambda: sharded(bench.sentences[: bench.cfg.batch_size]), None, note
    )
