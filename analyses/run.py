"""One run of the analyses on a model: its configuration (:class:`RunConfig`) and :func:`run_analyses`.

The orchestration of ``headscope report`` lives here, in analyses (reports -> analyses ->
probes): :func:`open_model` makes the model card and loads the model (a shipped name or
path, or a model a notebook holds), :func:`run_analyses` runs the head roles, the pruning
study and the patching stage on it and returns their tidy frames
(:class:`RunResult`); a stage that cannot run on the model is said before the first stage
spends any time (:func:`pruning_blocker`,
:func:`~headscope.analyses.run_patching.patching_blocker`) and recorded in ``absent``.
The report (:func:`headscope.reports.pipeline.build_report`) plans the run's memory, calls
both and writes the folder; its ``run.json`` comes from :mod:`headscope.analyses.run_json`.

Example (loads MiniLM-L6 and runs the analyses)::

    config = RunConfig(role_groups=("positional",), patching=False)
    opened = open_model("minilm-l6", config)
    result = run_analyses(opened.model, config)
    result.frames["roles"], result.absent
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from headscope.analyses.kvcache.stage import KVStageConfig, run_kv
from headscope.analyses.kvcache.stage import report_blocker as kv_report_blocker
from headscope.analyses.kvcache.stage import report_config as kv_report_config
from headscope.analyses.quick_settings import QUICK_PRUNING
from headscope.analyses.run_frames import examples_frame, prune_frames, skipped_frame
from headscope.analyses.run_patching import CAUSAL_METHOD, patching_blocker, run_patching
from headscope.analyses.run_weights import WeightsConfig, run_weights, weights_blocker
from headscope.probes.allocator import trim_heap
from headscope.probes.errors import HeadscopeError

log = logging.getLogger(__name__)

__all__ = [
    "BACKEND_CHOICES",
    "CAUSAL_METHOD",
    "CausalConfig",
    "OpenedModel",
    "RunConfig",
    "RunResult",
    "open_model",
    "pruning_blocker",
    "run_analyses",
]

#: ``RunConfig.backend``: ``"auto"`` or one of the backends of :func:`~headscope.probes.models.loading.load_model`
BACKEND_CHOICES = ("auto", "inhouse", "bridge", "hf")


@dataclass(frozen=True, kw_only=True)
class CausalConfig:
    """The report's patching stage: activation (denoising) and attribution patching of every
    head on each role's task (:attr:`~headscope.analyses.roles.base.Role.task`;
    :mod:`headscope.analyses.run_patching`).

    ``unit``: ``"head"`` or ``"kv_group"`` (the query heads sharing a KV head patched
    together, each given the group's effect); None: ``"kv_group"`` in quick mode on a model
    with GQA groups (a third of the forwards on SmolLM2), ``"head"`` otherwise and in full mode.
    ``n_items``: items per task; None: quick mode takes ``row_budget // (units × tasks)``
    items per task, clipped to ``[min_items, max_items]`` (activation patching runs one
    sequence per unit and item, so the budget bounds the stage's cost on any model), full
    mode ``max_items``. ``batch_size``, ``n_boot``, ``n_perm``, ``alpha``, ``seed``: as
    :class:`~headscope.analyses.patching.activation.PatchConfig`; ``top_k``: the heads
    compared (largest effects, and the role's best by attention score)."""

    unit: str | None = None
    n_items: int | None = None
    row_budget: int = 1500
    min_items: int = 4
    max_items: int = 64
    batch_size: int = 16
    max_rows: int = 144  # sequences per forward (PatchConfig's default); lowered only to fit in memory
    top_k: int = 10
    n_boot: int = 500
    n_perm: int = 2000
    alpha: float = 0.05
    seed: int = 0

    def __post_init__(self):
        for k in ("row_budget", "min_items", "max_items", "batch_size", "max_rows", "top_k"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"The {k!r} parameter of CausalConfig must be a positive int; got {v!r}.")
        if self.n_items is not None and (
            isinstance(self.n_items, bool) or not isinstance(self.n_items, int) or self.n_items < 2
        ):
            raise ValueError(
                f"The 'n_items' parameter of CausalConfig must be None or an int >= 2; got {self.n_items!r}."
            )
        if self.unit not in (None, "head", "kv_group"):
            raise ValueError(
                f"The 'unit' parameter of CausalConfig must be None, 'head' or 'kv_group'; got {self.unit!r}."
            )
        if self.min_items > self.max_items:
            raise ValueError(f"min_items must be <= max_items; got {self.min_items} and {self.max_items}")

    def unit_for(self, spec, *, full: bool) -> str:
        """The patching unit on a model of ``spec`` (see the class docstring)."""
        if self.unit is not None:
            return self.unit
        gqa = 0 < int(getattr(spec, "n_kv_heads", 0) or 0) < spec.n_heads
        return "kv_group" if gqa and not full else "head"

    def items_per_task(self, *, n_heads: int, n_tasks: int, full: bool) -> int:
        """Items per task (see the class docstring).

        >>> CausalConfig().items_per_task(n_heads=90, n_tasks=4, full=False)
        4
        >>> CausalConfig().items_per_task(n_heads=72, n_tasks=4, full=False), CausalConfig().items_per_task(n_heads=72, n_tasks=4, full=True)
        (5, 64)
        """
        if self.n_items is not None:
            return self.n_items
        if full:
            return self.max_items
        return int(min(self.max_items, max(self.min_items, self.row_budget // max(1, n_heads * n_tasks))))


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What one run of the analyses does: the model's load, the stages and their settings.

    ``backend``: ``"auto"`` (the loader's choice; a held model keeps its own backend),
    ``"inhouse"``, ``"bridge"`` or ``"hf"``; ``dtype`` / ``device`` / ``device_map`` /
    ``trust_remote_code``: as :func:`~headscope.probes.models.loading.load_model`.
    ``full``: every pruning study on all items, and the patching stage's full settings
    (default: the quick stage, :data:`~headscope.analyses.quick_settings.QUICK_PRUNING`).
    ``seed``: every random draw. ``roles_config`` / ``prune_config`` / ``causal_config``:
    the stages' settings (None: the defaults for ``seed`` and ``full``, see :meth:`roles`,
    :meth:`pruning`, :meth:`causal`). ``role_groups``: a subset of the registered role
    groups (default all); ``role_inputs``: ``text`` / ``conllu`` / ``coref`` for
    :func:`~headscope.analyses.roles.pipeline.head_roles` (default: the shipped corpora).
    ``patching``: run the patching stage. ``weights``: run the weights stage (circuits from
    the weights, joined with the roles and patching: :mod:`~headscope.analyses.run_weights`).
    ``kv``: run the KV-cache stage on a causal decoder (:mod:`~headscope.analyses.kvcache.stage`).
    ``weights_config`` / ``kv_config``: those stages' settings
    (:class:`~headscope.analyses.run_weights.WeightsConfig`,
    :class:`~headscope.analyses.kvcache.stage.KVStageConfig`; None: their defaults for ``seed``).
    ``large_cost``: the parameters × heads over which the report's quick mode takes its large-model
    settings (None: :data:`~headscope.analyses.quick_settings.LARGE_COST`).

    >>> RunConfig(seed=3).pruning().seed, RunConfig(full=True).pruning().quick
    (3, False)
    >>> RunConfig(backend="onnx")
    Traceback (most recent call last):
    ...
    ValueError: backend must be 'auto', 'inhouse', 'bridge' or 'hf'; got 'onnx'
    """

    backend: str = "auto"
    full: bool = False
    seed: int = 0
    roles_config: Any = None
    prune_config: Any = None
    causal_config: CausalConfig | None = None
    role_groups: Any = None
    role_inputs: dict | None = field(default=None, compare=False)
    trust_remote_code: bool = False
    dtype: str = "fp32"
    device: Any = None
    device_map: str | None = None
    patching: bool = True
    weights: bool = True
    kv: bool = True
    weights_config: Any = None
    kv_config: Any = None
    large_cost: float | None = None

    def __post_init__(self):
        if self.backend not in BACKEND_CHOICES:
            raise ValueError(f"backend must be 'auto', 'inhouse', 'bridge' or 'hf'; got {self.backend!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer; got {self.seed!r}")

    def roles(self):
        """The role analyses' :class:`~headscope.analyses.roles.config.RolesConfig` (default ``RolesConfig(seed=seed)``)."""
        from headscope.analyses.roles.config import RolesConfig

        return self.roles_config if self.roles_config is not None else RolesConfig(seed=self.seed)

    def pruning(self):
        """The pruning study's :class:`~headscope.analyses.pruning.study.PruneConfig`: ``prune_config``,
        else the quick stage (:data:`~headscope.analyses.quick_settings.QUICK_PRUNING`: no mean
        ablation, an extra corpus pass and H more evaluations, nor all-but-one, H more evaluations),
        or with ``full`` every study, both ablation modes, on all items."""
        from headscope.analyses.pruning.study import PruneConfig

        if self.prune_config is not None:
            return self.prune_config
        return PruneConfig(seed=self.seed) if self.full else PruneConfig(**QUICK_PRUNING, seed=self.seed)

    def causal(self) -> CausalConfig:
        """The patching stage's :class:`CausalConfig` (default ``CausalConfig(seed=seed)``)."""
        return self.causal_config if self.causal_config is not None else CausalConfig(seed=self.seed)

    def resolved(self, *, roles=None, pruning=None, causal=None) -> RunConfig:
        """This config with every stage's settings filled in (:meth:`roles`, :meth:`pruning`,
        :meth:`causal`), or replaced by those given (a memory plan's fitted batch sizes)."""
        return dataclasses.replace(
            self,
            roles_config=roles if roles is not None else self.roles(),
            prune_config=pruning if pruning is not None else self.pruning(),
            causal_config=causal if causal is not None else self.causal(),
        )

    def settings(self) -> dict:
        """run.json's ``config``: ``{"roles": ..., "pruning": ..., "patching": ...}``, each stage's settings as a dict."""
        return {
            "roles": _cfg_dict(self.roles()),
            "pruning": _cfg_dict(self.pruning()),
            "patching": _cfg_dict(self.causal()),
        }


def _cfg_dict(cfg) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}


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


# ----------------------------------------------------------------- the model
@dataclass
class OpenedModel:
    """A run's loaded ``model``, its ``card`` (and ``card_text``), the ``model_file`` record
    (``path``, ``name``, ``sha256``; None for a held model), the ``name`` run.json records as
    ``model_arg``, and the ``timings`` of the card and the load."""

    model: Any
    card: dict
    card_text: str
    model_file: dict
    name: str
    timings: dict[str, float] = field(default_factory=dict)


def open_model(model, config: RunConfig, *, progress=None) -> OpenedModel:
    """The model card and the loaded model of a run. ``model``: a shipped name or a path (its
    card from the checkpoint, its weights' SHA-256, then the load, each timed), or a model a
    notebook holds: what :func:`~headscope.probes.models.loading.load_model` returned, or what
    it takes (a transformer-lens ``TransformerBridge``; its card from the model's HF config;
    ``backend="auto"`` keeps the model's own backend)."""
    from headscope.probes.models.card import model_card, render_card, with_purpose
    from headscope.probes.models.checkpoints import resolve
    from headscope.probes.models.loading import load_model

    load = dict(
        dtype=config.dtype,
        device=config.device,
        device_map=config.device_map,
        trust_remote_code=config.trust_remote_code,
    )
    timings: dict[str, float] = {}
    if isinstance(model, (str, os.PathLike)):
        with timed(timings, "card", progress):
            source = resolve(model)  # once: the card, the hash and the load share it
            card = model_card(source)
            card_text, model_file = render_card(card), _model_hash(source)
        with timed(timings, "load", progress):
            loaded = load_model(source, config.backend, **load)
            trim_heap()  # the loading copy's blocks, freed into the heap, go back to the system
        card, card_text = with_purpose(card, loaded)  # #47: what it is for, decided at load
        return OpenedModel(loaded, card, card_text, model_file, model, timings)
    loaded = load_model(model, None if config.backend == "auto" else config.backend, **load)
    card, card_text = with_purpose(_card_of_model(loaded)[0], loaded)  # #47: what it is for, decided at load
    return OpenedModel(loaded, card, card_text, {"path": None, "name": None, "sha256": None}, loaded.spec.name, timings)


def _card_of_model(model):
    from headscope.probes.models.card import card_from_hf_config, render_card
    from headscope.probes.models.loading import hf_config_of

    cfg = hf_config_of(model)
    if cfg is None:
        raise ValueError(f"{model.spec.name!r}: no HF configuration to make the model card from")
    card = card_from_hf_config(cfg, name=model.spec.name)
    return card, render_card(card)


def _model_hash(source) -> dict:
    from headscope.probes.models.checkpoints import file_sha256, resolve

    f = resolve(source).file_for_hash
    return {"path": str(f) if f else None, "name": f.name if f else None, "sha256": file_sha256(f) if f else None}


# ----------------------------------------------------------------- the stages
def pruning_blocker(model, prune_config) -> str | None:
    """Why the pruning stage cannot run on ``model`` (its backend has no head hooks, or the
    metric reads another kind of model), or None — checked before the first stage runs."""
    from headscope.analyses.pruning.metrics import METRICS, check_kind, default_metric
    from headscope.probes.errors import ModelIncompatibleError
    from headscope.probes.models.backends.protocol import check_head_hooks

    metric = prune_config.metric or default_metric(model)
    try:
        check_head_hooks(model)
        check_kind(metric, METRICS[metric], model)
    except (ModelIncompatibleError, ValueError) as e:
        return str(e)
    return None


def blockers(model, config: RunConfig) -> dict[str, str]:
    """``{stage: why it cannot run}`` for the pruning and patching stages of ``config`` on
    ``model``, known before the first stage spends any time (each logged as a warning)."""
    absent = {}
    if (why := pruning_blocker(model, config.pruning())) is not None:
        absent["pruning"] = why
        log.warning("pruning will not run: %s", why)
    if not config.weights:
        absent["weights"] = "turned off (--no-weights)"
    elif (why := weights_blocker(model)) is not None:
        absent["weights"] = why
        log.warning("the weights stage will not run: %s", why)
    if not config.kv:
        absent["kv"] = "turned off (--no-kv)"
    elif (why := kv_report_blocker(model)) is not None:
        absent["kv"] = why  # by design on an encoder: no warning
    if not config.patching:
        absent["patching"] = "turned off (--no-patching)"
    elif (why := patching_blocker(model)) is not None:
        absent["patching"] = why
        log.warning("patching will not run: %s", why)
    return absent


@dataclass
class RunResult:
    """What :func:`run_analyses` measured. ``frames``: the tidy frames (``roles``, ``stats``,
    ``examples``, ``clusters``, ``coref_pairs``, the pruning study's ``prune_*`` and
    ``roles_vs_importance``, ``patching``, ``skipped``); ``absent``: stage -> why it did not
    run; ``n_items``: items each role group used; ``timings``: seconds per stage (``roles.<stage>``
    for the role analyses' own); ``prune_summary`` (its ``metric``) and ``patching_summary``:
    the stages' summaries (``{}`` when they did not run); ``config``: the settings run;
    ``weights_summary``, ``kv_summary``: the weights and KV stages' (``{}`` when they did not run)."""

    frames: dict[str, pd.DataFrame]
    absent: dict[str, str]
    n_items: dict[str, int]
    timings: dict[str, float]
    prune_summary: dict
    patching_summary: dict
    config: RunConfig
    weights_summary: dict = field(default_factory=dict)
    kv_summary: dict = field(default_factory=dict)

    @property
    def prune_metric(self) -> str | None:
        return self.prune_summary.get("metric") if self.prune_summary else None


def run_analyses(model, config: RunConfig, *, progress=None, roles_progress=None) -> RunResult:
    """Run the head roles, the pruning study (with the roles frame, so that it ablates each
    role's top heads against random ones) and the patching stage (each role's task) on the
    loaded ``model``. ``progress(stage, done, total)`` is told of the pruning and patching
    stages; ``roles_progress`` (default ``progress``) of the role analyses' stages. A stage that
    cannot run on the model is left out and said in ``absent`` (:func:`blockers`)."""
    from headscope.analyses.pruning.study import pruning_study
    from headscope.analyses.roles.pipeline import head_roles

    config = config.resolved()
    absent = blockers(model, config)
    timings: dict[str, float] = {}
    with timed(timings, "roles"):
        rr = head_roles(
            model,
            cfg=config.roles(),
            progress=progress if roles_progress is None else roles_progress,
            roles=config.role_groups,
            **(config.role_inputs or {}),
        )
    frames: dict[str, pd.DataFrame] = {
        "roles": rr.frame.reset_index(drop=True),
        "stats": rr.stats.reset_index(drop=True),
        "examples": examples_frame(rr.examples),
        "clusters": rr.clusters.reset_index(drop=True),
        "coref_pairs": rr.coref_pairs.reset_index(drop=True),
    }
    prune_summary, patch_summary = {}, {}
    if "pruning" not in absent:
        with timed(timings, "pruning"):  # pruning_study reports its own parts
            pr = pruning_study(model, config.pruning(), None, roles=frames["roles"], progress=progress)
        frames.update(prune_frames(pr.tables))
        prune_summary = pr.summary
    if "patching" not in absent:
        with timed(timings, "patching", progress):
            frames["patching"], patch_summary = run_patching(model, frames["roles"], config.causal(), full=config.full)
    weights_summary = {}
    if "weights" not in absent:  # last: its draws use their own generators, after every other stage
        with timed(timings, "weights", progress):
            wcfg = config.weights_config or WeightsConfig(seed=config.seed)
            weight_frames, weights_summary = run_weights(model, frames, wcfg)
        frames.update(weight_frames)
    kv_summary = {}
    if "kv" not in absent:  # after the others: it restores every cache and draws from its own seeded generators
        try:
            kc = config.kv_config or KVStageConfig()
            with timed(timings, "kv", progress):
                kv_frames, kv_summary = run_kv(
                    model,
                    kv_report_config(model, config.seed, kc.tokens),
                    role_items=kc.role_items,
                    role_tokens=kc.role_tokens,
                    causal_items=kc.causal_items,
                    logit_rows=kc.logit_rows,
                )
            frames.update(kv_frames)
        except (HeadscopeError, ValueError) as e:  # inputs the tokenizer or context cannot give: said, not fatal
            absent["kv"] = f"the KV-cache stage could not run: {str(e).splitlines()[0]}"
            log.warning("%s", absent["kv"])
    frames["skipped"] = skipped_frame(rr.skipped)
    timings.update({f"roles.{k}": round(float(v), 3) for k, v in rr.timings.items()})
    return RunResult(
        frames, absent, dict(rr.n_items), timings, prune_summary, patch_summary, config, weights_summary, kv_summary
    )
