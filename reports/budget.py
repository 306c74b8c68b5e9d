"""Each command's memory plan: what a ``roles``, ``prune``, ``patch`` or ``report`` run will
hold, checked before the model loads, and the batch sizes that fit.

:func:`plan` builds a :class:`Budget` from the model's config alone (a GGUF's metadata; no
weight is read) and the run's settings, one :class:`~headscope.probes.budget.WorkingSet` per
kind of forward (:mod:`headscope.reports.stages.plans`; the report's from each stage's ``plan``), and
fits it to :func:`~headscope.probes.budget.available_memory`: the batch of a stage that
would not fit is shrunk, and a run that cannot fit even at a batch of one is refused with
one line (:class:`~headscope.probes.errors.MemoryBudgetError`, exit 2) before anything is
written. Lengths are counted with the model's tokenizer where one is at hand without
loading the weights, else bounded by the items' UTF-8 bytes (a token covers at least one
byte). :meth:`Budget.refine` counts them again with the loaded model's tokenizer.

:meth:`Budget.line` is the line the CLI prints up front; :meth:`Budget.record` goes into
run.json as ``memory`` (with the measured ``peak_rss_bytes``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field, replace

from headscope.probes.budget import (
    Available,
    Estimate,
    Shape,
    WorkingSet,
    available_memory,
    check_limit,
    estimate,
    fit,
    gib,
    peak_rss_bytes,
    peak_vm_bytes,
)
from headscope.reports.stages.plans import (
    apply_patch,
    apply_prune,
    auto_probes,
    model_shape,
    patch_stages,
    prune_stages,
    roles_items,
    roles_stages,
    task_longest,
)

log = logging.getLogger(__name__)

#: components -> what to change, per command (the refusal names the largest component's)
_COMMON = {
    "weights": "the weights alone need this much: use a machine with more free memory or a smaller model",
    "loading": "loading reads a float32 copy of the weights beside them: use a machine with more free memory",
    "loader residue": "use a machine with more free memory or a smaller model",
    "probe copy": "use --backend inhouse (auto loads an HF copy beside it to check its patterns)",
}
REMEDIES = {
    "roles": {
        **_COMMON,
        "logits": "use --dtype bf16 (half the logits) or shorter items (--text/--conllu/--coref)",
        "patterns": "use shorter items (--text/--conllu/--coref) or fewer --roles",
        "reducers": "use shorter items (--text/--conllu/--coref) or fewer --roles",
        "attention": "use shorter items (--text/--conllu/--coref)",
        "activations": "use --dtype bf16",
    },
    "prune": {
        **_COMMON,
        "logits": "use --dtype bf16 or --studies without importance",
        "gradients": "use --studies without importance, or --dtype bf16",
        "cache": "use --dtype bf16",
    },
    "patch": {
        **_COMMON,
        "logits": "use --dtype bf16 or a shorter --seq-len",
        "cache": "use a shorter --seq-len or --dtype bf16",
        "gradients": "use --method activation (no gradients)",
    },
}
REMEDIES["circuit"] = {
    **_COMMON,
    "cache": "each item holds one gradient per receiver input and every sender's output: use a shorter --seq-len "
    "or a smaller model",
    "gradients": "use a shorter --seq-len or --dtype bf16",
    "logits": "use --dtype bf16",
}
REMEDIES["report"] = {**REMEDIES["prune"], **REMEDIES["roles"], "gradients": "use --no-patching or a smaller model"}


# ----------------------------------------------------------------------------- the plan


@dataclass
class Budget:
    """A run's memory plan: its ``estimate`` (batch sizes fitted), what was ``available``,
    and the batch each stage asked for (``asked``)."""

    command: str
    shape: Shape | None
    stages: list[WorkingSet]
    available: Available
    estimate: Estimate | None
    load: bool = True
    convert: bool = False
    asked: dict[str, int] = field(default_factory=dict)
    probe: bool = False
    emit: object = field(default=None, repr=False)  # where start() printed the plan (refine says a change)
    trimmed: bool = False  # the heap is trimmed after the load (the report's run: trim_heap)
    staged: bool = False  # the working sets are a report's stages, run one after another
    #: what the report's run keeps beside the plan (``owner``: working set -> stage)
    settings: dict = field(default_factory=dict, repr=False)

    def batch(self, stage: str, default: int) -> int:
        return self.estimate.batch_sizes.get(stage, default) if self.estimate else default

    def smallest_batch(self, default: int) -> int:
        """The smallest batch any stage was fitted to (one ``--batch-size`` for all of them)."""
        sizes = list(self.estimate.batch_sizes.values()) if self.estimate else []
        return min([default, *sizes])

    def shrunk(self) -> dict[str, tuple[int, int]]:
        """``{stage: (asked, fitted)}`` for the stages whose batch was shrunk to fit."""
        if self.estimate is None:
            return {}
        return {k: (self.asked[k], v) for k, v in self.estimate.batch_sizes.items() if v < self.asked.get(k, v)}

    def line(self) -> str:
        """``memory: ~1.2 GiB estimated peak (…); 20.1 GiB available (MemAvailable)``."""
        if self.estimate is None:
            return "memory: no estimate (the model's sizes are not known before it loads)"
        e, a = self.estimate, self.available
        avail = f"{gib(a.budget)} available ({a.source})" if a.budget is not None else "available memory unknown"
        shrunk = _changes(self.shrunk())
        return (
            f"memory: ~{gib(e.total)} estimated peak while {'loading' if e.phase == 'load' else e.phase} "
            f"({e.describe()}); {avail}" + (f"; {shrunk}" if shrunk else "")
        )

    def refine(self, stages: list[WorkingSet], *, uniform: bool = False) -> Budget:
        """The plan again with ``stages`` (counted with the loaded model's tokenizer): the process
        now holds the weights, so only the run's phases are estimated. ``uniform``: every stage
        runs at the smallest batch fitted (one ``--batch-size`` for all)."""
        if self.shape is None:
            return self
        avail = available_memory()
        est = _fit(self.command, self.shape, stages, avail, load=False, convert=False, uniform=uniform)
        if self.load and self.estimate is not None:  # the load, estimated before it, stays a phase of the run
            est.parts["load"] = self.estimate.parts["load"]
            est.phases["load"] = self.estimate.phases["load"]
            est.phase = max(est.phases, key=est.phases.get)
            est.total, est.breakdown = est.phases[est.phase], est.parts[est.phase]
        before = self.estimate.batch_sizes if self.estimate else {}
        changed = {k: (self.asked.get(k, v), v) for k, v in est.batch_sizes.items() if before.get(k, v) != v}
        if changed and self.emit:
            self.emit(
                f"memory: {_changes(changed)} (~{gib(est.total)} with the model loaded; {gib(avail.budget)} available)"
            )
        return replace(self, stages=stages, available=avail, estimate=est)

    def record(self, *, peak: int | None = None) -> dict:
        """run.json's ``memory``: the estimate (``estimate_bytes``, ``breakdown``, ``phases``,
        ``batch_sizes``), ``available_bytes``/``available_source``, ``peak_rss_bytes`` (VmHWM, the
        resident peak the estimate is of), ``peak_vm_bytes`` (VmPeak, the address space ``RLIMIT_AS``
        bounds), and what it was computed from (``shape``, ``stages``)."""
        out = self.estimate.record() if self.estimate else {"estimate_bytes": None}
        out["available_bytes"] = self.available.budget
        out["available_source"] = self.available.source
        out["process_bytes"] = self.available.resident  # resident when the batches were last fitted
        out["batch_sizes_asked"] = dict(self.asked)
        out["stages"] = [dataclasses.asdict(st) for st in self.stages]
        out["shape"] = dataclasses.asdict(self.shape) if self.shape is not None else None
        out["peak_rss_bytes"] = int(peak if peak is not None else peak_rss_bytes())
        out["peak_vm_bytes"] = peak_vm_bytes()
        if self.settings.get("host"):  # a device map's host share
            out["host"] = self.settings["host"]
        if self.settings.get("ray"):  # a --ray run: the estimate and peak above are the driver's; the workers'
            out["ray"] = {
                **self.settings["ray"],
                "driver_estimate_bytes": out.get("estimate_bytes"),
                "driver_peak_rss_bytes": out["peak_rss_bytes"],
            }
        return out


def _changes(sizes: dict[str, tuple[int, int]]) -> str:
    """``batch 32 -> 9 to fit (text, syntactic)``, one clause per distinct change."""
    by: dict[tuple[int, int], list[str]] = {}
    for stage, change in sizes.items():
        by.setdefault(change, []).append(stage)
    return "; ".join(f"batch {x} -> {y} to fit ({', '.join(names)})" for (x, y), names in by.items())


def _fit(
    command, shape, stages, avail, *, load, convert, uniform, probe=False, trimmed=False, staged=False, beside=None
) -> Estimate:
    """:func:`~headscope.probes.budget.fit`, then (``uniform``) every stage at the smallest batch fitted."""
    kw = dict(load=load, convert=convert, probe=probe, trimmed=trimmed, staged=staged, beside=beside)
    est = fit(shape, stages, avail, command=command, remedies=REMEDIES.get(command), **kw)
    if uniform and len(set(est.batch_sizes.values())) > 1:
        b = min(est.batch_sizes.values())
        est = estimate(shape, [replace(s, batch_size=b) for s in stages], process=avail.resident, **kw)
    return est


def plan(
    command: str,
    shape: Shape | None,
    stages: list[WorkingSet],
    *,
    load: bool = True,
    convert: bool = False,
    uniform: bool = False,
    probe: bool = False,
    trimmed: bool = False,
    staged: bool = False,
    refuse: bool = True,
    beside: dict[str, int] | None = None,
) -> Budget:
    """Fit ``stages`` of ``command`` to the memory available now (see the module doc; ``uniform``:
    one batch size for every stage, the smallest fitted; ``probe``: ``--backend auto`` will probe
    the in-house model against an HF copy while loading; ``trimmed``: the heap is trimmed after
    the load, :data:`~headscope.probes.budget.TRIMMED_RESIDUE`; ``refuse`` False: estimated as
    asked, neither fitted nor refused here: a ``--device-map auto`` run, whose weights and working
    sets go to the GPUs, is checked against the host by :func:`~headscope.reports.device_plan.check_host`;
    ``beside``: components every run phase holds besides its working set, as ``{name: bytes}``); raises
    :class:`~headscope.probes.errors.MemoryBudgetError` when it cannot fit, or when
    ``HEADSCOPE_MEMORY_LIMIT`` is not a size or is below the weights alone
    (:func:`~headscope.probes.budget.check_limit`)."""
    if shape is not None and refuse:
        check_limit(shape, load=load)
    avail = available_memory()
    asked = {s.name: s.batch_size for s in stages}
    if shape is None:
        return Budget(command, None, stages, avail, None, load, convert, asked, probe=probe, trimmed=trimmed)
    kw = dict(load=load, convert=convert, uniform=uniform, probe=probe, trimmed=trimmed, staged=staged, beside=beside)
    if refuse:
        est = _fit(command, shape, stages, avail, **kw)
    else:
        kw.pop("uniform")
        est = estimate(shape, stages, process=avail.resident, **kw)
    return Budget(command, shape, stages, avail, est, load, convert, asked, probe=probe, trimmed=trimmed, staged=staged)


# ----------------------------------------------------------------------------- CLI hooks

#: modules a command imports while it runs, imported before the process is measured so the
#: estimate's ``process`` holds them (scikit-learn and SciPy add ~90 MiB)
PRELOAD = {
    "roles": ("scipy.stats", "sklearn.cluster", "sklearn.manifold", "pyarrow.parquet"),
    "prune": ("scipy.stats", "pyarrow.parquet"),
    "patch": ("scipy.stats", "pyarrow.parquet", "matplotlib.pyplot"),
    "circuit": ("pyarrow.parquet",),
    "report": ("scipy.stats", "sklearn.cluster", "sklearn.manifold", "pyarrow.parquet", "matplotlib.pyplot"),
}


def preload(command: str) -> None:
    """Import what ``command`` will import anyway (:data:`PRELOAD`); a module not installed is skipped."""
    import importlib

    for name in PRELOAD.get(command, ()):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def on_gpu(device) -> bool:
    return device is not None and str(device).startswith("cuda")


def start(
    command: str,
    model,
    *,
    dtype: str,
    device,
    stages_of,
    emit=None,
    uniform: bool = False,
    backend: str = "auto",
    trimmed: bool = False,
) -> tuple[Budget, object]:
    """The plan of a run of ``command`` on MODEL ``model`` before it loads: ``stages_of(shape,
    tokenizer)`` gives its stages; ``backend``: the one asked for (``auto`` probes an in-house
    model against an HF copy while loading: :func:`~headscope.reports.stages.plans.auto_probes`).
    Prints :meth:`Budget.line` through ``emit``; raises
    :class:`~headscope.probes.errors.MemoryBudgetError` when the run cannot fit. Returns the
    budget and the tokenizer read for it (or None). On a CUDA device only the load is
    estimated here (a batch's tensors live on the device, bounded by its own free memory)."""
    preload(command)
    got = model_shape(model, dtype) if isinstance(model, str) or hasattr(model, "__fspath__") else None
    if got is None:  # nothing said: the load reports what is wrong with the model, or it loads
        return plan(command, None, []), None
    shape, convert, tokenizer = got
    stages = [] if on_gpu(device) else stages_of(shape, tokenizer)
    probe = backend == "auto" and auto_probes(model)
    budget = plan(command, shape, stages, convert=convert, uniform=uniform, probe=probe, trimmed=trimmed)
    budget.emit = emit
    say(budget)
    return budget, tokenizer


#: the estimate is printed up front when it is over this share of what may be used (or a batch shrank);
#: below, it is logged (``-v``) and kept in run.json, so a run with room to spare prints nothing more
NOTABLE_SHARE = 0.5


def say(budget: Budget) -> None:
    """Print :meth:`Budget.line` through ``budget.emit`` when it matters (:data:`NOTABLE_SHARE`),
    else log it."""
    line = budget.line()
    est, room = budget.estimate, budget.available.budget
    notable = est is not None and (budget.shrunk() or room is None or est.total > NOTABLE_SHARE * room)
    if budget.emit and notable:
        budget.emit(line)
    else:
        log.info(line)


def finish(budget: Budget, emit=None) -> dict:
    """run.json's ``memory`` now, and the line ``memory: peak … resident (estimated …)``."""
    rec = budget.record()
    if emit:
        est = f" (estimated ~{gib(rec['estimate_bytes'])})" if rec.get("estimate_bytes") else ""
        emit(f"memory: peak {gib(rec['peak_rss_bytes'])} resident{est}")
    return rec


def emitter(quiet: bool, prefix: str = "headscope: "):
    """``emit(line)`` printing ``<prefix><line>`` on stderr, or None when ``quiet``. The plan up
    front and a batch shrunk are notes on the run's settings (``prefix="note: "``, as the CLI's
    other notes); the estimated time and the peak are progress (``headscope: ``)."""
    import sys

    if quiet:
        return None
    return lambda line: print(f"{prefix}{line}", file=sys.stderr, flush=True)


def roles_start(args, cfg, groups, inputs: dict, device):
    """``headscope roles``: the plan before the model loads -> ``(budget, cfg)`` with
    ``cfg.batch_size`` the batch that fits (refused in one line when none does)."""
    emit = emitter(args.quiet, "note: ")
    budget, _tok = start(
        "roles",
        args.model,
        backend=getattr(args, "backend", "auto"),
        dtype=args.dtype,
        device=device,
        stages_of=lambda shape, tok: roles_stages(shape, cfg, groups, inputs, tok),
        emit=emit,
        uniform=True,
    )
    return budget, _with_batch(cfg, budget)


def roles_refine(budget: Budget, model, cfg, groups, inputs: dict):
    """After the load: the plan again with the model's own tokenizer -> ``(budget, cfg)``."""
    if budget.shape is None or not budget.stages:
        return budget, cfg
    asked = replace(cfg, batch_size=max(budget.asked.values(), default=cfg.batch_size))
    budget = budget.refine(roles_stages(budget.shape, asked, groups, inputs, model.tokenizer), uniform=True)
    return budget, _with_batch(asked, budget)


def _with_batch(cfg, budget: Budget):
    """``cfg`` with the batch size every roles stage was fitted to."""
    b = budget.smallest_batch(cfg.batch_size)
    if b < cfg.batch_size:
        log.info("batch size %d -> %d to fit in %s", cfg.batch_size, b, gib(budget.available.budget or 0))
        return replace(cfg, batch_size=b)
    return cfg


def roles_timer(progress, groups, inputs: dict, cfg, quiet: bool, spec=None):
    """``progress`` wrapped to print the estimated time of the run once its first batch is timed
    (``spec``: the loaded model's shape, for the groups whose work depends on it)."""
    emit = emitter(quiet)
    if emit is None:
        return progress
    from headscope.probes.timing import TimeEstimate

    return TimeEstimate(roles_items(groups, inputs, cfg, spec), emit, inner=progress)


def prune_start(args, cfg, device):
    """``headscope prune``: the plan before the model loads -> ``(budget, cfg)`` with the batch
    and ``max_rows`` that fit (refused in one line when none does)."""
    budget, _tok = start(
        "prune",
        args.model,
        backend=getattr(args, "backend", "auto"),
        dtype=args.dtype,
        device=device,
        stages_of=lambda shape, tok: prune_stages(shape, cfg, tok),
        emit=emitter(False, "note: "),
    )
    return budget, (apply_prune(cfg, budget.estimate.batch_sizes) if budget.estimate else cfg)


def prune_refine(budget: Budget, model, cfg, asked):
    """After the load: the plan again with the model's tokenizer -> ``(budget, cfg)``."""
    if budget.shape is None or not budget.stages:
        return budget, cfg
    budget = budget.refine(prune_stages(budget.shape, asked, model.tokenizer))
    return budget, apply_prune(asked, budget.estimate.batch_sizes)


def patch_start(args, cfg, device):
    """``headscope patch``: the plan before the model loads -> ``(budget, cfg)`` with the patching
    batch and ``max_rows`` that fit (refused in one line when none does)."""
    budget, _tok = start(
        "patch",
        args.model,
        backend=getattr(args, "backend", "auto"),
        dtype=args.dtype,
        device=device,
        stages_of=lambda shape, tok: patch_stages(
            shape, cfg.patch, longest=task_longest(args.task, args.seq_len, tok), methods=cfg.methods
        ),
        emit=emitter(False, "note: "),
    )
    if budget.estimate is None:
        return budget, cfg
    return budget, replace(cfg, patch=apply_patch(cfg.patch, budget.estimate.batch_sizes))


def patch_refine(budget: Budget, task, cfg, asked):
    """Once the task is built: the plan again with its longest sequence -> ``(budget, cfg)``."""
    if budget.shape is None or not budget.stages:
        return budget, cfg
    longest = max([len(getattr(it, "clean", ())) for it in getattr(task, "items", ())] or [1])
    budget = budget.refine(patch_stages(budget.shape, asked.patch, longest=longest, methods=asked.methods))
    return budget, replace(asked, patch=apply_patch(asked.patch, budget.estimate.batch_sizes))


def circuit_start(args, device, n_items: int):
    """``headscope circuit``: the plan before the model loads (:func:`~headscope.reports.stages.plans.circuit_stages`:
    one gradient per receiver input and every sender's output per item) -> ``(budget, batch size that
    fits)``; a model too large even for one item is refused in one line with the plan's numbers."""
    from headscope.reports.stages.plans import circuit_stages

    budget, _tok = start(
        "circuit",
        args.model,
        backend="inhouse",
        dtype=args.dtype,
        device=device,
        stages_of=lambda shape, tok: circuit_stages(
            shape,
            batch_size=args.batch_size,
            longest=task_longest(args.task, args.seq_len, tok),
            n_items=n_items,
        ),
        emit=emitter(False, "note: "),
        uniform=True,
    )
    return budget, budget.smallest_batch(args.batch_size)


def parts_timer(progress, stage: str, total: int | None, quiet: bool, unit: str):
    """``progress`` (may be None) wrapped to print the estimated time once the first unit of
    ``stage`` is done (``total``: None to read it from the first call)."""
    emit = emitter(quiet)
    if emit is None:
        return progress
    from headscope.probes.timing import TimeEstimate

    return TimeEstimate(total or 0, emit, inner=progress, unit=unit, stages={stage})
