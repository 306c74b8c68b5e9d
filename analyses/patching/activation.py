"""Activation patching of each head's output ``z`` between the clean and the corrupted run.

For every unit (one query head, or with ``unit="kv_group"`` all query heads reading one
KV head) and every item:

* **denoising**: run the corrupted input with the unit's ``z [batch, head, pos, d_head]``
  replaced by the clean run's (all positions); ``delta = m_patched - m_corrupted``;
* **noising**: run the clean input with the unit's ``z`` from the corrupted run;
  ``delta = m_clean - m_patched``.

Batched like :func:`~headscope.analyses.pruning.ablation.replica_masks`: ``R`` units are
patched in one forward of ``R`` stacked replicas of a batch (rows ``r*B .. (r+1)*B``),
through :meth:`Backend.head_hooks` on any backend::

    z'[r] = z[r] + mask[r] · (z_source - z[r])          # mask[r, head] = 1 on unit r's heads

A model that can resume a forward from a layer (the in-house backend, ``model.resumable``)
computes the unpatched prefix below the lowest patched layer once per batch. Frames:
:func:`~headscope.analyses.patching.frames.effect_frame`.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

import pandas as pd
import torch

from headscope.analyses.patching.frames import effect_frame
from headscope.analyses.patching.tasks import Task, metric_fn

log = logging.getLogger(__name__)

DIRECTIONS = ("denoising", "noising")
UNITS = ("head", "kv_group")


@dataclass(frozen=True, kw_only=True)
class PatchConfig:
    """Options of a patching run (written into run.json).

    ``directions``: which of :data:`DIRECTIONS`; ``unit``: ``"head"`` or ``"kv_group"``
    (GQA: patch all query heads of a KV group together); ``batch_size``: items per
    batch; ``max_rows``: sequences per forward (replicas × batch); ``alpha``, ``n_boot``,
    ``n_perm``, ``seed``: statistics (:mod:`~headscope.analyses.patching.frames`)."""

    directions: tuple[str, ...] = ("denoising", "noising")
    unit: str = "head"
    batch_size: int = 16
    max_rows: int = 144
    alpha: float = 0.05
    n_boot: int = 1000
    n_perm: int = 10000
    seed: int = 0

    def __post_init__(self):
        bad = [d for d in self.directions if d not in DIRECTIONS]
        if bad or not self.directions:
            raise ValueError(f"directions must be a non-empty subset of {DIRECTIONS}; got {self.directions}")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}; got {self.unit!r}")
        if self.batch_size < 1 or self.max_rows < 1:
            raise ValueError(f"batch_size and max_rows must be >= 1; got {self.batch_size}, {self.max_rows}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1); got {self.alpha}")


def patch_units(spec, unit: str = "head") -> list[list[tuple[int, int]]]:
    """The units patched together: ``[[(layer, head)], ...]`` per query head, or per layer and
    KV head the query heads reading it (``unit="kv_group"``), ordered by layer.

    >>> from headscope.probes.models.backend import ModelSpec
    >>> s = ModelSpec(name="m", family="llama", n_layers=1, n_heads=4, n_kv_heads=2, d_head=8, d_model=32,
    ...     causal=True, max_positions=64, backend="inhouse")
    >>> patch_units(s, "kv_group")
    [[(0, 0), (0, 1)], [(0, 2), (0, 3)]]
    """
    if unit == "head":
        return [[(l, h)] for l in range(spec.n_layers) for h in range(spec.n_heads)]
    if unit == "kv_group":
        return [[(l, h) for h in hs] for l in range(spec.n_layers) for hs in spec.kv_groups().values()]
    raise ValueError(f"unit must be one of {UNITS}; got {unit!r}")


# ----------------------------------------------------------------------------- runs
def last_logits(model, ids: torch.Tensor, **resume) -> torch.Tensor:
    """``[batch, vocab]`` logits at the last position (all inputs of a batch have equal length)."""
    mask = torch.ones_like(ids)
    return model.forward(ids, mask, **resume)[:, -1]


def capture_z(model, ids: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """One forward: ``(last-position logits [batch, vocab], {layer: z [batch, head, pos, d_head]})``."""
    kept: dict[int, torch.Tensor] = {}

    def keep(l):
        def fn(z):
            kept[l] = z.detach().clone()
            return z

        return fn

    with torch.inference_mode(), model.head_hooks({l: keep(l) for l in range(model.spec.n_layers)}):
        logits = last_logits(model, ids)
    return logits, kept


@contextmanager
def replica_patches(model, masks: torch.Tensor, source: dict[int, torch.Tensor]):
    """Head hooks patching ``R`` stacked replicas: replica ``r`` takes ``source[l]`` (``z [batch,
    head, pos, d_head]``) on the heads where ``masks [R, layer, head]`` is 1. Removed on exit."""
    fns = {}
    for l in range(masks.shape[1]):
        m = masks[:, l]
        if not bool(m.any()):
            continue

        def fn(z, m=m, src=source[l]):
            r = m.shape[0]
            zr = z.reshape(r, z.shape[0] // r, *z.shape[1:])  # [R, batch, head, pos, d_head]
            mm = m.to(z.dtype)[:, None, :, None, None]
            return (zr + mm * (src.to(z.dtype)[None] - zr)).reshape(z.shape)

        fns[l] = fn
    with model.head_hooks(fns):
        yield


def patched_metrics(
    model, target: torch.Tensor, source_z: dict[int, torch.Tensor], units, metric, answer, wrong, max_rows: int
) -> torch.Tensor:
    """The metric ``[batch, n_units]`` of the ``target`` ids ``[batch, pos]`` with each unit's
    heads patched from ``source_z``; ``ceil(n_units B / max_rows)`` forwards."""
    n_layers, n_heads = model.spec.n_layers, model.spec.n_heads
    b = target.shape[0]
    per = max(1, max_rows // b)
    out = torch.empty(b, len(units))
    prefix: dict[int, torch.Tensor] = {}
    resumable = bool(getattr(model, "resumable", False))
    for s in range(0, len(units), per):
        chunk = units[s : s + per]
        r = len(chunk)
        masks = torch.zeros(r, n_layers, n_heads)
        for i, heads in enumerate(chunk):
            for l, h in heads:
                masks[i, l, h] = 1.0
        l0 = min(l for heads in chunk for l, _ in heads)
        ids = target.repeat(r, 1)
        with torch.inference_mode(), replica_patches(model, masks, source_z):
            if resumable and l0 > 0:
                if l0 not in prefix:
                    prefix[l0] = model.forward(target, torch.ones_like(target), stop_at_layer=l0)
                logits = last_logits(model, ids, start_at_layer=l0, resid=prefix[l0].repeat(r, 1, 1))
            else:
                logits = last_logits(model, ids)
        log.info("patched units %d-%d of %d (from layer %d)", s + 1, s + r, len(units), l0)
        wrong_r = None if wrong is None else wrong.repeat(r)
        out[:, s : s + r] = metric(logits, answer.repeat(r), wrong_r).view(r, b).T
    return out


@dataclass
class RunMetrics:
    """Per-item metric of the clean and the corrupted run (item order)."""

    clean: torch.Tensor
    corrupted: torch.Tensor

    @property
    def gap(self) -> torch.Tensor:
        return self.clean - self.corrupted


@dataclass
class PairedBatch:
    """One batch of a task's pairs, both runs done: inputs ``[batch, pos]``, answer and
    wrong tokens ``[batch]``, item indices, each layer's ``z`` of the clean and the
    corrupted run, and their metrics ``[batch]``."""

    clean: torch.Tensor
    corrupted: torch.Tensor
    answer: torch.Tensor
    wrong: torch.Tensor | None
    rows: list[int]
    z_clean: dict
    z_corrupted: dict
    m_clean: torch.Tensor
    m_corrupted: torch.Tensor


def paired_runs(model, task: Task, cfg: PatchConfig, metric, run: RunMetrics):
    """Run the clean and the corrupted input of every batch of ``task``, capturing ``z``;
    write each item's two metrics into ``run`` and yield the :class:`PairedBatch`."""
    for clean, corrupted, answer, wrong, rows in task.batches(cfg.batch_size):
        logits_c, z_c = capture_z(model, clean)
        logits_x, z_x = capture_z(model, corrupted)
        m_c, m_x = metric(logits_c, answer, wrong), metric(logits_x, answer, wrong)
        run.clean[rows], run.corrupted[rows] = m_c, m_x
        yield PairedBatch(clean, corrupted, answer, wrong, rows, z_c, z_x, m_c, m_x)


def activation_patching(model, task: Task, cfg: PatchConfig = PatchConfig()) -> tuple[pd.DataFrame, RunMetrics]:
    """Activation patching of every unit in ``cfg.directions``: the :data:`PATCH_COLUMNS`
    frame (rows in unit order, one block per direction) and the clean/corrupted metrics."""
    units = patch_units(model.spec, cfg.unit)
    metric = metric_fn(task.metric)
    n = len(task.items)
    run = RunMetrics(torch.empty(n), torch.empty(n))
    delta = {d: torch.empty(n, len(units)) for d in cfg.directions}
    for b in paired_runs(model, task, cfg, metric, run):
        if "denoising" in delta:
            patched = patched_metrics(model, b.corrupted, b.z_clean, units, metric, b.answer, b.wrong, cfg.max_rows)
            delta["denoising"][b.rows] = patched - b.m_corrupted[:, None]
        if "noising" in delta:
            patched = patched_metrics(model, b.clean, b.z_corrupted, units, metric, b.answer, b.wrong, cfg.max_rows)
            delta["noising"][b.rows] = b.m_clean[:, None] - patched
        log.info("activation patching: %d/%d items", max(b.rows) + 1, n)
    return direction_frames(delta, run, units, cfg, "activation"), run


def direction_frames(delta: dict, run: RunMetrics, units, cfg: PatchConfig, method: str) -> pd.DataFrame:
    """One :func:`effect_frame` per direction of ``delta`` (``{direction: [item, unit]}``),
    ``method`` ``"{method}_{direction}"``, concatenated."""
    frames = [
        effect_frame(
            delta[d],
            run.gap,
            units,
            method=f"{method}_{d}",
            alpha=cfg.alpha,
            n_boot=cfg.n_boot,
            n_perm=cfg.n_perm,
            seed=cfg.seed,
            unit=cfg.unit,
        )
        for d in cfg.directions
    ]
    return pd.concat(frames, ignore_index=True)
