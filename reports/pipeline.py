"""``build_report``: run the analyses on a model and write the report folder.

The one place in ``reports/`` that calls the analyses (model card, head roles, pruning
study, patching on each role's task: :data:`ROLE_TASKS`); everything after :func:`run_analyses` works on frames only
(:func:`write_report`). ``<out>`` is claimed before the analyses run (refused at once
when it is a file, holds anything but an earlier report, or another run is writing it),
the folder is written into ``<out>.tmp-<pid>`` and swapped in whole once complete
(:mod:`headscope.probes.outputs.folder`), so a crash never leaves a half report that
looks complete, nor no report at all.

Folder layout::

    report.html      self-contained (inline CSS, images as data URIs)
    report.md        same findings; figures under figures/
    figures/*.png
    tables/*.csv, tables/*.parquet   tidy frames (roles, stats, examples, prune_*, patching, ...)
    run.json         config, versions, model file SHA-256, seed, timings, skipped counts

Example (runs the analyses)::

    result = build_report("minilm-l6", out_dir="runs/report-minilm-l6")
    result.paths["html"], result.summary["roles"]["positional:previous"]["top"][0]
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
import time
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from headscope.analyses.quick_settings import QUICK_PRUNING, QUICK_STUDIES  # noqa: F401 - QUICK_STUDIES kept for callers
from headscope.probes.budget import peak_rss_bytes
from headscope.probes.outputs.atomic import atomic_write, write_frame, write_json
from headscope.probes.outputs.folder import claim_output
from headscope.probes.outputs.kinds import manifest_header
from headscope.probes.outputs.swap import recover as recover_out  # noqa: F401 - kept for callers of the old name
from headscope.reports import figures as F
from headscope.reports.html import render_html
from headscope.reports.markdown import render_markdown
from headscope.reports.sections import build_document
from headscope.reports.sections.pruning import curves_frame
from headscope.reports.sections.role_detail import top_heads

log = logging.getLogger(__name__)

SKIPPED_COLUMNS = ["analysis", "reason", "count"]
VERSION_PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "transformer_lens": "transformer-lens",
    "headscope": "headscope",
    "numpy": "numpy",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
}


@dataclass
class ReportResult:
    """``frames``: the tidy frames written under tables/; ``paths``: html, markdown,
    run_json, out_dir; ``summary``: what the terminal shows (JSON-serialisable);
    ``timings``: seconds per stage."""

    frames: dict[str, pd.DataFrame]
    paths: dict[str, Path]
    summary: dict
    timings: dict[str, float] = field(default_factory=dict)


def versions() -> dict[str, str | None]:
    out = {}
    for key, dist in VERSION_PACKAGES.items():
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    return out


@contextmanager
def _timed(timings: dict, stage: str, progress):
    if progress:
        progress(stage, 0, None)  # length unknown until the stage reports it
    t0 = time.perf_counter()
    yield
    timings[stage] = round(time.perf_counter() - t0, 3)
    if progress:
        progress(stage, 1, 1)


# ----------------------------------------------------------------- adapters: analyses -> frames
def skipped_frame(skipped) -> pd.DataFrame:
    """Skipped counts as a tidy frame (analysis, reason, count) from a ``Counter`` of
    reasons, a dict ``{analysis: Counter}``, or ``{(analysis, reason): n}``.

    >>> skipped_frame({"syntactic": Counter({"too long": 2}), "coref": Counter()}).to_dict("records")
    [{'analysis': 'syntactic', 'reason': 'too long', 'count': 2}]
    """
    rows = []
    if isinstance(skipped, pd.DataFrame):
        return skipped.reindex(columns=SKIPPED_COLUMNS)
    for key, val in (skipped or {}).items():
        if isinstance(val, (dict, Counter)):
            rows += [(str(key), str(r), int(n)) for r, n in val.items() if n]
        elif isinstance(key, tuple) and len(key) == 2:
            rows.append((str(key[0]), str(key[1]), int(val)))
        elif val:
            rows.append(("all", str(key), int(val)))
    df = pd.DataFrame(rows, columns=SKIPPED_COLUMNS)
    return df.sort_values(["analysis", "reason"], kind="stable").reset_index(drop=True)


def _as_array(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=float)


WORD_MASS_MIN = 0.5  # below this mean word-level row mass, an example is drawn at token level


def _mean_row_mass(pat) -> float:
    a = _as_array(pat)
    return float(a.sum(axis=-1).mean()) if a.ndim == 2 and a.size else 0.0


def examples_frame(examples) -> pd.DataFrame:
    """Example attention maps as EXAMPLE_COLUMNS rows.

    Accepts a frame with those columns, or :attr:`RolesResult.examples`: a mapping
    ``{example key: record}`` where a record carries ``layer``, ``head``, ``words``, a
    word-level ``word_pattern`` (or ``pattern``) [query word][key word], and optionally
    ``role``, ``relation``, ``direction``, ``sentence``, ``marks`` (gold (query, key)
    word pairs), ``tokens`` and ``token_pattern``. The token-level pattern is drawn instead
    when the record has no words or when its word-level rows hold less than
    :data:`WORD_MASS_MIN` of the attention on average (a head looking at [CLS]/[SEP]/BOS,
    which belong to no word). Records whose pattern does not match the words are left out.
    """
    if examples is None:
        return pd.DataFrame(columns=F.EXAMPLE_COLUMNS)
    if isinstance(examples, pd.DataFrame):
        missing = [c for c in F.EXAMPLE_COLUMNS if c not in examples]
        if missing:
            raise ValueError(f"examples frame lacks columns {missing}; expected {F.EXAMPLE_COLUMNS}")
        return examples[F.EXAMPLE_COLUMNS].reset_index(drop=True)
    if not isinstance(examples, dict):
        raise TypeError(f"examples must be a DataFrame or a dict of records; got {type(examples).__name__}")
    rows = []
    for key, r in examples.items():
        if not isinstance(r, dict) or "layer" not in r or "head" not in r:
            continue
        level, pat, words = "word", r.get("word_pattern", r.get("pattern")), list(r.get("words") or [])
        has_tokens = r.get("token_pattern") is not None and bool(r.get("tokens"))
        # token level where there are no words (induction sequences) or where the word-level map would hide
        # where the head looks: most of its attention on special tokens, which belong to no word
        if has_tokens and (pat is None or not len(words) or _mean_row_mass(pat) < WORD_MASS_MIN):
            level, pat, words = "token", r["token_pattern"], list(r["tokens"])
        if pat is None:
            continue
        pat = _as_array(pat)
        words = [str(w) for w in words]
        if pat.ndim != 2 or pat.shape != (len(words), len(words)):
            log.warning(
                "example %r: pattern shape %s does not match %d %ss; left out", key, pat.shape, len(words), level
            )
            continue
        gold = {(int(m[0]), int(m[1])) for m in (r.get("marks") or []) if len(m) == 2} if level == "word" else set()
        sentence = str(r.get("sentence") or r.get("text") or " ".join(words))
        role = str(r.get("role") or str(key).split(":")[0])
        for i in range(pat.shape[0]):
            for j in range(pat.shape[1]):
                rows.append(
                    (
                        str(key),
                        role,
                        str(r.get("relation") or ""),
                        str(r.get("direction") or ""),
                        int(r["layer"]),
                        int(r["head"]),
                        level,
                        sentence,
                        i,
                        j,
                        words[i],
                        words[j],
                        float(pat[i, j]),
                        (i, j) in gold,
                    )
                )
    return pd.DataFrame(rows, columns=F.EXAMPLE_COLUMNS)


def prune_frames(tables) -> dict[str, pd.DataFrame]:
    """A pruning study's :class:`~headscope.analyses.pruning.study.PruneTables` -> the
    report's tables: ``prune_<file name>`` for each study table (baseline, ablation,
    all_but_one, importance, curves, curve_summary, prunable) and ``roles_vs_importance``
    for the role ablation."""
    from headscope.analyses.pruning.study import TABLE_FILES

    out = {}
    for field_name, file_name in TABLE_FILES.items():
        df = getattr(tables, field_name)
        if df is None:
            continue
        name = "roles_vs_importance" if field_name == "role_ablation" else f"prune_{file_name}"
        out[name] = df.reset_index(drop=True)
    return out


# ----------------------------------------------------------------- stages that call the analyses
def _run_card(model_name: str):
    from headscope.probes.models.card import model_card, render_card

    card = model_card(model_name)
    return card, render_card(card)


def _card_of_model(model):
    from headscope.probes.models.card import card_from_hf_config, render_card
    from headscope.probes.models.loading import hf_config_of

    cfg = hf_config_of(model)
    if cfg is None:
        raise ValueError(f"{model.spec.name!r}: no HF configuration to make the model card from")
    card = card_from_hf_config(cfg, name=model.spec.name)
    return card, render_card(card)


def _load(model_name, backend: str, trust_remote_code: bool = False, *, dtype="fp32", device=None, device_map=None):
    from headscope.probes.models.loading import load_model

    return load_model(
        model_name, backend, dtype=dtype, device=device, device_map=device_map, trust_remote_code=trust_remote_code
    )


def _model_hash(model_name: str) -> dict:
    from headscope.probes.models.checkpoints import file_sha256, resolve

    f = resolve(model_name).file_for_hash
    return {"path": str(f) if f else None, "name": f.name if f else None, "sha256": file_sha256(f) if f else None}


def _run_roles(model, *, seed: int, roles_config, progress, role_groups=None, role_inputs=None):
    from headscope.analyses.roles.config import RolesConfig
    from headscope.analyses.roles.pipeline import head_roles

    cfg = roles_config or RolesConfig(seed=seed)
    return head_roles(
        model, cfg=cfg, progress=progress, roles=role_groups, **(role_inputs or {})
    ), cfg  # progress(stage, done, total), stages text/syntactic/...


def _prune_config(*, full: bool, seed: int, prune_config):
    from headscope.analyses.pruning.study import PruneConfig

    if prune_config is not None:
        return prune_config
    # the quick report leaves out mean ablation (an extra corpus pass and H more evaluations)
    # and all-but-one (H more evaluations); --full runs every study, both ablation modes, on all items
    if full:
        return PruneConfig(seed=seed)
    return PruneConfig(**QUICK_PRUNING, seed=seed)  # the quick stage, defined once (analyses.quick_settings)


def pruning_blocker(model, prune_config) -> str | None:
    """Why the pruning stage cannot run on ``model`` (its backend has no head hooks, or the
    metric reads another kind of model), or None — checked before the first stage runs."""
    from headscope.analyses.pruning.ablation import check_head_hooks
    from headscope.analyses.pruning.metrics import METRICS, check_kind, default_metric
    from headscope.probes.errors import ModelIncompatibleError

    metric = prune_config.metric or default_metric(model.spec)
    try:
        check_head_hooks(model)
        check_kind(metric, METRICS[metric], model.spec)
    except (ModelIncompatibleError, ValueError) as e:
        return str(e)
    return None


def _run_pruning(model, prune_config, *, roles: pd.DataFrame | None, progress=None):
    """The pruning study in memory (the report folder is the output), with the roles
    frame so that it ablates each role's top heads against random ones."""
    from headscope.analyses.pruning.study import pruning_study

    return pruning_study(model, prune_config, None, roles=roles, progress=progress)


# ----------------------------------------------------------------- patching: causal evidence per role
#: The patching task that tests each role, by task name (looked up in
#: :data:`~headscope.analyses.patching.tasks.TASKS` at run time: a task not registered
#: leaves its roles "without a task"). Keys are role names of the roles frame, or
#: ``"role:relation"`` for one relation of a role (a role ``a:b`` falls back to ``a``):
#:
#: * ``induction`` -> ``induction`` (repeated random tokens: the log-prob of the token the
#:   induction rule predicts);
#: * ``coreference`` (``coreference:winograd``/``:gender``/``:number``) -> ``coreference``
#:   (the two candidates of Winograd-style pairs);
#: * ``syntactic:nsubj`` (subject <-> verb) -> ``agreement`` (subject-verb number agreement);
#: * ``previous-token``, ``positional:previous``, ``duplicate-token`` -> ``duplicate_token``.
ROLE_TASKS: dict[str, str] = {
    "induction": "induction",
    "coreference": "coreference",
    "syntactic:nsubj": "agreement",
    "previous-token": "duplicate_token",
    "positional:previous": "duplicate_token",
    "duplicate-token": "duplicate_token",
}
#: the patching method the report ranks heads by (the other, attribution, is compared with it)
CAUSAL_METHOD = "activation_denoising"


@dataclass(frozen=True, kw_only=True)
class CausalConfig:
    """The report's patching stage: activation (denoising) and attribution patching of every
    head on each role's task (:data:`ROLE_TASKS`).

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


def task_for_role(role: str, relation: str = "") -> str | None:
    """The registered patching task of ``role`` (and ``relation``), or None (:data:`ROLE_TASKS`).

    >>> task_for_role("syntactic", "nsubj"), task_for_role("syntactic", "det"), task_for_role("coreference:gender")
    ('agreement', None, 'coreference')
    """
    from headscope.analyses.patching.tasks import TASKS

    keys = [f"{role}:{relation}"] if relation else []
    keys += [role, str(role).split(":")[0]]
    for key in keys:
        if key in ROLE_TASKS:
            return ROLE_TASKS[key] if ROLE_TASKS[key] in TASKS else None
    return None


def causal_roles(roles: pd.DataFrame | None) -> pd.DataFrame:
    """The roles of a roles frame with a patching task: columns ``label`` (``role`` or
    ``role:relation``), ``role``, ``relation`` ("" for the whole role), ``task``; one row per
    label, in the frame's role order."""
    rows = []
    if roles is not None and not roles.empty:
        rel = roles["relation"].astype(str) if "relation" in roles else pd.Series("", index=roles.index)
        pairs = pd.DataFrame({"role": roles["role"].astype(str), "relation": rel}).drop_duplicates()
        for r in pairs.itertuples(index=False):
            whole = task_for_role(r.role)
            if whole is not None:
                rows.append((r.role, r.role, "", whole))
            elif r.relation and (t := task_for_role(r.role, r.relation)) is not None:
                rows.append((f"{r.role}:{r.relation}", r.role, r.relation, t))
    return pd.DataFrame(rows, columns=["label", "role", "relation", "task"]).drop_duplicates("label")


def patching_blocker(model) -> str | None:
    """Why the patching stage cannot run on ``model`` at all (no head hooks on its backend,
    or every role's task refused), or None — checked before the roles stage spends time."""
    from headscope.analyses.patching.tasks import TASKS, load_task
    from headscope.analyses.pruning.ablation import check_head_hooks
    from headscope.probes.errors import HeadscopeError

    try:
        check_head_hooks(model)
    except (HeadscopeError, ValueError) as e:
        return str(e)
    names = [t for t in dict.fromkeys(ROLE_TASKS.values()) if t in TASKS]
    if not names:
        return "no role task is registered (analyses.patching.tasks.TASKS)"
    why = {}
    for t in names:
        try:
            with warnings.catch_warnings():  # unusable items: the stage records them
                warnings.simplefilter("ignore")
                load_task(model, t, n_items=2)
        except (HeadscopeError, ValueError) as e:
            why[t] = str(e)
    if len(why) == len(names):
        return "; ".join(dict.fromkeys(why.values()))
    return None


def _run_patching(model, roles: pd.DataFrame, cfg: CausalConfig, *, full: bool):
    """Activation (denoising) + attribution patching on the task of each role of ``roles``
    that has one -> ``(frame, summary)``: the frame is ``task`` + the patching frame's columns
    (:data:`~headscope.analyses.patching.frames.PATCH_COLUMNS`, ``p_raw``, ``unit``) of every
    task; the summary holds ``roles`` (:func:`causal_roles` records), ``tasks`` (each task's
    ``patching_study`` summary + ``warnings``), ``refused`` (task -> reason), ``n_items``,
    ``unit``, ``method``, ``top_k``, ``seconds``. A task the model refuses is recorded in
    ``refused``, never raised."""
    from headscope.analyses.patching.activation import PatchConfig
    from headscope.analyses.patching.frames import PATCH_COLUMNS
    from headscope.analyses.patching.study import StudyConfig, patching_study
    from headscope.analyses.patching.tasks import load_task
    from headscope.probes.errors import HeadscopeError

    todo = causal_roles(roles)
    tasks = list(dict.fromkeys(todo["task"]))
    unit = cfg.unit_for(model.spec, full=full)
    per_layer = len(model.spec.kv_groups()) if unit == "kv_group" else model.spec.n_heads
    n_items = cfg.items_per_task(n_heads=model.spec.n_layers * per_layer, n_tasks=max(1, len(tasks)), full=full)
    study = StudyConfig(
        methods=("activation", "attribution"),
        patch=PatchConfig(
            directions=("denoising",),
            unit=unit,
            batch_size=cfg.batch_size,
            max_rows=cfg.max_rows,
            alpha=cfg.alpha,
            n_boot=cfg.n_boot,
            n_perm=cfg.n_perm,
            seed=cfg.seed,
        ),
        top_k=cfg.top_k,
    )
    frames, summaries, refused, seconds = [], {}, {}, {}
    for t in tasks:
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:  # unusable items, a task without a gap
                warnings.simplefilter("always")
                task = load_task(model, t, n_items=n_items, seed=cfg.seed)
                res = patching_study(model, task, study)
        except (HeadscopeError, ValueError) as e:
            refused[t] = str(e)
            log.warning("patching task %s refused: %s", t, e)
            continue
        seconds[t] = round(time.perf_counter() - t0, 3)
        f = res.frame.copy()
        f.insert(0, "task", t)
        frames.append(f)
        summaries[t] = {**res.summary, "warnings": sorted({str(w.message) for w in caught})}
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["task", *PATCH_COLUMNS])
    for c in ("task", "method"):
        frame[c] = frame[c].astype(str)
    summary = {
        "roles": todo.to_dict("records"),
        "tasks": summaries,
        "refused": refused,
        "n_items": n_items,
        "unit": unit,
        "method": CAUSAL_METHOD,
        "top_k": cfg.top_k,
        "seconds": seconds,
    }
    return frame, summary


def run_analyses(
    model_name: str = "minilm-l6",
    *,
    backend: str = "auto",
    full: bool = False,
    seed: int = 0,
    progress=None,
    roles_config=None,
    prune_config=None,
    role_groups=None,
    role_inputs=None,
    trust_remote_code: bool = False,
    dtype: str = "fp32",
    device=None,
    device_map: str | None = None,
    patching: bool = True,
    causal_config: CausalConfig | None = None,
    notice=None,
):
    """Run card, roles, pruning and patching; return ``(frames, card, card_text, meta)``.
    Before the model loads, the run's peak memory is estimated and its batch sizes fitted to
    what is available (:mod:`headscope.reports.budget`; ``MemoryBudgetError`` when nothing
    fits); ``notice(line)``, when given, receives the estimate and, once the first batch of
    the role analyses is timed, the estimated time; ``meta["memory"]`` records both with the peak.
    ``patching``: run the patching stage (:data:`ROLE_TASKS`, :class:`CausalConfig`; default
    ``CausalConfig(seed=seed)``); its frame is ``frames["patching"]``, its summary
    ``meta["patching_summary"]``.
    ``dtype``/``device``/``device_map``: see :func:`~headscope.probes.models.loading.load_model`.
    ``role_groups``: a subset of :data:`headscope.analyses.roles.pipeline.ROLE_GROUPS` (default all);
    ``role_inputs``: ``text``/``conllu``/``coref`` for :func:`~headscope.analyses.roles.pipeline.head_roles`
    (default: the shipped corpora)."""
    from headscope.analyses.roles.config import RolesConfig
    from headscope.reports import budget as memory

    timings: dict[str, float] = {}
    pcfg = _prune_config(full=full, seed=seed, prune_config=prune_config)
    ccfg = causal_config or CausalConfig(seed=seed)
    budget, roles_config, pcfg, ccfg = memory.report_start(
        model_name,
        dtype=dtype,
        device=device,
        rcfg=roles_config or RolesConfig(seed=seed),
        pcfg=pcfg,
        ccfg=ccfg,
        groups=role_groups,
        role_inputs=role_inputs,
        patching=patching,
        notice=notice,
    )
    if isinstance(model_name, (str, os.PathLike)):
        with _timed(timings, "card", progress):
            card, card_text = _run_card(model_name)
            model_file = _model_hash(model_name)
        with _timed(timings, "load", progress):
            model = _load(model_name, backend, trust_remote_code, dtype=dtype, device=device, device_map=device_map)
    else:  # a model a notebook holds: load_model's result, or what it takes (a TransformerBridge)
        model = _load(
            model_name,
            None if backend == "auto" else backend,
            trust_remote_code,
            dtype=dtype,
            device=device,
            device_map=device_map,
        )
        card, card_text = _card_of_model(model)
        model_file = {"path": None, "name": None, "sha256": None}
        model_name = model.spec.name
    absent = {}  # stage -> why it cannot run, known before the first stage spends any time
    if (why := pruning_blocker(model, pcfg)) is not None:
        absent["pruning"] = why
        log.warning("pruning will not run: %s", why)
    if not patching:
        absent["patching"] = "turned off (--no-patching)"
    elif (why := patching_blocker(model)) is not None:
        absent["patching"] = why
        log.warning("patching will not run: %s", why)
    with _timed(timings, "roles", None):
        rr, rcfg = _run_roles(
            model,
            seed=seed,
            roles_config=roles_config,
            progress=memory.report_timer(progress, budget, role_groups, roles_config, role_inputs, notice),
            role_groups=role_groups,
            role_inputs=role_inputs,
        )
    frames: dict[str, pd.DataFrame] = {
        "roles": rr.frame.reset_index(drop=True),
        "stats": rr.stats.reset_index(drop=True),
        "examples": examples_frame(rr.examples),
        "clusters": rr.clusters.reset_index(drop=True),
        "coref_pairs": rr.coref_pairs.reset_index(drop=True),
    }
    pr = None
    if "pruning" not in absent:
        with _timed(timings, "pruning", None):  # pruning_study reports its own parts
            pr = _run_pruning(model, pcfg, roles=frames["roles"], progress=progress)
        frames.update(prune_frames(pr.tables))
    patch_summary = {}
    if "patching" not in absent:
        with _timed(timings, "patching", progress):
            frames["patching"], patch_summary = _run_patching(model, frames["roles"], ccfg, full=full)
    frames["skipped"] = skipped_frame(rr.skipped)
    for k, v in rr.timings.items():
        timings[f"roles.{k}"] = round(float(v), 3)
    meta = {
        "model": card.get("name", model_name),
        "model_arg": model_name,
        "backend": model.backend,
        "backend_choice": getattr(model, "backend_choice", model.backend),
        **_placement(model),
        "full": full,
        "seed": seed,
        "model_file": model_file,
        "sha256": model_file["sha256"],
        "versions": versions(),
        "timings": timings,
        "trust_remote_code": model.trust_remote_code,
        "n_items": dict(rr.n_items),
        "config": {"roles": _cfg_dict(rcfg), "pruning": _cfg_dict(pcfg), "patching": _cfg_dict(ccfg)},
        "prune_metric": pr.summary["metric"] if pr else None,
        "prune_summary": pr.summary if pr else {},
        "patching_summary": patch_summary,
        "absent": absent,
        "memory": memory.finish(budget, notice),
    }
    return frames, card, card_text, meta


def _placement(model) -> dict:
    from headscope.probes.models.backend import placement

    return placement(model)


def _cfg_dict(cfg) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}


# ----------------------------------------------------------------- summary and writing
def run_summary(frames: dict[str, pd.DataFrame], meta: dict, out_dir: Path, top: int = 3) -> dict:
    """What the terminal shows, JSON-serialisable: top heads per role (with the causal
    comparison), pruning curve end points, skipped count, where the report is."""
    roles = frames.get("roles")
    rvi = frames.get("roles_vs_importance")
    out_roles = {}
    for role, best in top_heads(roles, top).items():
        d = roles[(roles["role"].astype(str) == role) & roles["verdict"].astype(bool)]
        causal = None
        if rvi is not None and not rvi.empty:
            c = rvi[rvi["role"].astype(str) == role]
            if not c.empty:
                r = c.iloc[0]
                causal = (
                    f"{r['metric']} {r['value_role']:.3f} vs {r['value_random_mean']:.3f}±{r['value_random_std']:.3f}"
                )
        out_roles[role] = {
            "n_heads": int(d.drop_duplicates(["layer", "head"]).shape[0]),
            "top": [
                {
                    "head": f"L{int(r.layer)}H{int(r.head)}",
                    "layer": int(r.layer),
                    "head_index": int(r.head),
                    "score": float(r.score),
                    "baseline": float(r.baseline),
                    "margin": float(r.margin),
                    "verdict": bool(r.verdict),
                }
                for r in best.itertuples()
            ],
            "causal": causal,
        }
    pruning = []
    curves = F.curve_rows(curves_frame(frames, meta.get("prune_metric")))
    for (study, metric), d in curves.groupby(["study", "metric"], observed=True):
        d = d.sort_values("fraction_pruned")
        mid = d.iloc[len(d) // 2]
        pruning.append(
            f"{study}: {metric} {d['value'].iloc[0]:.3f} → {mid['value']:.3f} at {mid['fraction_pruned']:.0%} pruned"
            f" → {d['value'].iloc[-1]:.3f} at {d['fraction_pruned'].iloc[-1]:.0%}"
        )
    sk = frames.get("skipped")
    return {
        "model": meta.get("model"),
        "patching": _patching_summary(frames, meta),
        "backend": meta.get("backend"),
        "out_dir": str(out_dir),
        "report": str(out_dir / "report.html"),
        "pruning_figure": str(out_dir / "figures" / "pruning_curves.png"),
        "roles": out_roles,
        "pruning": pruning,
        "skipped": int(sk["count"].sum()) if sk is not None and not sk.empty else 0,
        "timings": meta.get("timings", {}),
        "seconds": round(sum(v for k, v in meta.get("timings", {}).items() if "." not in k), 1),
    }


def _patching_summary(frames: dict[str, pd.DataFrame], meta: dict) -> dict:
    """Per role with a task: its task, top heads by attention and by patching, and how many
    of the first are among the second (``{}`` when patching did not run)."""
    from headscope.reports.sections.causal import attention_top, patching_top

    summ, patching, roles = meta.get("patching_summary") or {}, frames.get("patching"), frames.get("roles")
    out = {}
    if not summ or patching is None or roles is None:
        return out
    k = int(summ.get("top_k", 10))
    for r in summ.get("roles") or []:
        if r["task"] not in (summ.get("tasks") or {}):
            out[r["label"]] = {"task": r["task"], "refused": (summ.get("refused") or {}).get(r["task"])}
            continue
        att = attention_top(roles, r["role"], r.get("relation") or "", k)
        pat = patching_top(patching, r["task"], summ.get("method", CAUSAL_METHOD), k)
        a = [f"L{int(x.layer)}H{int(x.head)}" for x in att.itertuples()]
        p = [f"L{int(x.layer)}H{int(x.head)}" for x in pat.itertuples()]
        out[r["label"]] = {"task": r["task"], "by_attention": a, "by_patching": p, "overlap": len(set(a) & set(p))}
    return out


def write_report(
    frames: dict[str, pd.DataFrame], *, card: dict, card_text: str, meta: dict, out_dir, progress=None
) -> dict[str, Path]:
    """Write the report folder from frames (no model needed). Returns the paths.

    The folder is claimed (:func:`~headscope.probes.outputs.folder.claim_output`: an
    existing ``out_dir`` is replaced only when it is an earlier report with nothing else
    in it; a second run into it is refused), written beside it and swapped in whole."""
    out = Path(out_dir)
    timings = meta.setdefault("timings", {})
    with claim_output(out, "report") as folder:
        with _timed(timings, "figures", progress):
            doc = build_document(frames, card=card, card_text=card_text, meta=meta)
        with folder.staging() as tmp:
            if progress:
                progress("write", 0, None)
            t0 = time.perf_counter()
            _write_tables(frames, tmp / "tables")
            md, files = render_markdown(doc)
            for rel, png in files.items():
                with atomic_write(tmp / rel, "wb") as f:
                    f.write(png)
            with atomic_write(tmp / "report.md") as f:
                f.write(md)
            with atomic_write(tmp / "report.html") as f:
                f.write(render_html(doc))
            timings["write"] = round(time.perf_counter() - t0, 3)  # run.json, written last, records it
            write_json(_run_json(frames, card, meta), tmp / "run.json")
            if progress:
                progress("write", 1, 1)
    return {
        "out_dir": out,
        "html": out / "report.html",
        "markdown": out / "report.md",
        "run_json": out / "run.json",
        "tables": out / "tables",
        "figures": out / "figures",
    }


def _write_tables(frames: dict[str, pd.DataFrame], folder: Path) -> None:
    for name, df in frames.items():
        if isinstance(df, pd.DataFrame):
            write_frame(df, folder / name)


def _run_json(frames, card, meta) -> dict:
    sk = frames.get("skipped")
    skipped = {}
    if sk is not None and not sk.empty:
        for r in sk.itertuples(index=False):
            skipped.setdefault(r.analysis, {})[r.reason] = int(r.count)
    return {
        **manifest_header("report"),
        "model": meta.get("model"),
        "model_arg": meta.get("model_arg"),
        "backend": meta.get("backend"),
        "backend_choice": meta.get("backend_choice"),
        "device": meta.get("device"),
        "dtype": meta.get("dtype"),
        "absent": meta.get("absent") or {},
        "full": bool(meta.get("full")),
        "seed": meta.get("seed"),
        "config": meta.get("config", {}),
        "versions": meta.get("versions") or versions(),
        "model_file": meta.get("model_file", {}),
        "timings": meta.get("timings", {}),
        "skipped": skipped,
        "n_items": meta.get("n_items", {}),
        "architecture": {"layers": card.get("layers"), "heads": card.get("heads"), "kv_heads": card.get("kv_heads")},
        "pruning_summary": meta.get("prune_summary", {}),
        "patching_summary": meta.get("patching_summary", {}),
        "card": card,
        "tables": sorted(k for k, v in frames.items() if isinstance(v, pd.DataFrame)),
        "trust_remote_code": bool(meta.get("trust_remote_code")),
        "memory": {**meta["memory"], "peak_rss_bytes": peak_rss_bytes()} if meta.get("memory") else None,
    }


def build_report(
    model_name: str = "minilm-l6",
    *,
    backend: str = "auto",
    full: bool = False,
    out_dir=None,
    seed: int = 0,
    quiet: bool = False,
    progress=None,
    roles_config=None,
    prune_config=None,
    role_groups=None,
    role_inputs=None,
    trust_remote_code: bool = False,
    dtype: str = "fp32",
    device=None,
    device_map: str | None = None,
    patching: bool = True,
    causal_config: CausalConfig | None = None,
    notice=None,
) -> ReportResult:
    """Run the analyses on ``model_name`` and write the report folder ``out_dir``
    (default ``runs/report-<model>``). ``model_name`` is a shipped name or a path, or a
    model a notebook holds: what :func:`~headscope.probes.models.loading.load_model`
    returned, or a transformer-lens ``TransformerBridge`` (its card comes from the model's
    HF config; ``backend="auto"`` keeps the model's own backend). ``progress(stage, done, total)`` is called on every
    stage (``quiet=True``: never). ``roles_config`` / ``prune_config`` override the
    defaults (``RolesConfig(seed=seed)``, ``PruneConfig(**QUICK_PRUNING, seed=seed)``, or ``PruneConfig(seed=seed)`` with ``full``);
    ``role_groups`` / ``role_inputs`` are passed to the roles pipeline; ``patching`` /
    ``causal_config``: the patching stage (:func:`run_analyses`). Raises
    ``ValueError`` when ``out_dir`` exists and is not an earlier report."""
    if backend not in ("auto", "inhouse", "bridge", "hf"):
        raise ValueError(f"backend must be 'auto', 'inhouse', 'bridge' or 'hf'; got {backend!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer; got {seed!r}")
    label = (
        model_name
        if isinstance(model_name, (str, os.PathLike))
        else getattr(getattr(model_name, "spec", None), "name", "model")
    )
    out = Path(out_dir) if out_dir is not None else Path("runs") / f"report-{Path(str(label)).name}"
    if quiet:
        progress = None
    with claim_output(out, "report"):  # checked and locked before the analyses run
        frames, card, card_text, meta = run_analyses(
            model_name,
            backend=backend,
            full=full,
            seed=seed,
            progress=progress,
            roles_config=roles_config,
            prune_config=prune_config,
            role_groups=role_groups,
            role_inputs=role_inputs,
            trust_remote_code=trust_remote_code,
            dtype=dtype,
            device=device,
            device_map=device_map,
            patching=patching,
            causal_config=causal_config,
            notice=notice,
        )
        paths = write_report(frames, card=card, card_text=card_text, meta=meta, out_dir=out, progress=progress)
    summary = run_summary(frames, meta, out)
    return ReportResult(frames=frames, paths=paths, summary=summary, timings=dict(meta["timings"]))
