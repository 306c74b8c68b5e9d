"""Ablation of each unit's ``z`` on the CLEAN run: zero, mean and resample ablation.

For every unit (a query head, or a KV group with ``unit="kv_group"``) and every item, the
clean input runs with the unit's ``z [batch, head, pos, d_head]`` replaced by

* ``zero``: zeros;
* ``mean``: one ``d_head`` vector per head, that head's ``z`` averaged over every token of
  the task's clean inputs, the same at every position and for every item: the definition
  ``prune`` uses over its metric's texts (:func:`~headscope.analyses.pruning.ablation.mean_z`);
* ``mean_position``: the mean of that head's ``z`` over the task's clean inputs at each
  position; inputs of different lengths are aligned from the end (position ``-1`` is every
  input's last token), so a position's mean is over the inputs that have it;

Both means include the ablated item, as prune's corpus mean includes the text it scores:
mean ablation replaces a head by one fixed reference activation, and a reference that
changed with the item (leaving the item out) would be a different ablation for every item.
An item's share of it is one in ``n_items`` (the task's size is in the frame's ``n``).
* ``resample``: the ``z`` of the clean run of ANOTHER item of the same token length: a
  seeded derangement (one random cycle, ``torch.Generator`` seeded with ``cfg.seed``)
  within each length group; an item alone in its length group has no source and is left
  out of the resample rows (its ``n`` says so).

Effect (frame ``method`` ``"ablation_{zero,mean,mean_position,resample}"``): the *fraction of the
clean − corrupted gap lost*, ``(m_clean - m_ablated) / gap`` with ``gap = mean(m_clean -
m_corrupted)``, like noising: 0 = ablating the unit leaves the clean metric as it is,
1 = it brings the metric down to the corrupted run's (above 1: below it). Batched
through stacked replicas like :func:`~headscope.analyses.patching.activation.patched_metrics`.
"""

from __future__ import annotations

import logging

import pandas as pd
import torch

from headscope.analyses.patching.activation import (
    PatchConfig,
    RunMetrics,
    capture_z,
    chosen_units,
    paired_runs,
    patched_metrics,
    subset_frame,
)
from headscope.analyses.patching.items import Task
from headscope.analyses.patching.tasks import metric_fn

log = logging.getLogger(__name__)


def derangement(n: int, gen: torch.Generator) -> list[int]:
    """A permutation of ``range(n)`` without fixed points (one random cycle); ``[]`` for ``n < 2``.

    >>> d = derangement(5, torch.Generator().manual_seed(0))
    >>> sorted(d) == list(range(5)) and all(d[i] != i for i in range(5))
    True
    """
    if n < 2:
        return []
    order = torch.randperm(n, generator=gen).tolist()
    out = [0] * n
    for i in range(n):
        out[order[i]] = order[(i + 1) % n]
    return out


def resample_sources(task: Task, seed: int) -> dict[int, int | None]:
    """``{item: source item}``: a seeded derangement within each group of equal-length
    items (item order); ``None`` for an item alone in its length group."""
    gen = torch.Generator().manual_seed(seed)
    by_len: dict[int, list[int]] = {}
    for i, it in enumerate(task.items):
        by_len.setdefault(len(it.clean), []).append(i)
    out: dict[int, int | None] = {}
    for length in sorted(by_len):
        idx = by_len[length]
        d = derangement(len(idx), gen)
        for k, i in enumerate(idx):
            out[i] = idx[d[k]] if d else None
    return out


def mean_z(model, task: Task, batch_size: int) -> dict[int, torch.Tensor]:
    """``{layer: mean z [head, max_len, d_head]}`` over the task's clean inputs, aligned from
    the end (an input of length ``T`` contributes to the last ``T`` positions); float32."""
    max_len = max(len(it.clean) for it in task.items)
    sums: dict[int, torch.Tensor] = {}
    counts = torch.zeros(max_len)
    for clean, _, _, _, _ in task.batches(batch_size):
        _, z = capture_z(model, clean)
        t = clean.shape[1]
        for l, zl in z.items():
            if l not in sums:
                sums[l] = torch.zeros(zl.shape[1], max_len, zl.shape[3])
            sums[l][:, max_len - t :] += zl.float().sum(0).cpu()  # host sums; patched in on z's device
        counts[max_len - t :] += clean.shape[0]
    return {l: s / counts.clamp(min=1)[None, :, None] for l, s in sums.items()}


def pooled_mean_z(task: Task, means: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """``{layer: z [head, d_head]}`` averaged over every token of the task's clean inputs,
    from :func:`mean_z`'s per-position means (each position weighted by the inputs that have it)."""
    max_len = max(len(it.clean) for it in task.items)
    counts = torch.zeros(max_len)
    for it in task.items:
        counts[max_len - len(it.clean) :] += 1
    w = counts / counts.sum()
    return {l: (m * w[None, :, None]).sum(1) for l, m in means.items()}


def ablation_patching(model, task: Task, cfg: PatchConfig = PatchConfig()) -> tuple[pd.DataFrame, RunMetrics]:
    """Zero/mean/resample ablation (``cfg.ablations``) of every unit on the clean run ->
    (:data:`PATCH_COLUMNS` frame, one block per kind in ``cfg.ablations`` order; the
    clean/corrupted metrics)."""
    units = chosen_units(model.spec, cfg)
    metric = metric_fn(task.metric)
    n = len(task.items)
    run = RunMetrics(torch.empty(n), torch.empty(n))
    means = mean_z(model, task, cfg.batch_size) if {"mean", "mean_position"} & set(cfg.ablations) else None
    pooled = means and pooled_mean_z(task, means)
    sources = resample_sources(task, cfg.seed) if "resample" in cfg.ablations else None
    if sources is not None and all(v is None for v in sources.values()):
        raise ValueError("resample ablation needs at least two items of the same token length; the task has none")
    delta = {k: torch.full((n, len(units)), float("nan")) for k in cfg.ablations}
    for b in paired_runs(model, task, cfg, metric, run):
        bsz, t = b.clean.shape
        for kind in cfg.ablations:
            rows = list(range(bsz))
            if kind == "zero":
                src = {l: torch.zeros_like(z) for l, z in b.z_clean.items()}
            elif kind == "mean":
                src = {l: m.to(b.z_clean[l].dtype)[None, :, None].expand_as(b.z_clean[l]) for l, m in pooled.items()}
            elif kind == "mean_position":
                src = {l: m[:, -t:].to(b.z_clean[l].dtype)[None].expand_as(b.z_clean[l]) for l, m in means.items()}
            else:
                rows = [i for i, item in enumerate(b.rows) if sources[item] is not None]
                if not rows:
                    continue
                donors = torch.tensor([task.items[sources[b.rows[i]]].clean for i in rows], dtype=torch.long)
                _, src = capture_z(model, donors)
            sel = torch.tensor(rows)
            wrong = None if b.wrong is None else b.wrong[sel]
            patched = patched_metrics(
                model, b.clean[sel], src, units, metric, b.answer[sel], wrong, cfg.max_rows
            )  # [rows, unit]
            delta[kind][[b.rows[i] for i in rows]] = b.m_clean[sel][:, None] - patched
        log.info("ablation: %d/%d items", max(b.rows) + 1, n)
    gap = float(run.gap.mean())
    frames = [subset_frame(delta[k], gap, units, cfg, f"ablation_{k}") for k in cfg.ablations]
    return pd.concat(frames, ignore_index=True), run
