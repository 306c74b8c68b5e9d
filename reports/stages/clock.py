"""Each stage's time, estimated before it runs: its work (in GFLOP of the model's forwards, or of
the weights' products) times a per-stage factor, divided by this machine's matmul rate.

A stage's :meth:`~headscope.reports.stages.base.Stage.work` counts what its loop does, from the
model's shape and the stage's settings (items × tokens × a forward's GFLOP per token for the
stages that run forwards; the weights' products for the weights stage). Work alone is not time:
a forward also pays for Python, the hooks, softmaxes and the statistics, and those differ by
stage. :data:`FACTORS` holds, per stage, how many GFLOP of the reference matmul
(:func:`~headscope.probes.timing.reference_rate`, a float32 512-square ``torch.mm``) one GFLOP of
the stage's work costs, fitted by ``make estimates`` from the default reports of
:data:`~headscope.reports.tools.bench.estimates.REPORT_MODELS` (``data/figures/estimates.json``'s
``time`` rows; the geometric mean of ``seconds × rate / work`` over them). So

    seconds = work × factor / rate

where ``rate`` is measured on the machine that runs the estimate, once per process, before the
load (:func:`rate`): a factor measured on one machine reads on another at that machine's matmul
rate. It does not follow what the rate leaves out (a machine whose memory is slower than its
matmul suggests, other processes taking the cores after the rate was read), so the estimate is
a guide, held to 1.5× of the measured stage time on the calibration reports by a test reading the
committed JSON, never by a timed test. A stage's work that is 0 (the KV stage on an encoder) has no
time.

>>> from headscope.probes.budget import Shape
>>> s = Shape(n_layers=2, n_heads=4, n_kv_heads=4, d_model=64, d_head=16, d_mlp=256, vocab_size=1000,
...           n_params=200_000, causal=False)
>>> round(token_gflop(s, 10) * 1e9)  # FLOP: 2 x the 136,000 non-embedding parameters, plus attention
277120
"""

from __future__ import annotations

import functools
import math

from headscope.probes.budget import Shape

__all__ = ["FACTORS", "describe", "fit_factors", "rate", "seconds", "token_gflop"]

#: stage -> reference-matmul GFLOP per GFLOP of the stage's work (:meth:`~.base.Stage.work`), fitted by
#: ``make estimates`` (:func:`fit_factors` over ``data/figures/estimates.json``'s ``time`` rows; a test
#: holds these to that fit)
FACTORS: dict[str, float] = {
    "context": 1.146,
    "patching": 0.1971,
    "pruning": 0.9128,
    "roles": 0.8416,
    "weights": 12.87,
    "kv": 0.8261,
}


def token_gflop(shape: Shape, tokens: int, *, logits: bool = False) -> float:
    """GFLOP of one token's forward at a length of ``tokens``: two per non-embedding parameter
    (``n_params`` less the ``vocab × d_model`` embedding), the attention's scores and weighted
    sum over ``tokens`` keys (``4 × layers × heads × d_head × tokens``), and with ``logits`` the
    unembedding (``2 × d_model × vocab``)."""
    dense = 2 * max(0, shape.n_params - shape.vocab_size * shape.d_model)
    attention = 4 * shape.n_layers * shape.n_heads * shape.d_head * max(1, tokens)
    unembed = 2 * shape.d_model * shape.vocab_size if logits else 0
    return (dense + attention + unembed) / 1e9


@functools.lru_cache(maxsize=1)
def rate() -> float:
    """This machine's reference matmul rate (GFLOP/s), measured once per process
    (:func:`~headscope.probes.timing.reference_rate`, about 0.3 s)."""
    from headscope.probes.timing import reference_rate

    return reference_rate()


def seconds(stage: str, work: float | None, at_rate: float | None = None) -> float | None:
    """Estimated seconds of ``stage`` doing ``work`` GFLOP at ``at_rate`` GFLOP/s (None: :func:`rate`);
    None when the work is unknown or the stage has no factor yet."""
    factor = FACTORS.get(stage)
    if work is None or factor is None:
        return None
    return work * factor / (rate() if at_rate is None else at_rate)


def fit_factors(rows: list[dict]) -> dict[str, float]:
    """``{stage: factor}`` from calibration rows (``stage``, ``seconds``, ``rate``, ``work``): the
    geometric mean of ``seconds × rate / work`` over each stage's rows (a stage's factor is as far
    from each calibration model's by the same ratio)."""
    logs: dict[str, list[float]] = {}
    for r in rows:
        if r.get("seconds") and r.get("work") and r.get("rate"):
            logs.setdefault(r["stage"], []).append(math.log(r["seconds"] * r["rate"] / r["work"]))
    return {s: float(f"{math.exp(sum(v) / len(v)):.4g}") for s, v in logs.items()}


def duration(s: float) -> str:
    """``s`` seconds as the estimate line writes them: ``40 s``, ``3 min``, ``1.5 h``.

    >>> duration(39.6), duration(185), duration(9000)
    ('40 s', '3 min', '2.5 h')
    """
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def describe(estimates: dict[str, float | None], at_rate: float) -> str | None:
    """The line printed before a run: ``estimated time: roles ~40 s, pruning ~3 min, ... (~5 min in
    all at this machine's 64 GFLOP/s matmul rate)``; None when no stage has an estimate.

    >>> print(describe({"roles": 39.6, "pruning": 185.0, "kv": None}, 64.2))
    estimated time: roles ~40 s, pruning ~3 min (~4 min in all at this machine's 64 GFLOP/s matmul rate)
    """
    known = {k: v for k, v in estimates.items() if v}  # None: not known; 0: no work (a stage of decoders on an encoder)
    if not known:
        return None
    parts = ", ".join(f"{k} ~{duration(v)}" for k, v in known.items())
    return f"estimated time: {parts} (~{duration(sum(known.values()))} in all at this machine's {at_rate:.0f} GFLOP/s matmul rate)"
