"""What this machine can do and what a process holds: devices, matmul peaks, bf16, RSS.

Nothing here loads a model. :func:`check_device` validates a device string before any
model loads; :func:`matmul_peak_gflops` measures the rate the bench's ``peak_pct`` column
relates to; :func:`bf16_support` decides whether the ``bf16_forward`` path runs.

>>> check_device("cpu")
device(type='cpu')
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

__all__ = ["bf16_support", "check_device", "matmul_peak_gflops", "peak_rss_mb", "rss_mb", "run_child", "sync"]


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


def check_device(device: str | torch.device, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` the bench can run on: ``cpu``, ``cuda`` or ``cuda:N``
    with CUDA present (and device N on this machine). ``name`` starts the messages
    (``--device`` from the command line). Raises ``ValueError`` otherwise.

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


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); a no-op on the CPU. A timer stops after it."""
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
    sync(device)
    best, n, t_start = math.inf, 0, time.perf_counter()
    while n < 3 or time.perf_counter() - t_start < seconds:
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
        n += 1
    return 2 * size**3 / best / 1e9


def bf16_support(device: str | torch.device = "cpu") -> tuple[bool, str]:
    """``(native, why)``: whether bfloat16 matmuls are native here: on CUDA,
    ``torch.cuda.is_bf16_supported``; on a CPU, oneDNN must be available, a small bf16
    matmul must run, and an x86 CPU must list ``avx512_bf16`` or ``amx_bf16`` (without them
    oneDNN emulates bf16, tens of times slower than fp32); other CPUs count as native when
    the bf16 matmul keeps at least half the fp32 rate."""
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


def run_child(module: str, func: str, args: tuple, *, tag: str, what: str, timeout: float | None) -> dict:
    """``module.func(*args)`` (plain values; it returns a JSON-able dict) in a Python process of its
    own, so what it measures is its own resident set; its result is the stdout line starting with
    ``tag``. RuntimeError naming ``what``, the exit code and the child's last stderr line when it fails."""
    code = f"import json; from {module} import {func}; print({tag!r} + ' ' + json.dumps({func}(*{args!r})))"
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(f"{tag} ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1].split(" ", 1)[1])
