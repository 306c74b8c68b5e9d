"""What capturing attention costs: every way of getting patterns, timed on the same batches.

:func:`run_bench` generates sentences (12–40 words from a seeded word list, or lines of a
text file), cuts them into length-bucketed batches once, and times each *path* over all
batches: every path is warmed up on one batch, then ``repeats`` interleaved rounds each
time every path once (so load changes on a shared machine hit all paths alike), and a
path's time is its fastest round (as :mod:`timeit` advises: slower rounds measure other
processes; the median is kept in ``median_seconds``). The reference (ratio 1.0) is the
plain HF transformers forward with SDPA attention. A target's ratio of two paths is the
median over rounds of their times in the same round (the fastest-round ratio is in its note).

========================  ====================================================================
path                      what runs
========================  ====================================================================
``hf_sdpa``               HF transformers forward, SDPA attention (reference)
``hf_eager_attentions``   HF transformers, eager attention, ``output_attentions=True``
``tl_cache_full``         transformer-lens bridge ``run_with_cache`` (every hook)
``tl_cache_patterns``     same, ``names_filter`` on the patterns only
``capture_patterns``      headscope in-house ``model.run(batch, ["pattern"])``, all layers
``inhouse_forward``       headscope in-house plain forward (SDPA path)
``gate_grad``             in-house forward + backward of a scalar loss for gate gradients
``bf16_forward``          in-house plain forward in bfloat16 (where the CPU has bf16)
``capture_stream``        ``probes.capture.stream`` over the raw sentences, no reducer:
                          tokenising, word alignment, bucketing and the capture, the
                          same work ``roles`` does before any statistic
``roles``                 ``analyses.roles.head_roles`` text roles over the same sentences
``ablation_separate``     zero-ablating every head alone, one full forward per head
``ablation_batched``      the same, as ``single_head_ablation`` runs it: every head's mask
                          in one call, replicas of a batch each running the layers from its
                          own, the unablated prefix run once
``pruning_50``            forward of the model with 50% of heads physically pruned
``hook_gates``            gate-gradient importance (``importance.gate_gradients``: forward +
                          backward of the metric's loss) through ``ablation.head_gates``,
                          the head hooks every backend has
``inhouse_gates``         the same through the in-house ``Attention``'s built-in gates
                          (``ablation.gates_as``), same model, metric and batches
``quick_pruning``         the report's quick pruning stage (``PruneConfig(quick=True,
                          ablation_modes=("zero",), studies=("ablation", "importance",
                          "curves"))`` + role ablation against a seeded stand-in roles frame)
``quick_pruning_before``  the same with the previous algorithm (``pruning_study(shared=False)``:
                          no work shared across masks, studies, curves or steps)
``patch_attribution``     attribution patching of every head (``attribution_patching``,
                          denoising) on :data:`PATCHING` induction items in one batch:
                          the clean and corrupted runs, one forward + backward, statistics
``patch_forward_backward`` one forward + backward of the same (corrupted) batch, the
                          backward reaching every head's output ``z`` (as attribution's)
``patch_activation``      activation patching of every head, batched (``activation_patching``,
                          denoising: replicas, the unpatched prefix run once), statistics
``patch_one_forward_per_head`` the naive way: the clean and corrupted runs, then one full
                          forward of the batch per head with that head patched (measured,
                          not estimated: ``n_heads`` forwards)
========================  ====================================================================

A path this machine cannot run (:class:`PathSkipped`: bf16 without native bf16) is kept
as a row with ``status = "skipped"`` and a note. Each path's time is compared with the
targets of :mod:`headscope.analyses.bench.targets`. The frame (:data:`BENCH_COLUMNS`) has one row per
path; ``gflop`` counts model FLOPs as ``2 × linear parameters × real tokens + 4 × layers ×
d_model × n²`` per sequence (×2 for the gate-gradient pass, whose backward
stops at activations), ``peak_pct`` relates the achieved rate
to a measured 2048×2048 matmul loop of the same dtype.

>>> sents = generate_sentences(3, seed=0)
>>> [12 <= len(s.split()) <= 40 for s in sents], sents == generate_sentences(3, seed=0)
([True, True, True], True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from headscope.analyses.bench.targets import RATIO_TARGETS
from headscope.probes.capture import buckets, pattern_bytes
from headscope.probes.tokens import collate, pad_id, tokenize_one

log = logging.getLogger(__name__)

BENCH_COLUMNS = [
    "path",
    "description",
    "status",
    "seconds",
    "ratio",
    "gflop",
    "gflops_per_s",
    "peak_pct",
    "rss_mb",
    "peak_rss_mb",
    "repeats",
    "median_seconds",
    "note",
]
TARGET_COLUMNS = ["target", "value", "threshold", "met", "note"]

# --------------------------------------------------------------------------- sentences

_WORDS = {
    "det": "the a this that every some one another".split(),
    "adj": (
        "old small quiet bright heavy careful narrow early green wooden tired curious distant busy "
        "sudden gentle broken famous local simple"
    ).split(),
    "noun": (
        "cat teacher river engineer garden letter window village doctor bridge student kitchen "
        "market painter forest train museum sister question island farmer lamp story judge "
        "harbour child table mountain song"
    ).split(),
    "verb": (
        "saw carried found painted opened followed watched repaired described visited admired "
        "moved called noticed wrote built crossed remembered"
    ).split(),
    "prep": "near behind under across beside after before without inside towards".split(),
    "conj": "because while although when and but so".split(),
    "adv": "slowly quickly quietly again yesterday carefully often finally".split(),
}


def _phrase(rng: random.Random) -> list[str]:
    out = [rng.choice(_WORDS["det"])]
    if rng.random() < 0.6:
        out.append(rng.choice(_WORDS["adj"]))
    out.append(rng.choice(_WORDS["noun"]))
    return out


def _clause(rng: random.Random) -> list[str]:
    words = _phrase(rng) + [rng.choice(_WORDS["verb"])] + _phrase(rng)
    if rng.random() < 0.5:
        words += [rng.choice(_WORDS["prep"])] + _phrase(rng)
    if rng.random() < 0.3:
        words.append(rng.choice(_WORDS["adv"]))
    return words


def generate_sentences(n: int, *, seed: int = 0, min_words: int = 12, max_words: int = 40) -> list[str]:
    """``n`` English-like sentences of ``min_words``..``max_words`` words (uniform length),
    built from a fixed word list with ``random.Random(seed)``: same seed, same sentences."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int; got {n!r}")
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words; got {min_words}, {max_words}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target = rng.randint(min_words, max_words)
        words = _clause(rng)
        while len(words) < target:
            words += [rng.choice(_WORDS["conj"])] + _clause(rng)
        words = words[:target]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + ".")
    return out


def corpus_sentences(corpus: str, n: int, seed: int = 0) -> list[str]:
    """``"generated"``: :func:`generate_sentences`; ``"shipped"``: ``data/text/sentences.txt``;
    else a text file path. File lines are repeated in order until there are ``n``."""
    if corpus == "generated":
        return generate_sentences(n, seed=seed)
    if corpus == "shipped":
        from headscope.data import path

        p = path("text/sentences.txt")
    else:
        p = Path(corpus)
    from headscope.probes.corpora.text import read_text

    lines = list(read_text(p).lines)
    if not lines:
        raise ValueError(f"{p}: no non-blank lines to benchmark on")
    return [lines[i % len(lines)] for i in range(n)]


# --------------------------------------------------------------------------- machine


def rss_mb() -> float:
    """Current resident set size in MiB (psutil; falls back to /proc)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:  # pragma: no cover
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """Peak RSS of this process so far, MiB (``getrusage``; kilobytes on Linux)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 2**10


def check_device(device, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` the bench can run on: ``cpu``, ``cuda`` or ``cuda:N``
    with CUDA present (and device N on this machine). ``name`` starts the messages
    (``--device`` from the command line).

    >>> check_device("bogus", "--device")
    Traceback (most recent call last):
    ...
    ValueError: --device must be cpu, cuda or cuda:N; got bogus
    """
    text = str(device).strip()
    kind, _, index = text.partition(":")
    if not (kind == "cpu" and not _ and not index) and not (kind == "cuda" and (not _ or index.isdigit())):
        raise ValueError(f"{name} must be cpu, cuda or cuda:N; got {text or repr(device)}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {text}: CUDA is not available on this machine")
        n = torch.cuda.device_count()
        if index and int(index) >= n:
            raise ValueError(f"{name} {text}: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}")
    return torch.device(text)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_gflops(
    dtype: torch.dtype = torch.float32, *, size: int = 2048, seconds: float = 1.0, device: str | torch.device = "cpu"
) -> float:
    """Peak GFLOP/s of a ``size``×``size`` matmul: one warm-up, then products for at
    least ``seconds`` (and at least 3); the fastest product counts, as for the paths
    (on a shared machine the mean measures the neighbours too)."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    a @ b
    _sync(device)
    best, n, t_start = math.inf, 0, time.perf_counter()
    while n < 3 or time.perf_counter() - t_start < seconds:
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
        n += 1
    return 2 * size**3 / best / 1e9


def bf16_support(device: str | torch.device = "cpu") -> tuple[bool, str]:
    """Whether bfloat16 matmuls are native here: on CUDA, ``torch.cuda.is_bf16_supported``;
    on a CPU, oneDNN must be available, a small bf16 matmul must run, and an x86 CPU must
    list ``avx512_bf16`` or ``amx_bf16`` (without them oneDNN emulates bf16, tens of times
    slower than fp32); other CPUs count as native when the bf16 matmul keeps at least half
    the fp32 rate."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(), "CUDA"
    if not torch.backends.mkldnn.is_available():
        return False, "oneDNN (mkldnn) is not available"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    isa = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    try:
        f32 = matmul_peak_gflops(torch.float32, size=256, seconds=0.1)
        b16 = matmul_peak_gflops(torch.bfloat16, size=256, seconds=0.1)
    except RuntimeError as e:
        return False, f"bf16 matmul failed ({e})"
    x86 = any(f in flags for f in (" sse2", " avx2", " avx "))
    native = bool(isa) if x86 else b16 >= 0.5 * f32
    why = (
        f"256x256 matmul: bf16 {b16:.1f} vs fp32 {f32:.1f} GFLOP/s; CPU flags: "
        f"{', '.join(isa) if isa else ('no avx512_bf16/amx_bf16' if x86 else 'not x86')}"
    )
    return native, why


# --------------------------------------------------------------------------- config


PATHS = {
    "hf_sdpa": "HF transformers forward, SDPA attention (reference)",
    "hf_eager_attentions": "HF eager attention, output_attentions=True",
    "tl_cache_full": "transformer-lens bridge run_with_cache, full cache",
    "tl_cache_patterns": "transformer-lens bridge run_with_cache, patterns only",
    "capture_patterns": "headscope in-house capture of all patterns",
    "inhouse_forward": "headscope in-house plain forward (SDPA)",
    "gate_grad": "in-house forward + backward for gate gradients",
    "bf16_forward": "in-house plain forward, bfloat16",
    "capture_stream": "capture of all patterns from raw text (probes.capture.stream, no reducer)",
    "roles": "all text role statistics (analyses.roles.head_roles)",
    "ablation_separate": "single-head ablation of every head, a forward each",
    "ablation_batched": "single-head ablation of every head, per-layer replicas, shared prefix",
    "ablation_hf": "the same on the hf backend (its forward resumed from each replica's first layer)",
    "ablation_hf_whole": "the same on the hf backend, every replica run whole (before it resumed)",
    "pruning_50": "forward with 50% of heads physically pruned",
    "hook_gates": "gate-gradient importance through head hooks (head_gates, any backend)",
    "inhouse_gates": "gate-gradient importance through the in-house built-in gates (gates_as)",
    "quick_pruning": "the report's quick pruning stage (ablation, importance, curves, roles)",
    "quick_pruning_before": "the same, previous algorithm (pruning_study(shared=False))",
    "patch_attribution": "attribution patching of every head (one forward + backward per pair)",
    "patch_forward_backward": "one forward + backward of the patching batch (to every head's z)",
    "patch_activation": "activation patching of every head, batched (replicas, shared prefix)",
    "patch_one_forward_per_head": "activation patching, one full forward per head (naive)",
}

#: the report's quick pruning stage (``reports.pipeline._prune_config`` without ``--full``)
QUICK_PRUNING = {"quick": True, "ablation_modes": ("zero",), "studies": ("ablation", "importance", "curves")}
#: the patching paths' task and statistics: ``items`` induction items of ``seq_len`` tokens
#: (twice, plus BOS) in one batch, denoising, the report's patching statistics
PATCHING = {"items": 8, "seq_len": 8, "n_boot": 500, "n_perm": 2000}


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """``model``: shipped name or path; ``n_sentences`` and ``batch_size`` shape the batches;
    ``dtype``: ``"fp32"`` or ``"bf16"`` for the model paths; ``repeats``: timed passes
    (median); ``paths``: subset of :data:`PATHS` (None: all); ``corpus``: see
    :func:`corpus_sentences`; ``device``: torch device string; ``peak_size`` and
    ``peak_seconds``: the matmul loop that measures the peak; ``prune_items``: items of the
    ``quick_pruning`` paths' metric (None: the quick stage's 24)."""

    model: str = "minilm-l6"
    n_sentences: int = 512
    batch_size: int = 64
    dtype: str = "fp32"
    repeats: int = 3
    paths: tuple[str, ...] | None = None
    corpus: str = "generated"
    seed: int = 0
    device: str = "cpu"
    peak_seconds: float = 1.0
    peak_size: int = 2048
    prune_items: int | None = None

    def __post_init__(self):
        if self.prune_items is not None and (
            isinstance(self.prune_items, bool) or not isinstance(self.prune_items, int) or self.prune_items < 2
        ):
            raise ValueError(
                f"The 'prune_items' parameter of BenchConfig must be None or an int >= 2; got {self.prune_items!r}."
            )
        for k in ("n_sentences", "batch_size", "repeats", "peak_size"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"The {k!r} parameter of BenchConfig must be a positive int; got {v!r}.")
        if self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"The 'dtype' parameter of BenchConfig must be 'fp32' or 'bf16'; got {self.dtype!r}.")
        if self.paths is not None:
            object.__setattr__(self, "paths", tuple(self.paths))
            bad = [p for p in self.paths if p not in PATHS]
            if bad:
                raise ValueError(f"unknown bench path {bad[0]!r}; valid paths: {', '.join(PATHS)}")
        check_device(self.device)


@dataclass
class BenchResult:
    """``frame``: one row per path (:data:`BENCH_COLUMNS`); ``targets``: one row per target
    (:data:`TARGET_COLUMNS`); ``info``: machine, batches, padding, pattern memory."""

    frame: pd.DataFrame
    targets: pd.DataFrame
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "paths": json.loads(self.frame.to_json(orient="records")),
            "targets": json.loads(self.targets.to_json(orient="records")),
            "info": self.info,
        }


class PathSkipped(Exception):
    """A path that cannot run here; the message becomes the row's note."""


# --------------------------------------------------------------------------- the bench


def linear_params(module: torch.nn.Module) -> int:
    """Parameters of the model's ``nn.Linear`` layers (the matmuls), shared ones once."""
    seen, n = set(), 0
    for m in module.modules():
        if isinstance(m, torch.nn.Linear) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            n += m.weight.numel()
    return n


def model_gflop(*, linear: int, n_layers: int, d_model: int, lengths: list[int]) -> float:
    """Forward FLOPs of one pass, in GFLOP: ``2 × linear × Σn + 4 × layers × d_model × Σn²``
    over the sequences' real lengths ``n`` (for a pruned model pass ``n_layers × d_model``
    as the total attention width ``Σ_layers heads × d_head`` with ``n_layers=1``).

    >>> model_gflop(linear=1_000_000, n_layers=2, d_model=8, lengths=[10, 20])
    0.060032
    """
    tokens = sum(lengths)
    return (2 * linear * tokens + 4 * n_layers * d_model * sum(n * n for n in lengths)) / 1e9


def padding_ratio(lengths: list[int], groups: list[list[int]]) -> float:
    """Padded positions / real positions when ``groups`` of item indices are padded to
    their longest item.

    >>> padding_ratio([2, 4, 4], [[0, 1], [2]])
    0.2
    """
    real = sum(lengths)
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    return (padded - real) / max(real, 1)


class _Bench:
    """Shared state: batches and lazily loaded models."""

    def __init__(self, cfg: BenchConfig):
        from headscope.probes.models.checkpoints import resolve

        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
        self.source = resolve(cfg.model)
        self._models: dict = {}
        self.sentences = corpus_sentences(cfg.corpus, cfg.n_sentences, cfg.seed)
        inhouse = self.model("inhouse")
        tok = inhouse.tokenizer
        items, skipped = [], 0
        for s in self.sentences:
            it = tokenize_one(tok, text=s)
            if len(it["ids"]) > inhouse.spec.max_positions:
                skipped += 1
                continue
            items.append(it)
        if not items:
            raise ValueError("no sentence fits the model's context")
        self.lengths = [len(it["ids"]) for it in items]
        pad = pad_id(tok)
        self.groups = buckets(self.lengths, cfg.batch_size, None)
        self.batches = [collate([items[i] for i in g], pad) for g in self.groups]
        self.unsorted_groups = [
            list(range(i, min(i + cfg.batch_size, len(items)))) for i in range(0, len(items), cfg.batch_size)
        ]
        self.n_skipped = skipped
        self.spec = inhouse.spec
        self.linear = linear_params(inhouse.module)
        self.fwd_gflop = model_gflop(
            linear=self.linear, n_layers=self.spec.n_layers, d_model=self.spec.d_model, lengths=self.lengths
        )
        self.bf16 = bf16_support(self.device)
        self.ids = [(b.input_ids.to(self.device), b.attention_mask.to(self.device)) for b in self.batches]

    def model(self, kind: str):
        if kind in self._models:
            return self._models[kind]
        from headscope.probes.models.loading import BridgeModel, HFReference, InHouseModel

        if kind == "inhouse":
            m = InHouseModel.from_source(self.source, dtype=self.dtype)
            m.module.to(self.device)
        elif kind == "inhouse_bf16":
            m = InHouseModel.from_source(self.source, dtype=torch.bfloat16)
            m.module.to(self.device)
        elif kind in ("hf_sdpa", "hf_eager"):
            m = HFReference.from_source(self.source, attn_implementation="sdpa" if kind == "hf_sdpa" else "eager")
            m.hf.to(device=self.device, dtype=self.dtype)
        elif kind == "bridge":
            m = BridgeModel.from_source(self.source)
            if self.device.type != "cpu":
                with contextlib.redirect_stdout(sys.stderr):  # the bridge's .to() prints "Moving model to device"
                    m.bridge.to(self.device)
        else:  # pragma: no cover
            raise ValueError(kind)
        self._models[kind] = m
        return m

    # each path returns (pass function, warm-up function, gflop per pass or None, note)

    def _over_batches(self, step):
        def one_pass():
            for ids, mask in self.ids:
                step(ids, mask)

        def warm():
            step(*self.ids[0])

        return one_pass, warm

    def p_hf_sdpa(self):
        hf = self.model("hf_sdpa").hf

        def step(ids, mask):
            with torch.inference_mode():
                hf(input_ids=ids, attention_mask=mask)

        return (*self._over_batches(step), self.fwd_gflop, "")

    def p_hf_eager_attentions(self):
        hf = self.model("hf_eager").hf

        def step(ids, mask):
            with torch.inference_mode():
                hf(input_ids=ids, attention_mask=mask, output_attentions=True)

        return (*self._over_batches(step), self.fwd_gflop, "")

    def _tl(self, names_filter, note):
        bridge = self.model("bridge").bridge

        def step(ids, mask):
            with torch.inference_mode():
                _, cache = bridge.run_with_cache(ids, attention_mask=mask, names_filter=names_filter)
                del cache

        return (*self._over_batches(step), self.fwd_gflop, note)

    def p_tl_cache_full(self):
        return self._tl(None, "")

    def p_tl_cache_patterns(self):
        return self._tl(lambda name: name.endswith("attn.hook_pattern"), "names_filter: *.attn.hook_pattern")

    def p_capture_patterns(self):
        model = self.model("inhouse")
        batches = [
            dataclasses.replace(b, input_ids=ids, attention_mask=mask) for b, (ids, mask) in zip(self.batches, self.ids)
        ]

        def one_pass():
            for b in batches:
                model.run(b, ["pattern"])

        return (
            one_pass,
            lambda: model.run(batches[0], ["pattern"]),
            self.fwd_gflop,
            f"{self.spec.n_layers} layers x {self.spec.n_heads} heads",
        )

    def p_inhouse_forward(self):
        module = self.model("inhouse").module

        def step(ids, mask):
            with torch.inference_mode():
                module(ids, mask)

        return (*self._over_batches(step), self.fwd_gflop, "")

    def p_gate_grad(self):
        module = self.model("inhouse").module
        causal = self.spec.causal

        def step(ids, mask):
            gates = module.gates
            for g in gates:
                g.requires_grad_(True)
            try:
                with torch.enable_grad():
                    out = module(ids, mask)
                if causal:
                    logits = out[:, :-1].float()
                    target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
                    loss = torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100
                    )
                else:
                    loss = (out.float() ** 2 * mask[..., None]).sum() / mask.sum()
                    torch.autograd.grad(loss, gates)  # only the paths to the gates, no weight gradients
            finally:
                for g in gates:
                    g.requires_grad_(False)

        loss = "next-token CE" if causal else "mean squared hidden state"
        return (
            *self._over_batches(step),
            2 * self.fwd_gflop,
            f"loss: {loss}; backward to the gates only (counted 2x forward)",
        )

    def p_bf16_forward(self):
        ok, why = self.bf16
        if not ok:
            raise PathSkipped(f"no native bf16 here ({why})")
        module = self.model("inhouse_bf16").module

        def step(ids, mask):
            with torch.inference_mode():
                module(ids, mask)

        return (*self._over_batches(step), self.fwd_gflop, why)

    def p_capture_stream(self):
        model = self.model("inhouse")
        from headscope.probes.capture import stream

        def one_pass():
            stream(model, list(self.sentences), [], batch_size=self.cfg.batch_size)

        def warm():
            stream(model, list(self.sentences[: self.cfg.batch_size]), [], batch_size=self.cfg.batch_size)

        return one_pass, warm, self.fwd_gflop, "from text: tokenise, align words, bucket, capture"

    def p_roles(self):
        from headscope.analyses.roles import pipeline as roles
        from headscope.analyses.roles.config import RolesConfig

        model = self.model("inhouse")
        groups = tuple(roles.TEXT_GROUPS)
        rcfg = RolesConfig(batch_size=self.cfg.batch_size)

        def one_pass():
            roles.head_roles(model, text=list(self.sentences), roles=groups, cfg=rcfg, examples=False)

        def warm():
            roles.head_roles(
                model, text=list(self.sentences[: self.cfg.batch_size]), roles=groups, cfg=rcfg, examples=False
            )

        return (
            one_pass,
            warm,
            self.fwd_gflop,
            f"groups: {', '.join(groups)}; includes tokenising, bootstrap and permutation tests",
        )

    def _ablation(self, batched: bool, kind: str = "inhouse", whole: bool = False):
        from headscope.analyses.pruning import ablation as abl
        from headscope.analyses.pruning import metrics as im

        model = self.model(kind)
        spec = model.spec
        by_layer = [
            abl.head_masks(n_layers=spec.n_layers, n_heads=spec.n_heads, heads=group)
            for group in abl._group_heads(spec, "layer")
        ]  # as single_head_ablation groups them
        sents = self.sentences[: min(len(self.sentences), 32)]  # the separate way costs layers x heads forwards
        metric = _SentenceMetric(im, model, sents, len(sents))

        if kind != "inhouse":  # the hf backend's own check, once, outside the timed passes
            model._resume_checked = None
            checked = model._check_resume()

        def as_run():  # the hf backend, resumed (where its check allows) or run whole
            if kind != "inhouse":
                model._resume_checked = (False, False) if whole else checked

        def one_pass():
            as_run()
            if batched:  # every head in one call: replicas, each from its own layer, the prefix run once
                abl.evaluate(model, metric.metric, torch.cat(by_layer))
                return
            for masks in by_layer:  # a full forward per head
                for r in range(len(masks)):
                    with abl.gates_as(model.module, masks[r]):
                        abl.evaluate(model, metric.metric)

        def warm():
            as_run()
            abl.evaluate(model, metric.metric, by_layer[-1][:2])

        lengths = [len(tokenize_one(model.tokenizer, text=t)["ids"]) for t in sents]
        n_heads = spec.n_layers * spec.n_heads
        gflop = n_heads * model_gflop(linear=self.linear, n_layers=spec.n_layers, d_model=spec.d_model, lengths=lengths)
        return (
            one_pass,
            warm,
            gflop,
            f"{n_heads} heads x the first {len(sents)} sentences ({metric.name}); gflop as separate forwards",
        )

    def p_ablation_separate(self):
        return self._ablation(False)

    def p_ablation_batched(self):
        return self._ablation(True)

    def p_ablation_hf(self):
        return self._ablation(True, "hf_eager")

    def p_ablation_hf_whole(self):
        return self._ablation(True, "hf_eager", whole=True)

    def _gates(self, hook: bool):
        from headscope.analyses.pruning import ablation as abl
        from headscope.analyses.pruning import metrics as im

        model = self.model("inhouse")
        spec = model.spec
        sents = self.sentences[: min(len(self.sentences), 32)]
        metric = _SentenceMetric(im, model, sents, self.cfg.batch_size).metric
        mask = torch.ones(spec.n_layers, spec.n_heads)

        def one_pass():
            gates = (
                abl.head_gates(model, mask, requires_grad=True)
                if hook
                else abl.gates_as(model.module, mask, requires_grad=True)
            )
            with gates as g, torch.enable_grad():  # importance.gate_gradients, gates of either kind
                for u in metric.units:
                    out = model.forward(u.batch.input_ids, u.batch.attention_mask)
                    torch.autograd.grad(metric.loss(out, u), g, allow_unused=True)

        lengths = [len(tokenize_one(model.tokenizer, text=t)["ids"]) for t in sents]
        gflop = 2 * model_gflop(linear=self.linear, n_layers=spec.n_layers, d_model=spec.d_model, lengths=lengths)
        return one_pass, one_pass, gflop, f"the first {len(sents)} sentences ({metric.name} loss); counted 2x forward"

    def p_hook_gates(self):
        return self._gates(True)

    def p_inhouse_gates(self):
        return self._gates(False)

    def _quick_pruning(self, shared: bool):
        from headscope.analyses.pruning import ablation as abl
        from headscope.analyses.pruning.metrics import build_metric, default_metric
        from headscope.analyses.pruning.study import PruneConfig, pruning_study

        model = self.model("inhouse")
        pcfg = PruneConfig(**QUICK_PRUNING, seed=self.cfg.seed, n_items=self.cfg.prune_items)
        roles = stand_in_roles(model.spec, seed=self.cfg.seed)

        def one_pass():
            pruning_study(model, pcfg, None, roles=roles, shared=shared)

        def warm():
            metric = build_metric(default_metric(model.spec), model, n_items=pcfg.items, batch_size=pcfg.batch_size)
            abl.evaluate(model, metric, torch.ones(2, model.spec.n_layers, model.spec.n_heads))

        return one_pass, warm, None, f"{pcfg.items} items; roles: {roles['role'].nunique()} seeded stand-in roles"

    def p_quick_pruning(self):
        return self._quick_pruning(True)

    def p_quick_pruning_before(self):
        return self._quick_pruning(False)

    def _patching(self):
        """``(model, task, PatchConfig)`` of the patching paths (:data:`PATCHING`)."""
        from headscope.analyses.patching.activation import PatchConfig
        from headscope.analyses.patching.tasks import load_task
        from headscope.probes.errors import ModelIncompatibleError

        model = self.model("inhouse")
        try:
            task = load_task(model, "induction", n_items=PATCHING["items"], seq_len=PATCHING["seq_len"])
        except ModelIncompatibleError as e:
            raise PathSkipped(str(e)) from None
        pcfg = PatchConfig(
            directions=("denoising",),
            batch_size=PATCHING["items"],
            n_boot=PATCHING["n_boot"],
            n_perm=PATCHING["n_perm"],
            seed=self.cfg.seed,
        )
        return model, task, pcfg

    def _patch_note(self, task) -> str:
        n = len(task.items[0].clean)
        return f"{len(task.items)} induction items of {n} tokens, one batch; {self.spec.n_layers * self.spec.n_heads} heads"

    def _patch_gflop(self, task, forwards: float) -> float:
        n = len(task.items[0].clean)
        one = model_gflop(
            linear=self.linear, n_layers=self.spec.n_layers, d_model=self.spec.d_model, lengths=[n] * len(task.items)
        )
        return forwards * one

    def p_patch_attribution(self):
        from headscope.analyses.patching.attribution import attribution_patching

        model, task, pcfg = self._patching()

        def one_pass():
            attribution_patching(model, task, pcfg)

        return one_pass, one_pass, self._patch_gflop(task, 4), self._patch_note(task) + "; gflop: 2 runs + 1 fwd+bwd"

    def p_patch_forward_backward(self):
        from headscope.analyses.patching.activation import readout

        model, task, _ = self._patching()
        ids = next(task.batches(len(task.items)))[1]  # the corrupted inputs, where attribution takes its gradient

        def one_pass():
            leaves = []

            def leaf(z):
                z = z.detach().requires_grad_(True)
                leaves.append(z)
                return z

            with torch.enable_grad(), model.head_hooks({l: leaf for l in range(model.spec.n_layers)}):
                out = readout(model, ids).float()
                torch.autograd.grad(out.logsumexp(-1).sum(), leaves)

        return one_pass, one_pass, self._patch_gflop(task, 2), self._patch_note(task) + "; gflop counted 2x forward"

    def p_patch_activation(self):
        from headscope.analyses.patching.activation import activation_patching

        model, task, pcfg = self._patching()

        def one_pass():
            activation_patching(model, task, pcfg)

        def warm():  # one item: every code path, an eighth of the forwards
            one = type(task)(name=task.name, items=task.items[:1], metric=task.metric)
            activation_patching(model, one, dataclasses.replace(pcfg, n_boot=10, n_perm=10))

        n_heads = self.spec.n_layers * self.spec.n_heads
        return (
            one_pass,
            warm,
            self._patch_gflop(task, n_heads + 2),
            self._patch_note(task) + "; gflop as separate forwards",
        )

    def p_patch_one_forward_per_head(self):
        from headscope.analyses.patching.activation import capture_z, readout, replica_patches
        from headscope.analyses.patching.frames import effect_frame
        from headscope.analyses.patching.tasks import REFERENCE_METRICS, metric_fn

        model, task, pcfg = self._patching()
        spec = self.spec
        clean, corrupted, answer, wrong, _ = next(task.batches(len(task.items)))
        metric = metric_fn(task.metric)
        heads = [(l, h) for l in range(spec.n_layers) for h in range(spec.n_heads)]

        def run(heads):
            out_c, z_c = capture_z(model, clean)
            out_x, _ = capture_z(model, corrupted)
            ref = out_c if task.metric in REFERENCE_METRICS else answer  # a reference metric reads the clean run
            m_c, m_x = metric(out_c, ref, wrong), metric(out_x, ref, wrong)
            delta = torch.empty(len(clean), len(heads))
            for i, (l, h) in enumerate(heads):
                mask = torch.zeros(1, spec.n_layers, spec.n_heads)
                mask[0, l, h] = 1.0
                with torch.inference_mode(), replica_patches(model, mask, z_c):
                    delta[:, i] = metric(readout(model, corrupted), ref, wrong) - m_x
            effect_frame(delta, m_c - m_x, [[x] for x in heads], method="activation_denoising", n_boot=pcfg.n_boot, n_perm=pcfg.n_perm)

        return (
            lambda: run(heads),
            lambda: run(heads[:2]),
            self._patch_gflop(task, len(heads) + 2),
            self._patch_note(task) + f"; {len(heads)} full forwards",
        )

    def p_pruning_50(self):
        from headscope.probes.models import physical as phys

        model = self.model("inhouse")
        heads = phys.half_of_heads(model, seed=self.cfg.seed)
        pruned = phys.prune_heads(model, heads).module.to(self.device).eval()
        ratio = phys.count_params(pruned) / phys.count_params(model.module)

        def step(ids, mask):
            with torch.inference_mode():
                pruned(ids, mask)

        width = sum(len(b.heads) * self.spec.d_head for b in pruned.blocks)
        gflop = model_gflop(linear=linear_params(pruned), n_layers=1, d_model=width, lengths=self.lengths)
        return (*self._over_batches(step), gflop, f"{sum(map(len, heads.values()))} heads pruned; params x{ratio:.3f}")


def stand_in_roles(spec, *, n_roles: int = 9, k: int = 3, seed: int = 0) -> pd.DataFrame:
    """A seeded roles frame for the ``quick_pruning`` paths (``n_roles`` roles of ``k`` heads
    with a True verdict, as SmolLM2's report has 9): role ablation's cost without running roles.

    >>> from types import SimpleNamespace
    >>> df = stand_in_roles(SimpleNamespace(n_layers=2, n_heads=3), n_roles=2, k=2)
    >>> len(df), sorted(df["role"].unique()), bool(df["verdict"].all())
    (4, ['role0', 'role1'], True)
    """
    gen = torch.Generator().manual_seed(seed)
    n = spec.n_layers * spec.n_heads
    rows = []
    for r in range(n_roles):
        for rank, i in enumerate(torch.randperm(n, generator=gen)[: min(k, n)].tolist()):
            rows.append(
                {
                    "layer": i // spec.n_heads,
                    "head": i % spec.n_heads,
                    "role": f"role{r}",
                    "score": 1.0 - rank / 10,
                    "verdict": True,
                }
            )
    return pd.DataFrame(rows)


class _SentenceMetric:
    """The default impact metric of the model's family over the bench sentences."""

    def __init__(self, im, model, sentences, batch_size):
        self.name = im.default_metric(model.spec)
        kw = {"batch_size": batch_size}
        if self.name == "lm_loss":
            self.metric = im.LMLoss(model, list(sentences), **kw)
        else:
            self.metric = im.EmbeddingCosine(model, list(sentences), **kw)


def _targets(frame: pd.DataFrame, rounds: dict[str, list[float]] | None = None) -> pd.DataFrame:
    """Each target of :data:`~headscope.analyses.bench.targets.RATIO_TARGETS` against the
    frame. With ``rounds`` (seconds per interleaved round), a ratio is the median over
    rounds of the two paths' times in the same round: both ran minutes apart at most, so
    a machine that speeds up or slows down between rounds moves both alike, where the
    ratio of two fastest rounds may pair one path's lucky round with the other's ordinary
    one. The note gives the ratio of fastest rounds too."""
    s = {r.path: r.seconds for r in frame.itertuples() if r.status == "ok"}
    rows = []
    for t in RATIO_TARGETS:
        num, den, note = t.numerator, t.denominator, t.note
        if num in s and den in s and s[den] > 0:
            v = s[num] / s[den]
            rn, rd = (rounds or {}).get(num, []), (rounds or {}).get(den, [])
            if len(rn) == len(rd) and rn and all(d > 0 for d in rd):
                note = f"{note}; median of {len(rn)} paired rounds (fastest rounds: {v:.2f})"
                v = statistics.median(a / b for a, b in zip(rn, rd))
            rows.append({"target": t.name, "value": v, "threshold": t.threshold, "met": t.met(v), "note": note})
        else:
            missing = [p for p in (num, den) if p not in s]
            rows.append(
                {
                    "target": t.name,
                    "value": float("nan"),
                    "threshold": t.threshold,
                    "met": None,
                    "note": f"not measured ({', '.join(missing)})",
                }
            )
    return pd.DataFrame(rows, columns=TARGET_COLUMNS)


def _failure(name: str, e: Exception) -> str:
    log.warning("bench path %s failed: %s: %s", name, type(e).__name__, e)
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def run_bench(cfg: BenchConfig = BenchConfig(), progress: Callable[[str], None] | None = None) -> BenchResult:
    """Time every path of :data:`PATHS` (or ``cfg.paths``) on the same batches.

    Every path is built and warmed up first (one batch); then ``cfg.repeats`` rounds each
    time every path once over all batches; a path's ``seconds`` is its fastest round
    (``median_seconds``: its median).
    ``rss_mb``/``peak_rss_mb`` are read after the path's warm-up (its models loaded).

    Returns a :class:`BenchResult`; ``frame`` has one row per path, in :data:`PATHS`
    order, ``ratio = seconds / seconds of hf_sdpa`` (NaN when the reference was not run).
    A path that raises is kept with ``status = "failed"`` and the error as note; one that
    cannot run here (:class:`PathSkipped`) gives ``status = "skipped"``.
    """
    if not isinstance(cfg, BenchConfig):
        raise TypeError(f"cfg must be a BenchConfig; got {type(cfg).__name__}")
    t_start = time.perf_counter()
    bench = _Bench(cfg)
    wanted = list(cfg.paths or PATHS)
    peak32 = matmul_peak_gflops(torch.float32, size=cfg.peak_size, seconds=cfg.peak_seconds, device=bench.device)
    bf16_ok, bf16_why = bench.bf16
    peak16 = (
        matmul_peak_gflops(torch.bfloat16, size=cfg.peak_size, seconds=cfg.peak_seconds, device=bench.device)
        if bf16_ok
        else None
    )
    rows, prepared = {}, {}
    for name in wanted:  # build and warm every path first
        if progress:
            progress(f"{name}: warm-up")
        row = {
            "path": name,
            "description": PATHS[name],
            "status": "ok",
            "seconds": math.nan,
            "gflop": math.nan,
            "repeats": 0,
            "median_seconds": math.nan,
            "note": "",
        }
        try:
            one_pass, warm, gflop, note = getattr(bench, "p_" + name)()
            warm()
            _sync(bench.device)
            prepared[name] = one_pass
            row.update(gflop=gflop if gflop is not None else math.nan, note=note)
        except PathSkipped as e:
            row.update(status="skipped", note=str(e))
        except Exception as e:  # noqa: BLE001 - one failing path must not lose the others' figures
            row.update(status="failed", note=_failure(name, e))
        row["rss_mb"] = rss_mb()
        row["peak_rss_mb"] = peak_rss_mb()
        rows[name] = row
    # interleaved rounds: each round times every path once, so a load change on a shared
    # machine hits all paths alike instead of the ones that happened to run during it
    times: dict[str, list[float]] = {name: [] for name in prepared}
    for r in range(cfg.repeats):
        for name in list(prepared):
            if progress:
                progress(f"{name}: round {r + 1}/{cfg.repeats}")
            gc.collect()  # no collection of an earlier path's garbage inside this path's time
            try:
                t0 = time.perf_counter()
                prepared[name]()
                _sync(bench.device)
                times[name].append(time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001
                rows[name].update(status="failed", note=_failure(name, e))
                del prepared[name]
    for name in prepared:
        rows[name].update(
            seconds=min(times[name]), median_seconds=statistics.median(times[name]), repeats=len(times[name])
        )
    rows = [rows[name] for name in wanted]
    frame = pd.DataFrame(rows)
    ref = frame.loc[(frame.path == "hf_sdpa") & (frame.status == "ok"), "seconds"]
    frame["ratio"] = frame["seconds"] / float(ref.iloc[0]) if len(ref) else math.nan
    frame["gflops_per_s"] = frame["gflop"] / frame["seconds"]
    is16 = (frame.path == "bf16_forward") | (cfg.dtype == "bf16")
    peak = pd.Series([peak16 if (b and peak16) else peak32 for b in is16], index=frame.index)
    frame["peak_pct"] = 100 * frame["gflops_per_s"] / peak
    frame = frame[BENCH_COLUMNS]

    n_real = sum(bench.lengths)
    store_all = sum(
        pattern_bytes(len(b.lengths), b.shape[1], bench.spec.n_heads, bench.spec.n_layers) for b in bench.batches
    )
    stream_peak = max(
        pattern_bytes(len(b.lengths), b.shape[1], bench.spec.n_heads, bench.spec.n_layers) for b in bench.batches
    )
    info = {
        "config": asdict(cfg),
        "model": bench.spec.name,
        "machine": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "device": str(bench.device),
            "fp32_peak_gflops": peak32,
            "bf16_peak_gflops": peak16,
            "bf16_native": bf16_ok,
            "bf16_note": bf16_why,
        },
        "sentences": len(bench.sentences),
        "skipped_longer_than_context": bench.n_skipped,
        "batches": len(bench.batches),
        "real_tokens": n_real,
        "linear_params": bench.linear,
        "forward_gflop": bench.fwd_gflop,
        "padding_ratio_bucketed": padding_ratio(bench.lengths, bench.groups),
        "padding_ratio_unsorted": padding_ratio(bench.lengths, bench.unsorted_groups),
        "pattern_bytes_store_all": store_all,
        "pattern_bytes_streaming": stream_peak,
        "round_seconds": times,
        "wall_seconds": time.perf_counter() - t_start,
    }
    return BenchResult(frame=frame, targets=_targets(frame, rounds=times), info=info)


# --------------------------------------------------------------------------- memory mode

MEMORY_COLUMNS = [
    "n_sentences",
    "reducer",
    "peak_rss_mb",
    "rss_after_load_mb",
    "stream_growth_mb",
    "seconds",
    "n_batches",
    "padding_ratio",
    "role_rows",
]


def memory_child(model: str, n: int, reducer: str, batch_size: int, seed: int, device: str = "cpu") -> dict:
    """Body of one ``--memory`` subprocess: load, stream ``n`` generated sentences through a
    reducer, report peak RSS (MiB). Run in a fresh process so the peak is this run's."""
    from headscope.analyses.experiments.distributed import AttentionMassReducer, NoOpReducer, on_device
    from headscope.probes.allocator import tune_allocator
    from headscope.probes.capture import stream
    from headscope.probes.models.loading import load_model

    tune_allocator()  # as the headscope command does
    reducers = {"noop": NoOpReducer, "mass": AttentionMassReducer}
    if reducer not in (*reducers, "roles"):
        raise ValueError(f"unknown memory reducer {reducer!r}; valid: {', '.join((*reducers, 'roles'))}")
    m = on_device(load_model(model), device)
    sents = generate_sentences(n, seed=seed)
    after_load = peak_rss_mb()
    t0 = time.perf_counter()
    if reducer == "roles":  # every text role (positional, special, rare-word, summary, clustering) with its verdicts
        from headscope.analyses.roles.config import RolesConfig
        from headscope.analyses.roles.pipeline import TEXT_GROUPS, head_roles

        res = head_roles(
            m, text=sents, roles=TEXT_GROUPS, cfg=RolesConfig(seed=seed, batch_size=batch_size), examples=False
        )
        n_batches = None
        padding = None
        n_rows = len(res.frame)
    else:
        rep = stream(m, sents, [reducers[reducer]()], batch_size=batch_size)
        n_batches, padding, n_rows = rep.n_batches, rep.padding_ratio, None
    peak = peak_rss_mb()
    return {
        "n_sentences": n,
        "reducer": reducer,
        "peak_rss_mb": peak,
        "rss_after_load_mb": after_load,
        "stream_growth_mb": peak - after_load,
        "seconds": time.perf_counter() - t0,
        "n_batches": n_batches,
        "padding_ratio": padding,
        "role_rows": n_rows,
    }


def memory_scaling(
    model: str = "minilm-l6",
    sizes: tuple[int, ...] = (1000, 10000),
    *,
    reducer: str = "roles",
    batch_size: int = 64,
    seed: int = 0,
    device: str = "cpu",
    timeout: float | None = None,
) -> tuple[pd.DataFrame, float]:
    """Peak RSS of streaming ``sizes[i]`` sentences, each in its own subprocess.

    Returns ``(frame [MEMORY_COLUMNS], ratio)`` where ``ratio`` is the peak RSS of the
    largest size over the smallest (target: :data:`~headscope.analyses.bench.targets.MEMORY`;
    memory must not grow with the corpus).
    """
    if len(sizes) < 2:
        raise ValueError(f"sizes needs at least two corpus sizes; got {sizes!r}")
    check_device(device)
    rows = []
    for n in sizes:
        code = (
            "import json, sys; from headscope.analyses.bench.harness import memory_child; "
            f"print('HEADSCOPE_MEMORY ' + json.dumps(memory_child({model!r}, {int(n)}, {reducer!r}, {int(batch_size)}, {int(seed)}, {device!r})))"
        )
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("HEADSCOPE_MEMORY ")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"memory run of {n} sentences failed (exit {proc.returncode}): {tail}")
        rows.append(json.loads(lines[-1].split(" ", 1)[1]))
    frame = pd.DataFrame(rows, columns=MEMORY_COLUMNS)
    small, large = frame.loc[frame.n_sentences.idxmin()], frame.loc[frame.n_sentences.idxmax()]
    return frame, float(large.peak_rss_mb / small.peak_rss_mb)
