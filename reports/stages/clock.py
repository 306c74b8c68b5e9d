"""Each stage's time, estimated before it runs from what its loop does, in two quantities: the
GFLOP of its products and the count of its fixed-cost calls, each times a per-stage factor, over
this machine's matmul rate.

A stage's :meth:`~headscope.reports.stages.base.Stage.work` counts what its loop does, from the
model's shape and the stage's settings, as a :class:`Work`: ``gflop`` (items × tokens × a
forward's GFLOP per token for the stages that run forwards; the weights' products for the weights
stage) and ``calls`` (a layer of one sequence's forward; a draw of the weights stage's null). FLOPs
alone are not time: a forward also pays, per layer and sequence, for Python, the hooks, the norms,
softmaxes and the statistics, which no FLOP count sees, so a 2-layer shape of 4 wide heads runs
faster per GFLOP than MiniLM-L6's 6 layers of 12 narrow ones. :data:`FACTORS` holds, per stage,
the reference-matmul GFLOP (:func:`~headscope.probes.timing.reference_rate`, a float32 512-square
``torch.mm``) that one GFLOP of its work costs and that one call costs, fitted by ``make estimates``
(:func:`fit_factors`: least squares on the log of estimate / measured over the ``time`` rows of
``data/figures/estimates.json``, the default reports of
:data:`~headscope.reports.tools.bench.estimates.REPORT_MODELS`). So

    seconds = (gflop × factor["gflop"] + calls × factor["calls"] + slow_gflop × factor["slow_gflop"]) / rate

where ``rate`` is measured on the machine that runs the estimate, once per process, before the
load (:func:`rate`): a factor measured on one machine reads on another at that machine's matmul
rate (the calls' cost too: a machine with a faster matmul is taken to run Python faster). It does
not follow what the rate leaves out (a machine whose memory is slower than its matmul suggests,
other processes taking the cores after the rate was read), so the estimate is a guide, held to
1.5× of the measured stage time on the calibration reports by a test reading the committed JSON,
never by a timed test. A stage whose work is 0 (the KV stage on an encoder) has no time.

>>> from headscope.probes.budget import Shape
>>> s = Shape(n_layers=2, n_heads=4, n_kv_heads=4, d_model=64, d_head=16, d_mlp=256, vocab_size=1000,
...           n_params=200_000, causal=False)
>>> round(token_gflop(s, 10) * 1e9)  # FLOP: 2 x the 136,000 non-embedding parameters, plus attention
277120
>>> forward_work(s, rows=3, tokens=10).calls  # 3 sequences through 2 layers
6
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from headscope.probes.budget import Shape

__all__ = ["FACTORS", "Work", "describe", "fit_factors", "forward_work", "rate", "seconds", "token_gflop"]

#: stage -> {"gflop": reference-matmul GFLOP per GFLOP of its products, "calls": reference-matmul GFLOP
#: per call (a layer of one sequence's forward; a null draw), "slow_gflop": per GFLOP of its QRs (the
#: weights stage's null)} (:meth:`~.base.Stage.work`), fitted by
#: ``make estimates`` (:func:`fit_factors` over ``data/figures/estimates.json``'s ``time`` rows; a test
#: holds these to that fit)
#: patching's "slow_gflop": per GFLOP of one row's unembedding counted once per forward that unembeds (a
#: product of a few rows reads the whole matrix; :func:`~headscope.reports.stages.patching.patch_work`)
FACTORS: dict[str, dict[str, float]] = {
    "context": {"gflop": 1.597, "calls": 0.011, "slow_gflop": 0.0},
    "patching": {"gflop": 1.402, "calls": 0.0, "slow_gflop": 49.51},
    "pruning": {"gflop": 1.192, "calls": 0.003382, "slow_gflop": 0.0},
    "roles": {"gflop": 0.7665, "calls": 0.0968, "slow_gflop": 0.0},
    "weights": {"gflop": 2.01, "calls": 0.1499, "slow_gflop": 9.449},
    "kv": {"gflop": 0.6928, "calls": 5.023, "slow_gflop": 0.0},
    "circuits": {"gflop": 2.869, "calls": 0.0, "slow_gflop": 0.0},
}


@dataclass(frozen=True)
class Work:
    """What a stage's loop does: ``gflop``, its products' GFLOP; ``calls``, its fixed-cost calls
    (what the stage's :meth:`~.base.Stage.work` says they are); ``slow_gflop``, GFLOP of a kind
    that runs at a rate of its own (the weights stage's null draws: QR factorisations; the patching
    stage's unembedding of a few rows, bound by reading the matrix). Added and scaled together.

    >>> Work(2.0, 3) + 2 * Work(1.0, 1)
    Work(gflop=4.0, calls=5, slow_gflop=0.0)
    """

    gflop: float = 0.0
    calls: float = 0.0
    slow_gflop: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.gflop + other.gflop, self.calls + other.calls, self.slow_gflop + other.slow_gflop)

    def __mul__(self, k: float) -> Work:
        return Work(self.gflop * k, self.calls * k, self.slow_gflop * k)

    __rmul__ = __mul__


def token_gflop(shape: Shape, tokens: float, *, logits: bool = False) -> float:
    """GFLOP of one token's forward at a length of ``tokens``: two per non-embedding parameter
    (``n_params`` less the ``vocab × d_model`` embedding, and less the unembedding where it is not
    tied), the attention's scores and weighted sum over ``tokens`` keys
    (``4 × layers × heads × d_head × tokens``), and with ``logits`` the unembedding
    (``2 × d_model × vocab``)."""
    embeddings = shape.vocab_size * shape.d_model * (1 if shape.tied else 2)
    dense = 2 * max(0, shape.n_params - embeddings)
    attention = 4 * shape.n_layers * shape.n_heads * shape.d_head * max(1, tokens)
    unembed = 2 * shape.d_model * shape.vocab_size if logits else 0
    return (dense + attention + unembed) / 1e9


def forward_work(shape: Shape, rows: float, tokens: float, *, logits: bool = False) -> Work:
    """The :class:`Work` of ``rows`` sequences of ``tokens`` tokens through the model: their GFLOP
    (:func:`token_gflop`) and, as calls, ``rows × layers`` (one layer of one sequence: its hooks,
    norms, softmax and Python, which cost the same whatever the FLOPs)."""
    return Work(rows * tokens * token_gflop(shape, tokens, logits=logits), rows * shape.n_layers)


@functools.lru_cache(maxsize=1)
def rate() -> float:
    """This machine's reference matmul rate (GFLOP/s), measured once per process
    (:func:`~headscope.probes.timing.reference_rate`, about 0.3 s)."""
    from headscope.probes.timing import reference_rate

    return reference_rate()


def seconds(stage: str, work: Work | None, at_rate: float | None = None, factors: dict | None = None) -> float | None:
    """Estimated seconds of ``stage`` doing ``work`` at ``at_rate`` GFLOP/s (None: :func:`rate`) with
    ``factors`` (None: :data:`FACTORS`); None when the work is unknown or the stage has no factor yet."""
    factor = (FACTORS if factors is None else factors).get(stage)
    if work is None or factor is None:
        return None
    ref = work.gflop * factor["gflop"] + work.calls * factor["calls"] + work.slow_gflop * factor["slow_gflop"]
    return ref / (rate() if at_rate is None else at_rate)


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def fit_factors(rows: list[dict]) -> dict[str, dict[str, float]]:
    """``{stage: {"gflop": a, "calls": b, "slow_gflop": c}}`` from calibration rows (``stage``,
    ``seconds``, ``rate``, ``work_gflop``, ``work_calls``, ``work_slow_gflop``): per stage, the
    factors ``>= 0`` that minimise the sum of squared ``log(estimate / seconds)`` (the band is a
    ratio), ``estimate = (a × gflop + b × calls + c × slow_gflop) / rate``, over the terms its rows
    have. A stage keeps fewer terms than rows (``n`` rows fit ``n`` terms exactly, which says
    nothing of another shape): the GFLOP term first, then calls, then the slow GFLOP.
    Deterministic: a grid of the terms' mix (steps of 1/1000 for two terms, 1/200 for three), the
    scale in closed form (the mean of the logs).

    >>> fit_factors([{"stage": "s", "seconds": 2.0, "rate": 10.0, "work_gflop": 4.0, "work_calls": 1}])
    {'s': {'gflop': 5.0, 'calls': 0.0, 'slow_gflop': 0.0}}
    """
    by: dict[str, list[tuple[float, ...]]] = {}
    for r in rows:
        work = (r.get("work_gflop") or 0.0, r.get("work_calls") or 0.0, r.get("work_slow_gflop") or 0.0)
        if r.get("seconds") and r.get("rate") and any(work):
            by.setdefault(r["stage"], []).append((r["seconds"] * r["rate"], *work))
    return {s: _fit(v) for s, v in by.items()}


_TERMS = ("gflop", "calls", "slow_gflop")


def _fit(points: list[tuple[float, ...]]) -> dict[str, float]:
    """:func:`fit_factors` of one stage: ``points`` of (reference GFLOP measured, gflop, calls, slow gflop)."""
    logy = [math.log(p[0]) for p in points]
    have = [i for i in range(3) if any(p[1 + i] for p in points)][: max(1, len(points) - 1)]
    sums = [sum(p[1 + i] for p in points) for i in have]
    n = 1000 if len(have) <= 2 else 200
    mixes = [(1.0,)] if len(have) == 1 else _simplex(len(have), n)
    best = None
    for w in mixes:
        m = [sum(wi * p[1 + i] / s for wi, i, s in zip(w, have, sums)) for p in points]
        if min(m) <= 0:
            continue
        logs = [math.log(x) for x in m]
        scale = sum(a - b for a, b in zip(logy, logs)) / len(points)
        sse = sum((b + scale - a) ** 2 for a, b in zip(logy, logs))
        if best is None or sse < best[0] - 1e-12:
            best = (sse, w, scale)
    _, w, scale = best
    out = dict.fromkeys(_TERMS, 0.0)
    for wi, i, s in zip(w, have, sums):
        out[_TERMS[i]] = _sig(wi * math.exp(scale) / s)
    return out


def _simplex(k: int, n: int) -> list[tuple[float, ...]]:
    """Every mix of ``k`` non-negative weights in steps of ``1/n`` summing to 1."""
    if k == 1:
        return [(1.0,)]
    return [(i / n, *(x * (n - i) / n for x in rest)) for i in range(n + 1) for rest in _simplex(k - 1, n - i or 1)]


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
