"""The stage contract: what one part of a report run declares, in its own module.

A report is a list of stages (head roles, pruning, patching, weights, KV cache, and what comes
next). Each stage is one module under :mod:`headscope.reports.stages` exposing ``STAGE``, an
instance of a :class:`Stage` subclass, and one line in :mod:`headscope.reports.stages.registry`.
The runner (:mod:`headscope.reports.stages.runner`), the memory plan, ``run.json``, the
report's sections, ``headscope report --only/--skip/--no-<stage>`` and the per-stage
subcommands all iterate that registry; nothing else names a stage.

Design note
-----------
- **One model object.** The MODEL argument is resolved and its config read once, into a
  :class:`RunContext` (name, source, shape, card, tokenizer); the memory plan works from
  ``ctx.shape`` *before* the weights load (a run that cannot fit is refused before loading),
  then the model loads once into ``ctx.model`` and every stage receives the same context.
- **A stage declares** ``name``; ``Config`` (a frozen dataclass, every field typed, no ``Any``,
  a default for each: the CLI flags ``--<field-name>`` of its subcommand are derived from the
  fields; a field's ``metadata={"help": ...}`` is its flag's help, ``metadata={"cli": False}``
  keeps it off the command line); ``requires`` (stages whose frames it reads: the run order is a
  topological sort of these, ties broken by registry order, never hand-written) and ``after``
  (stages it reads when present, ordering only); ``unit`` and :meth:`Stage.merge` (how results
  computed on parts of the unit combine exactly, for a later sharded run); ``schemas`` (frame
  name -> {column: dtype}, every frame it may write, checked by a test on real runs).
- **Its methods**, all given the run's :class:`RunContext` and the stage's resolved config:
  :meth:`Stage.config` (the settings this run uses: the given config, else the defaults for the
  run's seed, ``--full`` and the model's shape), :meth:`Stage.blocker` (why it cannot run on this
  model or these inputs, one line, or None), :meth:`Stage.plan` (the memory working sets of its
  forwards, from ``ctx.shape`` and ``ctx.tokenizer``; no model is loaded yet),
  :meth:`Stage.fitted` (its config with the batch sizes the plan fitted), :meth:`Stage.work` (its
  GFLOP and fixed-cost calls, from which :meth:`Stage.seconds` estimates its time), :meth:`Stage.run`
  (the computation on ``ctx.model``, reading earlier stages' frames from ``ctx.frames``; returns
  a :class:`StageResult`), :meth:`Stage.section` (its part of the report from frames and meta
  alone: no model), :meth:`Stage.leaves_out` (what quick mode leaves out of ``--full``),
  :meth:`Stage.describe` (what ``headscope <name>`` prints once the run is written).
- **Absent, never fatal.** A stage that is turned off (``--skip``, ``--no-<stage>``, not in
  ``--only``), blocked (:meth:`Stage.blocker`), failing (an exception inside :meth:`Stage.run`),
  or whose requirement is absent ("needs roles, which failed: …") is recorded in run.json's
  ``absent`` with its reason, and every other stage still runs and writes.
  A reason known only once it runs (inputs the model cannot take) is raised as
  :class:`StageAbsent` from :meth:`Stage.run`: absent with that reason, not failed.
- **Around it**: ``place`` (where its sections go in the report), ``command`` (the hand-written
  subcommand that runs it alone; None: ``headscope <name>`` is derived from its config),
  ``summary_key`` (meta's and run.json's key for its summary; default ``<name>_summary``).
- run.json records per stage ``stages: {name: {status, reason, seconds, estimate_mb, peak_mb}}``
  (status: ran, off, blocked, absent or failed; ``peak_mb``: the process's resident peak sampled
  while it ran).

Adding a stage: its module (a ``Stage`` subclass and ``STAGE = ...``), its registry line, its
test, and ``make schemas`` (its frames' columns into ``data/schemas/report_tables.json``, which
:func:`~headscope.reports.runs.load_run` checks a report's tables against). Example (a toy stage)::

    @dataclass(frozen=True, kw_only=True)
    class CountConfig:
        top: int = field(default=3, metadata={"help": "heads listed"})

    class CountStage(Stage[CountConfig]):
        name, Config, unit = "count", CountConfig, "heads"
        requires = ("roles",)
        schemas = {"count": {"role": "object", "n": "int64"}}
        help = "heads per role"

        def run(self, ctx, cfg):
            r = ctx.frames["roles"]
            n = r[r.verdict].groupby("role", observed=True).size()
            return StageResult({"count": n.rename("n").reset_index().astype({"role": object})}, {"top": cfg.top})

    STAGE = CountStage()
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

import pandas as pd

from headscope.probes.budget import Shape, WorkingSet

if typing.TYPE_CHECKING:
    from headscope.reports.stages.clock import Work

__all__ = ["UNITS", "RunContext", "Stage", "StageAbsent", "StageResult", "Unit", "WorkingSet", "check_config_type"]

#: what a stage's work divides into (:attr:`Stage.unit`), for a sharded run
Unit = Literal["items", "heads", "layers", "kv_groups"]
UNITS: tuple[str, ...] = typing.get_args(Unit)

C = TypeVar("C")


@dataclass
class RunContext:
    """One run of the report: the model, resolved and opened once, and what stages share.

    ``name``: the MODEL argument as given (run.json's ``model_arg``); ``source``: its resolved
    :class:`~headscope.probes.models.checkpoints.Source` (None for a model a notebook holds);
    ``shape``: its :class:`~headscope.probes.budget.Shape` from the config read once (None when not
    known before the load); ``card`` / ``card_text`` / ``model_file``: the model card and the
    weights' record (path, name, sha256); ``tokenizer``: read without the weights before the load
    where possible, the model's own once loaded; ``model``: the loaded model (None while planning).
    ``full``, ``seed``, ``dtype``, ``device``, ``large_cost``: the run's settings; ``inputs``: the
    role analyses' inputs (``text`` / ``conllu`` / ``coref``; empty: the shipped corpora);
    ``role_groups``: the role groups asked (None: every registered one).
    ``frames`` / ``summaries`` / ``absent``: what the stages run so far wrote (frame name ->
    frame; stage name -> summary; stage name -> why absent). ``progress(stage, done, total)``
    and ``notice(line)``: the terminal's, or None. ``shards``: the run's
    :class:`~headscope.reports.stages.sharded.ShardPool` under ``--ray`` (None: every stage in process)."""

    name: str
    source: object | None = None
    shape: Shape | None = None
    card: dict = field(default_factory=dict)
    card_text: str = ""
    model_file: dict = field(default_factory=dict)
    tokenizer: object | None = None
    model: object | None = None
    full: bool = False
    seed: int = 0
    dtype: str = "fp32"
    device: object | None = None
    large_cost: float | None = None
    inputs: dict = field(default_factory=dict)
    role_groups: tuple[str, ...] | None = None
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    summaries: dict[str, dict] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)
    progress: Callable | None = None
    notice: Callable | None = None
    timings: dict[str, float] = field(default_factory=dict)
    #: stage name -> the working sets its :meth:`Stage.plan` returned for the memory plan (its
    #: :meth:`Stage.work` reads their lengths instead of counting the corpora twice)
    plans: dict[str, list] = field(default_factory=dict)
    shards: object | None = None

    @property
    def context(self) -> int | None:
        """The loaded model's positions (its spec), or None before the load."""
        spec = getattr(self.model, "spec", None)
        return None if spec is None else int(spec.max_positions)


class StageAbsent(Exception):
    """Raised inside :meth:`Stage.run` when the inputs turn out not to allow the stage (a reason
    known only once it runs): the stage is absent with ``str(exc)`` as its reason, not failed."""


@dataclass(frozen=True)
class StageResult:
    """What :meth:`Stage.run` returns: ``frames`` (name -> tidy frame, each declared in the
    stage's ``schemas``), ``summary`` (JSON-serialisable: run.json and the report's sections read
    it), ``timings`` (extra seconds under their full run.json names, e.g. ``roles.text``),
    ``counts`` (run.json's ``n_items``: role group -> items; most stages: empty)."""

    frames: Mapping[str, pd.DataFrame]
    summary: Mapping = field(default_factory=dict)
    timings: Mapping[str, float] = field(default_factory=dict)
    counts: Mapping[str, int] = field(default_factory=dict)


class Stage(Generic[C]):
    """One part of a report run (see the module docstring). Subclasses set the class attributes
    and override :meth:`run` (and, where they have one, :meth:`blocker`, :meth:`plan`,
    :meth:`fitted`, :meth:`section`, :meth:`leaves_out`, :meth:`merge`)."""

    #: the stage's name: ``--only``/``--skip`` take it, ``--no-<name>`` turns it off, run.json keys it
    name: ClassVar[str]
    #: its settings: a frozen dataclass, every field typed (no ``Any``) with a default
    Config: ClassVar[type]
    #: one line for ``--help`` and the subcommand
    help: ClassVar[str] = ""
    #: stages whose frames it needs (absent when one of them is: "needs roles, which failed: ...")
    requires: ClassVar[tuple[str, ...]] = ()
    #: stages it reads when they ran (ordering only)
    after: ClassVar[tuple[str, ...]] = ()
    #: what its work divides into, for a sharded run
    unit: ClassVar[Unit] = "items"
    #: frame name -> {column: dtype} of every frame it may write
    schemas: ClassVar[Mapping[str, Mapping[str, str]]] = {}
    #: where its sections go in the report: by ``place``, then registry order (the pruning study, a
    #: cost rather than a finding, goes last)
    place: ClassVar[int] = 50
    #: the hand-written subcommand that runs it alone (None: ``headscope <name>``, derived from the registry)
    command: ClassVar[str | None] = None
    #: whether a report runs it unless told otherwise (False: only with ``--<name>`` or ``--only``)
    default_on: ClassVar[bool] = True
    #: its run tells ``ctx.progress`` of its own parts (else the runner says when it starts and ends)
    reports_progress: ClassVar[bool] = False
    #: a blocker is logged as a warning (False: absent by design on some models, logged at info)
    warn_absent: ClassVar[bool] = True
    #: where the report and run.json keep its summary (``{stage}_summary`` unless set)
    summary_key: ClassVar[str | None] = None

    # ----------------------------------------------------------------- settings and planning
    def config(self, ctx: RunContext, given: C | None = None) -> C:
        """The settings this run uses: ``given``, else ``Config(seed=ctx.seed)`` (or ``Config()``
        when it has no seed). Override to size the defaults by ``ctx.full`` / ``ctx.shape``."""
        if given is not None:
            return given
        names = {f.name for f in dataclasses.fields(self.Config)}
        return self.Config(seed=ctx.seed) if "seed" in names else self.Config()

    def blocker(self, ctx: RunContext, cfg: C) -> str | None:
        """Why the stage cannot run on ``ctx``'s model or inputs, in one line, or None. Called
        once the model is loaded (``ctx.model``), before any stage runs."""
        return None

    def by_design(self, reason: str, backend: str | None) -> bool:
        """Whether ``reason`` (this stage's absence on a model loaded with ``backend``) means the
        stage does not apply to that kind of model, rather than that something failed: the family
        sweep counts such a stage as left out by design. Default: never."""
        return False

    def plan(self, ctx: RunContext, cfg: C) -> list[WorkingSet]:
        """The memory working sets of its forwards, from ``ctx.shape`` (never None here) and
        ``ctx.tokenizer`` (may be None: lengths bounded by bytes); [] when it holds little."""
        return []

    def fitted(self, cfg: C, batch_sizes: Mapping[str, int]) -> C:
        """``cfg`` with the batch sizes the memory plan fitted to its own working sets
        (``batch_sizes``: working set name -> batch; only those :meth:`plan` returned)."""
        return cfg

    def work(self, ctx: RunContext, cfg: C) -> Work | None:
        """Its work with these settings (:class:`~headscope.reports.stages.clock.Work`: GFLOP and
        fixed-cost calls), from ``ctx.shape`` (never None here) and its settings
        (:mod:`~headscope.reports.stages.clock`: what its loop scales with); None: not known."""
        return None

    def seconds(self, ctx: RunContext, cfg: C) -> float | None:
        """Its estimated seconds: :meth:`work` times its calibrated factor over this machine's matmul
        rate (:func:`~headscope.reports.stages.clock.seconds`); None when not known."""
        from headscope.reports.stages.clock import seconds

        return None if ctx.shape is None else seconds(self.name, self.work(ctx, cfg))

    # ----------------------------------------------------------------- the run and its report
    def run(self, ctx: RunContext, cfg: C) -> StageResult:
        """The computation on ``ctx.model``; earlier stages' frames are in ``ctx.frames``."""
        raise NotImplementedError(f"stage {self.name!r} defines no run()")

    def section(self, frames: Mapping[str, pd.DataFrame], meta: Mapping) -> list:
        """Its part of the report: :class:`~headscope.reports.document.Section` objects built from
        ``frames`` and ``meta`` alone (``meta["layers"]``, ``meta["heads"]``, its summary under
        :meth:`key`, ``meta["absent"]``). [] to show nothing."""
        return []

    def leaves_out(self, ctx: RunContext, cfg: C) -> list[str]:
        """What its quick settings leave out of ``--full``, one ``"<stage>: ..."`` clause each."""
        return []

    def describe(self, frames: Mapping[str, pd.DataFrame], summary: Mapping) -> str | None:
        """What its derived subcommand (``headscope <name>``) prints on stdout once the run is
        written, from its frames and summary alone; None: nothing."""
        return None

    # ----------------------------------------------------------------- a sharded run (--ray)
    def split(self, ctx: RunContext, cfg: C, n: int) -> list | None:
        """At most ``n`` disjoint parts of :attr:`unit` (picklable values, in order) for
        :meth:`run_part` on workers (:mod:`~headscope.reports.stages.sharded`), or None: the stage
        is not sharded yet and runs whole in the driver. Default: None."""
        return None

    def run_part(self, ctx: RunContext, cfg: C, part) -> StageResult:
        """The computation on one part from :meth:`split`, on a worker's own ``ctx.model``: per-unit
        values only (statistics over all units belong in :meth:`finish`)."""
        raise NotImplementedError(f"stage {self.name!r} is not sharded")

    def finish(self, ctx: RunContext, cfg: C, merged: StageResult) -> StageResult:
        """The stage's result from :meth:`merge` of its parts, in the driver: what needs every unit
        (multiple-comparison adjustment, bootstrap, permutation nulls) runs here, on the collected
        values, so the result does not depend on the sharding. Default: ``merged``."""
        return merged

    def merge(self, parts: Sequence[StageResult]) -> StageResult:
        """The result of the whole from results on disjoint parts of :attr:`unit`: each frame
        concatenated in order, the first part's summary. Stages whose frames do not combine this
        way (streaming statistics, nulls drawn over all units) override it or raise."""
        if not parts:
            raise ValueError(f"stage {self.name!r}: merge needs at least one part; got none")
        names = list(dict.fromkeys(k for p in parts for k in p.frames))
        frames = {k: pd.concat([p.frames[k] for p in parts if k in p.frames], ignore_index=True) for k in names}
        return StageResult(frames, dict(parts[0].summary))

    # ----------------------------------------------------------------- names
    def key(self) -> str:
        """Where meta and run.json keep its summary."""
        return self.summary_key or f"{self.name}_summary"

    def __repr__(self) -> str:
        return f"<stage {self.name}>"


def check_config_type(cls: type) -> None:
    """Raise ``TypeError`` unless ``cls`` is a frozen dataclass whose fields are all typed, none
    ``Any``, each with a default (a stage's ``Config``)."""
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"a stage's Config must be a dataclass; got {cls!r}")
    if not cls.__dataclass_params__.frozen:
        raise TypeError(f"a stage's Config must be frozen; {cls.__name__} is not")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        t = hints.get(f.name)
        if t is None or t is Any or Any in typing.get_args(t):
            raise TypeError(f"{cls.__name__}.{f.name} must have a concrete type (no Any); got {t!r}")
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} must have a default")
