"""The GPU bench: headscope's main paths on a model with Llama-3.1-8B's shapes, random weights.

``.ci/gpu-check`` runs it on a machine with one GPU (nothing downloaded there: the model is
built from a config, directly on the device in bf16, and the tokenizer is trained on the
shipped corpora); ``dry_run=True`` runs the same code on the CPU with tiny shapes, so the
normal suite tests its logic. Paths, each timed after a warm-up (fastest of ``repeats``):

``forward``        the in-house model's plain forward on ``batch × seq_len`` random ids
``capture``        ``model.run`` keeping the pattern of every layer, same batch
``grad_forward``   the plain forward on the ``grad_batch`` rows the gradient path uses
``gate_grad``      gate-gradient importance (Michel et al.): forward with head gates, the
                   next-token loss, ``autograd.grad`` to every gate, same rows
``capture_text``   :func:`~headscope.probes.capture.stream` of ``n_texts`` sentences, no reducer
``roles_text``     every text role (:data:`~headscope.analyses.roles.pipeline.TEXT_GROUPS`) on
                   the same sentences, verdicts included

and the targets of issue 17 (reported, never enforced): forward ≥ 50% of the bf16 peak,
capture ≤ 1.1× forward, roles ≤ 1.3× capture (from text), gate gradients ≤ 3× forward.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from headscope.probes.corpora.bench_sentences import generate_sentences
from headscope.reports.tools.bench.counts import linear_params, model_gflop
from headscope.reports.tools.bench.machine import matmul_peak_gflops, sync
from headscope.reports.tools.bench.targets import RatioTarget

__all__ = ["GPU_TARGETS", "GpuBenchConfig", "LLAMA_8B", "TINY", "gpu_bench"]

#: Llama-3.1-8B's shapes (HF config keys); random weights, no download
LLAMA_8B = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}

#: the same family at test size (``dry_run``)
TINY = {
    **LLAMA_8B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,  # the default tokenizer's ids fit
}

#: nominal dense bf16 peaks (TFLOP/s) by device name, for the "% of nominal" column
NOMINAL_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}

GPU_TARGETS: tuple[RatioTarget, ...] = (
    RatioTarget("forward >= 50% of bf16 peak", "forward", "peak", 0.5, True, "share of the measured matmul peak"),
    RatioTarget("capture / plain forward <= 1.1", "capture", "forward", 1.1, False, "all patterns, every layer"),
    RatioTarget("roles / capture from text <= 1.3", "roles_text", "capture_text", 1.3, False, "every text role"),
    RatioTarget("gate-grad importance / forward <= 3", "gate_grad", "grad_forward", 3.0, False, "same rows"),
)


@dataclass(frozen=True, kw_only=True)
class GpuBenchConfig:
    """``hf_config``: the model's shapes (default :data:`LLAMA_8B`); ``batch`` × ``seq_len``:
    the forward and capture batch; ``grad_batch``: rows of the gradient path (its
    activations are kept for the backward pass); ``n_texts``: sentences of the text paths;
    ``dtype``: ``bf16`` (default) or ``fp32``; ``device``: ``cuda`` (default) or ``cpu``."""

    hf_config: dict = dataclasses.field(default_factory=lambda: dict(LLAMA_8B))
    batch: int = 16
    seq_len: int = 512
    grad_batch: int = 8
    n_texts: int = 2048
    repeats: int = 3
    dtype: str = "bf16"
    device: str = "cuda"
    seed: int = 0
    peak_size: int = 8192

    def __post_init__(self):
        for k in ("batch", "seq_len", "grad_batch", "n_texts", "repeats", "peak_size"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"The {k!r} parameter of GpuBenchConfig must be a positive int; got {v!r}.")
        if self.dtype not in ("bf16", "fp32"):
            raise ValueError(f"The 'dtype' parameter of GpuBenchConfig must be 'bf16' or 'fp32'; got {self.dtype!r}.")

    @classmethod
    def dry_run(cls) -> GpuBenchConfig:
        """Tiny shapes on the CPU in fp32: the same code, in seconds."""
        return cls(
            hf_config=dict(TINY),
            batch=2,
            seq_len=32,
            grad_batch=2,
            n_texts=24,
            repeats=1,
            dtype="fp32",
            device="cpu",
            peak_size=256,
        )


def build_model(cfg: GpuBenchConfig, tokenizer):
    """The in-house transformer of ``cfg.hf_config``, random weights (seeded), built directly
    on ``cfg.device`` in ``cfg.dtype`` (an 8B model in bf16 is 16 GB: never on the host)."""
    from headscope.probes.models.arch import arch_from_hf_config
    from headscope.probes.models.backends.inhouse import InHouseModel
    from headscope.probes.models.config import config_from_arch
    from headscope.probes.models.inhouse.transformer import Transformer

    mcfg = config_from_arch(arch_from_hf_config(cfg.hf_config, "gpu bench config"), name="llama-8b-shapes")
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    torch.manual_seed(cfg.seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(cfg.device), torch.no_grad():
            module = Transformer(mcfg)
    finally:
        torch.set_default_dtype(previous)
    return InHouseModel(module, tokenizer, name=mcfg.name)


def _time(fn, device: torch.device, repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn`` after one warm-up call."""
    fn()
    sync(device)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _free_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


class _Rows:
    """The result rows, one per path, in the order they ran; ``say`` reports each."""

    def __init__(self, say):
        self.rows: list[dict] = []
        self.say = say

    def record(self, path: str, seconds: float, gflop: float | None, tokens: int, note: str = "") -> None:
        self.rows.append(
            {
                "path": path,
                "seconds": seconds,
                "gflop_per_s": (gflop / seconds) if gflop else None,
                "tokens_per_s": tokens / seconds,
                "note": note,
            }
        )
        self.say(f"{path}: {seconds:.4f} s")


def _model_paths(model, cfg: GpuBenchConfig, ids: torch.Tensor, am: torch.Tensor, out: _Rows) -> None:
    """``forward``, ``capture``, ``grad_forward``, ``gate_grad`` on ``ids``/``am``
    (``[batch, seq_len]``; the gradient paths on the first ``cfg.grad_batch`` rows)."""
    from headscope.analyses.pruning.ablation import head_gates
    from headscope.analyses.pruning.metric_functions import token_nll

    device, spec = torch.device(cfg.device), model.spec
    g_ids, g_am = ids[: cfg.grad_batch], am[: cfg.grad_batch]
    linear = linear_params(model.network)

    def flop(rows: int) -> float:
        return model_gflop(linear=linear, n_layers=spec.n_layers, d_model=spec.d_model, lengths=[cfg.seq_len] * rows)

    def forward():
        with torch.inference_mode():
            model.forward(ids, am)

    out.record("forward", _time(forward, device, cfg.repeats), flop(cfg.batch), ids.numel(), "plain forward, logits")
    _free_cache(device)

    batch = _ids_batch(ids, am)

    def capture():
        model.run(batch, ("pattern",), None)

    out.record(
        "capture", _time(capture, device, cfg.repeats), flop(cfg.batch), ids.numel(), "every layer's pattern kept"
    )
    _free_cache(device)

    def grad_forward():
        with torch.inference_mode():
            model.forward(g_ids, g_am)

    out.record("grad_forward", _time(grad_forward, device, cfg.repeats), flop(cfg.grad_batch), g_ids.numel())
    ones = torch.ones(spec.n_layers, spec.n_heads)  # [layer, head]

    def gate_grad():
        with head_gates(model, ones, requires_grad=True) as gates, torch.enable_grad():
            logits = model.forward(g_ids, g_am)
            s, n = token_nll(logits, g_ids, g_am)
            loss = s.sum() / n.sum()
            torch.autograd.grad(loss, gates, allow_unused=True)

    out.record(
        "gate_grad", _time(gate_grad, device, cfg.repeats), None, g_ids.numel(), "forward + backward to the gates"
    )
    _free_cache(device)


def _text_paths(model, cfg: GpuBenchConfig, sentences: list[str], n_tokens: int, out: _Rows) -> None:
    """``capture_text`` and ``roles_text`` on ``sentences`` (``n_tokens`` tokens), one timed call each."""
    from headscope.analyses.roles import pipeline as roles
    from headscope.analyses.roles.config import RolesConfig
    from headscope.probes.capture import stream

    device = torch.device(cfg.device)

    def capture_text():
        stream(model, sentences, [], batch_size=64)

    out.record("capture_text", _time(capture_text, device, 1), None, n_tokens, f"{len(sentences)} sentences")
    groups = tuple(roles.TEXT_GROUPS)
    rcfg = RolesConfig(seed=cfg.seed, batch_size=64)

    def roles_text():
        roles.head_roles(model, text=sentences, roles=groups, cfg=rcfg, examples=False)

    out.record("roles_text", _time(roles_text, device, 1), None, n_tokens, ", ".join(groups))
    _free_cache(device)


def _targets(by: dict[str, dict], peak: float) -> list[dict]:
    """Each of :data:`GPU_TARGETS` against the rows ``by`` path (``peak``: the matmul peak, GFLOP/s)."""
    fwd = by["forward"]["gflop_per_s"]
    targets = []
    for t in GPU_TARGETS:
        if t.denominator == "peak":
            value = fwd / peak if peak else math.nan
        else:
            value = by[t.numerator]["seconds"] / by[t.denominator]["seconds"]
        targets.append({"target": t.name, "value": value, "threshold": t.threshold, "met": t.met(value)})
    return targets


def _info(cfg: GpuBenchConfig, spec, by: dict[str, dict], *, peak: float, n_tokens: int, build_s: float) -> dict:
    device = torch.device(cfg.device)
    nominal = next((v for k, v in NOMINAL_BF16_TFLOPS.items() if k in _device_name(device)), None)
    fwd = by["forward"]["gflop_per_s"]
    info = {
        "device": _device_name(device),
        "dtype": cfg.dtype,
        "shapes": {k: cfg.hf_config[k] for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads")}
        | {"d_model": spec.d_model, "d_ff": cfg.hf_config["intermediate_size"], "vocab": cfg.hf_config["vocab_size"]},
        "batch": [cfg.batch, cfg.seq_len],
        "grad_batch": [cfg.grad_batch, cfg.seq_len],
        "text_tokens": n_tokens,
        "matmul_peak_gflops": peak,
        "forward_pct_of_peak": 100 * fwd / peak if peak else None,
        "nominal_bf16_tflops": nominal,
        "forward_pct_of_nominal": (100 * fwd / (nominal * 1e3)) if nominal else None,
        "roles_tokens_per_s": by["roles_text"]["tokens_per_s"],
        "build_seconds": build_s,
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        info["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return info


def gpu_bench(cfg: GpuBenchConfig, *, tokenizer=None, texts=None, log=None) -> dict:
    """Run every path (module docstring) and return ``{"paths", "targets", "info"}``
    (JSON-serialisable). ``tokenizer``: any HF tokenizer whose ids fit the vocabulary
    (default: the shipped corpora's byte-level BPE of the test suite); ``texts``: the
    sentences of the text paths (default: generated, seeded); ``log(message)`` reports progress.
    Raises ``ValueError`` for a CUDA device on a machine without CUDA."""
    say = log or (lambda m: None)
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("the GPU bench needs CUDA; this machine has none (use dry_run for the CPU)")
    if tokenizer is None:
        tokenizer = default_tokenizer()
    t_build = time.perf_counter()
    model = build_model(cfg, tokenizer)
    sync(device)
    build_s = time.perf_counter() - t_build
    spec = model.spec
    say(f"built {spec.n_layers} layers x {spec.n_heads} heads ({spec.n_kv_heads} KV), d_model {spec.d_model}")
    vocab = min(int(cfg.hf_config["vocab_size"]), len(tokenizer))
    gen = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, vocab, (cfg.batch, cfg.seq_len), generator=gen).to(device)  # [batch, seq_len]
    am = torch.ones_like(ids)
    out = _Rows(say)

    say("matmul peak")
    peak = matmul_peak_gflops(
        torch.bfloat16 if cfg.dtype == "bf16" else torch.float32, size=cfg.peak_size, seconds=1.0, device=device
    )
    _model_paths(model, cfg, ids, am, out)
    sentences = list(texts) if texts is not None else generate_sentences(cfg.n_texts, seed=cfg.seed)
    n_tokens = sum(len(tokenizer(s)["input_ids"]) for s in sentences)
    _text_paths(model, cfg, sentences, n_tokens, out)

    by = {r["path"]: r for r in out.rows}
    info = _info(cfg, spec, by, peak=peak, n_tokens=n_tokens, build_s=build_s)
    return {"paths": out.rows, "targets": _targets(by, peak), "info": info}


def _ids_batch(ids: torch.Tensor, am: torch.Tensor):
    """A :class:`~headscope.probes.tokens.TokenBatch` of raw ids (no texts)."""
    from headscope.probes.tokens import TokenBatch

    n, t = ids.shape
    empty = [[] for _ in range(n)]
    return TokenBatch(
        input_ids=ids,
        attention_mask=am,
        texts=[""] * n,
        words=empty,
        tokens=empty,
        offsets=empty,
        word_ids=empty,
        special=empty,
        lengths=[t] * n,
    )


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def default_tokenizer():
    """A byte-level BPE trained on the shipped corpora (no download; what the test suite uses)."""
    import importlib.util
    import sys

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("_headscope_tiny_models", root / "tests" / "tiny_models.py")
    if spec is None or not (root / "tests" / "tiny_models.py").exists():
        raise FileNotFoundError(f"{root / 'tests' / 'tiny_models.py'}: the GPU bench trains its tokenizer with it")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.tokenizer(False, 4000)
