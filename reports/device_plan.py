"""The plan of a model spread over several devices (``--device-map auto``), before anything loads.

:func:`plan_devices` places the model's layers as ``from_pretrained(device_map="auto")`` will
(:func:`~headscope.probes.models.placement.place`, on the meta device) and adds to each device the
working set the memory plan estimates for the run's largest stage
(:class:`~headscope.reports.budget.Budget`), split by where each part lands:

* the attention scores and activations of one forward: on every device that holds a layer (each
  layer makes them where it runs), and on the embedding's and the unembedding's;
* what a backward keeps (``gradients``): each device its layers' share;
* the patterns kept: each device its layers' share while the forward runs, then all of them on the
  embedding's device (a spread model gathers every capture there, where the reducers work), with
  the reducers' copies, the resampling chunks and the stage's cache;
* the logits: on the unembedding's device.

The bytes given to the placement are each device's memory (``--max-memory``, else its free CUDA
memory) less that working set, so the map leaves room for it; where a device's part turns out larger
than reserved (the unembedding on another device than expected) the placement is computed again with
the difference reserved. A model that fits on no combination of the devices is refused in one line
(:class:`~headscope.probes.errors.MemoryBudgetError`, exit 2) before anything loads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from headscope.probes.errors import MemoryBudgetError

log = logging.getLogger(__name__)

__all__ = [
    "WORK",
    "DevicePlan",
    "check_host",
    "check_present",
    "host_bytes",
    "plan_devices",
    "plannable",
    "split_working_set",
]

#: the components of a working set (:func:`~headscope.probes.budget.estimate`'s parts beyond what every phase holds)
WORK = ("patterns", "attention", "activations", "logits", "reducers", "statistics", "gradients", "cache")
#: placements computed before giving up on reserving what a device's part turned out to need
TRIES = 4
#: tensors a ``device_map`` load holds on the host at once: transformers (5.x) builds the model on the meta
#: device and reads each tensor from the checkpoint straight to its device, in a pool of
#: ``transformers.core_model_loading.GLOBAL_WORKERS = min(4, cpus)`` threads, so no float32 copy of the
#: whole model is made on the host; each in-flight tensor is read, then cast, then moved (two host copies)
IN_FLIGHT = 4


def size(n: int) -> str:
    """``512.0 MiB`` under a GiB, ``8.00 GiB`` above."""
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def device_name(d) -> str:
    return f"cuda:{d}" if isinstance(d, int) else str(d)


def split_working_set(parts: dict[str, int], layers: dict, input_device, output_device) -> dict:
    """``{device: bytes}`` of one working set's ``parts`` (bytes per component) on a model whose
    ``layers`` are ``{device: (layer indices)}`` (see the module doc for where each part lands)."""
    n = max(1, sum(len(v) for v in layers.values()))
    g = {k: int(parts.get(k, 0)) for k in WORK}
    out = {}
    for d, held in layers.items():
        share = len(held) / n
        runs = bool(held) or d in (input_device, output_device)
        work = (g["attention"] + g["activations"]) * runs + int((g["gradients"] + g["patterns"]) * share)
        if d == input_device:
            work += g["patterns"] - int(g["patterns"] * share) + g["reducers"] + g["statistics"] + g["cache"]
        if d == output_device:
            work += g["logits"]
        out[d] = work
    return out


def _reserve(parts: dict[str, int], devices: list) -> dict:
    """A first reservation before the layers are placed: the embedding on the first device, the
    unembedding on the last, the layers spread evenly."""
    even = {d: tuple(range(i, i + 1)) for i, d in enumerate(devices)}
    return split_working_set(parts, even, devices[0], devices[-1])


@dataclass(frozen=True, kw_only=True)
class DevicePlan:
    """The placement (:class:`~headscope.probes.models.placement.Placement`), each device's memory
    (``given``: bytes, from ``source``), its working set (``working``: bytes) of the largest stage
    (``stage``). ``max_memory``: what the load passes to ``from_pretrained`` (the bytes the placement
    was computed under: ``given`` less the working set)."""

    placement: object
    given: dict
    working: dict
    stage: str
    source: str

    @property
    def max_memory(self) -> dict:
        return dict(self.placement.max_memory)

    def rows(self) -> list[dict]:
        """One dict per device: ``device``, ``layers`` (``"0-5"``), ``n_layers``, ``weights_bytes``,
        ``working_bytes``, ``total_bytes``, ``memory_bytes``."""
        weights, layers = self.placement.weights(), self.placement.layers()
        out = []
        for d, mem in self.given.items():
            held = layers.get(d, ())
            out.append(
                {
                    "device": device_name(d),
                    "layers": f"{held[0]}-{held[-1]}" if held else "-",
                    "n_layers": len(held),
                    "weights_bytes": weights.get(d, 0),
                    "working_bytes": self.working.get(d, 0),
                    "total_bytes": weights.get(d, 0) + self.working.get(d, 0),
                    "memory_bytes": mem,
                }
            )
        return out

    def lines(self) -> list[str]:
        """The table the CLI prints (``--dry-run``, and before a ``--device-map auto`` load)."""
        p = self.placement
        head = (
            f"device plan (--device-map auto, placed on the meta device; memory: {self.source}; "
            f"working set of the largest stage, {self.stage}):"
        )
        out = [head, f"  {'device':<8} {'layers':<10} {'weights':>11} {'working set':>12} {'total':>11} {'memory':>11}"]
        for r in self.rows():
            layers = f"{r['layers']} ({r['n_layers']})" if r["n_layers"] else "-"
            out.append(
                f"  {r['device']:<8} {layers:<10} {size(r['weights_bytes']):>11} {size(r['working_bytes']):>12} "
                f"{size(r['total_bytes']):>11} {size(r['memory_bytes']):>11}"
            )
        pair = (("embedding", p.input_device), ("unembedding", p.output_device))
        ends = ", ".join(f"{what} on {device_name(d)}" for what, d in pair if d is not None) or "no embedding"
        out.append(f"  {ends}; {size(p.total_bytes)} of weights in all")
        return out

    def record(self) -> dict:
        """run.json's ``device_plan``: the map, the rows and what the placement was computed under."""
        return {
            "device_map": {k: device_name(v) for k, v in self.placement.device_map.items()},
            "devices": self.rows(),
            "max_memory": {device_name(k): int(v) for k, v in self.max_memory.items()},
            "memory_source": self.source,
            "stage": self.stage,
        }


def _largest(budget) -> tuple[str, dict[str, int]]:
    """``(stage, parts)`` of the working set with the most bytes of its own (none: ``("load", {})``)."""
    est = getattr(budget, "estimate", None)
    runs = {k: v for k, v in (est.parts.items() if est is not None else ()) if k != "load"}
    if not runs:
        return "load", {}
    name = max(runs, key=lambda k: sum(runs[k].get(c, 0) for c in WORK))
    owner = budget.settings.get("owner", {}).get(name) if isinstance(getattr(budget, "settings", None), dict) else None
    return (f"{owner} ({name})" if owner and owner != name else name), runs[name]


def _refuse(need: int, given: dict, source: str, why: str) -> MemoryBudgetError:
    have = ", ".join(f"{device_name(d)} {size(b)}" for d, b in given.items())
    return MemoryBudgetError(
        f"--device-map auto: {why}; the model needs ~{size(need)} and the devices hold {size(sum(given.values()))} "
        f"({have}; {source}); give more devices or memory (--max-memory), use --dtype bf16 or a smaller model"
    )


def plan_devices(model, budget, given: dict[int, int], *, source: str) -> DevicePlan:
    """The :class:`DevicePlan` of ``model`` (built by :func:`~headscope.probes.models.placement.meta_model`)
    over the devices ``given`` (``{gpu index: bytes}``) with the working set of ``budget``'s largest
    stage. Raises :class:`~headscope.probes.errors.MemoryBudgetError` (one line) when no placement fits."""
    from headscope.probes.models.placement import model_bytes, place

    stage, parts = _largest(budget)
    devices = list(given)
    reserve = _reserve(parts, devices)
    need = model_bytes(model) + sum(int(parts.get(k, 0)) for k in WORK)
    if need > sum(given.values()):
        raise _refuse(need, given, source, "the weights and the working set exceed every device together")
    why = "no placement of the layers leaves each device room for its working set"
    for _ in range(TRIES):
        room = {d: given[d] - reserve[d] for d in devices}
        if min(room.values()) <= 0:
            d = min(room, key=room.get)
            why = f"{device_name(d)}'s share of the working set alone is ~{size(reserve[d])}, more than its {size(given[d])}"
            break
        placement = place(model, room)
        working = split_working_set(parts, placement.layers(), placement.input_device, placement.output_device)
        weights = placement.weights()
        over = {d: weights.get(d, 0) + working[d] - given[d] for d in devices}
        if not placement.offloaded() and max(over.values()) <= 0:
            return DevicePlan(placement=placement, given=dict(given), working=working, stage=stage, source=source)
        if placement.offloaded():  # accelerate also keeps the largest layer's size free on the first GPU
            off = placement.offloaded()
            why = f"accelerate would offload {off[0]}{f' and {len(off) - 1} more' if len(off) > 1 else ''} to disk"
        grown = {d: max(reserve[d], working[d]) for d in devices}
        if grown == reserve:
            break
        reserve = grown
    raise _refuse(need, given, source, why)


def check_present(given: dict[int, int]) -> None:
    """Refuse (one line) a ``--max-memory`` naming a GPU this machine does not have, before a load:
    the plan of other GPUs is for ``--dry-run``."""
    from headscope.probes.models.placement import gpu_memory

    n = len(gpu_memory())
    missing = [d for d in given if d >= n]
    if missing:
        raise ValueError(
            f"--max-memory names GPU {missing[0]}; this machine has {n} CUDA device(s): plan it with --dry-run, "
            "or name the GPUs present"
        )


def plan_run(ctx, budget, config) -> tuple[DevicePlan | None, str | None]:
    """``(plan, note)`` of a report run with ``config.device_map`` (``(None, None)`` without one): over
    ``config.max_memory`` (``--max-memory``), else every CUDA device's free memory. ``note`` says why
    there is no plan: no CUDA device and no ``--max-memory`` (the model then loads on the CPU, whole),
    or a MODEL that is not an hf folder (a GGUF is converted, a hub id fetched, only when it loads)."""
    from headscope.probes.models.placement import gpu_memory, meta_model

    if config.device_map is None:
        return None, None
    source = ctx.source
    if source is None or source.kind != "hf-dir":
        kind = "a model object" if source is None else f"a {source.kind} MODEL"
        return None, f"device plan: none before the load for {kind} (it is planned from an hf folder's config)"
    if config.max_memory:
        given, where = dict(config.max_memory), "--max-memory"
    else:
        given, where = gpu_memory(), "free CUDA memory"
    if not given:
        return None, "device plan: no CUDA device here and no --max-memory; device_map auto loads the model on the CPU"
    model = meta_model(source, dtype=ctx.dtype, trust_remote_code=config.trust_remote_code)
    return plan_devices(model, budget, given, source=where), None


def plannable(ctx, config) -> bool:
    """Whether :func:`plan_run` will place the model over GPUs (``--device-map auto`` on an hf folder,
    with ``--max-memory`` or CUDA devices here): the run's weights and working sets then go to the
    GPUs and the host is checked by :func:`check_host`, not by the single-process plan."""
    from headscope.probes.models.placement import gpu_memory

    if config.device_map is None or ctx.source is None or ctx.source.kind != "hf-dir" or ctx.shape is None:
        return False
    return bool(config.max_memory) or bool(gpu_memory())


def host_bytes(plan: DevicePlan, shape, process: int) -> dict[str, int]:
    """``{part: bytes}`` the host holds while a placed run loads and runs: the process as it is, the
    weights the map leaves on ``cpu`` (``disk`` is read from disk), :data:`IN_FLIGHT` tensors of the
    largest kind being loaded (the embedding, or an MLP or attention projection: read and cast, two
    float32 copies each) with the loader's code and buffers, and the tokenizer."""
    from headscope.probes.budget import LOADER_EXTRA, TOKENIZER_BYTES_PER_ENTRY

    on_host = sum(b for d, b in plan.placement.weights().items() if d == "cpu")
    d = shape.d_model
    largest = max(shape.vocab_size * d, d * shape.d_mlp, d * shape.n_heads * shape.d_head)
    return {
        "process": int(process),
        "weights on the host": int(on_host),
        "loading": IN_FLIGHT * 2 * largest * 4 + LOADER_EXTRA,
        "tokenizer": TOKENIZER_BYTES_PER_ENTRY * shape.vocab_size,
    }


def check_host(plan: DevicePlan, budget) -> dict:
    """The host's share of a placed run (:func:`host_bytes`) against what the host may use: run.json's
    ``memory.host`` (``estimate_bytes``, ``parts``, ``available_bytes``); raises
    :class:`~headscope.probes.errors.MemoryBudgetError` (one line) when it does not fit."""
    from headscope.probes.budget import gib

    parts = host_bytes(plan, budget.shape, budget.available.resident)
    need, room = sum(parts.values()), budget.available.budget
    top = ", ".join(f"{k} {gib(v)}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
    if room is not None and need > room:
        raise MemoryBudgetError(
            f"--device-map auto: the host needs ~{gib(need)} ({top}) with the layers on the GPUs, more than the "
            f"{gib(room)} this run may use ({budget.available.source}); free host memory"
        )
    rec = {"estimate_bytes": int(need), "parts": parts, "available_bytes": room}
    budget.settings["host"] = rec
    return rec
