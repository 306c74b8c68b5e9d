"""The patching paths: attribution and activation patching of every head, against one
forward + backward and against the naive one-forward-per-head way.

Every function is a bench path ``(bench: BenchState) -> Prepared`` (registered in
:data:`~headscope.reports.tools.bench.registry.PATHS`, which says what each runs); all four
run on the same induction task (:data:`PATCHING`) in one batch. A model the task cannot
run on (an encoder) skips them (:class:`~headscope.reports.tools.bench.state.PathSkipped`).
"""

from __future__ import annotations

import dataclasses

import torch

from headscope.reports.tools.bench.counts import model_gflop
from headscope.reports.tools.bench.state import BenchState, PathSkipped, Prepared

__all__ = [
    "PATCHING",
    "forward_backward",
    "patch_activation",
    "patch_attribution",
    "patch_forward_backward",
    "patch_one_forward_per_head",
]

#: the patching paths' task and statistics: ``items`` induction items of ``seq_len`` tokens
#: (twice, plus BOS) in one batch, denoising, the report's patching statistics
PATCHING = {"items": 8, "seq_len": 8, "n_boot": 500, "n_perm": 2000}


def _task(bench: BenchState):
    """``(model, task, PatchConfig)`` of the patching paths (:data:`PATCHING`)."""
    from headscope.analyses.patching.activation import PatchConfig
    from headscope.analyses.patching.tasks import load_task
    from headscope.probes.errors import ModelIncompatibleError

    model = bench.model("inhouse")
    try:
        task = load_task(model, "induction", n_items=PATCHING["items"], seq_len=PATCHING["seq_len"])
    except ModelIncompatibleError as e:
        raise PathSkipped(str(e)) from None
    pcfg = PatchConfig(
        directions=("denoising",),
        batch_size=PATCHING["items"],
        n_boot=PATCHING["n_boot"],
        n_perm=PATCHING["n_perm"],
        seed=bench.cfg.seed,
    )
    return model, task, pcfg


def _note(bench: BenchState, task) -> str:
    n = len(task.items[0].clean)
    return (
        f"{len(task.items)} induction items of {n} tokens, one batch; {bench.spec.n_layers * bench.spec.n_heads} heads"
    )


def _gflop(bench: BenchState, task, forwards: float) -> float:
    """``forwards`` forward passes of the task's batch, in GFLOP."""
    n = len(task.items[0].clean)
    one = model_gflop(
        linear=bench.linear, n_layers=bench.spec.n_layers, d_model=bench.spec.d_model, lengths=[n] * len(task.items)
    )
    return forwards * one


def patch_attribution(bench: BenchState) -> Prepared:
    from headscope.analyses.patching.attribution import attribution_patching

    model, task, pcfg = _task(bench)

    def one_pass():
        attribution_patching(model, task, pcfg)

    return Prepared(one_pass, one_pass, _gflop(bench, task, 4), _note(bench, task) + "; gflop: 2 runs + 1 fwd+bwd")


def patch_forward_backward(bench: BenchState) -> Prepared:
    model, task, _ = _task(bench)
    ids = next(task.batches(len(task.items)))[1]  # the corrupted inputs, where attribution takes its gradient

    def one_pass():
        forward_backward(model, ids)

    return Prepared(one_pass, one_pass, _gflop(bench, task, 2), _note(bench, task) + "; gflop counted 2x forward")


def forward_backward(model, ids) -> None:
    """One forward of ``ids`` and one backward reaching every head's output ``z`` (each layer's
    ``z`` made a leaf): the price attribution patching and EAP-IG are held against."""
    from headscope.analyses.patching.activation import readout

    leaves = []

    def leaf(z):  # z: [batch, head, pos, d_head] of one layer, made a leaf to take its gradient
        z = z.detach().requires_grad_(True)
        leaves.append(z)
        return z

    with torch.enable_grad(), model.head_hooks({l: leaf for l in range(model.spec.n_layers)}):
        out = readout(model, ids).float()
        torch.autograd.grad(out.logsumexp(-1).sum(), leaves)


def patch_activation(bench: BenchState) -> Prepared:
    from headscope.analyses.patching.activation import activation_patching

    model, task, pcfg = _task(bench)

    def one_pass():
        activation_patching(model, task, pcfg)

    def warm():  # one item: every code path, an eighth of the forwards
        one = type(task)(name=task.name, items=task.items[:1], metric=task.metric)
        activation_patching(model, one, dataclasses.replace(pcfg, n_boot=10, n_perm=10))

    n_heads = bench.spec.n_layers * bench.spec.n_heads
    return Prepared(
        one_pass, warm, _gflop(bench, task, n_heads + 2), _note(bench, task) + "; gflop as separate forwards"
    )


def patch_one_forward_per_head(bench: BenchState) -> Prepared:
    from headscope.analyses.patching.activation import capture_z, readout, replica_patches
    from headscope.analyses.patching.frames import effect_frame
    from headscope.analyses.patching.tasks import REFERENCE_METRICS, metric_fn

    model, task, pcfg = _task(bench)
    spec = bench.spec
    clean, corrupted, answer, wrong, _ = next(task.batches(len(task.items)))
    metric = metric_fn(task.metric)
    heads = [(l, h) for l in range(spec.n_layers) for h in range(spec.n_heads)]

    def run(heads):
        out_c, z_c = capture_z(model, clean)
        out_x, _ = capture_z(model, corrupted)
        ref = out_c if task.metric in REFERENCE_METRICS else answer  # a reference metric reads the clean run
        m_c, m_x = metric(out_c, ref, wrong), metric(out_x, ref, wrong)
        delta = torch.empty(len(clean), len(heads))  # [item, head patched]
        for i, (l, h) in enumerate(heads):
            mask = torch.zeros(1, spec.n_layers, spec.n_heads)  # [replica, layer, head]
            mask[0, l, h] = 1.0
            with torch.inference_mode(), replica_patches(model, mask, z_c):
                delta[:, i] = metric(readout(model, corrupted), ref, wrong) - m_x
        # the statistics of activation_patching's denoising frame (the same method, computed the naive way)
        effect_frame(
            delta,
            m_c - m_x,
            [[x] for x in heads],
            method="activation_denoising",
            n_boot=pcfg.n_boot,
            n_perm=pcfg.n_perm,
        )

    return Prepared(
        lambda: run(heads),
        lambda: run(heads[:2]),
        _gflop(bench, task, len(heads) + 2),
        _note(bench, task) + f"; {len(heads)} full forwards",
    )
