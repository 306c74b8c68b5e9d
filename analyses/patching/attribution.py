"""Attribution patching: the first-order estimate of activation patching, for all heads from
one forward and one backward per batch (Nanda 2023; Syed et al. 2023).

Denoising: at the corrupted run, ``delta ≈ (z_clean - z_corrupted) · ∂m/∂z``, summed over
positions and ``d_head`` per head (``cfg.per_position``: over ``d_head`` only, one estimate
per head and position, positions counted from the end as in activation patching); noising: at the clean run, ``m_clean - m_patched ≈
-(z_corrupted - z_clean) · ∂m/∂z``. A KV-group unit sums its heads (the estimate is linear).
Gradients reach ``z`` through :meth:`Backend.head_hooks`: a zero tensor that requires grad
is added to each layer's ``z`` (``z + δ_l``, the value unchanged), and ``∂m/∂δ_l`` is the total
derivative through every later path: the residual stream, later MLPs and later heads' Q, K
and V inputs (the composition an induction circuit uses). ``cfg.gradient="bypass_heads"``
gives the narrower estimate instead: each layer's ``z`` replaced by a detached leaf, so the
gradient reaching layer l skips every later head (it still passes the residual stream and
the MLPs); its frames are labelled ``attribution_bypass_heads_*``.
Frames: :func:`~headscope.analyses.patching.frames.effect_frame`, compared with activation
patching by :func:`~headscope.analyses.patching.frames.agreement`.
"""

from __future__ import annotations

import pandas as pd
import torch

from headscope.analyses.patching.activation import (
    GRADIENTS,
    PatchConfig,
    RunMetrics,
    direction_frames,
    paired_runs,
    patch_units,
    position_frames,
    readout,
    store_positions,
)
from headscope.analyses.patching.items import Task
from headscope.analyses.patching.tasks import metric_fn


def z_gradients(
    model, ids: torch.Tensor, metric, answer, wrong, gradient: str = "total"
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """``(metric [batch], {layer: ∂(sum of metric)/∂z [batch, head, pos, d_head]})`` at ``ids``
    (items are independent rows, so the gradient of the sum is each item's own).
    ``gradient``: ``"total"`` (through every later path) or ``"bypass_heads"`` (later heads cut)."""
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {GRADIENTS}; got {gradient!r}")
    probes: dict[int, torch.Tensor] = {}

    def probe(l):
        def fn(z):
            if gradient == "bypass_heads":
                d = probes[l] = z.detach().requires_grad_(True)
                return d
            d = probes[l] = torch.zeros_like(z, requires_grad=True)
            return z + d

        return fn

    with torch.enable_grad(), model.head_hooks({l: probe(l) for l in range(model.spec.n_layers)}):
        m = metric(readout(model, ids), answer, wrong)
        grads = torch.autograd.grad(m.sum(), [probes[l] for l in sorted(probes)], allow_unused=True)
    out = {}
    for l, g in zip(sorted(probes), grads):
        out[l] = torch.zeros_like(probes[l]) if g is None else g.detach()
    return m.detach(), out


def attribution_patching(model, task: Task, cfg: PatchConfig = PatchConfig()) -> tuple[pd.DataFrame, RunMetrics]:
    """Attribution patching in ``cfg.directions`` -> (:data:`PATCH_COLUMNS` frame, metrics of the runs)."""
    delta, run = attribution_deltas(model, task, cfg)
    return attribution_frames(model, delta, run, cfg), run


def attribution_deltas(
    model, task: Task, cfg: PatchConfig = PatchConfig(), part: tuple[int, int] | None = None
) -> tuple[dict, RunMetrics]:
    """``({direction: [n_items, n_units]} estimates, the runs' metrics)`` of attribution patching
    (per position: ``{direction: {position: [n_items, n_units]}}``). ``part`` ``(k, n)``: only the
    task's batches ``k, k+n, ...`` (:func:`~headscope.probes.capture.in_part`; not per position),
    the other items' estimates and metrics NaN: the parts joined by
    :func:`~headscope.analyses.patching.activation.merge_deltas` are the whole run's, each
    item's values from the same batch as one process."""
    from headscope.analyses.patching.atp_star import atp_star_estimates, check_atp_model

    check_atp_model(model, cfg.atp_fix)
    per_pos = cfg.per_position
    if per_pos and part is not None:
        raise ValueError("attribution patching per position does not shard: part must be None")
    units = patch_units(model.spec, cfg.unit)
    metric = metric_fn(task.metric)
    n = len(task.items)
    run = RunMetrics(torch.full((n,), torch.nan), torch.full((n,), torch.nan))
    delta = {d: ({} if per_pos else torch.full((n, len(units)), torch.nan)) for d in cfg.directions}
    for b in paired_runs(model, task, cfg, metric, run, part):
        for d in cfg.directions:
            at, z_at, z_other = (
                (b.corrupted, b.z_corrupted, b.z_clean) if d == "denoising" else (b.clean, b.z_clean, b.z_corrupted)
            )
            if cfg.atp_fix != "none":
                dz = {l: z_other[l] - z_at[l] for l in z_at}
                est = atp_star_estimates(model, at, dz, metric, b.answer, b.wrong, units, cfg.atp_fix, cfg.max_rows)
            else:
                _, grads = z_gradients(model, at, metric, b.answer, b.wrong, cfg.gradient)
                dims = 3 if per_pos else (2, 3)  # -> [batch, head, pos] or [batch, head]
                per_head = {l: ((z_other[l] - z_at[l]) * grads[l]).float().sum(dims).cpu() for l in grads}
                est = torch.stack(
                    [sum(per_head[l][:, h] for l, h in heads) for heads in units], 1
                )  # [batch, unit(, pos)]
            magnitude = cfg.atp_fix in ("graddrop", "both")  # GradDrop's figures are |estimates|: no sign to flip
            est = est if d == "denoising" or magnitude else -est
            if per_pos:
                store_positions(delta[d], est, b.rows, n)
            else:
                delta[d][b.rows] = est
    return delta, run


def attribution_frames(model, delta: dict, run: RunMetrics, cfg: PatchConfig = PatchConfig()) -> pd.DataFrame:
    """The :data:`PATCH_COLUMNS` frame of :func:`attribution_deltas`' estimates (every item's, of one
    process or of the parts merged): effects, bootstrap intervals and permutation p-values over all items."""
    from headscope.analyses.patching.atp_star import ATP_LABELS

    units = patch_units(model.spec, cfg.unit)
    label = "attribution" if cfg.gradient == "total" else f"attribution_{cfg.gradient}"
    label = ATP_LABELS.get(cfg.atp_fix, label)
    if cfg.per_position:
        return position_frames(delta, float(run.gap.mean()), units, cfg, label)
    return direction_frames(delta, run, units, cfg, label)
