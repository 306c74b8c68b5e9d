"""The roles pipeline in parts, for a sharded run (``--ray``): each worker fills the role
groups' reducers with its part of every stage's batches, the driver merges them and finishes.

:func:`fill_roles` runs one part ``(k, n)``: every corpus is read, tokenised and bucketed as
:func:`~headscope.analyses.roles.pipeline.head_roles` does, and the part runs every ``n``-th
batch from the ``k``-th (:func:`~headscope.probes.capture.in_part`), so each batch, and each
item's values, is the one a single process computes. :func:`merge_filled` merges the parts'
reducers (their ``merge``: per-item values joined and put back in item order, sums added) and
stream reports (:func:`~headscope.probes.capture.merge_reports`); :func:`finish_filled` runs
each group's ``finish`` on the merged reducers (the verdicts, bootstrap intervals and
permutation p-values, on the collected per-item values) and assembles the
:class:`~headscope.analyses.roles.pipeline.RolesResult` as ``head_roles`` does. A generated
group's feed shards where it says so (:attr:`~headscope.analyses.roles.base.Role.shards`: every
shipped one; IOI by batches of items, function vectors by groups of tasks); one that does not
runs whole in part 0.

>>> parts = [fill_roles(model, cfg=cfg, part=(k, 2)) for k in range(2)]  # doctest: +SKIP
>>> res = finish_filled(model, merge_filled(parts), cfg=cfg)  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from headscope.analyses.roles.base import REGISTRY
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.examples import build_examples
from headscope.analyses.roles.inputs import read_inputs
from headscope.analyses.roles.pipeline import (
    RolesResult,
    _assemble,
    _check_options,
    _contexts,
    _fill,
    _stages,
    check_roles,
    corpora_for,
)
from headscope.probes.capture import merge_reports

__all__ = ["FilledRoles", "fill_roles", "finish_filled", "merge_filled"]


@dataclass
class FilledRoles:
    """One part's (or the merged) filled role groups: ``groups`` ``{group: (reducer,
    StreamReport)}`` (None: a group this part did not run), ``timings`` seconds per stage."""

    groups: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)


def fill_roles(
    model,
    *,
    cfg: RolesConfig = RolesConfig(),
    roles: Sequence[str] | None = None,
    inputs: Mapping | None = None,
    options: Mapping | None = None,
    part: tuple[int, int] = (0, 1),
) -> FilledRoles:
    """The role groups ``roles`` (:func:`~headscope.analyses.roles.pipeline.check_roles`) filled with
    part ``(k, n)`` of every stage's batches; ``inputs``: ``{"text"|"conllu"|"coref": ...}`` as
    ``head_roles`` takes them (missing: the shipped corpora). Raises ``ValueError`` for a part
    that is not ``0 <= k < n``."""
    k, n = part
    if not 0 <= k < n:
        raise ValueError(f"part must be (k, n) with 0 <= k < n; got {part!r}")
    wanted, opts = check_roles(roles), _check_options(options)
    read = read_inputs(corpora_for(wanted), _given(inputs), cfg, {})
    out = FilledRoles()
    for stage, corpus, groups in _stages(wanted):
        t0 = time.perf_counter()
        rs = [REGISTRY[g] for g in groups]
        ctxs = _contexts(model, corpus, rs, read.get(corpus), cfg, opts, part)
        out.groups.update(_fill(corpus, rs, ctxs, cfg, None))
        out.timings[stage] = time.perf_counter() - t0
    return out


def merge_filled(parts: Sequence[FilledRoles]) -> FilledRoles:
    """The parts' reducers merged in part order (each group's first filled reducer takes the
    others'), their stream reports merged; timings: the longest part's per stage. Raises
    ``ValueError`` for no parts or parts of different groups."""
    if not parts:
        raise ValueError("merge_filled needs at least one part; got none")
    names = list(parts[0].groups)
    if any(list(p.groups) != names for p in parts):
        raise ValueError(f"the parts filled different role groups: {[list(p.groups) for p in parts]}")
    out = FilledRoles()
    reports: dict[int, object] = {}  # a stream's groups share one report: merged once
    for g in names:
        filled = [p.groups[g] for p in parts if p.groups[g] is not None]
        red = filled[0][0]
        for other, _ in filled[1:]:
            red = red.merge(other)
        key = id(filled[0][1])
        if key not in reports:
            reports[key] = merge_reports([rep for _, rep in filled])
        out.groups[g] = (red, reports[key])
    for p in parts:
        for stage, sec in p.timings.items():
            out.timings[stage] = max(out.timings.get(stage, 0.0), sec)
    return out


def finish_filled(
    model,
    filled: FilledRoles,
    *,
    cfg: RolesConfig = RolesConfig(),
    roles: Sequence[str] | None = None,
    inputs: Mapping | None = None,
    options: Mapping | None = None,
    examples: bool = True,
) -> RolesResult:
    """Each group's ``finish`` on ``filled`` (merged), on ``model`` (the driver's), assembled as
    :func:`~headscope.analyses.roles.pipeline.head_roles` assembles it; the same ``cfg``,
    ``roles``, ``inputs`` and ``options`` as the parts."""
    wanted, opts = check_roles(roles), _check_options(options)
    file_skips: dict[str, dict] = {}
    t0 = time.perf_counter()
    read = read_inputs(corpora_for(wanted), _given(inputs), cfg, file_skips)
    timings = {"read": time.perf_counter() - t0, **filled.timings}
    outputs, modes = {}, {}
    for stage, corpus, groups in _stages(wanted):
        rs = [REGISTRY[g] for g in groups]
        ctxs = _contexts(model, corpus, rs, read.get(corpus), cfg, opts)
        t0 = time.perf_counter()
        for r in rs:
            outputs[r.name] = r.finish(*filled.groups[r.name], ctxs[r.name])
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - t0
        modes[stage] = getattr(filled.groups[rs[0].name][1], "patterns", "materialised")
    result = _assemble(model, cfg, {g: outputs[g] for g in wanted}, file_skips, timings)
    result.pattern_statistics = modes
    if examples:
        t0 = time.perf_counter()
        result.examples = build_examples(model, result, read)
        timings["examples"] = time.perf_counter() - t0
    return result


def _given(inputs: Mapping | None) -> dict:
    inputs = dict(inputs or {})
    return {"text": inputs.get("text"), "conllu": inputs.get("conllu"), "coref": inputs.get("coref")}
