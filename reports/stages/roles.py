"""The head-roles stage: every registered role group on its corpora
(:func:`~headscope.analyses.roles.pipeline.head_roles`), its statistics, examples and clusters.

Writes ``roles``, ``stats``, ``examples``, ``clusters``, ``coref_pairs`` and ``skipped``; its
summary holds nothing (run.json's ``n_items`` comes from its ``counts``). Its report part is the
roles overview with the head view, one subsection per role, and the attention statistics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from headscope.analyses.roles.config import RolesConfig
from headscope.reports.stages.base import RunContext, Stage, StageResult, WorkingSet

log = logging.getLogger(__name__)


class RolesStage(Stage[RolesConfig]):
    name = "roles"
    Config = RolesConfig
    command = "roles"
    help = "what each head does: the registered roles' verdicts with baselines, CIs and p-values"
    unit = "items"
    summary_key = "roles_summary"
    reports_progress = True
    schemas = {
        "roles": {
            "layer": "int64",
            "head": "int64",
            "role": "object",
            "relation": "object",
            "direction": "object",
            "score": "float64",
            "baseline": "float64",
            "margin": "float64",
            "ci_low": "float64",
            "ci_high": "float64",
            "p_value": "float64",
            "n": "int64",
            "verdict": "bool",
            "p_raw": "float64",
            "test": "object",
            "interval": "object",
            "family": "object",
            "meets_threshold": "bool",
        },
        "stats": {"layer": "int64", "head": "int64", "metric": "object", "value": "float64", "n": "int64"},
        "examples": {
            "example": "str",
            "role": "str",
            "relation": "str",
            "direction": "str",
            "layer": "int64",
            "head": "int64",
            "level": "str",
            "sentence": "str",
            "query_index": "int64",
            "key_index": "int64",
            "query_word": "str",
            "key_word": "str",
            "weight": "float64",
            "gold": "bool",
        },
        "clusters": {"layer": "int64", "head": "int64", "x": "float64", "y": "float64", "cluster": "int64"},
        "coref_pairs": {
            "layer": "int64",
            "head": "int64",
            "kind": "str",
            "n_pairs": "int64",
            "both_right": "int64",
            "one_right": "int64",
            "none_right": "int64",
            "pair_accuracy": "float64",
        },
        "skipped": {"analysis": "str", "reason": "str", "count": "int64"},
        "qk_drivers": {
            "role": "object",
            "layer": "int64",
            "head": "int64",
            "side": "object",
            "rank": "int64",
            "component": "object",
            "share": "float64",
            "n": "int64",
        },
    }

    def config(self, ctx: RunContext, given: RolesConfig | None = None) -> RolesConfig:
        return given if given is not None else RolesConfig(seed=ctx.seed)

    def plan(self, ctx: RunContext, cfg: RolesConfig) -> list[WorkingSet]:
        from headscope.analyses.roles.pipeline import check_roles
        from headscope.reports.stages.plans import role_corpora, roles_stages

        groups = check_roles(ctx.role_groups)
        return roles_stages(ctx.shape, cfg, groups, role_corpora(groups, ctx.inputs), ctx.tokenizer)

    def work(self, ctx: RunContext, cfg: RolesConfig):
        """Every item of its corpora and generated sequences, each a forward at the mean of the
        corpora's longest lengths (one forward per item; the reducers and statistics ride on it),
        without the unembedding (:func:`~headscope.probes.capture.run_batch` computes no logits);
        calls: the items × layers (each layer's reducers run per item)."""
        from headscope.analyses.roles.pipeline import check_roles
        from headscope.reports.stages.clock import forward_work
        from headscope.reports.stages.plans import role_corpora, roles_items

        groups = check_roles(ctx.role_groups)
        sets = ctx.plans.get(self.name) or self.plan(ctx, cfg)
        t = sum(w.longest for w in sets) / max(1, len(sets))
        n = roles_items(groups, role_corpora(groups, ctx.inputs), cfg)
        return forward_work(ctx.shape, n, int(t))

    def fitted(self, cfg: RolesConfig, batch_sizes) -> RolesConfig:
        from dataclasses import replace

        b = min([cfg.batch_size, *batch_sizes.values()])  # one batch for every corpus
        return replace(cfg, batch_size=b) if b < cfg.batch_size else cfg

    def run(self, ctx: RunContext, cfg: RolesConfig) -> StageResult:
        from headscope.analyses.roles.pipeline import head_roles

        rr = head_roles(ctx.model, cfg=cfg, progress=_timer(ctx, cfg), roles=ctx.role_groups, **(ctx.inputs or {}))
        return _result(ctx, cfg, rr)

    def split(self, ctx: RunContext, cfg: RolesConfig, n: int) -> list:
        """``n`` interleaved parts of every role group's batches (:class:`~headscope.reports.stages.sharded.Interleaved`):
        each worker reads and buckets the corpora as one process does and runs every ``n``-th
        batch, so each item's values are the single run's; the verdicts, intervals and p-values
        and the examples run after the merge (:meth:`finish`); IOI's S-inhibition path patching
        (:class:`PathsPart`) and the QK drivers (:class:`DriversPart`) go back to the workers."""
        from headscope.reports.stages.sharded import Interleaved

        return [Interleaved(k, n) for k in range(n)]

    def run_part(self, ctx: RunContext, cfg: RolesConfig, part) -> StageResult:
        from headscope.analyses.roles.parts import fill_roles

        if isinstance(part, DriversPart):  # the last round: the QK drivers of every n-th role (_result)
            from headscope.analyses.qk.roles import driver_parts

            return StageResult(
                {}, {"drivers": driver_parts(ctx.model, part.roles, seed=part.seed, part=(part.k, part.n))}
            )
        if isinstance(part, PathsPart):  # the second round: IOI's S-inhibition path patching (finish)
            from headscope.analyses.patching.path import path_deltas

            delta, run, senders, read = path_deltas(ctx.model, part.task, part=(part.k, part.n), **part.kwargs)
            return StageResult({}, {"delta": delta, "run": run, "senders": senders, "read": read})

        filled = fill_roles(ctx.model, cfg=cfg, roles=ctx.role_groups, inputs=ctx.inputs, part=(part.k, part.n))
        return StageResult({}, {"filled": filled})  # the filled reducers: merged and finished in the driver

    def merge(self, parts) -> StageResult:
        from headscope.analyses.roles.parts import merge_filled

        return StageResult({}, {"filled": merge_filled([p.summary["filled"] for p in parts])})

    def finish(self, ctx: RunContext, cfg: RolesConfig, merged: StageResult) -> StageResult:
        from headscope.analyses.roles.parts import finish_filled

        filled = merged.summary["filled"]
        options = None
        if ctx.shards is not None:  # a group's path patching (IOI's S-inhibition) on the workers (PathsPart)
            from headscope.analyses.roles.base import REGISTRY

            paths = lambda model, task, **kw: _paths_on(ctx.shards, ctx, cfg, task, kw)  # noqa: E731
            options = {g: {"paths": paths} for g in filled.groups if "paths" in REGISTRY[g].options}
        rr = finish_filled(ctx.model, filled, cfg=cfg, roles=ctx.role_groups, inputs=ctx.inputs, options=options)
        return _result(ctx, cfg, rr)

    def section(self, frames, meta) -> list:
        from headscope.reports.head_view import head_view_block
        from headscope.reports.sections.role_detail import role_sections
        from headscope.reports.sections.roles import qk_drivers_blocks, roles_section
        from headscope.reports.sections.stats import stats_section

        roles, n_layers, n_heads = frames.get("roles"), int(meta["layers"]), int(meta["heads"])
        out = []
        if roles is not None and not roles.empty:
            rc = (meta.get("config") or {}).get("roles") or {}
            out.append(roles_section(roles, n_layers, n_heads, meta["model"], rc, frames.get("coref_pairs")))
            out[-1].blocks += qk_drivers_blocks(frames.get("qk_drivers"))
            out[-1].blocks.append(head_view_block(frames, n_layers, n_heads))
            out += role_sections(roles, frames.get("examples"), frames.get("roles_vs_importance"), meta.get("top", 3))
        stats = stats_section(frames.get("stats"), frames.get("clusters"))
        return out + ([stats] if stats else [])


def _result(ctx: RunContext, cfg: RolesConfig, rr) -> StageResult:
    """The stage's frames, timings and counts from a :class:`~headscope.analyses.roles.pipeline.RolesResult`
    (the QK drivers computed here, on ``ctx.model``)."""
    from headscope.reports.stages.frames import examples_frame, skipped_frame

    frames = {
        "roles": rr.frame.reset_index(drop=True),
        "stats": rr.stats.reset_index(drop=True),
        "examples": examples_frame(rr.examples),
        "clusters": rr.clusters.reset_index(drop=True),
        "coref_pairs": rr.coref_pairs.reset_index(drop=True),
        "skipped": skipped_frame(rr.skipped),
    }
    timings = {f"roles.{k}": round(float(v), 3) for k, v in rr.timings.items()}
    t0 = time.perf_counter()
    frames["qk_drivers"] = _qk_drivers(ctx, rr.frame, cfg.seed, cfg)
    timings["roles.qk_drivers"] = round(time.perf_counter() - t0, 3)
    return StageResult(frames, {}, timings, dict(rr.n_items))


def _qk_drivers(ctx: RunContext, roles, seed: int, cfg: RolesConfig | None = None):
    """What drives the attention of each task role's top head (:func:`~headscope.analyses.qk.roles.role_drivers`):
    one forward per batch of up to 16 items of the role's task; a model it cannot split gives no rows (logged).
    With the run's workers (``ctx.shards``) the roles are interleaved over them (:class:`DriversPart`)."""
    from headscope.analyses.qk.roles import drivers_frame, drivers_from_parts, role_drivers, top_heads

    try:
        n = 0 if ctx.shards is None else min(ctx.shards.workers, len(top_heads(roles)))
        if n:
            parts = [DriversPart(k, n, roles, seed) for k in range(n)]
            frame, notes = drivers_from_parts(ctx.shards.run(ctx, _Drivers(), cfg, parts).summary["drivers"])
        else:
            frame, notes = role_drivers(ctx.model, roles, seed=seed)
    except Exception as e:  # the roles table is written whatever the attribution does
        frame, notes = drivers_frame(), [f"QK drivers: {str(e).strip().splitlines()[0]}"]
    for note in notes:
        log.info("%s", note)
    return frame.reset_index(drop=True)


def _timer(ctx: RunContext, cfg: RolesConfig):
    """``ctx.progress`` wrapped to say the estimated time once the first batch is timed."""
    if ctx.notice is None:
        return ctx.progress
    from headscope.analyses.roles.pipeline import _stages, check_roles
    from headscope.probes.timing import TimeEstimate
    from headscope.reports.stages.plans import role_corpora, roles_items

    groups = check_roles(ctx.role_groups)
    names = {name for name, _corpus, _gs in _stages(groups)}
    n = roles_items(groups, role_corpora(groups, ctx.inputs), cfg, getattr(ctx.model, "spec", None))
    return TimeEstimate(n, ctx.notice, inner=ctx.progress, unit="items of the role analyses", stages=names)


@dataclass(frozen=True)
class PathsPart:
    """Part ``k`` of ``n`` of a path patching's patched forwards (:func:`~headscope.analyses.patching.path.path_deltas`
    with ``part``): the task and the call's settings (``kwargs``, no ``progress``)."""

    k: int
    n: int
    task: Any
    kwargs: dict

    def __repr__(self) -> str:
        return f"path-patching forwards {self.k}, {self.k + self.n}, ..."


class _Paths:
    """The roles stage's second round on the workers (:class:`PathsPart`): the parts' deltas merged
    cell by cell, the runs' metrics (each part computes them all) from the first."""

    name, unit = "roles", "items"

    def merge(self, parts) -> StageResult:
        from headscope.analyses.patching.path import merge_deltas

        first = parts[0].summary
        delta = merge_deltas([p.summary["delta"] for p in parts])
        return StageResult({}, {**first, "delta": delta})

    def finish(self, ctx, cfg, merged: StageResult) -> StageResult:
        return merged


@dataclass(frozen=True)
class DriversPart:
    """Part ``k`` of ``n`` of the QK drivers: every ``n``-th role's top head
    (:func:`~headscope.analyses.qk.roles.driver_parts` with ``part``) of the ``roles`` frame."""

    k: int
    n: int
    roles: Any
    seed: int

    def __repr__(self) -> str:
        return f"QK drivers of roles {self.k}, {self.k + self.n}, ..."


class _Drivers:
    """The roles stage's QK-driver round on the workers (:class:`DriversPart`): each role's rows and
    notes joined by their place in the attribution order."""

    name, unit = "roles", "items"

    def merge(self, parts) -> StageResult:
        got: dict = {}
        for p in parts:
            got.update(p.summary["drivers"])
        return StageResult({}, {"drivers": got})

    def finish(self, ctx, cfg, merged: StageResult) -> StageResult:
        return merged


def _paths_on(pool, ctx: RunContext, cfg: RolesConfig, task, kwargs: dict):
    """:func:`~headscope.analyses.patching.path.path_deltas` of ``task`` with ``kwargs``, its patched
    forwards interleaved over ``pool``'s workers -> the same ``(delta, runs, senders, read)``."""
    kw = {k: v for k, v in kwargs.items() if k != "progress"}  # the workers' progress is not the driver's
    parts = [PathsPart(k, pool.workers, task, kw) for k in range(pool.workers)]
    got = pool.run(ctx, _Paths(), cfg, parts).summary
    progress = kwargs.get("progress")
    if progress is not None:
        progress(1, 1)
    return got["delta"], got["run"], got["senders"], got["read"]


STAGE = RolesStage()
