"""Stages sharded over Ray workers (``--ray``), merged exactly.

A :class:`ShardPool` joins a Ray cluster (``--ray-address``) or starts a local one, and on the
first stage that shards starts ``--workers`` actors (:class:`StageWorker`), each of which loads
the model **once, by its name or path** (the MODEL argument, resolved on the worker: a shipped
name, a folder or a ``.gguf`` on a path every node shares), never pickled per task. A stage that
shards (:meth:`~headscope.reports.stages.base.Stage.split` returns parts of its
:attr:`~headscope.reports.stages.base.Stage.unit`) has each part run by
:meth:`~headscope.reports.stages.base.Stage.run_part` on a worker; the driver merges the parts in
order (:meth:`~headscope.reports.stages.base.Stage.merge`) and finishes what needs every unit
(:meth:`~headscope.reports.stages.base.Stage.finish`: adjustments, bootstrap, nulls), so the
tables do not depend on how the units were cut. A stage that does not shard yet runs whole in
the driver, as without ``--ray``.

Threads: each worker asks Ray for ``threads`` CPUs and sets torch's (and BLAS's) threads to them,
``threads = cluster CPUs // workers`` (at most a node's CPUs), so workers x threads <= cores.
GPUs: with ``--device cuda`` each worker also asks Ray for ``num_gpus`` (:func:`gpu_share`: one GPU
each where the cluster has one per worker, else an equal fraction, the workers sharing a GPU) and
loads the model on ``cuda``, which in a Ray worker is the GPU Ray assigned it (Ray sets
``CUDA_VISIBLE_DEVICES`` per worker); a cluster without GPUs is refused in one line.
Memory: where the run has a memory plan (``ctx.shape`` and the stages' working sets), each worker
also asks Ray for the plan's peak (:func:`worker_memory`: the weights, loaded, and the largest
working set), so Ray places no more workers on a node than its memory holds; a cluster whose
memory cannot host one is refused in one line.
Waiting: workers Ray cannot place (another job's actors or tasks hold the CPUs or memory they
ask for) are waited for, as Ray does, but not silently: after ``notice_after`` seconds (5) a
warning names how many wait, what each asks for and what the cluster has free, once a minute.
Faults: a part whose worker dies (or that raises) is run once more (the actor is restarted by Ray,
loading the model again); a part failing twice fails the stage with the part named, and the runner
records the stage as failed while the other stages still run.

Nothing here imports Ray at module level: without ``--ray`` Ray is never imported.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from headscope.reports.stages.base import RunContext, Stage, StageResult

log = logging.getLogger(__name__)

__all__ = [
    "RAY_HINT",
    "Interleaved",
    "RayConfig",
    "ShardPool",
    "StageWorker",
    "contiguous",
    "gpu_share",
    "import_ray",
    "preflight",
    "wait_get",
    "worker_memory",
]

RAY_HINT = "pip install 'headscope[ray]'"
#: the environment a worker is given from the driver's (offline switches, caches)
_ENV_PASSED = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HEADSCOPE_CACHE", "XDG_CACHE_HOME", "TOKENIZERS_PARALLELISM")
#: the Ray client's port when ``ray://HOST`` names none, and a cluster head's GCS port
_CLIENT_PORT, _GCS_PORT = 10001, 6379


@dataclass(frozen=True)
class RayConfig:
    """``--ray``: ``workers`` (None: one per CPU of the cluster), ``address`` (``--ray-address``:
    ``HOST:PORT`` of a cluster's head, ``ray://HOST:PORT``, or ``auto``; None: start a local
    cluster), ``connect_timeout``: seconds to reach ``address`` before giving up, ``threads``:
    torch threads (and Ray CPUs) per worker (None: ``cluster CPUs // workers``), ``notice_after``:
    seconds a run waits on workers (or jobs) that Ray cannot place before it says so (a warning
    naming the resources asked and free, repeated every minute while it waits); ``gpus``: GPUs
    each worker asks for under ``--device cuda`` (None: :func:`gpu_share`'s default; a fraction
    puts several workers on one GPU; above 1, a whole number, as Ray requires)."""

    workers: int | None = None
    address: str | None = None
    connect_timeout: float = 5.0
    threads: int | None = None
    notice_after: float = 5.0
    gpus: float | None = None

    def __post_init__(self):
        if self.workers is not None and (isinstance(self.workers, bool) or self.workers < 1):
            raise ValueError(f"--workers must be an integer >= 1; got {self.workers!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ValueError(f"threads must be an integer >= 1; got {self.threads!r}")
        if not self.notice_after > 0:
            raise ValueError(f"notice_after must be > 0 seconds; got {self.notice_after!r}")
        if self.gpus is not None and not (0.0001 <= self.gpus and (self.gpus <= 1 or float(self.gpus).is_integer())):
            raise ValueError(f"gpus per worker must be a fraction in [0.0001, 1] or a whole number; got {self.gpus!r}")


def import_ray():
    """The ``ray`` module, or a ``ValueError`` (one line at the CLI, exit 2) naming the extra."""
    try:
        import ray
    except ImportError:
        raise ValueError(f"--ray needs Ray, which is not installed: {RAY_HINT}") from None
    return ray


def contiguous(n_units: int, n: int) -> list[tuple[int, ...]]:
    """``range(n_units)`` in at most ``n`` contiguous runs, sizes differing by at most one.

    >>> contiguous(6, 4)
    [(0, 1), (2, 3), (4,), (5,)]
    >>> contiguous(2, 3)
    [(0,), (1,)]
    """
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}")
    base, extra = divmod(n_units, n)
    out, start = [], 0
    for s in range(n):
        stop = start + base + (s < extra)
        if stop > start:
            out.append(tuple(range(start, stop)))
        start = stop
    return out


@dataclass(frozen=True)
class Interleaved:
    """Part ``k`` of ``n`` of a stage's batches: every ``n``-th batch from the ``k``-th
    (:func:`~headscope.probes.capture.in_part`), where the batches are cut as one process cuts them.

    >>> Interleaved(1, 3)
    batches 1, 4, 7, ...
    """

    k: int
    n: int

    def __repr__(self) -> str:
        return f"batches {self.k}, {self.k + self.n}, {self.k + 2 * self.n}, ..."


def gpu_share(workers: int, gpus: float, asked: float | None = None) -> float:
    """GPUs each of ``workers`` asks Ray for on a cluster of ``gpus`` GPUs: ``asked`` where given,
    else one each where there is a GPU per worker, else an equal share, ``1 / ceil(workers /
    gpus)`` rounded down to Ray's 0.0001 (so that many workers fit on one GPU and share its
    memory). ``ValueError`` (one line) for a cluster without GPUs or an ``asked`` it cannot host.

    >>> gpu_share(2, 4), gpu_share(4, 2), gpu_share(3, 1), gpu_share(2, 1, asked=0.25)
    (1.0, 0.5, 0.3333, 0.25)
    """
    if gpus <= 0:
        raise ValueError("no GPUs")
    if asked is not None:
        if workers * asked > gpus + 1e-9:
            raise ValueError(f"{workers} workers x {asked:g} GPUs each exceed its {gpus:g} GPUs")
        return float(asked)
    if workers <= gpus:
        return 1.0
    per = math.ceil(workers / gpus)
    return math.floor(10_000 / per) / 10_000


#: what a ``--ray`` driver maps of Ray's object store and keeps resident: the frames it puts for each stage
#: and the parts' results it reads (pickled on the workers, mapped into the driver, then unpickled), the
#: store's pages staying resident once touched (its RssShmem). Measured with ``--workers 2``: MiniLM-L6's
#: default report, a 42 MiB high-water (the parts' results once the roles parts no longer carry the model; they
#: were 190 MiB with it). A stage's results held again unpickled are within its one-process working set, which
#: the driver's phase keeps (the driver runs no forward of a sharded stage)
RAY_DRIVER_OBJECTS = 64 << 20


def worker_memory(ctx: RunContext, process: int = 0) -> int | None:
    """Bytes one worker holds at its peak, from the run's memory plan: ``process`` (what a process
    holds before its load: the driver's, measured when the run was planned), the model's weights
    as a worker loads them and the largest working set of the stages planned (``ctx.plans``), by
    :func:`~headscope.probes.budget.estimate`; None where the run has no plan (no ``ctx.shape``,
    a model held by a notebook, a GPU run)."""
    sets = [w for ws in ctx.plans.values() for w in ws]
    if ctx.shape is None or not sets:
        return None
    from headscope.probes.budget import estimate

    return int(estimate(ctx.shape, sets, process=process, load=True, trimmed=True).total)


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` that ``address`` must answer on, or None for ``auto``.

    >>> _host_port("10.0.0.5:6379"), _host_port("ray://head"), _host_port("auto")
    (('10.0.0.5', 6379), ('head', 10001), None)
    """
    if address == "auto":
        return None
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://")
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not host:
        raise ValueError(f"--ray-address {address!r}: expected HOST:PORT, ray://HOST[:PORT] or auto")
    try:
        return host, int(port) if port else (_CLIENT_PORT if client else _GCS_PORT)
    except ValueError:
        raise ValueError(f"--ray-address {address!r}: the port {port!r} is not a number") from None


def _reachable(address: str, timeout: float) -> None:
    """Raise ``ValueError`` (address and error, one line) unless ``address`` accepts a connection
    within ``timeout`` seconds: an unreachable cluster is refused before Ray waits on it."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        socket.create_connection(hp, timeout=timeout).close()
    except OSError as e:
        raise ValueError(f"--ray-address {address}: cannot reach the Ray cluster: {e.strerror or e}") from None


def preflight(config: RayConfig) -> None:
    """The checks of ``--ray`` that need no cluster, for a command whose work runs in the driver:
    ``ValueError`` (one line) for an unreachable ``--ray-address``, for ``--workers`` past this
    machine's cores when no address is given, and for Ray not installed (naming the extra)."""
    if config.address is not None:
        _reachable(config.address, config.connect_timeout)
    else:
        _local_cores(config.workers)
    import_ray()


def _local_cores(workers: int | None) -> int:
    """This machine's cores, the CPUs of a local cluster; ``ValueError`` (one line) for ``--workers``
    past them."""
    cores = os.cpu_count() or 1
    if workers is not None and workers > cores:
        raise ValueError(f"--workers {workers}: this machine hosts at most {cores} (one per core)")
    return cores


class StageWorker:
    """One Ray actor: the model loaded once (by name or path, ``load``: ``model``, ``backend``,
    ``dtype``, ``trust_remote_code``), ``threads`` torch threads; runs stages' parts on it."""

    def __init__(self, load: dict, threads: int, env: dict):
        os.environ.update(env)
        import torch

        torch.set_num_threads(threads)
        from headscope.probes.models import checkpoints
        from headscope.probes.models.loading import load_model

        source = checkpoints.resolve(load["model"])
        # a GPU worker sees the GPU(s) Ray assigned it as cuda:0..: the driver's index means nothing here
        device = "cuda" if str(load.get("device") or "").startswith("cuda") else load.get("device")
        model = load_model(
            source, load["backend"], dtype=load["dtype"], device=device, trust_remote_code=load["trust_remote_code"]
        )
        self.ctx = RunContext(name=load["model"], source=source, model=model, tokenizer=model.tokenizer)

    def pid(self) -> int:
        return os.getpid()

    def peak(self) -> int:
        """This worker's resident peak (``VmHWM``), bytes."""
        from headscope.probes.budget import peak_rss_bytes

        return peak_rss_bytes()

    def run_part(self, stage: str, cfg, part, frames: dict, run: dict) -> StageResult:
        from headscope.reports.stages.registry import STAGES

        self.ctx.frames, self.ctx.full, self.ctx.seed = dict(frames), run["full"], run["seed"]
        self.ctx.inputs, self.ctx.role_groups = dict(run["inputs"]), run["role_groups"]
        return STAGES[stage].run_part(self.ctx, cfg, part)


class ShardPool:
    """Ray workers for one report run: :meth:`connect` (before the model loads: a bad address or
    a count the cluster cannot host is refused in one line), :meth:`run` (a stage's parts),
    :meth:`close` (the actors killed; a local cluster it started shut down)."""

    def __init__(self, config: RayConfig, load: dict):
        self.config, self.load = config, dict(load)
        self.ray = None
        self.workers = 0
        self.threads = 1
        self.memory: int | None = None  # bytes each worker asked Ray for (None: none)
        self.gpus: float | None = None  # GPUs each worker asks Ray for (None: a CPU run)
        self.process = 0  # bytes a process holds before its load (the driver's, when the run was planned)
        self._actors: list = []
        self._started = False

    # ------------------------------------------------------------------ the cluster
    def connect(self) -> ShardPool:
        cfg = self.config
        if cfg.address is not None:  # before Ray loads: an unreachable address is refused in seconds
            _reachable(cfg.address, cfg.connect_timeout)
        ray = import_ray()
        if not ray.is_initialized():  # a process that started Ray itself (a notebook, a test) keeps its cluster
            if cfg.address is not None:
                # Ray retries an address that answers but is no cluster once a second, 20 times by
                # default: its own switch bounds that to connect_timeout; its C++ retry warnings (one a
                # second, on fd 2) are held back and shown only if it joins: a failure is one line
                knobs = {"RAY_gcs_server_port_wait_time_s": str(max(1, int(cfg.connect_timeout)))}
                saved = {k: os.environ.get(k) for k in knobs}
                os.environ.update(knobs)
                try:
                    with _held_stderr():
                        ray.init(
                            address=cfg.address,
                            include_dashboard=False,
                            log_to_driver=False,
                            logging_level=logging.WARNING,
                        )
                except Exception as e:  # noqa: BLE001 - Ray's own: one line naming the address
                    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    raise ValueError(f"--ray-address {cfg.address}: cannot join the Ray cluster: {msg}") from None
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
            else:
                cores = _local_cores(cfg.workers)
                ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
                self._started = True
        self.ray = ray
        cpus = int(ray.cluster_resources().get("CPU", 0))
        node_cpus = max((int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=cpus)
        where = cfg.address or "the local Ray cluster"
        if cfg.workers is not None and cfg.workers > cpus:
            self.close()
            raise ValueError(f"--workers {cfg.workers}: {where} hosts at most {cpus} (one CPU each)")
        self.workers = cfg.workers or max(1, cpus)
        self.threads = cfg.threads or max(1, min(cpus // self.workers, node_cpus))
        if self.workers * self.threads > cpus:
            self.close()
            raise ValueError(f"--workers {self.workers} x {self.threads} threads: {where} hosts at most {cpus} CPUs")
        if str(self.load.get("device") or "").startswith("cuda"):
            gpus = float(ray.cluster_resources().get("GPU", 0))
            try:
                self.gpus = gpu_share(self.workers, gpus, cfg.gpus)
            except ValueError as e:
                self.close()
                if gpus <= 0:
                    raise ValueError(
                        f"--ray --device cuda: {where} has no GPUs (Ray counts {cpus} CPUs and no GPU); "
                        "use --device cpu, or join a cluster whose nodes have GPUs"
                    ) from None
                raise ValueError(f"--ray --device cuda: {where}: {e}") from None
        return self

    def _start_actors(self, memory: int | None = None) -> None:
        """The workers, each asking Ray for ``threads`` CPUs and ``memory`` bytes (None: none asked);
        ``ValueError`` when the cluster's memory cannot host one."""
        if self._actors:
            return
        ray = self.ray
        env = {k: os.environ[k] for k in _ENV_PASSED if k in os.environ}
        threads = str(self.threads)
        env_vars = {**env, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
        asks = self.asks()
        if memory:
            node = max((n["Resources"].get("memory", 0) for n in ray.nodes() if n.get("Alive")), default=0)
            if node and memory > node:
                raise ValueError(
                    f"each Ray worker needs about {memory / 2**30:.1f} GiB (the run's memory plan); "
                    f"the largest node of {self.config.address or 'the local cluster'} has {node / 2**30:.1f} GiB"
                )
            asks["memory"] = int(memory)
        self.memory = memory
        actor = ray.remote(**asks, max_restarts=2, max_task_retries=0)(StageWorker)
        self._actors = [
            actor.options(runtime_env={"env_vars": env_vars}).remote(self.load, self.threads, env)
            for _ in range(self.workers)
        ]

    def asks(self) -> dict:
        """What each worker asks Ray for, as ``ray.remote`` takes it: ``num_cpus`` (its threads) and,
        on a GPU run, ``num_gpus`` (:func:`gpu_share`); the memory is added when the workers start."""
        return {"num_cpus": self.threads, **({"num_gpus": self.gpus} if self.gpus else {})}

    def _unplaced(self) -> str | None:
        """A line saying how many workers Ray has not placed yet, what each asks for and what the
        cluster has free; None when every worker is placed (loading its model or running)."""
        waiting = [a for a in self._actors if not _placed(self.ray, a)]
        if not waiting:
            return None
        asks = {
            "CPU": self.threads,
            **({"GPU": self.gpus} if self.gpus else {}),
            **({"memory": self.memory} if self.memory else {}),
        }
        return (
            f"Ray cannot place {len(waiting)} of the {len(self._actors)} workers yet: each asks for "
            f"{_resources(asks)}; {self.config.address or 'the local Ray cluster'} has {_free(self.ray)} "
            "(other jobs' actors or tasks hold the rest); waiting for them to be freed"
        )

    def pids(self, wait: float = 120.0) -> list[int]:
        """The workers' process ids (started if they were not); a worker Ray is restarting (it
        loads the model again) is waited for, up to ``wait`` seconds."""
        self._start_actors()
        out, deadline = [], time.monotonic() + wait
        for a in self._actors:
            while True:
                try:
                    out.append(self.ray.get(a.pid.remote()))
                    break
                except self.ray.exceptions.RayActorError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        return out

    # ------------------------------------------------------------------ a stage
    def run(self, ctx: RunContext, stage: Stage, cfg, parts: Sequence) -> StageResult:
        """``stage``'s ``parts`` on the workers (:meth:`each`); the parts' results merged in order,
        then finished in the driver."""
        t0 = time.perf_counter()
        results = self.each(ctx, stage, cfg, parts, frames=ctx.frames)
        merged = stage.merge(results)
        log.info(
            "%s: %d shards on %d workers in %.1f s", stage.name, len(parts), len(self._actors), time.perf_counter() - t0
        )
        return stage.finish(ctx, cfg, merged)

    def each(self, ctx: RunContext, stage: Stage, cfg, parts: Sequence, frames: dict | None = None) -> list:
        """:meth:`~headscope.reports.stages.base.Stage.run_part` of each of ``parts`` on the workers
        (part ``i`` on worker ``i`` modulo their number), each tried at most twice (the second time on
        the next worker) -> their results, in order. ``frames``: the earlier stages' frames the parts
        read (put once into the object store; None: none). A stage whose driver goes back to the
        workers several times (the pruning study, a round per step) calls it for each round."""
        ray = self.ray
        self._start_actors(worker_memory(ctx, self.process))
        frames = ray.put(dict(frames or {}))  # once, into the object store
        run = {"full": ctx.full, "seed": ctx.seed, "inputs": dict(ctx.inputs or {}), "role_groups": ctx.role_groups}

        def submit(i: int, attempt: int):
            actor = self._actors[(i + attempt) % len(self._actors)]
            return actor.run_part.remote(stage.name, cfg, parts[i], frames, run)

        pending = {i: submit(i, 0) for i in range(len(parts))}
        results: dict = {}
        for attempt in (0, 1):
            retry = {}
            for i, ref in pending.items():
                try:
                    results[i] = wait_get(ray, ref, self._unplaced, self.config.notice_after)
                except ray.exceptions.RayError as e:
                    why = _first_line(e)
                    if attempt:
                        raise RuntimeError(
                            f"the {stage.name} shard {_name(stage, parts[i])} failed twice: {why}"
                        ) from None
                    log.warning(
                        "the %s shard %s failed (%s); running it again", stage.name, _name(stage, parts[i]), why
                    )
                    retry[i] = submit(i, 1)
            pending = retry
        return [results[i] for i in range(len(parts))]

    def record(self) -> dict:
        """run.json's ``memory.ray``: the workers, their threads and GPUs, what each asked Ray for
        (``worker_estimate_bytes``: :func:`worker_memory`) and each one's measured resident peak
        (``worker_peak_rss_bytes``; None for a worker that cannot answer), and the object store's
        allowance in the driver's plan (:data:`RAY_DRIVER_OBJECTS`)."""
        peaks = []
        for a in self._actors:
            try:
                peaks.append(int(self.ray.get(a.peak.remote(), timeout=30)))
            except Exception:  # noqa: BLE001 - a dead or restarting worker: no figure, the others still count
                peaks.append(None)
        return {
            "workers": self.workers,
            "threads": self.threads,
            "gpus_per_worker": self.gpus,
            "worker_estimate_bytes": self.memory,
            "worker_peak_rss_bytes": peaks,
            "driver_objects_bytes": RAY_DRIVER_OBJECTS,
        }

    def close(self) -> None:
        ray = self.ray
        if ray is None:
            return
        for a in self._actors:
            ray.kill(a)
        self._actors = []
        if self._started:
            ray.shutdown()
            self._started = False


@contextlib.contextmanager
def _held_stderr():
    """File descriptor 2 (where Ray's C++ logs) into a temporary file for the ``with`` body; what
    it caught is written back to stderr only when the body succeeds."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            os.close(saved)
            raise
        os.dup2(saved, 2)
        os.close(saved)
        held.seek(0)
        sys.stderr.write(held.read().decode(errors="replace"))


def wait_get(ray, ref, unplaced, notice_after: float = 5.0, every: float = 60.0):
    """``ray.get(ref)``, saying why it waits: after ``notice_after`` seconds and then every
    ``every`` seconds, ``unplaced()`` (a line naming what Ray cannot place, or None when all is
    placed and merely running) is logged as a warning."""
    start = time.monotonic()
    told = None
    while True:
        done, _ = ray.wait([ref], timeout=1.0)
        if done:
            return ray.get(ref)
        now = time.monotonic()
        if now - start >= notice_after and (told is None or now - told >= every):
            line = unplaced()
            if line:
                log.warning("%s (%.0f s so far)", line, now - start)
                told = now


def _placed(ray, actor) -> bool:
    """Whether Ray has given ``actor`` a worker process (its constructor may still be running):
    the cluster's actor table has its pid. Where that table cannot be read, True (nothing said)."""
    try:
        from ray._private import state

        info = state.actors(actor_id=actor._actor_id.hex())
        return bool(info.get("Pid")) or info.get("State") not in ("PENDING_CREATION", "DEPENDENCIES_UNREADY")
    except Exception:  # noqa: BLE001 - a private table: a Ray version without it says nothing
        return True


def _resources(r: dict) -> str:
    """``{"CPU": 1, "memory": 2**30}`` as ``1 CPU, 1.0 GiB of memory``."""
    parts = [f"{r['CPU']:g} CPU"] if "CPU" in r else []
    if r.get("GPU"):
        parts.append(f"{r['GPU']:g} GPU")
    if r.get("memory"):
        parts.append(f"{r['memory'] / 2**30:.1f} GiB of memory")
    return ", ".join(parts)


def _free(ray) -> str:
    """What the cluster has free of what it has: ``0 of 4 CPUs and 9.3 of 12.1 GiB of memory free``."""
    total, free = ray.cluster_resources(), ray.available_resources()
    line = f"{free.get('CPU', 0):g} of {total.get('CPU', 0):g} CPUs"
    if total.get("GPU"):
        line += f", {free.get('GPU', 0):g} of {total['GPU']:g} GPUs"
    if total.get("memory"):
        line += f" and {free.get('memory', 0) / 2**30:.1f} of {total['memory'] / 2**30:.1f} GiB of memory"
    return line + " free"


def _name(stage: Stage, part) -> str:
    """A part as its unit and values: ``layers 0-2``, ``items 3``."""
    if isinstance(part, tuple) and part and all(isinstance(x, int) for x in part):
        span = str(part[0]) if len(part) == 1 else f"{part[0]}-{part[-1]}"
        if list(part) != list(range(part[0], part[-1] + 1)):
            span = ",".join(map(str, part))
        return f"({stage.unit} {span})"
    return f"({stage.unit} {part!r})"


def _first_line(e: BaseException) -> str:
    lines = [x for x in str(e).strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else type(e).__name__
