"""``headscope bench --memory``: does the peak RSS of streaming grow with the corpus?

:func:`memory_scaling` runs :func:`memory_child` once per corpus size, each in a fresh
subprocess (so each peak is that run's own), and relates the largest corpus's peak to the
smallest's (target :data:`~headscope.reports.tools.bench.targets.MEMORY`).
"""

from __future__ import annotations

import time

import pandas as pd

from headscope.probes.corpora.bench_sentences import generate_sentences
from headscope.reports.tools.bench.machine import check_device, peak_rss_mb, run_child

__all__ = ["MEMORY_COLUMNS", "MEMORY_REDUCERS", "memory_child", "memory_scaling"]

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
#: what a memory run streams through: every text role with its verdicts, nothing, or the mass reducer
MEMORY_REDUCERS = ("noop", "mass", "roles")


def memory_child(model: str, n: int, reducer: str, batch_size: int, seed: int, device: str = "cpu") -> dict:
    """Body of one ``--memory`` subprocess: load, stream ``n`` generated sentences through
    ``reducer`` (:data:`MEMORY_REDUCERS`), report peak RSS (MiB): one row of
    :data:`MEMORY_COLUMNS` as a dict. Run in a fresh process so the peak is this run's.
    Raises ``ValueError`` for an unknown reducer."""
    from headscope.probes.allocator import tune_allocator
    from headscope.probes.capture import stream
    from headscope.probes.models.loading import load_model
    from headscope.reports.tools.bench.reducers import AttentionMassReducer, NoOpReducer, on_device

    tune_allocator()  # as the headscope command does
    reducers = {"noop": NoOpReducer, "mass": AttentionMassReducer}
    if reducer not in MEMORY_REDUCERS:
        raise ValueError(f"unknown memory reducer {reducer!r}; valid: {', '.join(MEMORY_REDUCERS)}")
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
    largest size over the smallest (target: :data:`~headscope.reports.tools.bench.targets.MEMORY`;
    memory must not grow with the corpus). Raises ``ValueError`` for fewer than two sizes
    or a bad device, ``RuntimeError`` when a subprocess fails (its last stderr line).
    """
    if len(sizes) < 2:
        raise ValueError(f"sizes needs at least two corpus sizes; got {sizes!r}")
    check_device(device)
    rows = []
    for n in sizes:
        args = (model, int(n), reducer, int(batch_size), int(seed), device)
        rows.append(
            run_child(
                "headscope.reports.tools.bench.memory",
                "memory_child",
                args,
                tag="HEADSCOPE_MEMORY",
                what=f"memory run of {n} sentences",
                timeout=timeout,
            )
        )
    frame = pd.DataFrame(rows, columns=MEMORY_COLUMNS)
    small, large = frame.loc[frame.n_sentences.idxmin()], frame.loc[frame.n_sentences.idxmax()]
    return frame, float(large.peak_rss_mb / small.peak_rss_mb)
