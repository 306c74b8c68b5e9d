"""``headscope bench --long-context``: peak memory and time of the role statistics on one long
text, patterns reduced in query chunks (never stored) against stored patterns.

:func:`long_context_scaling` runs :func:`long_context_child` once per length and path, each in a
fresh subprocess (so each peak RSS is that run's own): the text roles of
:data:`~headscope.analyses.roles.pipeline.TEXT_GROUPS` on one text of ``n`` tokens built from the
generated corpus (:func:`~headscope.analyses.roles.long_inputs.long_text`). A stored-pattern run
whose patterns alone would take more than half the memory the machine has available is not run
(a row with ``status`` saying so). :func:`long_context_summary` relates the two paths at
:data:`TARGET_TOKENS` tokens and fits the exponent of the chunked path's memory growth in the
length. The targets (issue #27) are reported, never enforced:

* peak memory of the statistics (peak RSS of the run over the RSS before it, the load's own
  peak reset) chunked ≤ 1/8 of stored;
* time chunked ≤ 1.2 × stored where both run;
* memory growing linearly: exponent of growth ~ length^e with e ≤ :data:`EXPONENT_TARGET`.
"""

from __future__ import annotations

import math
import time

import pandas as pd

from headscope.reports.tools.bench.machine import run_child

__all__ = [
    "LONG_COLUMNS",
    "LONG_LENGTHS",
    "fit_exponent",
    "long_context_child",
    "long_context_scaling",
    "long_context_summary",
    "parse_lengths",
    "render_long",
]

LONG_COLUMNS = [
    "tokens",
    "path",
    "status",
    "pattern_statistics",
    "peak_rss_mb",
    "rss_after_load_mb",
    "growth_mb",
    "seconds",
    "stored_patterns_mb",
]
#: the lengths measured by default (tokens)
LONG_LENGTHS = (512, 1024, 2048, 4096)
#: the length the two paths are compared at (the issue's 2,048 tokens)
TARGET_TOKENS = 2048
MEMORY_RATIO_TARGET = 1 / 8
TIME_RATIO_TARGET = 1.2
EXPONENT_TARGET = 1.2
PATHS = ("chunked", "stored")


def stored_patterns_mb(spec, n_tokens: int) -> float:
    """MiB that stored fp32 patterns of every layer take for one item of ``n_tokens``."""
    return spec.n_layers * spec.n_heads * n_tokens * n_tokens * 4 / 2**20


def long_context_child(model: str, n_tokens: int, path: str, seed: int = 0, device: str = "cpu") -> dict:
    """Body of one subprocess: load ``model``, build a text of ``n_tokens`` tokens, run the text
    roles on it with ``path`` ``"chunked"`` (query chunks of
    :data:`~headscope.probes.chunked.QUERY_CHUNK`) or ``"stored"``; one row of :data:`LONG_COLUMNS`."""
    from headscope.analyses.roles.config import RolesConfig
    from headscope.analyses.roles.long_inputs import long_text
    from headscope.analyses.roles.pipeline import TEXT_GROUPS, head_roles
    from headscope.probes.allocator import tune_allocator
    from headscope.probes.chunked import QUERY_CHUNK
    from headscope.probes.models.loading import load_model
    from headscope.reports.tools.bench.machine import peak_rss_mb
    from headscope.reports.tools.bench.reducers import on_device

    if path not in PATHS:
        raise ValueError(f"unknown long-context path {path!r}; valid: {', '.join(PATHS)}")
    tune_allocator()
    m = on_device(load_model(model), device)
    text = long_text(m.tokenizer, n_tokens, corpus="generated", seed=seed)
    cfg = RolesConfig(seed=seed, n_boot=50, n_perm=50, query_chunk=QUERY_CHUNK if path == "chunked" else None)
    head_roles(m, text=[text[:200]], roles=TEXT_GROUPS, cfg=cfg, examples=False)  # warm the code paths
    after_load = rss_now_mb(reset_peak=True)  # the load's own peak (a GGUF read) would hide the run's
    t0 = time.perf_counter()
    res = head_roles(m, text=[text], roles=TEXT_GROUPS, cfg=cfg, examples=False)
    seconds = time.perf_counter() - t0
    peak = peak_since_reset_mb() or peak_rss_mb()
    return {
        "tokens": n_tokens,
        "path": path,
        "status": "ok",
        "pattern_statistics": res.pattern_statistics.get("text", ""),
        "peak_rss_mb": peak,
        "rss_after_load_mb": after_load,
        "growth_mb": peak - after_load,
        "seconds": seconds,
        "stored_patterns_mb": stored_patterns_mb(m.spec, n_tokens),
    }


def _status_mb(key: str) -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def rss_now_mb(*, reset_peak: bool = False) -> float:
    """This process's RSS now, MiB; ``reset_peak``: first reset its peak (``VmHWM``, Linux's
    ``/proc/self/clear_refs``), so :func:`peak_since_reset_mb` is the peak from here on."""
    from headscope.reports.tools.bench.machine import peak_rss_mb

    if reset_peak:
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
                f.write("5")
        except OSError:
            pass
    return _status_mb("VmRSS") or peak_rss_mb()


def peak_since_reset_mb() -> float | None:
    """``VmHWM``, MiB: the peak RSS since :func:`rss_now_mb` reset it (None off Linux)."""
    return _status_mb("VmHWM")


def available_mb() -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` in MiB (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _run_child(model: str, n: int, path: str, seed: int, device: str, timeout) -> dict:
    return run_child(
        "headscope.reports.tools.bench.long_context",
        "long_context_child",
        (model, int(n), path, int(seed), device),
        tag="HEADSCOPE_LONG",
        what=f"long-context run of {n} tokens ({path})",
        timeout=timeout,
    )


def long_context_scaling(
    model: str = "smollm2-135m",
    lengths: tuple[int, ...] = LONG_LENGTHS,
    *,
    paths: tuple[str, ...] = PATHS,
    seed: int = 0,
    device: str = "cpu",
    timeout: float | None = None,
    n_heads_layers: tuple[int, int] | None = None,
) -> pd.DataFrame:
    """One row of :data:`LONG_COLUMNS` per length and path, each run in its own subprocess;
    a stored run whose patterns would take over half the available memory is listed, not run
    (``n_heads_layers``: the model's ``(heads, layers)`` for that estimate, read from the loaded
    spec of the first run when None)."""
    bad = [p for p in paths if p not in PATHS]
    if bad:
        raise ValueError(f"unknown long-context path {bad[0]!r}; valid: {', '.join(PATHS)}")
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 8 for n in lengths):
        raise ValueError(f"lengths must be token counts >= 8; got {lengths!r}")
    rows, per_cell_mb = [], None
    if n_heads_layers is not None:
        per_cell_mb = n_heads_layers[0] * n_heads_layers[1] * 4 / 2**20
    for n in lengths:
        for path in paths:
            need = None if per_cell_mb is None else per_cell_mb * n * n
            free = available_mb()
            if path == "stored" and need is not None and free is not None and need > free / 2:
                rows.append(
                    {
                        "tokens": n,
                        "path": path,
                        "status": f"not run: stored patterns need {need:.0f} MiB, {free:.0f} MiB available",
                        "stored_patterns_mb": need,
                    }
                )
                continue
            row = _run_child(model, n, path, seed, device, timeout)
            if per_cell_mb is None:
                per_cell_mb = row["stored_patterns_mb"] / (n * n)
            rows.append(row)
    return pd.DataFrame(rows, columns=LONG_COLUMNS)


def fit_exponent(lengths, values) -> float:
    """Least-squares slope of ``log(values)`` on ``log(lengths)`` (NaN for fewer than two
    positive points): ``values ~ lengths^slope``.

    >>> round(fit_exponent([512, 1024, 2048], [10.0, 20.0, 40.0]), 6)
    1.0
    """
    pts = [(math.log(n), math.log(v)) for n, v in zip(lengths, values) if v is not None and v > 0 and n > 0]
    if len(pts) < 2:
        return math.nan
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else math.nan


def long_context_summary(frame: pd.DataFrame, target_tokens: int = TARGET_TOKENS) -> dict:
    """The targets of the frame: memory and time ratios chunked / stored at ``target_tokens``
    (NaN where either did not run), the exponent of each path's memory growth, each with
    ``met`` (None where not measured)."""
    ok = frame[frame.status == "ok"]

    def at(path, col):
        r = ok[(ok.tokens == target_tokens) & (ok.path == path)]
        return float(r[col].iloc[0]) if len(r) else math.nan

    mem = at("chunked", "growth_mb") / at("stored", "growth_mb")
    secs = at("chunked", "seconds") / at("stored", "seconds")
    exps = {p: fit_exponent(list(g.tokens), list(g.growth_mb)) for p, g in ok.groupby("path")}

    def met(value, threshold):
        return None if math.isnan(value) else bool(value <= threshold)

    chunk_exp = exps.get("chunked", math.nan)
    return {
        "tokens": target_tokens,
        "memory_ratio": mem,
        "memory_ratio_target": MEMORY_RATIO_TARGET,
        "memory_met": met(mem, MEMORY_RATIO_TARGET),
        "time_ratio": secs,
        "time_ratio_target": TIME_RATIO_TARGET,
        "time_met": met(secs, TIME_RATIO_TARGET),
        "exponents": exps,
        "exponent_target": EXPONENT_TARGET,
        "exponent_met": met(chunk_exp, EXPONENT_TARGET),
    }


def parse_lengths(text: str) -> tuple[int, ...]:
    """``--long-lengths``: comma-separated token counts, each 8..65536 (one-line ``ValueError``)."""
    try:
        lengths = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--long-lengths must be comma-separated integers; got {text!r}") from None
    if not lengths or min(lengths) < 8 or max(lengths) > 65536:
        raise ValueError(f"--long-lengths needs token counts from 8 to 65536; got {text!r}")
    return lengths


def render_long(frame: pd.DataFrame, summary: dict) -> str:
    """The frame as a table, then the targets (reported, not enforced)."""

    def fmt(v, spec=".2f"):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)

    lines = [frame.to_string(index=False, float_format=lambda x: f"{x:.1f}"), ""]
    n = summary["tokens"]
    lines.append("targets (reported, not enforced):")
    lines.append(
        f"  memory chunked / stored at {n} tokens <= 1/8: {fmt(summary['memory_ratio'], '.4f')} "
        f"({'-' if summary['memory_met'] is None else 'met' if summary['memory_met'] else 'NOT met'})"
    )
    lines.append(
        f"  time chunked / stored at {n} tokens <= {summary['time_ratio_target']}: {fmt(summary['time_ratio'])} "
        f"({'-' if summary['time_met'] is None else 'met' if summary['time_met'] else 'NOT met'})"
    )
    exps = ", ".join(f"{p} {fmt(e)}" for p, e in summary["exponents"].items())
    lines.append(
        f"  memory growth ~ length^e, chunked e <= {summary['exponent_target']}: {exps or '-'} "
        f"({'-' if summary['exponent_met'] is None else 'met' if summary['exponent_met'] else 'NOT met'})"
    )
    return "\n".join(lines)
