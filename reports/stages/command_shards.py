"""A hand-written command's stage work on Ray workers (``headscope roles|prune|... --ray``).

The commands that run one stage alone (``roles``, ``prune``, ...) shard it as the report does:
:func:`command_pool` connects a :class:`~headscope.reports.stages.sharded.ShardPool` before the
model loads (a bad ``--ray-address`` or ``--workers`` is refused at once) and closes it when the
command ends; :func:`merged` runs the stage's :meth:`~headscope.reports.stages.base.Stage.split`
parts through :meth:`~headscope.reports.stages.base.Stage.run_part` on the workers and returns
their :meth:`~headscope.reports.stages.base.Stage.merge`. The command then finishes the merged
parts with the same analysis function the stage's :meth:`~headscope.reports.stages.base.Stage.finish`
calls, and writes its own files from it: they equal its run without ``--ray``.

Without ``--ray`` (``ray`` is None) nothing here starts or imports Ray.

>>> with command_pool(None, "minilm-l6") as pool:
...     pool is None
True
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from headscope.reports.stages.base import RunContext, StageResult

log = logging.getLogger(__name__)

__all__ = ["command_pool", "merged", "shard_context"]


@contextlib.contextmanager
def command_pool(
    ray,
    model: str,
    *,
    backend: str = "auto",
    dtype: str = "fp32",
    trust_remote_code: bool = False,
    device: str | None = None,
) -> Iterator[object | None]:
    """The command's :class:`~headscope.reports.stages.sharded.ShardPool` under ``ray`` (a
    :class:`~headscope.reports.stages.sharded.RayConfig`), connected, closed on exit; None without
    ``--ray``. ``model``: the MODEL argument (the workers load it by name or path); ``device``: the
    command's resolved ``--device`` (``cuda``: each worker asks Ray for its GPU share)."""
    if ray is None:
        yield None
        return
    from headscope.reports.stages.sharded import ShardPool

    load = {"model": str(model), "backend": backend, "dtype": dtype, "trust_remote_code": trust_remote_code}
    if device is not None:
        load["device"] = str(device)
    pool = ShardPool(ray, load).connect()
    try:
        yield pool
    finally:
        pool.close()


def shard_context(pool, model, *, seed: int = 0, full: bool = False, **fields) -> RunContext:
    """The :class:`~headscope.reports.stages.base.RunContext` a stage's parts read, for ``model``
    (loaded in the driver) and ``pool``; ``fields``: ``inputs``, ``role_groups``, ``frames``. The
    workers load the backend the driver's load chose (no second ``--backend auto`` probe)."""
    pool.load["backend"] = model.backend
    name = pool.load["model"]
    return RunContext(name=name, model=model, tokenizer=model.tokenizer, seed=seed, full=full, shards=pool, **fields)


def merged(ctx: RunContext, stage: str, cfg, parts=None) -> StageResult | None:
    """The stage ``stage``'s parts (:meth:`~headscope.reports.stages.base.Stage.split` into the
    pool's workers, or ``parts`` where the driver holds no loaded model to split by) run on the
    workers and merged in order, not finished; None where the stage does not split (it then runs
    whole in the driver, logged)."""
    from headscope.reports.stages.registry import STAGES

    s = STAGES[stage]
    parts = s.split(ctx, cfg, ctx.shards.workers) if parts is None else parts
    if parts is None:
        log.info("the %s stage does not shard yet: it runs in the driver", stage)
        return None
    return s.merge(ctx.shards.each(ctx, s, cfg, parts, frames=ctx.frames))
