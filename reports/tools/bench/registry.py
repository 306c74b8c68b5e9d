"""Every bench path, by name: ``PATHS[name] = BenchPath(description, fn)``.

``headscope bench`` runs the paths in this order (or the ``--paths`` asked for), its
``--help`` lists them with their descriptions, and the result frame has one row per path
in this order, its ``description`` column taken from here. A path is a function
``fn(bench: BenchState) -> Prepared`` (:mod:`~headscope.reports.tools.bench.state`); adding a
path is one function in the module of its kind and one line below.

==============================  ==============================================================
path                            what runs
==============================  ==============================================================
``hf_sdpa``                     HF transformers forward, SDPA attention (reference)
``hf_eager_attentions``         HF transformers, eager attention, ``output_attentions=True``
``tl_cache_full``               transformer-lens bridge ``run_with_cache`` (every hook)
``tl_cache_patterns``           same, ``names_filter`` on the patterns only
``capture_patterns``            headscope in-house ``model.run(batch, ["pattern"])``, all layers
``inhouse_forward``             headscope in-house plain forward (SDPA path)
``gate_grad``                   in-house forward + backward of a scalar loss for gate gradients
``bf16_forward``                in-house plain forward in bfloat16 (where the CPU has bf16)
``capture_stream``              ``probes.capture.stream`` over the raw sentences, no reducer:
                                tokenising, word alignment, bucketing and the capture, the
                                same work ``roles`` does before any statistic
``roles``                       ``analyses.roles.head_roles`` text roles over the same sentences
``roles_stage``                 the roles stage's text groups on the same sentences, in this process
``roles_ray1``                  the same on one Ray worker (``--ray --workers 1``: Ray's overhead)
``roles_ray2``                  the same sharded over two Ray workers (:mod:`~headscope.reports.tools.bench.ray_paths`);
                                the notes: tables equal to one process
``ablation_separate``           zero-ablating every head alone, one full forward per head
``ablation_batched``            the same, as ``single_head_ablation`` runs it: every head's mask
                                in one call, replicas of a batch each running the layers from its
                                own, the unablated prefix run once
``ablation_hf``                 ``ablation_batched`` on the hf backend (eager attention), its
                                forward resumed from each replica's first layer
``ablation_hf_whole``           the same, every replica run whole (the hf backend before it resumed)
``pruning_50``                  forward of the model with 50% of heads physically pruned
``hook_gates``                  gate-gradient importance (``importance.gate_gradients``: forward +
                                backward of the metric's loss) through ``ablation.head_gates``,
                                the head hooks every backend has
``inhouse_gates``               the same through the in-house ``Attention``'s built-in gates
                                (``ablation.gates_as``), same model, metric and batches
``quick_pruning``               the report's quick pruning stage (``PruneConfig(**QUICK_PRUNING)``,
                                :mod:`~headscope.reports.stages.quick`: zero ablation,
                                importance, curves) + role ablation against a seeded stand-in
                                roles frame
``patch_attribution``           attribution patching of every head (``attribution_patching``,
                                denoising) on ``PATCHING`` induction items in one batch:
                                the clean and corrupted runs, one forward + backward, statistics
``patch_forward_backward``      one forward + backward of the same (corrupted) batch, the
                                backward reaching every head's output ``z`` (as attribution's)
``patch_activation``            activation patching of every head, batched (``activation_patching``,
                                denoising: replicas, the unpatched prefix run once), statistics
``patch_one_forward_per_head``  the naive way: the clean and corrupted runs, then one full
                                forward of the batch per head with that head patched (measured,
                                not estimated: ``n_heads`` forwards)
``eap_ig``                      EAP-IG edge scores (5 steps) of every edge of the model's graph on
                                the patching batch (:mod:`~headscope.analyses.circuits.edges`)
``eap_ig_forward_backward``     its price: 6 forward + backward passes of the model's own forward,
                                same batch, the backward reaching every head's ``z``
``weights_heads``               per-head circuits from the weights alone (OV copying, OV/QK norms,
                                QK positional share, Gaussian baselines), read lazily
``weights_composition``         Q/K/V composition of every pair of heads with the Gaussian nulls
``weights_all``                 both: everything ``headscope weights`` computes
==============================  ==============================================================

>>> list(PATHS)[:2], PATHS["hf_sdpa"].description
(['hf_sdpa', 'hf_eager_attentions'], 'HF transformers forward, SDPA attention (reference)')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from headscope.reports.tools.bench import capture_paths as cap
from headscope.reports.tools.bench import circuit_paths as circ
from headscope.reports.tools.bench import patching_paths as patch
from headscope.reports.tools.bench import pruning_paths as prune
from headscope.reports.tools.bench import ray_paths
from headscope.reports.tools.bench import weights_paths as wts
from headscope.reports.tools.bench.state import BenchState, Prepared

__all__ = ["PATHS", "BenchPath", "unknown_path"]


class BenchPath(NamedTuple):
    """One path: ``description`` (the frame's column, ``--help``'s line) and ``fn``, which
    prepares it on the shared state."""

    description: str
    fn: Callable[[BenchState], Prepared]


PATHS: dict[str, BenchPath] = {
    "hf_sdpa": BenchPath("HF transformers forward, SDPA attention (reference)", cap.hf_sdpa),
    "hf_eager_attentions": BenchPath("HF eager attention, output_attentions=True", cap.hf_eager_attentions),
    "tl_cache_full": BenchPath("transformer-lens bridge run_with_cache, full cache", cap.tl_cache_full),
    "tl_cache_patterns": BenchPath("transformer-lens bridge run_with_cache, patterns only", cap.tl_cache_patterns),
    "capture_patterns": BenchPath("headscope in-house capture of all patterns", cap.capture_patterns),
    "inhouse_forward": BenchPath("headscope in-house plain forward (SDPA)", cap.inhouse_forward),
    "gate_grad": BenchPath("in-house forward + backward for gate gradients", cap.gate_grad),
    "bf16_forward": BenchPath("in-house plain forward, bfloat16", cap.bf16_forward),
    "capture_stream": BenchPath(
        "capture of all patterns from raw text (probes.capture.stream, no reducer)", cap.capture_stream
    ),
    "roles": BenchPath("all text role statistics (analyses.roles.head_roles)", cap.roles),
    "roles_stage": BenchPath("the roles stage's text groups in this process", ray_paths.roles_stage),
    "roles_ray1": BenchPath("the roles stage's text groups on 1 Ray worker (--ray --workers 1)", ray_paths.roles_ray1),
    "roles_ray2": BenchPath(
        "the roles stage's text groups sharded over 2 Ray workers (--ray --workers 2)", ray_paths.roles_ray2
    ),
    "ablation_separate": BenchPath("single-head ablation of every head, a forward each", prune.ablation_separate),
    "ablation_batched": BenchPath(
        "single-head ablation of every head, per-layer replicas, shared prefix", prune.ablation_batched
    ),
    "ablation_hf": BenchPath(
        "the same on the hf backend (its forward resumed from each replica's first layer)", prune.ablation_hf
    ),
    "ablation_hf_whole": BenchPath(
        "the same on the hf backend, every replica run whole (before it resumed)", prune.ablation_hf_whole
    ),
    "pruning_50": BenchPath("forward with 50% of heads physically pruned", prune.pruning_50),
    "hook_gates": BenchPath("gate-gradient importance through head hooks (head_gates, any backend)", prune.hook_gates),
    "inhouse_gates": BenchPath(
        "gate-gradient importance through the in-house built-in gates (gates_as)", prune.inhouse_gates
    ),
    "quick_pruning": BenchPath(
        "the report's quick pruning stage (ablation, importance, curves, roles)", prune.quick_pruning
    ),
    "patch_attribution": BenchPath(
        "attribution patching of every head (one forward + backward per pair)", patch.patch_attribution
    ),
    "patch_forward_backward": BenchPath(
        "one forward + backward of the patching batch (to every head's z)", patch.patch_forward_backward
    ),
    "patch_activation": BenchPath(
        "activation patching of every head, batched (replicas, shared prefix)", patch.patch_activation
    ),
    "patch_one_forward_per_head": BenchPath(
        "activation patching, one full forward per head (naive)", patch.patch_one_forward_per_head
    ),
    "eap_ig": BenchPath("EAP-IG (5 steps) scores of every edge, the patching batch", circ.eap_ig),
    "eap_ig_forward_backward": BenchPath(
        "6 x forward + backward of the same batch (EAP-IG's price)", circ.eap_ig_forward_backward
    ),
    "weights_heads": BenchPath("per-head circuits from the weights (copying, norms, baselines)", wts.weights_heads),
    "weights_composition": BenchPath("composition of every pair of heads from the weights", wts.weights_composition),
    "weights_all": BenchPath("every weights-only analysis (headscope weights)", wts.weights_all),
}


def unknown_path(names: tuple[str, ...] | list[str]) -> str | None:
    """The message for the first name of ``names`` that is not a registered path, or None.

    >>> unknown_path(["hf_sdpa", "nope"])[:32]
    "unknown bench path 'nope'; valid"
    """
    bad = [p for p in names if p not in PATHS]
    return f"unknown bench path {bad[0]!r}; valid paths: {', '.join(PATHS)}" if bad else None
