"""The memory a run will need, the memory it may use, and the batch that fits.

:func:`estimate` is arithmetic on a model's sizes (:class:`Shape`, read from its config
before any weight is loaded) and on what the run does (one :class:`WorkingSet` per kind of
forward pass). It returns an :class:`Estimate`: bytes per component and the peak, the
larger of two phases that never overlap:

* **load**: the process as it is now, the weights, and a second float32 copy of them
  while they are read (a third of one more for a GGUF dequantised on first use);
* **run**: the process, the weights and what the loader leaves behind, plus the largest
  working set: the patterns kept of one batch (``[batch, head, query_pos,
  key_pos]`` per captured layer), the attention scores and activations of one forward,
  the logits of the rows read (``rows × vocab``), the reducers' copies of the patterns,
  the resampling chunks of the statistics, the activations a backward pass keeps
  (gradient importance), and the heap glibc keeps after freeing
  (:mod:`headscope.probes.allocator`).

The factors below were measured on MiniLM-L6 and SmolLM2-135M (CPU, float32): a forward
costs the patterns kept plus :data:`~headscope.probes.capture.WORK_CELLS` float32 copies of
one layer's cells, :data:`~headscope.probes.capture.WORK_ACTIVATIONS` values per token and
``d_model``, and one logit per row read and vocabulary entry.

:func:`available_memory` is what the process may still take: the smallest of
``MemAvailable``, the cgroup's ``memory.max`` minus its current use, ``RLIMIT_AS`` minus the
address space mapped and ``RLIMIT_DATA`` minus the data segment, and
``HEADSCOPE_MEMORY_LIMIT`` (``2G``, ``512M``, bytes: a cap on this process's resident
memory). :func:`fit` picks the largest batch, at most the one asked for, whose estimate
fits, and raises :class:`~headscope.probes.errors.MemoryBudgetError` (one line: the
estimate, what is available, what to change) when even a batch of one does not.

>>> qwen = Shape(n_layers=24, n_heads=14, n_kv_heads=2, d_model=896, d_head=64, d_mlp=4864,
...              vocab_size=151936, n_params=494_032_768, causal=True)
>>> est = estimate(qwen, [WorkingSet(name="roles", batch_size=32, longest=40, kept_layers=24)])
>>> est.phase, round(est.total / 2**30, 2), round(est.parts["roles"]["logits"] / 2**30, 2)
('load', 3.76, 0.72)
>>> parse_size("1.5G"), parse_size("512M"), parse_size("4096")
(1610612736, 536870912, 4096)
"""

from __future__ import annotations

import logging
import os
import re
import resource
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from headscope.probes.capture import WORK_ACTIVATIONS, WORK_CELLS
from headscope.probes.errors import MemoryBudgetError

log = logging.getLogger(__name__)

__all__ = [
    "ENV_LIMIT",
    "Available",
    "Estimate",
    "Shape",
    "WorkingSet",
    "available_memory",
    "check_limit",
    "estimate",
    "fit",
    "parse_size",
    "peak_rss_bytes",
    "peak_vm_bytes",
    "rss_bytes",
]

#: the environment variable that caps this process's resident memory (``2G``, ``512M``, bytes)
ENV_LIMIT = "HEADSCOPE_MEMORY_LIMIT"
GiB = 1 << 30
MiB = 1 << 20

#: bytes of float32 log-probabilities the next-token loss computes at once
#: (:func:`~headscope.analyses.metrics.token_nll`: the log-softmax over row chunks, never all logits at once)
LOGP_CHUNK_BYTES = 32 * MiB
#: copies of the kept patterns the role reducers make of a batch (masked rows, word pooling, JS rows)
REDUCER_COPIES = 2
#: the largest resampling chunk (:func:`~headscope.analyses.stats.resampling.bootstrap_ci`:
#: ``2**21`` draws × (8-byte index + 4-byte count + 4-byte one), the permutation test likewise)
STATISTICS_BYTES = (1 << 21) * 16
#: heap glibc keeps after a free (``M_TRIM_THRESHOLD`` of :func:`~headscope.probes.allocator.tune_allocator`)
ALLOCATOR_SLACK = 64 * MiB
#: share of the float32 loading copy the heap still holds once the weights are in place (measured: 0.35-0.45)
LOADER_RESIDUE = 0.4
#: the same once the heap is trimmed after the load (:func:`~headscope.probes.allocator.trim_heap`, as the
#: report does; measured on a Qwen2-0.5B-shaped bf16 checkpoint loaded in float32 and probed: 0.13)
TRIMMED_RESIDUE = 0.15
#: what a report's run holds beyond each stage's working set once stages have run before it (the frames and
#: summaries kept, the HF probe copy's and earlier stages' heap the allocator keeps, torch's per-thread
#: buffers); measured: MiniLM-L6's default report, the context stage (no working set) 179 MiB over the rest
STAGED_RESIDUE = 180 * MiB
#: resident bytes of a tokenizer per vocabulary entry (measured: MiniLM-L6 and SmolLM2-135M)
TOKENIZER_BYTES_PER_ENTRY = 300
#: code and buffers the loader maps while reading weights (safetensors, tokenizers)
LOADER_EXTRA = 40 * MiB
#: float32 copies of the weights a GGUF's first dequantisation holds besides the usual loading copy
#: (measured on SmolLM2-135M: a peak of 2.3 float32 weights against 2.0 for a load from the cache)
CONVERT_COPIES = 0.3
#: the HF eager copy ``--backend auto``'s in-house probe loads beside the in-house weights (the weights
#: once more, and what its load leaves; measured on a Qwen2-0.5B-shaped bf16 checkpoint loaded in
#: float32: a 5.19 GiB peak while probing against 4.22 GiB estimated for the load alone)
PROBE_COPIES = 1.15
#: values per token, layer and ``d_model`` (and one per ``d_mlp``) a backward pass keeps besides each
#: layer's pattern (residual, norms, q/k/v, outputs; measured: MiniLM-L6 attribution patching of
#: 402-token sequences, 1.30 GiB estimated against a 1.11 GiB peak)
GRAD_ACTIVATIONS = 4


@dataclass(frozen=True, kw_only=True)
class Shape:
    """The sizes :func:`estimate` reads: ``bytes_per`` is the run's dtype (4: fp32, 2: bf16/fp16);
    ``n_params`` counts the weights (a tied unembedding once); ``tied``: the unembedding is the
    embedding matrix (False: ``n_params`` counts a second ``vocab × d_model``)."""

    n_layers: int = 1
    n_heads: int = 1
    n_kv_heads: int = 1
    d_model: int = 1
    d_head: int = 1
    d_mlp: int = 4
    vocab_size: int = 0
    n_params: int = 0
    causal: bool = False
    bytes_per: int = 4
    tied: bool = True

    def __post_init__(self):
        for k in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head", "d_mlp"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"The {k!r} parameter of Shape must be a positive int; got {v!r}.")
        for k in ("vocab_size", "n_params"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"The {k!r} parameter of Shape must be an int >= 0; got {v!r}.")
        if self.bytes_per not in (1, 2, 4, 8):
            raise ValueError(f"The 'bytes_per' parameter of Shape must be 1, 2, 4 or 8; got {self.bytes_per!r}.")

    @classmethod
    def from_hf_config(cls, hf: dict, *, dtype: str = "fp32", where: str = "config") -> Shape:
        """The shape of the model an HF config dict describes (a GGUF's is read from its metadata:
        :func:`~headscope.probes.models.card.source_hf_config`), nothing loaded.

        >>> s = Shape.from_hf_config({"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896,
        ...     "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
        ...     "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": True})
        >>> s.n_params, s.d_head, s.causal
        (494032768, 64, True)
        """
        from headscope.probes.models.arch import arch_from_hf_config
        from headscope.probes.models.checkpoints import estimate_params

        arch = arch_from_hf_config(hf, where)
        return cls(
            n_layers=arch.n_layers,
            n_heads=arch.n_heads,
            n_kv_heads=arch.n_kv_heads,
            d_model=arch.d_model,
            d_head=arch.d_head,
            d_mlp=arch.d_mlp or 4 * arch.d_model,
            vocab_size=arch.vocab_size or 0,
            n_params=estimate_params(hf) or 0,
            causal=arch.causal,
            tied=arch.tie_embeddings,
            bytes_per=2 if dtype in ("bf16", "bfloat16", "fp16", "float16") else 4,
        )


@dataclass(frozen=True, kw_only=True)
class WorkingSet:
    """What one kind of forward pass of a run holds (a phase of :func:`estimate`, named by ``name``).

    ``batch_size``: sequences per forward (the knob :func:`fit` turns); ``longest``: tokens of
    the longest sequence; ``max_tokens``/``max_cells``: :func:`~headscope.probes.capture.stream`'s
    caps per batch (padded tokens; attention cells per head, rows × length²; None: none);
    ``kept_layers``: layers whose patterns are kept for the whole forward; ``logits``:
    ``"all"`` (every position unembedded), ``"last"`` (one row per sequence) or ``"none"``
    (an encoder's hidden states); ``loss``: the logits also pass a log-softmax; ``grad``: a
    backward pass follows (its activations are kept); ``chunked``: the loss's log-softmax runs
    over row chunks of :data:`LOGP_CHUNK_BYTES`, so only the logits
    themselves are held whole (the pruning metrics); ``reducers``: role reducers read
    the patterns; ``statistics``: per-item values are resampled; ``cache_per_row``: bytes the
    run holds per sequence besides the forward (a patching study's clean ``z``, the unablated
    stream of a pruning batch), for at most ``cache_rows`` sequences (None: the batch);
    ``loss_copies``: float32 copies of the logits an unchunked loss adds without a backward, beside
    the float32 cast of lower-precision logits (2: the rows it reads gathered, and their
    log-softmax; 1: the rows read are the ones unembedded, so the log-softmax alone)."""

    name: str = "run"
    batch_size: int = 1
    longest: int = 1
    max_tokens: int | None = None
    max_cells: int | None = None
    kept_layers: int = 0
    logits: str = "all"
    loss: bool = False
    grad: bool = False
    chunked: bool = False
    reducers: bool = False
    statistics: bool = False
    cache_per_row: int = 0
    cache_rows: int | None = None
    loss_copies: int = 2

    def __post_init__(self):
        for k in ("batch_size", "longest"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"The {k!r} parameter of WorkingSet must be a positive int; got {v!r}.")
        if self.logits not in ("all", "last", "none"):
            raise ValueError(
                f"The 'logits' parameter of WorkingSet must be 'all', 'last' or 'none'; got {self.logits!r}."
            )

    def extent(self) -> tuple[int, int, int]:
        """``(rows, tokens, cells)`` of its largest batch: the most sequences, padded tokens and
        attention cells per head that one batch can hold, over every length up to ``longest``
        (an item alone is never split).

        >>> WorkingSet(batch_size=32, longest=37).extent()
        (32, 1184, 43808)
        >>> WorkingSet(batch_size=32, longest=300, max_cells=1 << 17, max_tokens=8192).extent()
        (32, 2048, 131072)
        """
        rows = tokens = cells = 0
        for t in range(1, self.longest + 1):
            r = self.batch_size
            if self.max_tokens:
                r = min(r, max(1, self.max_tokens // t))
            if self.max_cells:
                r = min(r, max(1, self.max_cells // (t * t)))
            rows, tokens, cells = max(rows, r), max(tokens, r * t), max(cells, r * t * t)
        return rows, tokens, cells


@dataclass
class Estimate:
    """What :func:`estimate` found: ``breakdown`` (bytes per component), ``phases`` (bytes per
    phase: ``load`` and each working set), ``total`` (the largest phase, named by ``phase``) and
    the batch size of each working set."""

    breakdown: dict[str, int]
    phases: dict[str, int]
    total: int
    phase: str
    batch_sizes: dict[str, int] = field(default_factory=dict)
    parts: dict[str, dict[str, int]] = field(default_factory=dict, repr=False)

    def describe(self, n: int = 4, phase: str | None = None) -> str:
        """The ``n`` largest components of ``phase`` (default: the peak's): ``weights 1.8 GiB, …``."""
        comps = self.parts.get(phase, self.breakdown) if phase else self.breakdown
        top = sorted(((v, k) for k, v in comps.items() if v > 0), reverse=True)[:n]
        return ", ".join(f"{k.replace('_', ' ')} {gib(v)}" for v, k in top)

    def record(self) -> dict:
        """JSON-ready: ``estimate_bytes``, ``phase``, ``breakdown``, ``phases``, ``batch_sizes``."""
        return {
            "estimate_bytes": int(self.total),
            "phase": self.phase,
            "breakdown": {k: int(v) for k, v in self.breakdown.items()},
            "phases": {k: int(v) for k, v in self.phases.items()},
            "batch_sizes": dict(self.batch_sizes),
        }


def _working_set_bytes(shape: Shape, ws: WorkingSet) -> dict[str, int]:
    """The working set of one batch of ``ws``, by component."""
    b, f32 = shape.bytes_per, 4
    rows, tokens, cells = ws.extent()
    h, d, L = shape.n_heads, shape.d_model, shape.n_layers
    out = {
        "patterns": ws.kept_layers * h * cells * b,
        "attention": WORK_CELLS * h * cells * f32,
        "activations": WORK_ACTIVATIONS * tokens * d * b,
        "logits": 0,
        "reducers": REDUCER_COPIES * ws.kept_layers * h * cells * f32 if ws.reducers else 0,
        "statistics": STATISTICS_BYTES if ws.statistics else 0,
        "gradients": 0,
        "cache": int(ws.cache_per_row) * min(ws.batch_size, ws.cache_rows or ws.batch_size),
    }
    if shape.causal and shape.vocab_size and ws.logits != "none":
        read = tokens if ws.logits == "all" else rows
        whole = read * shape.vocab_size * b
        if ws.chunked and ws.loss and not ws.grad:  # the logits, and one chunk's float32 copy and log-softmax
            out["logits"] = whole + 2 * min(LOGP_CHUNK_BYTES, read * shape.vocab_size * f32)
        elif ws.loss and not ws.grad:  # the logits, their float32 cast, the rows gathered, the log-softmax
            f32_whole = read * shape.vocab_size * f32
            out["logits"] = whole + (f32_whole if b != f32 else 0) + ws.loss_copies * f32_whole
        else:  # a backward keeps the log-softmax and its gradient whole
            out["logits"] = whole * (1 + 2 * ws.grad)
    if ws.grad:  # every layer's activations and its (float32) pattern are kept for the backward pass
        out["gradients"] = L * (GRAD_ACTIVATIONS * tokens * d + tokens * shape.d_mlp) * b + L * h * cells * f32
    return out


def estimate(
    shape: Shape,
    working_sets: Sequence[WorkingSet],
    *,
    process: int = 0,
    load: bool = True,
    convert: bool = False,
    probe: bool = False,
    trimmed: bool = False,
    staged: bool = False,
    beside: dict[str, int] | None = None,
) -> Estimate:
    """The peak resident memory of a run (see the module doc). ``process``: bytes this process
    holds now (:func:`rss_bytes`); ``load``: the weights are still to be read (False: a model
    already in memory, counted in ``process``); ``convert``: a GGUF is dequantised first;
    ``probe``: once the in-house weights are in place, ``--backend auto`` loads an HF eager copy
    beside them to check their patterns (:data:`PROBE_COPIES`), and the load phase is the larger
    of reading the weights and that probe; ``trimmed``: the heap is trimmed once the model is
    loaded, so the working sets hold :data:`TRIMMED_RESIDUE` of the loading copy, not :data:`LOADER_RESIDUE`;
    ``staged``: the working sets are a report's stages, run one after another (:data:`STAGED_RESIDUE`);
    ``beside``: components every working set's phase holds besides (a ``--ray`` driver's object store).
    ``breakdown`` gives the components of the largest phase (``weights``, ``loading``,
    ``process``, and that working set's ``patterns``, ``logits``, …).

    >>> tiny = Shape(n_layers=2, n_heads=4, d_model=64, d_head=16, d_mlp=256, vocab_size=1000, n_params=10**6)
    >>> e = estimate(tiny, [WorkingSet(batch_size=8, longest=16)], process=100 * 2**20)
    >>> e.phase, e.breakdown["weights"], e.breakdown["patterns"]
    ('run', 4000000, 0)
    """
    w = shape.n_params * shape.bytes_per if load else 0
    base = {"process": int(process), "weights": w}
    tokenizer = TOKENIZER_BYTES_PER_ENTRY * shape.vocab_size if load else 0
    load_extra = {
        "loading": (int(shape.n_params * 4 * (1 + CONVERT_COPIES * convert)) + LOADER_EXTRA) if load else 0,
        "tokenizer": tokenizer,
    }
    residue = {"loader residue": int(LOADER_RESIDUE * shape.n_params * 4) if load else 0, "tokenizer": tokenizer}
    phases = {"load": sum(base.values()) + sum(load_extra.values())}
    parts = {"load": {**base, **load_extra}}
    if load and probe:  # the in-house model, what its load left, and the HF copy of the probe
        probing = {**base, **residue, "probe copy": int(PROBE_COPIES * w) + LOADER_EXTRA}
        if sum(probing.values()) > phases["load"]:
            phases["load"], parts["load"] = sum(probing.values()), probing
    if trimmed and load:
        residue["loader residue"] = int(TRIMMED_RESIDUE * shape.n_params * 4)
    for ws in working_sets:
        work = _working_set_bytes(shape, ws)
        parts[ws.name] = {**base, **residue, **work, "allocator": ALLOCATOR_SLACK}
        if staged:
            parts[ws.name]["staged residue"] = STAGED_RESIDUE
        parts[ws.name].update({k: int(v) for k, v in (beside or {}).items()})
        phases[ws.name] = sum(parts[ws.name].values())
    phase = max(phases, key=phases.get)
    return Estimate(
        breakdown=parts[phase],
        phases=phases,
        total=phases[phase],
        phase=phase,
        batch_sizes={s.name: s.batch_size for s in working_sets},
        parts=parts,
    )


# ----------------------------------------------------------------------------- what may be used


def parse_size(text) -> int:
    """``"2G"``, ``"1.5GiB"``, ``"512M"``, ``"300k"``, ``"4096"`` -> bytes (powers of 1024);
    ``ValueError`` otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{ENV_LIMIT} must be a size such as 2G, 512M or a number of bytes; got {str(text)[:40]!r}")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def _status() -> dict[str, int]:
    """``/proc/self/status`` sizes in bytes (VmRSS, VmHWM, VmSize, VmPeak, VmData); {} off Linux."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "VmSize", "VmPeak", "VmData"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def rss_bytes() -> int:
    """Resident memory of this process now (0 when unknown)."""
    return _status().get("VmRSS", 0)


def peak_rss_bytes() -> int:
    """The most resident memory this process has held (``VmHWM``, else ``ru_maxrss``)."""
    hwm = _status().get("VmHWM")
    if hwm:
        return hwm
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_vm_bytes() -> int | None:
    """The most address space this process has mapped (``VmPeak``: what ``RLIMIT_AS`` bounds, far
    above the resident ``VmHWM`` in a torch process); None off Linux."""
    return _status().get("VmPeak")


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_headroom() -> tuple[int, str] | None:
    """``memory.max − memory.current`` of this process's cgroup (v2, or v1's ``limit_in_bytes −
    usage_in_bytes``); None when there is no limit or it cannot be read."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            candidates = [(f"/sys/fs/cgroup{path}".rstrip("/"), "memory.max", "memory.current")]
        elif "memory" in controllers.split(","):
            candidates = [
                (f"/sys/fs/cgroup/memory{path}".rstrip("/"), "memory.limit_in_bytes", "memory.usage_in_bytes"),
                ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
            ]
        else:
            continue
        for folder, lim_name, cur_name in candidates:
            limit, current = _read_int(f"{folder}/{lim_name}"), _read_int(f"{folder}/{cur_name}")
            if limit is None or current is None or limit >= 1 << 60:  # "max" or v1's "no limit"
                continue
            room = (max(0, limit - current), f"cgroup limit {gib(limit)}")
            best = room if best is None or room[0] < best[0] else best
            break
    return best


@dataclass(frozen=True)
class Available:
    """``bytes``: what the process may still take; ``source``: which limit says so;
    ``resident``: what it held when measured (the estimate counts it as ``process``);
    ``cap``: the limit on the whole process's resident memory, where that is what ``source`` is
    (``HEADSCOPE_MEMORY_LIMIT``)."""

    bytes: int | None
    source: str
    resident: int
    cap: int | None = None

    @property
    def budget(self) -> int | None:
        """The peak resident memory the run may reach: ``cap``, else ``resident + bytes``."""
        if self.cap is not None:
            return self.cap
        return None if self.bytes is None else self.resident + self.bytes


def available_memory() -> Available:
    """The smallest of: ``HEADSCOPE_MEMORY_LIMIT`` minus this process's resident memory,
    ``MemAvailable``, the cgroup's limit minus its use, ``RLIMIT_AS`` minus the address space
    mapped, ``RLIMIT_DATA`` minus the data segment. ``bytes`` is None when none is known.
    ``ValueError`` for a ``HEADSCOPE_MEMORY_LIMIT`` that is not a size."""
    st = _status()
    rss = st.get("VmRSS", 0)
    found: list[tuple[int, str]] = []
    env = os.environ.get(ENV_LIMIT)
    cap = None
    if env is not None and env.strip():
        cap = parse_size(env)
        found.append((max(0, cap - rss), f"{ENV_LIMIT}={env.strip()}"))
    from headscope.probes.models.checkpoints import available_memory_bytes

    avail = available_memory_bytes()
    if avail is not None:
        found.append((avail, "MemAvailable"))
    cg = _cgroup_headroom()
    if cg is not None:
        found.append(cg)
    for name, res, key in (
        ("RLIMIT_AS", resource.RLIMIT_AS, "VmSize"),
        ("RLIMIT_DATA", resource.RLIMIT_DATA, "VmData"),
    ):
        soft, _hard = resource.getrlimit(res)
        if soft != resource.RLIM_INFINITY and key in st:
            found.append((max(0, soft - st[key]), f"{name} {gib(soft)}"))
    if not found:
        return Available(None, "unknown", rss)
    room, source = min(found)
    return Available(room, source, rss, cap if source.startswith(ENV_LIMIT) else None)


def check_limit(shape: Shape, *, load: bool = True) -> None:
    """Refuse, in one line, a ``HEADSCOPE_MEMORY_LIMIT`` that is not a size, or one below what the
    weights of ``shape`` alone need (``n_params × bytes_per``; nothing when ``load`` is False: the
    weights are in the process already). Raises :class:`MemoryBudgetError` (exit 2 in the CLI)
    before anything loads; returns None when the variable is unset or large enough.

    Example: ``HEADSCOPE_MEMORY_LIMIT=1M`` for a model of 10**6 float32 parameters is refused with
    ``HEADSCOPE_MEMORY_LIMIT=1M reads as 1.0 MiB, below the 3.8 MiB the weights alone need …``.
    """
    env = os.environ.get(ENV_LIMIT)
    if env is None or not env.strip():
        return
    need = shape.n_params * shape.bytes_per if load else 0
    sizes = f"({shape.n_params:,} parameters x {shape.bytes_per} bytes)"
    try:
        cap = parse_size(env)
    except ValueError:
        raise MemoryBudgetError(
            f"{ENV_LIMIT}={env.strip()[:40]!r} is not a size (such as 2G, 512M or a number of bytes); the "
            f"weights alone need {_mib(need)} {sizes}: set it to at least that or unset it"
        ) from None
    if cap < need:
        raise MemoryBudgetError(
            f"{ENV_LIMIT}={env.strip()} reads as {_mib(cap)}, below the {_mib(need)} the weights alone need "
            f"{sizes}; set it to at least {_mib(need)} or unset it"
        )


def _mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n < GiB else gib(n)


# ----------------------------------------------------------------------------- choosing the batch


def gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n < 10 * GiB else f"{n / GiB:.1f} GiB"


def fit(
    shape: Shape,
    working_sets: Sequence[WorkingSet],
    available: Available,
    *,
    command: str,
    load: bool = True,
    convert: bool = False,
    probe: bool = False,
    trimmed: bool = False,
    staged: bool = False,
    beside: dict[str, int] | None = None,
    remedies: dict[str, str] | None = None,
) -> Estimate:
    """The estimate with each working set's batch at most its ``batch_size``, shrunk (largest first)
    until the peak fits in ``available.budget``. Raises :class:`MemoryBudgetError` with one line
    (the estimate, what is available and from where, what to change) when the load alone, or
    every working set at a batch of one, does not fit. With no known limit, the estimate as asked.
    ``remedies``: component -> advice (``{"weights": "use --dtype bf16"}``) for the message."""
    working_sets = list(working_sets)
    kw = dict(load=load, convert=convert, probe=probe, trimmed=trimmed, staged=staged, beside=beside)
    kw["process"] = available.resident
    est = estimate(shape, working_sets, **kw)
    budget = available.budget
    if budget is None or est.total <= budget:
        return est
    if est.phases["load"] > budget:
        raise MemoryBudgetError(_refusal(command, est, "load", available, remedies))
    fitted = []
    for i, s in enumerate(working_sets):
        lo, hi = 1, s.batch_size  # the largest batch whose phase fits, by bisection (monotone in the batch)

        def fits(n, i=i, s=s):
            trial = estimate(shape, [replace(s, batch_size=n)], **kw)
            return trial.phases[s.name] <= budget

        if not fits(1):
            one = estimate(shape, [replace(s, batch_size=1)], **kw)
            raise MemoryBudgetError(_refusal(command, one, s.name, available, remedies))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        fitted.append(replace(s, batch_size=lo))
    return estimate(shape, fitted, **kw)


def _refusal(command, est: Estimate, phase: str, available: Available, remedies) -> str:
    """The one line of a refusal: the estimate of ``phase``, its largest parts, what is
    available and from where, and what to change (``remedies`` of its largest part)."""
    remedies = remedies or {}
    where = "loading the model" if phase == "load" else f"its {phase} forward passes at batch size 1"
    comps = est.parts.get(phase, {})
    top = max((k for k in comps if k != "process"), key=lambda k: comps[k], default="weights")
    advice = remedies.get(top) or remedies.get("*") or "free memory or use a smaller model"
    return (
        f"{command} needs ~{gib(est.phases[phase])} for {where} ({est.describe(phase=phase)}), more than the "
        f"{gib(available.budget)} this run may use ({available.source}); {advice}, or set {ENV_LIMIT} higher "
        "if more memory is free"
    )
