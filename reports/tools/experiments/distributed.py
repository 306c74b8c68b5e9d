"""Streaming reducers sharded over Ray workers, merged exactly.

:func:`stream_distributed` cuts a corpus into contiguous shards, hands each to a Ray actor
that loaded the model (by name) once, runs :func:`~headscope.probes.capture.stream` there
with fresh reducers, and merges the partial reducers with ``reducer.merge(other)``. Item
ids seen by the reducers are global (shard offset added), so per-item reducers merge to
exactly what one process would have computed.

:class:`AttentionMassReducer` is a small, exactly mergeable reducer: per head, the sum of
the attention mass on the first token and of the pattern entropy over real query rows,
with the row count, in float64. Its ``result()`` is a tidy frame
(:data:`~headscope.analyses.frames.STAT_COLUMNS`).

Ray is optional (``pip install 'headscope[ray]'``). :func:`on_device` moves a model's
batches to ``device`` (``"cuda"`` where a GPU exists) and its outputs back to the CPU.

>>> import torch
>>> from headscope.probes.capture import Capture
>>> from headscope.probes.tokens import TokenBatch
>>> tb = TokenBatch(input_ids=torch.zeros(1, 2, dtype=torch.long), attention_mask=torch.ones(1, 2, dtype=torch.long),
...                 texts=[""], words=[[]], tokens=[[]], offsets=[[]], word_ids=[[]], special=[[]], lengths=[2])
>>> p = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])          # one head: row 0 on key 0, row 1 uniform
>>> r = AttentionMassReducer(); r.update(Capture(tokens=tb, data={("pattern", 0): p}, layers=(0,), spec=None))
>>> r.result()[["metric", "value", "n"]].round(4).values.tolist()
[['first_token_mass', 0.75, 2], ['entropy', 0.3466, 2]]
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence

import pandas as pd
import torch

from headscope.analyses.frames import STAT_COLUMNS
from headscope.probes.capture import Capture, StreamReport, stream

log = logging.getLogger(__name__)

RAY_HINT = "pip install 'headscope[ray]'"
_ENV_PASSED = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HEADSCOPE_CACHE", "XDG_CACHE_HOME", "TOKENIZERS_PARALLELISM")


# ----------------------------------------------------------------------------- a mergeable reducer


class AttentionMassReducer:
    """Per (layer, head): sums over real query rows of the attention on the first key
    position and of the pattern's entropy (nats), and the number of rows; float64.

    ``result()`` -> frame ``[layer, head, metric, value, n]`` with metrics
    ``first_token_mass`` and ``entropy`` (means over rows). ``merge`` adds the sums, so
    any split of the corpus gives the same result up to float64 rounding.
    """

    def __init__(self):
        self.mass: dict[int, torch.Tensor] = {}  # layer -> [head]
        self.entropy: dict[int, torch.Tensor] = {}
        self.rows: int = 0

    def update(self, cap: Capture) -> None:
        qmask = cap.key_mask.to(torch.float64)  # [batch, query_pos]: real query rows
        n_rows = int(qmask.sum())
        for layer in cap.layers:
            p = cap["pattern", layer].to(torch.float64)  # [batch, head, query_pos, key_pos]
            first = (p[..., 0] * qmask[:, None, :]).sum((0, 2))  # [head]
            ent = (torch.special.entr(p).sum(-1) * qmask[:, None, :]).sum((0, 2))  # [head]
            self.mass[layer] = self.mass.get(layer, 0) + first.cpu()  # [head] sums on the host: merged across workers
            self.entropy[layer] = self.entropy.get(layer, 0) + ent.cpu()
        self.rows += n_rows

    def merge(self, other: AttentionMassReducer) -> AttentionMassReducer:
        if not isinstance(other, AttentionMassReducer):
            raise TypeError(f"can only merge AttentionMassReducer; got {type(other).__name__}")
        for layer in other.mass:
            self.mass[layer] = self.mass.get(layer, 0) + other.mass[layer]
            self.entropy[layer] = self.entropy.get(layer, 0) + other.entropy[layer]
        self.rows += other.rows
        return self

    def result(self) -> pd.DataFrame:
        rows = []
        for layer in sorted(self.mass):
            for metric, sums in (("first_token_mass", self.mass[layer]), ("entropy", self.entropy[layer])):
                for head, s in enumerate(sums.tolist()):
                    rows.append(
                        {"layer": layer, "head": head, "metric": metric, "value": s / max(self.rows, 1), "n": self.rows}
                    )
        df = pd.DataFrame(rows, columns=STAT_COLUMNS)
        return df.astype({"layer": "int64", "head": "int64", "value": "float64", "n": "int64"})


class NoOpReducer:
    """Looks at nothing; counts batches. For measuring the cost of capture alone."""

    def __init__(self):
        self.batches = 0

    def update(self, cap: Capture) -> None:
        self.batches += 1

    def merge(self, other: NoOpReducer) -> NoOpReducer:
        self.batches += other.batches
        return self

    def result(self) -> int:
        return self.batches


class ReducerSet:
    """Several reducers fed the same captures, merged key by key: ``ReducerSet(mass=
    AttentionMassReducer, pos=functools.partial(PositionalReducer, causal=False))`` makes a
    fresh one of each (pass the factories, so the set itself is a picklable factory via
    ``functools.partial(ReducerSet, ...)``). ``result()`` -> ``{name: result}``."""

    def __init__(self, **factories: Callable[[], object]):
        if not factories:
            raise ValueError("ReducerSet needs at least one name=factory")
        self.reducers = {k: f() for k, f in factories.items()}

    def update(self, cap: Capture) -> None:
        for r in self.reducers.values():
            r.update(cap)

    def merge(self, other: ReducerSet) -> ReducerSet:
        if set(other.reducers) != set(self.reducers):
            raise ValueError(f"cannot merge ReducerSets of {sorted(self.reducers)} and {sorted(other.reducers)}")
        for k, r in self.reducers.items():
            res = r.merge(other.reducers[k])
            self.reducers[k] = r if res is None else res
        return self

    def result(self) -> dict:
        return {k: r.result() for k, r in self.reducers.items()}

    def __getitem__(self, name: str):
        return self.reducers[name]


# ----------------------------------------------------------------------------- device


class on_device:
    """Wrap a loaded model after moving it to ``device``; everything passes through (every
    backend's ``run`` moves its batch to the model's device, and the captured tensors stay
    there: reducers work on the device and hand small per-item values to the host).
    ``"cpu"`` leaves the model where it is."""

    def __init__(self, model, device: str | torch.device = "cpu"):
        self._model = model
        self.device = torch.device(device)
        if self.device.type != "cpu":
            with contextlib.redirect_stdout(sys.stderr):  # the bridge's .to() prints to stdout
                model.to(self.device)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def run(self, batch, quantities=("pattern",), layers=None, **kw):
        return self._model.run(batch, quantities, layers, **kw)


# ----------------------------------------------------------------------------- Ray


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError(f"distributed streaming needs Ray, which is not installed: {RAY_HINT}") from None
    return ray


class _Offset:
    """Reducer wrapper that turns a shard's item ids into corpus-wide ids."""

    def __init__(self, inner, offset: int):
        self.inner, self.offset = inner, offset

    def update(self, cap: Capture) -> None:
        self.inner.update(dataclasses.replace(cap, item_ids=[i + self.offset for i in cap.item_ids]))


class ShardWorker:
    """One Ray actor: loads the model by name once, then streams shards through it."""

    def __init__(self, model_name: str, backend: str, device: str, env: dict):
        os.environ.update(env)
        from headscope.probes.models.loading import load_model

        self.model = on_device(load_model(model_name, backend), device)

    def run(self, items, offset: int, reducer_factory, quantities, layers, batch_size, max_tokens, words):
        red = reducer_factory()
        rep = stream(
            self.model,
            items,
            [_Offset(red, offset)],
            quantities=quantities,
            layers=layers,
            batch_size=batch_size,
            max_tokens=max_tokens,
            words=words,
        )
        rep.skipped_items = [(i + offset, why) for i, why in rep.skipped_items]
        return red, rep


def shard_bounds(n_items: int, n_shards: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` shards, sizes differing by at most one.

    >>> shard_bounds(10, 3)
    [(0, 4), (4, 7), (7, 10)]
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1; got {n_shards}")
    base, extra = divmod(n_items, n_shards)
    out, start = [], 0
    for s in range(n_shards):
        stop = start + base + (s < extra)
        out.append((start, stop))
        start = stop
    return [b for b in out if b[1] > b[0]]


def merge_reports(reports: Sequence[StreamReport]) -> StreamReport:
    """Sum the counts of shard reports (skipped items already carry corpus-wide ids)."""
    out = StreamReport()
    for r in reports:
        out.n_items += r.n_items
        out.n_used += r.n_used
        out.skipped += Counter(r.skipped)
        out.skipped_items.extend(r.skipped_items)
        out.n_batches += r.n_batches
        out.real_tokens += r.real_tokens
        out.padded_tokens += r.padded_tokens
    out.skipped_items.sort()
    return out


def actor_options(device: str | torch.device = "cpu", gpus_per_worker: float | None = None) -> dict:
    """Ray options of one shard actor: 1 CPU, and on CUDA ``num_gpus`` (``gpus_per_worker``,
    default 1; a fraction such as 0.5 packs two actors on one GPU). Ray hides the GPUs
    from an actor that asks for none, so a CUDA device needs them asked for.

    >>> actor_options("cpu"), actor_options("cuda"), actor_options("cuda:1", 0.25)
    ({'num_cpus': 1}, {'num_cpus': 1, 'num_gpus': 1.0}, {'num_cpus': 1, 'num_gpus': 0.25})
    >>> actor_options("cpu", 0.5)
    Traceback (most recent call last):
    ...
    ValueError: gpus_per_worker goes with a CUDA device; got device 'cpu'
    """
    kind = torch.device(device).type
    if gpus_per_worker is not None:
        if kind != "cuda":
            raise ValueError(f"gpus_per_worker goes with a CUDA device; got device {str(device)!r}")
        if isinstance(gpus_per_worker, bool) or not 0 < float(gpus_per_worker) <= 1:
            raise ValueError(f"gpus_per_worker must be in (0, 1]; got {gpus_per_worker!r}")
    if kind != "cuda":
        return {"num_cpus": 1}
    return {"num_cpus": 1, "num_gpus": float(gpus_per_worker if gpus_per_worker is not None else 1)}


def n_actors(n_shards: int, resources: dict, options: dict) -> int:
    """How many actors the cluster's ``resources`` hold at ``options`` (at least 1, at most
    ``n_shards``): CPUs, and GPUs over ``num_gpus`` when asked for.

    >>> n_actors(8, {"CPU": 16, "GPU": 2}, {"num_cpus": 1, "num_gpus": 0.5}), n_actors(8, {"CPU": 4}, {"num_cpus": 1})
    (4, 4)
    """
    fit = int(resources.get("CPU", 1) // options.get("num_cpus", 1))
    if options.get("num_gpus"):
        fit = min(fit, int(resources.get("GPU", 0) // options["num_gpus"] + 1e-9))
    return max(1, min(n_shards, fit))


def stream_distributed(
    model_spec_name: str,
    items: Sequence,
    reducer_factory: Callable[[], object],
    *,
    ray_address: str | None = None,
    n_shards: int | None = None,
    quantities: Sequence[str] = ("pattern",),
    layers: Sequence[int] | None = None,
    batch_size: int = 32,
    max_tokens: int | None = 8192,
    words: bool | None = None,
    backend: str = "inhouse",
    device: str = "cpu",
    gpus_per_worker: float | None = None,
):
    """Stream ``items`` through ``model_spec_name`` on Ray workers; merge the reducers.

    ``reducer_factory()`` makes one fresh reducer (it must pickle: a class or a
    module-level function); each shard's reducer is merged into the first with
    ``merge``. ``ray_address``: an existing cluster (``"auto"``, ``"ray://host:10001"``);
    without it a running ``ray.init`` is reused, else a local one is started (and shut
    down afterwards). ``n_shards`` defaults to the cluster's CPUs; one actor per worker
    (``min(n_shards, CPUs)`` actors, 1 CPU each) loads the model once and takes shards in
    turn. On a CUDA ``device`` each actor asks Ray for ``gpus_per_worker`` GPUs (default 1,
    :func:`actor_options`), so the shards spread over every GPU of the cluster (Ray gives
    each actor its own, seen there as ``cuda``). Returns ``(merged reducer, StreamReport)``
    with corpus-wide item indices.

    Raises ``ImportError`` naming ``pip install 'headscope[ray]'`` without Ray,
    ``ValueError`` on an empty corpus or ``n_shards < 1``.
    """
    ray = _import_ray()
    items = list(items)
    if not items:
        raise ValueError("items is empty: nothing to stream")
    if n_shards is not None and (isinstance(n_shards, bool) or not isinstance(n_shards, int) or n_shards < 1):
        raise ValueError(f"n_shards must be a positive int; got {n_shards!r}")
    if words is None:
        words = not isinstance(items[0], str)
    options = actor_options(device, gpus_per_worker)  # a bad device or fraction fails before Ray starts
    run_args = (
        reducer_factory,
        tuple(quantities),
        None if layers is None else tuple(layers),
        batch_size,
        max_tokens,
        words,
    )
    started = False
    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        started = ray_address is None
    try:
        parts, n_workers = _run_shards(ray, model_spec_name, backend, device, options, items, n_shards, run_args)
    finally:
        if started:
            ray.shutdown()
    merged = parts[0][0]
    for red, _ in parts[1:]:
        res = merged.merge(red)
        merged = merged if res is None else res
    report = merge_reports([rep for _, rep in parts])
    log.info("merged %d shards from %d workers: %d items used", len(parts), n_workers, report.n_used)
    return merged, report


def _run_shards(ray, model_spec_name: str, backend: str, device: str, options: dict, items: list, n_shards, run_args):
    """Cut ``items`` into shards, run them on actors of ``ShardWorker`` (``options``: their
    Ray resources) and return ``([(reducer, StreamReport)] per shard, actors used)``. The
    actors are killed afterwards, also on an error. ``run_args``: what
    :meth:`ShardWorker.run` takes after a shard's items and first index."""
    resources = ray.cluster_resources()
    cpus = max(1, int(resources.get("CPU", 1)))
    n = min(n_shards or cpus, len(items))
    bounds = shard_bounds(len(items), n)
    n_workers = n_actors(len(bounds), resources, options)
    env = {k: os.environ[k] for k in _ENV_PASSED if k in os.environ}
    actor = ray.remote(**options)(ShardWorker)
    worker_device = "cuda" if "num_gpus" in options else device  # Ray shows an actor its own GPUs only
    workers = [actor.remote(model_spec_name, backend, worker_device, env) for _ in range(n_workers)]
    try:
        futures = [workers[s % n_workers].run.remote(items[a:b], a, *run_args) for s, (a, b) in enumerate(bounds)]
        return ray.get(futures), n_workers
    finally:
        for w in workers:
            ray.kill(w)
