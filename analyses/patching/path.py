"""Path patching: a sender head's effect through ONE input (Q, K or V) of a receiver head.

For a receiver ``(lr, hr)``, ``via`` in ``q``/``k``/``v``, and each sender ``(ls, hs)``
with ``ls < lr`` (Wang et al. 2022, simplified: everything downstream of the receiver
runs freely). With ``target`` the run patched into and ``source`` the other run
(noising, the default: target = clean, source = corrupted; denoising: the reverse):

1. the sender's contribution: the target run with the sender's ``z`` taken from the
   source, read at ``blocks.{ls}.hook_resid_mid``, minus the target's own
   (exactly the sender's ``W_O`` term; nothing else in that block has run yet);
2. the receiver's input along the path: the target's residual entering block ``lr`` plus
   that contribution, run through block ``lr`` to ``blocks.{lr}.attn.hook_{via}``;
3. the target run with only the receiver's slice of ``hook_{via}`` replaced by it -> the
   metric. For ``q`` that slice is the query head ``hr``. For ``k``/``v`` with GQA/MQA, where
   a KV head is shared by a group of query heads, ``reads`` says whose read is patched:
   ``"head"`` (the default) only query head ``hr``'s read of the shared K/V (at
   ``hook_{via}_head``, one slice per query head), so the effect is the receiver's alone;
   ``"kv_group"`` the KV head itself, which every query head of the group reads (the effect
   then includes the group's other heads). With one query head per KV head both are the same
   computation (``hook_{via}`` is patched). The frame's ``receiver_reads`` column says which.

So ``(0, 0) -> (1, 1) via k`` asks whether the receiver's keys carry what the sender
writes. In-house backend only (its hook points and resumable forward); ``R`` senders
per forward as stacked replicas. Frame: :data:`~headscope.analyses.patching.frames.PATCH_COLUMNS`
with ``method = "path_{via}_{direction}"`` and ``receiver = "L.H"``, one row per sender.
"""

from __future__ import annotations

import pandas as pd
import torch

from headscope.analyses.patching.activation import (
    PatchConfig,
    RunMetrics,
    paired_runs,
    readout,
    replica_patches,
    tile,
)
from headscope.analyses.patching.frames import effect_frame
from headscope.analyses.patching.items import Task
from headscope.analyses.patching.tasks import metric_fn
from headscope.probes.capture import in_part
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.inhouse.hooks import hooks

VIAS = ("q", "k", "v")
#: whose read of a shared K/V a k/v path patches (module docstring)
READS = ("head", "kv_group")


def parse_head(text: str) -> tuple[int, int]:
    """``"L.H"`` (or ``"LxHy"``-free ``"1.2"``) -> ``(layer, head)``.

    >>> parse_head("1.1")
    (1, 1)
    """
    try:
        layer, head = (int(x) for x in str(text).split("."))
    except ValueError:
        raise ValueError(f"a head is written LAYER.HEAD (e.g. 1.1); got {text!r}") from None
    return layer, head


def check_path(model, receiver, via, senders) -> list[tuple[int, int]]:
    """The senders (default: every head below the receiver), sorted; ``ModelIncompatibleError``
    off the in-house backend, ``ValueError`` for a bad ``via``, receiver or sender."""
    if getattr(model, "backend", None) != "inhouse" or not hasattr(model, "module"):
        raise ModelIncompatibleError(
            f"path patching needs the in-house backend's hook points; got backend {getattr(model, 'backend', '?')!r}: "
            "load with backend='inhouse' (--backend inhouse)"
        )
    if via not in VIAS:
        raise ValueError(f"via must be one of {VIAS}; got {via!r}")
    spec = model.spec
    lr, hr = receiver
    if not (0 < lr < spec.n_layers and 0 <= hr < spec.n_heads):
        raise ValueError(
            f"receiver must be a head of layers 1..{spec.n_layers - 1}, heads 0..{spec.n_heads - 1}; got {lr}.{hr}"
        )
    if senders is None:
        senders = [(l, h) for l in range(lr) for h in range(spec.n_heads)]
    bad = [s for s in senders if not (0 <= s[0] < lr and 0 <= s[1] < spec.n_heads)]
    if bad:
        raise ValueError(f"a sender must sit below the receiver's layer {lr}; got {bad[0][0]}.{bad[0][1]}")
    return sorted(senders)


def _keeper(store: dict, key):
    """A hook function storing a copy of its tensor as ``store[key]``."""

    def fn(t, name):
        store[key] = t.clone()

    return fn


def _receiver_slot(spec, receiver, via: str, direction: str, reads: str) -> tuple[str, int, str]:
    """``(hook point, slot, whose read)`` of the receiver's ``via`` input that path patching
    replaces: the query head, the receiver's own read of its group's K/V (``reads="head"``
    on GQA/MQA) or the KV head itself; ``ValueError`` for a bad ``direction`` or ``reads``."""
    if direction not in ("denoising", "noising"):
        raise ValueError(f"direction must be 'denoising' or 'noising'; got {direction!r}")
    if reads not in READS:
        raise ValueError(f"reads must be one of {READS}; got {reads!r}")
    lr, hr = receiver
    shared = via != "q" and spec.group_size > 1
    if shared and reads == "head":  # the receiver's own read of its group's K/V
        return f"blocks.{lr}.attn.hook_{via}_head", hr, reads
    # the query head, or the KV head itself
    return f"blocks.{lr}.attn.hook_{via}", hr if via == "q" else hr // spec.group_size, reads if shared else "head"


def path_patching(
    model,
    task: Task,
    *,
    receiver: tuple[int, int],
    via: str = "k",
    senders: list[tuple[int, int]] | None = None,
    direction: str = "noising",
    reads: str = "head",
    cfg: PatchConfig = PatchConfig(),
) -> tuple[pd.DataFrame, RunMetrics]:
    """Path patching of each sender (default: every head below the receiver) into the
    receiver's ``via`` input, read by the receiver alone or by its KV group (``reads``; see
    the module docstring) -> (frame, metrics of the runs)."""
    delta, run, senders, read_by = path_deltas(
        model, task, receiver=receiver, via=via, senders=senders, direction=direction, reads=reads, cfg=cfg
    )
    lr, hr = receiver
    frame = effect_frame(
        delta,
        run.gap,
        [[sd] for sd in senders],
        method=f"path_{via}_{direction}",
        alpha=cfg.alpha,
        n_boot=cfg.n_boot,
        n_perm=cfg.n_perm,
        seed=cfg.seed,
        extra={"receiver": f"{lr}.{hr}", "receiver_reads": read_by},
    )
    return frame, run


def path_deltas(
    model,
    task: Task,
    *,
    receiver: tuple[int, int],
    via: str = "k",
    senders: list[tuple[int, int]] | None = None,
    direction: str = "noising",
    reads: str = "head",
    cfg: PatchConfig = PatchConfig(),
    also: tuple[int, ...] = (),
    progress=None,
    part: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, RunMetrics, list[tuple[int, int]], str]:
    """The per-item effects behind :func:`path_patching`: ``(delta [item, sender], runs, senders,
    whose read)``. ``also``: more query heads of the receiver's layer patched together with it
    (``via="q"`` only: a sender's path into the queries of several heads at once, e.g. the name
    movers of IOI); ``progress(done, total)`` counts senders × batches. ``part`` ``(k, n)``: every
    ``n``-th patched forward from the ``k``-th only, the other cells NaN (:func:`merge_deltas`)."""
    senders = check_path(model, receiver, via, senders)
    point, slot, read_by = _receiver_slot(model.spec, receiver, via, direction, reads)
    slots = _slots(model.spec, receiver, slot, via, also)
    metric = metric_fn(task.metric)
    points = model.hook_points
    spec = model.spec
    lr, hr = receiver
    n = len(task.items)
    run = RunMetrics(torch.empty(n), torch.empty(n))
    delta = torch.full((n, len(senders)), float("nan"))
    layers = sorted({l for l, _ in senders})
    n_batches = sum(1 for _ in task.batches(cfg.batch_size))
    done, forward = 0, -1  # forward: the patched forwards' count over the batches (``part``)
    for pb in paired_runs(model, task, cfg, metric, run):
        clean, corrupted, answer, wrong, rows = pb.clean, pb.corrupted, pb.answer, pb.wrong, pb.rows
        z_c, z_x, m_c, m_x = pb.z_clean, pb.z_corrupted, pb.m_clean, pb.m_corrupted
        target, source_z, m_target = (clean, z_x, m_c) if direction == "noising" else (corrupted, z_c, m_x)
        b = target.shape[0]
        mask = torch.ones_like(target)
        mids: dict[int, torch.Tensor] = {}
        pairs = [(points[f"blocks.{l}.hook_resid_mid"], _keeper(mids, l)) for l in layers]
        with torch.inference_mode(), hooks(pairs):
            target_pre = model.forward(target, mask, stop_at_layer=lr)  # [batch, pos, d_model] entering block lr
        target_mid = dict(mids)
        per = max(1, cfg.max_rows // b)
        for s in range(0, len(senders), per):
            forward += 1
            if not in_part(part, forward):
                continue
            chunk = senders[s : s + per]
            r = len(chunk)
            ids, mask_r = target.repeat(r, 1), mask.repeat(r, 1)
            masks = torch.zeros(r, spec.n_layers, spec.n_heads)
            for i, (l, h) in enumerate(chunk):
                masks[i, l, h] = 1.0
            mids.clear()
            with torch.inference_mode(), hooks(pairs), replica_patches(model, masks, source_z):
                model.forward(ids, mask_r, stop_at_layer=max(l for l, _ in chunk) + 1)
            contrib = torch.stack(
                [mids[l].view(r, b, *mids[l].shape[1:])[i] - target_mid[l] for i, (l, _) in enumerate(chunk)]
            )  # [R, batch, pos, d_model]
            resid = target_pre.repeat(r, 1, 1) + contrib.reshape(r * b, *contrib.shape[2:])
            got: dict = {}
            keep = [(points[point], _keeper(got, "x"))]
            with torch.inference_mode(), hooks(keep):
                model.forward(ids, mask_r, start_at_layer=lr, resid=resid, stop_at_layer=lr + 1)
            new = got["x"]  # [R*batch, head or kv_head, pos, d_head]

            def swap(t, name, new=new):
                out = t.clone()
                out[:, slots] = new[:, slots]
                return out

            with torch.inference_mode(), hooks([(points[point], swap)]):
                logits = readout(model, ids, start_at_layer=lr, resid=target_pre.repeat(r, 1, 1))
            m = metric(logits, tile(answer, r), tile(wrong, r)).view(r, b).T.cpu()
            delta[rows, s : s + r] = (m_target[:, None] - m) if direction == "noising" else (m - m_target[:, None])
            done += r
            if progress is not None:
                progress(done, len(senders) * n_batches)
    return delta, run, senders, read_by


def _slots(spec, receiver, slot: int, via: str, also) -> list[int]:
    """The receiver's slot and those of ``also`` (more query heads of its layer); ``ValueError``
    for ``also`` through keys or values, or a head outside the layer."""
    slots = [slot, *(int(h) for h in also if int(h) != slot)]
    if also and via != "q":
        raise ValueError(f"more receivers (also) are patched through their queries only; got via {via!r}")
    if any(not 0 <= h < spec.n_heads for h in slots):
        raise ValueError(f"also: heads of layer {receiver[0]} lie in 0..{spec.n_heads - 1}; got {list(also)}")
    return slots


def merge_deltas(deltas) -> torch.Tensor:
    """:func:`path_deltas`' ``delta`` of the parts ``(k, n)``, ``k = 0..n-1`` -> one process's: a part
    runs every ``n``-th patched forward (a batch's senders in runs of ``cfg.max_rows`` rows, counted
    over the batches, as one process cuts them), so each cell is taken from the part that computed
    it (the others hold NaN there; a NaN it computed stays NaN)."""
    out = deltas[0].clone()
    for d in deltas[1:]:
        out = torch.where(torch.isnan(out), d, out)
    return out
