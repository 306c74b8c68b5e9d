"""Many checkpoints in one job: each checkpoint's report run as its own job, one after another
(the default) or in parallel on Ray (``--ray``), a failing one recorded and the others run.

Each job is :func:`~headscope.reports.pipeline.build_report` of one checkpoint into its own
subfolder ``<out>/<label>`` (a complete report, as ``headscope report CKPT`` writes it). On Ray,
each checkpoint is one Ray task: ``--workers`` tasks run at once, each given ``cluster CPUs //
workers`` CPUs as its torch (and BLAS) threads, so workers × threads ≤ cores; every task loads its
own checkpoint by path (the path must be readable from every node: a shared folder on a cluster).
The stages inside a job run in that task's process (a job's own ``RunConfig.ray`` is dropped: the
checkpoints are the parallel unit here, not the stages' items). A task whose worker dies is run
once more by Ray; a job that raises is recorded as failed with its error's first line. Jobs that
wait for CPUs other work holds are waited for with a warning naming the CPUs asked and free
(:func:`~headscope.reports.stages.sharded.wait_get`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from headscope.reports.checkpoint_inputs import Checkpoint
from headscope.reports.stages.config import RunConfig

__all__ = ["JobResult", "run_jobs"]

#: the environment a Ray task is given from the driver's (offline switches, caches)
_ENV_PASSED = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HEADSCOPE_CACHE", "XDG_CACHE_HOME", "TOKENIZERS_PARALLELISM")


@dataclass(frozen=True)
class JobResult:
    """One checkpoint's job: ``out_dir`` (its report folder), ``ok``, ``error`` (the first line of
    what failed, None when it ran) and ``seconds`` (wall time of the job)."""

    checkpoint: Checkpoint
    out_dir: Path
    ok: bool
    error: str | None
    seconds: float


def _first_line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def report_job(model: str, config: RunConfig, out_dir: str, threads: int | None = None) -> dict:
    """Build one checkpoint's report; ``{"ok", "error", "seconds"}`` (an exception is the job's
    failure, recorded, never raised: the other checkpoints still run)."""
    from headscope.reports.pipeline import build_report

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        build_report(model, config, out_dir=out_dir, quiet=True)
    except Exception as e:  # noqa: BLE001 - one checkpoint's failure is recorded; the others run
        return {"ok": False, "error": _first_line(e), "seconds": round(time.perf_counter() - t0, 2)}
    return {"ok": True, "error": None, "seconds": round(time.perf_counter() - t0, 2)}


def run_jobs(checkpoints: list[Checkpoint], config: RunConfig, out: Path, *, ray=None, notice=None) -> list[JobResult]:
    """Every checkpoint's report under ``out/<label>``, in order (``ray``: a
    :class:`~headscope.reports.stages.sharded.RayConfig`, the jobs in parallel on its cluster);
    ``notice(line)`` is told as each job ends."""
    config = replace(config, ray=None)
    out = Path(out)
    if ray is None:
        results = []
        for ck in checkpoints:
            r = report_job(ck.model, config, str(out / ck.label))
            results.append(_result(ck, out, r, notice))
        return results
    return _on_ray(checkpoints, config, out, ray, notice)


def _unplaced(ray, refs, pool) -> str | None:
    """A line when jobs may be waiting for CPUs that other work holds: fewer free than one job asks
    for, and more held than this run's unfinished jobs can hold; else None."""
    unfinished = len(refs) - len(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
    total, free = ray.cluster_resources().get("CPU", 0), ray.available_resources().get("CPU", 0)
    ours = min(unfinished, pool.workers) * pool.threads  # the most this run's running jobs hold
    others = total - free - ours
    if unfinished == 0 or free >= pool.threads or others <= 0:
        return None
    where = pool.config.address or "the local Ray cluster"
    return (
        f"Ray cannot start every checkpoint job yet: each asks for {pool.threads} CPU; {where} has "
        f"{free:g} of {total:g} CPUs free and other jobs' actors or tasks hold at least {others:g}; "
        f"{unfinished} job(s) wait or run"
    )


def _result(ck: Checkpoint, out: Path, r: dict, notice) -> JobResult:
    res = JobResult(checkpoint=ck, out_dir=out / ck.label, ok=r["ok"], error=r["error"], seconds=r["seconds"])
    if notice is not None:
        notice(
            f"{ck.label}: report written to {res.out_dir} in {res.seconds:.1f} s"
            if res.ok
            else f"{ck.label}: report failed ({res.error})"
        )
    return res


def _on_ray(checkpoints, config, out, ray_config, notice) -> list[JobResult]:
    """The jobs as Ray tasks (``--workers`` at a time); the cluster joined or started by
    :class:`~headscope.reports.stages.sharded.ShardPool` (a bad address or worker count refused in
    one line before any job runs)."""
    from headscope.reports.stages.sharded import ShardPool, wait_get

    pool = ShardPool(ray_config, load={}).connect()
    try:
        ray = pool.ray
        threads = pool.threads
        env = {k: os.environ[k] for k in _ENV_PASSED if k in os.environ}
        env.update({v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
        task = ray.remote(num_cpus=threads, max_retries=1)(report_job).options(runtime_env={"env_vars": env})
        refs = [task.remote(ck.model, config, str(out / ck.label), threads) for ck in checkpoints]
        results = []
        for ck, ref in zip(checkpoints, refs):
            try:
                r = wait_get(ray, ref, lambda: _unplaced(ray, refs, pool), ray_config.notice_after)
            except ray.exceptions.RayError as e:  # the worker died twice: this checkpoint failed
                r = {"ok": False, "error": f"Ray: {_first_line(e)}", "seconds": float("nan")}
            results.append(_result(ck, out, r, notice))
        return results
    finally:
        pool.close()
