"""The report run: the model resolved once, the registered stages planned, loaded, run in order.

:func:`report_run` is the whole of it: :func:`open_context` resolves the MODEL argument and reads
its config once into a :class:`~headscope.reports.stages.base.RunContext` (shape, card, a
tokenizer for counting lengths); every stage's settings are settled
(:meth:`~headscope.reports.stages.base.Stage.config`) and their memory working sets planned and
fitted *before* the weights load (:func:`plan_memory`: a run that cannot fit is refused before
loading); the model loads once (:func:`load_into`); each stage's blocker is asked, then the
stages run in :func:`~headscope.reports.stages.registry.run_order`. A stage turned off, blocked,
failing, or needing an absent one is recorded in ``absent`` and every other stage still runs.

Example (runs the analyses)::

    frames, card, card_text, meta = report_run("minilm-l6", RunConfig(only=("roles",)))
    meta["stages"]["roles"]["status"], meta["absent"]["pruning"]
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

from headscope.probes.allocator import trim_heap
from headscope.probes.budget import rss_bytes
from headscope.reports.stages import registry
from headscope.reports.stages.base import RunContext, StageAbsent, StageResult
from headscope.reports.stages.config import RunConfig

if TYPE_CHECKING:
    from headscope.reports.budget import Budget

log = logging.getLogger(__name__)

__all__ = ["RunConfig", "load_into", "open_context", "plan_memory", "plan_report", "report_run", "timed"]


@contextmanager
def timed(timings: dict, stage: str, progress=None):
    """Record the seconds of the ``with`` body as ``timings[stage]``; ``progress(stage, done, total)``
    is told the stage starts (length unknown) and ends."""
    if progress:
        progress(stage, 0, None)  # length unknown until the stage reports it
    t0 = time.perf_counter()
    yield
    trim_heap()  # what the stage freed goes back to the system before the next one
    timings[stage] = round(time.perf_counter() - t0, 3)
    if progress:
        progress(stage, 1, 1)


class RssWindow:
    """The peak resident memory of the process over a ``with`` block, sampled every ``every``
    seconds by a thread (``peak`` bytes once the block ends)."""

    def __init__(self, every: float = 0.1):
        self.every, self.peak = every, 0
        self._stop = threading.Event()

    def _sample(self):
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self):
        self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        return False


# ----------------------------------------------------------------- the model, once
def open_context(model, config: RunConfig, *, progress=None, notice=None) -> tuple[RunContext, dict]:
    """The run's :class:`RunContext` before the load, and what planning needs (``convert``: a GGUF
    not yet dequantised; ``probe``: ``--backend auto`` will probe an in-house model against an HF
    copy). A MODEL argument is resolved once and its config read once: the card, the shape, the
    backend guess and the hash all come from them. A model a notebook holds is loaded here (its
    weights are in the process already) and its card read from it."""
    from headscope.probes.models import card as cards
    from headscope.probes.models import checkpoints

    ctx = RunContext(
        name="",
        full=config.full,
        seed=config.seed,
        dtype=config.dtype,
        device=config.device,
        large_cost=config.large_cost,
        inputs=dict(config.role_inputs or {}),
        role_groups=config.role_groups,
        progress=progress,
        notice=notice,
    )
    extra = {"convert": False, "probe": False, "held": False}
    if not isinstance(model, (str, os.PathLike)):
        extra["held"] = True
        load_into(ctx, model, config)
        return ctx, extra
    ctx.name = model
    with timed(ctx.timings, "card", progress):
        source = checkpoints.resolve(model)  # once: the card, the shape, the hash and the load share it
        hf = cards.source_hf_config(source)
        ctx.source, ctx.card = source, cards.card_from_hf_config(hf, name=source.name)
        ctx.card_text, ctx.model_file = cards.render_card(ctx.card), _model_hash(source)
    if source.kind != "hub":
        ctx.shape, extra["convert"], ctx.tokenizer = _shape(source, hf, config.dtype)
        extra["probe"] = config.backend == "auto" and _covered(hf, source)
    return ctx, extra


def _shape(source, hf: dict, dtype: str):
    """``(shape, convert, tokenizer)`` of a resolved source from its config (``(None, False,
    None)`` when its sizes cannot be read here: the load then says what is wrong)."""
    from headscope.probes.budget import Shape
    from headscope.probes.errors import HeadscopeError
    from headscope.probes.models.checkpoints import cache_dir, file_sha256

    try:
        shape = Shape.from_hf_config(hf, dtype=dtype, where=str(source.path))
    except (HeadscopeError, ValueError, TypeError, KeyError) as e:
        log.info("no memory estimate for %s before it loads: %s", source.name, e)
        return None, False, None
    folder = None
    if source.kind == "hf-dir":
        folder = source.path
    elif source.kind == "gguf":
        cached = cache_dir() / "gguf" / file_sha256(source.path)[:16]
        folder = cached if (cached / "model.safetensors").exists() else None
    tokenizer = None
    if folder is not None and any((folder / f).exists() for f in ("tokenizer.json", "vocab.txt", "tokenizer.model")):
        try:
            from headscope.probes.models.checkpoints import load_tokenizer

            tokenizer = load_tokenizer(folder)
        except Exception as e:  # noqa: BLE001 - lengths are then bounded by bytes; the load reports the error
            log.info("tokenizer of %s not read for the memory estimate (%s); lengths bounded by bytes", source.name, e)
    if tokenizer is None and source.kind == "gguf":  # not converted yet: its metadata's tokenizer counts the lengths
        from headscope.probes.models.tokenizer import gguf_tokenizer

        tokenizer = gguf_tokenizer(source.path)
    return shape, source.kind == "gguf" and folder is None, tokenizer


def _covered(hf: dict, source) -> bool:
    """Whether ``--backend auto`` will load the model in-house (and probe it against an HF copy):
    :func:`~headscope.probes.models.loading.choose_backend`'s test, on the config already read."""
    from headscope.probes.errors import HeadscopeError
    from headscope.probes.models.arch import arch_from_hf_config
    from headscope.probes.models.config import config_from_arch

    try:
        config_from_arch(arch_from_hf_config(hf, str(source.path)))
    except (HeadscopeError, ValueError, TypeError, KeyError):
        return False
    return True


def _model_hash(source) -> dict:
    from headscope.probes.models.checkpoints import file_sha256

    f = source.file_for_hash
    return {"path": str(f) if f else None, "name": f.name if f else None, "sha256": file_sha256(f) if f else None}


def load_into(ctx: RunContext, model, config: RunConfig, *, max_memory: dict | None = None) -> None:
    """Load the model once into ``ctx.model`` (a resolved source, or a model a notebook holds: its
    card, shape and name then read from it); the tokenizer becomes the model's. ``max_memory``: the
    bytes per GPU a device plan placed the layers under (:mod:`~headscope.reports.device_plan`)."""
    from headscope.probes.models.loading import load_model

    load = dict(
        dtype=config.dtype,
        device=config.device,
        device_map=config.device_map,
        trust_remote_code=config.trust_remote_code,
    )
    if max_memory is not None:
        load["max_memory"] = max_memory
    if ctx.source is not None:
        with timed(ctx.timings, "load", ctx.progress):
            ctx.model = load_model(ctx.source, config.backend, **load)
            trim_heap()  # the loading copy's blocks, freed into the heap, go back to the system
    else:
        ctx.model = load_model(model, None if config.backend == "auto" else config.backend, **load)
        _card_of_model(ctx)
    from headscope.probes.models.card import with_purpose

    ctx.card, ctx.card_text = with_purpose(ctx.card, ctx.model)  # #47: what it is for, decided at load
    ctx.tokenizer = ctx.model.tokenizer


def _card_of_model(ctx: RunContext) -> None:
    from headscope.probes.budget import Shape
    from headscope.probes.errors import HeadscopeError
    from headscope.probes.models.card import card_from_hf_config, render_card
    from headscope.probes.models.loading import hf_config_of

    m = ctx.model
    hf = hf_config_of(m)
    if hf is None:
        raise ValueError(f"{m.spec.name!r}: no HF configuration to make the model card from")
    ctx.name, ctx.card = m.spec.name, card_from_hf_config(hf, name=m.spec.name)
    ctx.card_text, ctx.model_file = render_card(ctx.card), {"path": None, "name": None, "sha256": None}
    try:
        ctx.shape = Shape.from_hf_config(hf, dtype=ctx.dtype)
    except (HeadscopeError, ValueError, TypeError, KeyError) as e:
        log.info("no memory estimate for the model object: %s", e)


# ----------------------------------------------------------------- settings and the memory plan
#: the reason of an opt-in stage that was not asked for (run.json's ``stages``; not an absence)
OFF_BY_DEFAULT = "off by default"


def turned_off(config: RunConfig) -> dict[str, str]:
    """``{stage: why it does not run}`` from ``config``'s ``only``, ``skip`` and ``--no-<stage>``
    switches (unknown names refused, listing the known stages)."""
    names = list(registry.STAGES)
    off = {}
    if config.only is not None:
        only = registry.check_names(config.only, "--only")
        off.update({n: "not in --only" for n in names if n not in only})
    off.update({n: f"skipped (--skip {n})" for n in registry.check_names(config.skip, "--skip")})
    off.update({n: f"turned off (--no-{n})" for n in registry.check_names(config.off, "--no")})
    on = set(registry.check_names(config.on, "--")) | set(config.only or ())
    off.update(
        {
            n: f"{OFF_BY_DEFAULT} (--{n} or --only {n} runs it)"
            for n, s in registry.STAGES.items()
            if not s.default_on and n not in on and n not in off
        }
    )
    return off


def plan_memory(ctx: RunContext, cfgs: dict, on: list, extra: dict) -> tuple[Budget, dict]:
    """The memory plan of the stages ``on`` with settings ``cfgs`` from ``ctx.shape`` (before the
    load; a held model without its load) -> ``(budget, cfgs)`` with each stage's batch sizes
    fitted. Raises :class:`~headscope.probes.errors.MemoryBudgetError` when nothing fits."""
    from headscope.reports import budget as memory

    memory.preload("report")
    owner: dict[str, str] = {}
    sets = []
    if ctx.shape is not None and not memory.on_gpu(ctx.device):
        for s in on:
            ctx.plans[s.name] = s.plan(ctx, cfgs[s.name])
            for w in ctx.plans[s.name]:
                owner[w.name] = s.name
                sets.append(w)
    held = extra["held"]
    kw = {"load": False} if held else {"convert": extra["convert"], "probe": extra["probe"], "trimmed": True}
    kw["staged"] = len(on) > 1  # stages run one after another: what earlier ones leave is held too
    kw["refuse"] = not extra.get("devices")  # placed on GPUs: the host is checked once placed (check_host)
    if extra.get("ray"):  # the driver maps what it puts into Ray's object store and the parts it reads back
        from headscope.reports.stages.sharded import RAY_DRIVER_OBJECTS

        kw["beside"] = {"ray objects": RAY_DRIVER_OBJECTS}
    budget = memory.plan("report", ctx.shape, sets, **kw)
    budget.emit = ctx.notice
    memory.say(budget)
    est = budget.estimate
    if est is not None:
        for s in on:
            own = {k: v for k, v in est.batch_sizes.items() if owner.get(k) == s.name}
            cfgs[s.name] = s.fitted(cfgs[s.name], own)
    budget.settings = {"owner": owner}
    return budget, cfgs


# ----------------------------------------------------------------- the stages
def _absent_need(stage, absent: dict[str, str], status: dict) -> str | None:
    for need in stage.requires:
        if need in absent:
            why = absent[need]
            state = status.get(need, {}).get("status")
            if state == "off":
                return f"needs {need}, which was skipped"
            if state == "failed":
                return f"needs {need}, which failed: {why.removeprefix('failed: ')}"
            return f"needs {need}, which is absent: {why}"
    return None


def _run_one(ctx: RunContext, stage, cfg, record: dict) -> StageResult | None:
    """Run ``stage`` into ``ctx`` (frames, summary, timings, counts); on :class:`StageAbsent` or an
    exception, record it absent and return None."""
    with RssWindow() as rss:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            with timed(ctx.timings, stage.name, None if stage.reports_progress else ctx.progress):
                result = _sharded(ctx, stage, cfg, record) if ctx.shards is not None else None
                if result is None:
                    result = stage.run(ctx, cfg)
        except StageAbsent as e:
            ctx.absent[stage.name], record["status"] = str(e), "absent"
            log.warning("%s", e)
            result = None
        except Exception as e:  # noqa: BLE001 - one stage failing leaves the others to run and write
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            ctx.absent[stage.name] = f"failed: {type(e).__name__}: {msg}"
            record["status"] = "failed"
            log.warning("the %s stage failed: %s: %s", stage.name, type(e).__name__, msg, exc_info=log.isEnabledFor(10))
            result = None
    record["seconds"] = round(time.perf_counter() - t0, 3)
    record["cpu_s"] = round(time.process_time() - c0, 3)  # on one thread: its seconds on a core of its own
    record["peak_mb"] = round(rss.peak / 2**20, 1)
    if result is not None:
        ctx.frames.update(result.frames)
        ctx.summaries[stage.name] = dict(result.summary)
        ctx.timings.update(result.timings)
        record["status"] = "ran"
    return result


def time_estimates(ctx: RunContext, cfgs: dict, names) -> dict[str, float | None]:
    """``{stage: estimated seconds or None}`` of the stages ``names`` in run order
    (:meth:`~headscope.reports.stages.base.Stage.seconds`; a stage whose work cannot be told is None)."""
    out: dict[str, float | None] = {}
    for s in registry.run_order(names):
        try:
            out[s.name] = s.seconds(ctx, cfgs[s.name])
        except Exception as e:  # noqa: BLE001 - an estimate never stops a run; the stage says what is wrong when it runs
            log.info("no time estimate for the %s stage: %s: %s", s.name, type(e).__name__, e)
            out[s.name] = None
    return out


def _sharded(ctx: RunContext, stage, cfg, record: dict) -> StageResult | None:
    """``stage`` run in parts on the run's Ray workers and merged (run.json's ``shards``: how many
    parts), or None where it does not shard (yet): it then runs whole here."""
    parts = stage.split(ctx, cfg, ctx.shards.workers)
    if parts is None:
        log.info("the %s stage does not shard yet: it runs in the driver", stage.name)
        return None
    record["shards"] = len(parts)
    return ctx.shards.run(ctx, stage, cfg, parts)


def run_stages(
    ctx: RunContext,
    cfgs: dict,
    off: dict[str, str],
    estimates: dict[str, float],
    seconds: dict[str, float | None] | None = None,
) -> tuple[dict, dict]:
    """Ask every stage's blocker (before any runs), then run them in order -> ``(status, counts)``:
    run.json's ``stages`` (with ``estimate_s`` from ``seconds``, the time estimates) and the role
    analyses' ``n_items``."""
    order = registry.run_order()
    status = {s.name: {"status": "off", "reason": off[s.name]} for s in order if s.name in off}
    # an opt-in stage not asked for is no absence: run.json's ``stages`` says "off", ``absent`` keeps to what was wanted
    ctx.absent.update({n: why for n, why in off.items() if not why.startswith(OFF_BY_DEFAULT)})
    for s in order:
        if s.name in off:
            continue
        why = s.blocker(ctx, cfgs[s.name])
        if why is not None:
            ctx.absent[s.name], status[s.name] = why, {"status": "blocked", "reason": why}
            (log.warning if s.warn_absent else log.info)("the %s stage will not run: %s", s.name, why)
    counts: dict[str, int] = {}
    for s in order:
        if s.name in status:
            continue
        rec = status[s.name] = {"status": "ran", "reason": None}
        if (why := _absent_need(s, ctx.absent, status)) is not None:
            ctx.absent[s.name], rec["status"], rec["reason"] = why, "absent", why
            continue
        result = _run_one(ctx, s, cfgs[s.name], rec)
        if result is None:
            rec["reason"] = ctx.absent.get(s.name)
        else:
            counts.update(result.counts)
    for s in order:
        status[s.name].setdefault("seconds", None)
        status[s.name].setdefault("cpu_s", None)
        status[s.name].setdefault("peak_mb", None)
        planned = status[s.name]["status"] == "ran" or status[s.name].get("peak_mb") is not None
        status[s.name]["estimate_mb"] = estimates.get(s.name, estimates.get("*") if planned else None)
        est_s = (seconds or {}).get(s.name)
        ran = status[s.name]["status"] not in ("off", "blocked")
        status[s.name]["estimate_s"] = None if est_s is None or not ran else round(est_s, 1)
    return {s.name: status[s.name] for s in order}, counts


#: the parts of a run phase that every stage holds, whatever its working set
_HELD = ("process", "weights", "loader residue", "tokenizer", "allocator", "staged residue", "ray objects")


def _estimates(budget: Budget) -> dict[str, float]:
    """Each stage's largest planned phase, in MiB; a stage with no working set of its own (its
    :meth:`~headscope.reports.stages.base.Stage.plan` is []) gets what every phase holds (the
    process, the weights, what the load left) under ``"*"``."""
    est, owner = budget.estimate, budget.settings.get("owner", {})
    out: dict[str, float] = {}
    for name, b in est.phases.items() if est is not None else ():
        if name in owner:
            out[owner[name]] = max(out.get(owner[name], 0.0), round(b / 2**20, 1))
    if est is not None:
        run = next((p for n, p in est.parts.items() if n != "load"), None)
        held = sum(run.get(k, 0) for k in _HELD) if run else est.parts["load"].get("process", 0)
        out["*"] = round(held / 2**20, 1)
    return out


def plan_report(model, config: RunConfig, *, progress=None, notice=None):
    """Everything before the load: ``(ctx, budget, cfgs, off)``: the context of MODEL ``model``
    (resolved and read once), the memory plan of the stages that run (refused in one line when
    nothing fits), every stage's settled config with its fitted batch sizes, the stages turned off."""
    off = turned_off(config)
    ctx, extra = open_context(model, config, progress=progress, notice=notice)
    if config.device_map is not None:
        from headscope.reports.device_plan import plannable

        extra["devices"] = plannable(ctx, config)
    extra["ray"] = config.ray is not None
    stages = list(registry.STAGES.values())
    cfgs = {s.name: s.config(ctx, config.given(s.name)) for s in stages}
    budget, cfgs = plan_memory(ctx, cfgs, [s for s in stages if s.name not in off], extra)
    return ctx, budget, cfgs, off


def report_run(model, config: RunConfig, *, progress=None, notice=None):
    """Plan the run's memory, open the model once and run the stages; return ``(frames, card,
    card_text, meta)``. ``notice(line)``, when given, receives the memory estimate, the estimated
    time and the peak; ``meta`` holds what run.json and the report's sections read."""
    from headscope.analyses.run_json import model_record, versions
    from headscope.reports import budget as memory
    from headscope.reports.stages.clock import describe, rate

    pool = _pool(model, config)  # before anything loads: a bad --ray-address or --workers is refused at once
    try:
        ctx, budget, cfgs, off = plan_report(model, config, progress=progress, notice=notice)
        ctx.shards = pool
        if pool is not None:  # a worker starts as this process did before its load
            pool.process = budget.available.resident
        stages = list(registry.STAGES.values())
        seconds = time_estimates(ctx, cfgs, [n for n in registry.STAGES if n not in off])
        if notice is not None and any(seconds.values()) and (line := describe(seconds, rate())) is not None:
            notice(line)
        placed = _device_plan(ctx, budget, config, notice)
        if ctx.model is None:
            load_into(ctx, model, config, max_memory=placed.max_memory if placed else None)
        if pool is not None:  # the workers load what the driver loaded (no second --backend auto probe)
            pool.load["backend"] = ctx.model.backend
        for r in getattr(ctx.model, "backend_rejected", ()) if notice is not None else ():  # the library prints none
            notice(f"backend auto: rejected {r['backend']} ({r['reason']})")
        status, counts = run_stages(ctx, cfgs, off, _estimates(budget), seconds)
        if pool is not None:
            budget.settings["ray"] = pool.record()
    finally:
        if pool is not None:
            pool.close()
    meta = {
        **model_record(ctx.model),
        "model": ctx.card.get("name", ctx.name),
        "model_arg": ctx.name,
        "trust_remote_code": ctx.model.trust_remote_code,
        "full": config.full,
        "seed": config.seed,
        "model_file": ctx.model_file,
        "sha256": ctx.model_file["sha256"],
        "versions": versions(),
        "timings": dict(sorted(ctx.timings.items(), key=lambda kv: "." in kv[0])),  # a stage's parts last
        "n_items": counts,
        "config": config.settings(cfgs),
        **{s.key(): ctx.summaries.get(s.name, {}) for s in stages},
        "absent": dict(ctx.absent),
        "stages": status,
        "memory": memory.finish(budget, notice),
        "quick": None if config.full else {"leaves_out": _leaves_out(ctx, cfgs, status)},
    }
    meta["prune_metric"] = (meta.get("prune_summary") or {}).get("metric")
    if placed is not None:
        meta["device_plan"] = placed.record()
    return dict(ctx.frames), ctx.card, ctx.card_text, meta


def _device_plan(ctx: RunContext, budget, config: RunConfig, notice):
    """The :class:`~headscope.reports.device_plan.DevicePlan` of a ``--device-map auto`` run, told
    through ``notice`` before the load (None without a device map, or where none can be made)."""
    if config.device_map is None:
        return None
    from headscope.reports import device_plan

    if config.max_memory:
        device_plan.check_present(config.max_memory)
    placed, note = device_plan.plan_run(ctx, budget, config)
    if placed is not None:
        device_plan.check_host(placed, budget)
    for line in placed.lines() if placed is not None else [note] if note else []:
        if notice is not None:
            notice(line)
        else:
            log.info("%s", line)
    return placed


def _pool(model, config: RunConfig):
    """The run's :class:`~headscope.reports.stages.sharded.ShardPool`, connected, under ``config.ray``;
    else None (Ray is not imported)."""
    if config.ray is None:
        return None
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError(
            "--ray: the workers load the model by name or path; give MODEL as a name or path, not a model object"
        )
    from headscope.reports.stages.sharded import ShardPool

    load = {
        "model": str(model),
        "backend": config.backend,
        "dtype": config.dtype,
        "device": None if config.device is None else str(config.device),  # cuda: each worker asks Ray for a GPU
        "trust_remote_code": config.trust_remote_code,
    }
    return ShardPool(config.ray, load).connect()


def _leaves_out(ctx: RunContext, cfgs: dict, status: dict) -> str:
    """What the quick report leaves out of ``--full``, one clause per stage that ran."""
    parts = []
    for s in registry.STAGES.values():
        if status.get(s.name, {}).get("status") == "ran":
            parts += s.leaves_out(ctx, cfgs[s.name])
    return "; ".join(parts)
