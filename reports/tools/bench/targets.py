"""The benchmark's targets, as a table: what ``headscope bench`` compares each measurement with.

A :class:`RatioTarget` is met when the time of path ``numerator`` over the time of path
``denominator`` is ``<= threshold`` (``higher_is_good=False``: a cost) or ``>= threshold``
(``higher_is_good=True``: a speed-up). :data:`MEMORY` is the target of ``--memory``: the
peak RSS of the largest corpus over the smallest's. A :class:`SecondsTarget` is met when a
path's time on its model is at most ``threshold`` seconds (reported as not measured on another
model). Targets are reported, never enforced.

>>> [t.name for t in RATIO_TARGETS][:2]
['capture / plain forward <= 1.1', 'run_with_cache / capture >= 2']
>>> MEMORY.met(1.05), MEMORY.met(1.2)
(True, False)
>>> SECONDS_TARGETS[0].path, SECONDS_TARGETS[0].met(59.0)
('weights_all', True)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RatioTarget:
    """``numerator`` / ``denominator`` (path names of the harness) against ``threshold``."""

    name: str
    numerator: str
    denominator: str
    threshold: float
    higher_is_good: bool
    note: str

    def met(self, value: float) -> bool:
        return bool(value >= self.threshold if self.higher_is_good else value <= self.threshold)


@dataclass(frozen=True)
class SecondsTarget:
    """The fastest round of path ``path`` on model ``model`` at most ``threshold`` seconds."""

    name: str
    path: str
    model: str
    threshold: float
    note: str

    def met(self, value: float) -> bool:
        return bool(value <= self.threshold)


@dataclass(frozen=True)
class MemoryTarget:
    """Peak RSS of the largest corpus / of the smallest, at most ``threshold``."""

    name: str
    threshold: float
    note: str

    def met(self, value: float) -> bool:
        return bool(value <= self.threshold)


RATIO_TARGETS: tuple[RatioTarget, ...] = (
    RatioTarget("capture / plain forward <= 1.1", "capture_patterns", "hf_sdpa", 1.1, False, "time ratio"),
    RatioTarget("run_with_cache / capture >= 2", "tl_cache_full", "capture_patterns", 2.0, True, "speed-up of capture"),
    RatioTarget(
        "roles / capture from text <= 1.5",
        "roles",
        "capture_stream",
        1.5,
        False,
        "time ratio; both start from raw text",
    ),
    RatioTarget("gate gradients / forward <= 3", "gate_grad", "inhouse_forward", 3.0, False, "time ratio"),
    RatioTarget("fp32 / bf16 forward >= 2.5", "inhouse_forward", "bf16_forward", 2.5, True, "speed-up of bf16"),
    RatioTarget(
        "separate / batched ablation > 1",
        "ablation_separate",
        "ablation_batched",
        1.0,
        True,
        "speed-up of batching",
    ),
    RatioTarget(
        "hf ablation / in-house ablation <= 1.25",
        "ablation_hf",
        "ablation_batched",
        1.25,
        False,
        "time ratio; single-head ablation of every head, batched, same sentences (hf resumes from a layer)",
    ),
    RatioTarget(
        "hook gates / in-house gates <= 1.1",
        "hook_gates",
        "inhouse_gates",
        1.1,
        False,
        "time ratio; gate-gradient importance, same model and batches",
    ),
    RatioTarget(
        "attribution patching / forward+backward <= 3",
        "patch_attribution",
        "patch_forward_backward",
        3.0,
        False,
        "time ratio; every head, the same batch (statistics included)",
    ),
    RatioTarget(
        "batched activation patching / one forward per head <= 0.5",
        "patch_activation",
        "patch_one_forward_per_head",
        0.5,
        False,
        "time ratio; every head, the same batch, both with the clean/corrupted runs and statistics",
    ),
    RatioTarget(
        "EAP-IG(5) / 6 x (forward+backward) <= 1.3",
        "eap_ig",
        "eap_ig_forward_backward",
        1.3,
        False,
        "time ratio; every edge's score against (steps + 1) forward + backward passes of the same batch (#42)",
    ),
    RatioTarget(
        "Ray 1 worker / one process <= 1.15",
        "roles_ray1",
        "roles_stage",
        1.15,
        False,
        "time ratio; the roles stage's text groups, 1 thread each, the same sentences (#45)",
    ),
    RatioTarget(
        "one process / Ray 2 workers > 1",
        "roles_stage",
        "roles_ray2",
        1.0,
        True,
        "speed-up of 2 one-thread workers on 2 cores, measured in the same run as the row above (#45)",
    ),
)

SECONDS_TARGETS: tuple[SecondsTarget, ...] = (
    SecondsTarget(
        "weights-only analyses on SmolLM2 < 60 s",
        "weights_all",
        "smollm2-135m",
        60.0,
        "seconds on 2 cores; headscope weights' defaults (200 draws per head, 1000 per null)",
    ),
)
#: peak RSS of the per-head stage on a random checkpoint of Llama-3.1-8B's shapes (bf16 shards, 16 GB on
#: disk), MB: ``reports.tools.bench.weights_paths.large_checkpoint_case``, run only when asked
LARGE_CHECKPOINT_RSS_MB = 4000.0

MEMORY = MemoryTarget("peak RSS 10x corpus <= 1.10", 1.10, "streaming memory")
