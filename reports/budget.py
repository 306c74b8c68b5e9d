"""Each command's memory plan: what a ``roles``, ``prune``, ``patch`` or ``report`` run will
hold, checked before the model loads, and the batch sizes that fit.

:func:`plan` builds a :class:`Budget` from the model's config alone (a GGUF's metadata; no
weight is read) and the run's settings, one :class:`~headscope.probes.budget.Stage` per
kind of forward (:func:`roles_stages`, :func:`prune_stages`, :func:`patch_stages`), and
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
import inspect
import logging
from dataclasses import dataclass, field, replace

from headscope.probes.budget import (
    Available,
    Estimate,
    Shape,
    Stage,
    available_memory,
    estimate,
    fit,
    gib,
    peak_rss_bytes,
)

log = logging.getLogger(__name__)

#: components -> what to change, per command (the refusal names the largest component's)
_COMMON = {
    "weights": "the weights alone need this much: use a machine with more free memory or a smaller model",
    "loading": "loading reads a float32 copy of the weights beside them: use a machine with more free memory",
    "loader residue": "use a machine with more free memory or a smaller model",
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
REMEDIES["report"] = {**REMEDIES["prune"], **REMEDIES["roles"], "gradients": "use --no-patching or a smaller model"}


def _stream_caps() -> tuple[int | None, int | None]:
    """``(max_tokens, max_cells)``: :func:`~headscope.probes.capture.stream`'s defaults."""
    from headscope.probes.capture import stream

    p = inspect.signature(stream).parameters
    return p["max_tokens"].default, p["max_cells"].default


def longest_tokens(items, tokenizer=None, *, words: bool = False) -> int:
    """Tokens of the longest of ``items`` (texts, or word lists with ``words``): counted with
    ``tokenizer``, else bounded by UTF-8 bytes + 2 (special tokens). 1 for no items."""
    from headscope.probes.tokens import tokenize_one

    best = 1
    for it in items:
        if tokenizer is not None:
            try:
                n = len(
                    tokenize_one(tokenizer, words=list(it), add_bos=False)["ids"]
                    if words
                    else tokenize_one(tokenizer, text=it)["ids"]
                )
            except (ValueError, TypeError):  # skipped by the run, counted there
                continue
        else:
            n = (sum(len(str(w).encode()) + 1 for w in it) if words else len(str(it).encode())) + 2
        best = max(best, n)
    return best


def model_shape(model, dtype: str = "fp32") -> tuple[Shape, bool, object] | None:
    """``(shape, convert, tokenizer)`` of a MODEL argument from its config alone (``convert``:
    a GGUF not yet dequantised; ``tokenizer``: loaded where its files are at hand without
    the weights, else None); None for a hub id (nothing to read before the download) and for
    a model whose config cannot be read here: the load then reports what is wrong, as before."""
    from headscope.probes.errors import HeadscopeError

    try:
        return _model_shape(model, dtype)
    except (HeadscopeError, ValueError, TypeError, KeyError, OSError) as e:
        log.info("no memory estimate for %s before it loads: %s", model, e)
        return None


def _model_shape(model, dtype: str):
    from headscope.probes.models.card import source_hf_config
    from headscope.probes.models.checkpoints import cache_dir, file_sha256, resolve

    source = resolve(model)
    if source.kind == "hub":
        return None
    hf = source_hf_config(source)
    folder = None
    if source.kind == "hf-dir":
        folder = source.path
    elif source.kind == "gguf":
        cached = cache_dir() / "gguf" / file_sha256(source.path)[:16]
        folder = cached if (cached / "model.safetensors").exists() else None
    convert = source.kind == "gguf" and folder is None
    tokenizer = None
    if folder is not None and any((folder / f).exists() for f in ("tokenizer.json", "vocab.txt", "tokenizer.model")):
        try:
            from headscope.probes.models.checkpoints import load_tokenizer

            tokenizer = load_tokenizer(folder)
        except Exception as e:  # noqa: BLE001 - lengths are then bounded by bytes; the load reports the error
            log.info("tokenizer of %s not read for the memory estimate (%s); lengths bounded by bytes", model, e)
    return Shape.from_hf_config(hf, dtype=dtype, where=str(source.path)), convert, tokenizer


def _shape_of_model(model, dtype: str) -> Shape | None:
    """The :class:`Shape` of a loaded model (its HF config), for a run on a model a notebook
    holds; None when its config is unknown or unreadable."""
    from headscope.probes.errors import HeadscopeError
    from headscope.probes.models.loading import hf_config_of

    try:
        hf = hf_config_of(model)
        return None if hf is None else Shape.from_hf_config(hf, dtype=dtype)
    except (HeadscopeError, ValueError, TypeError, KeyError, OSError) as e:
        log.info("no memory estimate for the model object: %s", e)
        return None


# ----------------------------------------------------------------------------- stages per command


def roles_stages(shape: Shape, cfg, groups, inputs: dict, tokenizer=None) -> list[Stage]:
    """One stage per corpus the role ``groups`` stream (text, syntactic, coreference) and one for
    induction's generated sequences, at ``cfg.batch_size`` with every layer's patterns kept."""
    from headscope.analyses.roles.base import REGISTRY

    max_tokens, max_cells = _stream_caps()
    common = dict(
        batch_size=cfg.batch_size,
        max_tokens=max_tokens,
        max_cells=max_cells,
        kept_layers=shape.n_layers,
        reducers=True,
        statistics=True,
    )
    out = []
    corpora = {}
    for g in groups:
        corpora.setdefault(REGISTRY[g].corpus, []).append(g)
    for corpus, gs in corpora.items():
        if corpus == "generated":
            if "induction" in gs:
                out.append(Stage(name="induction", longest=2 * cfg.induction_seq_len + 2, **common))
            continue
        items = inputs.get(corpus)
        if corpus == "text":
            lines = list(items.lines) if hasattr(items, "lines") else list(items or [])
            n = longest_tokens(lines, tokenizer)
        elif corpus == "conllu":
            sents = [s for c in items or [] for s in (c.sentences if hasattr(c, "sentences") else [c])]
            n = longest_tokens([s.words for s in sents], tokenizer, words=True)
        else:
            its = list(items.items) if hasattr(items, "items") else list(items or [])
            n = longest_tokens([i.words for i in its], tokenizer, words=True)
        out.append(Stage(name="text" if corpus == "text" else "+".join(gs), longest=n, **common))
    return out


def roles_items(groups, inputs: dict, cfg) -> int:
    """Items the role ``groups`` will run (for the time estimate)."""
    from headscope.analyses.roles.base import REGISTRY

    corpora = {REGISTRY[g].corpus for g in groups}
    n = 0
    if "text" in corpora and inputs.get("text") is not None:
        n += len(getattr(inputs["text"], "lines", inputs["text"]))
    if "conllu" in corpora:
        n += sum(len(getattr(c, "sentences", [c])) for c in inputs.get("conllu") or [])
    if "coref" in corpora and inputs.get("coref") is not None:
        n += len(getattr(inputs["coref"], "items", inputs["coref"]))
    if "generated" in corpora and "induction" in groups:
        n += cfg.induction_n_sequences
    return n


def _prune_data(metric: str, n_items: int | None):
    """``(items, words)`` the pruning metric reads (its shipped data, first ``n_items``)."""
    from headscope.data import path

    if metric == "coref_accuracy":
        from headscope.probes.corpora import read_coref

        items = [i.words for i in read_coref(path("coref/coref.jsonl")).items]
        return items[:n_items] if n_items else items, True
    if metric == "paraphrase_accuracy":
        from headscope.analyses.pruning.metrics import read_paraphrases

        pairs = read_paraphrases(path("paraphrase/pairs.jsonl"))
        pairs = pairs[:n_items] if n_items else pairs
        texts = []
        for p in pairs:  # anchor, positive, negatives
            for v in p.values():
                texts.extend(t for t in (v if isinstance(v, list) else [v]) if isinstance(t, str))
        return texts, False
    from headscope.analyses.pruning.metrics import read_lines

    lines = read_lines(path("heldout/lm_text.txt"))
    return (lines[:n_items] if n_items else lines), False


def prune_stages(shape: Shape, pcfg, tokenizer=None) -> list[Stage]:
    """The masked replicas of a batch (``max(batch_size, max_rows)`` rows per forward, the
    unablated stream of the batch kept per layer) and, with importance, one batch's backward."""
    from headscope.analyses.pruning.metrics import default_metric

    metric = pcfg.metric or default_metric(shape)
    items, words = _prune_data(metric, pcfg.items)
    n = longest_tokens(items, tokenizer, words=words)
    b = shape.bytes_per
    decoder = shape.causal
    rows = max(pcfg.batch_size, pcfg.max_rows)
    out = [
        Stage(
            name="pruning",
            batch_size=rows,
            longest=n,
            logits="all" if decoder else "none",
            loss=decoder,
            statistics=True,
            cache_per_row=shape.n_layers * n * shape.d_model * b,  # the unablated stream of the batch
            cache_rows=pcfg.batch_size,
        )
    ]
    if "importance" in pcfg.studies or "curves" in pcfg.studies:
        out.append(
            Stage(
                name="importance", batch_size=pcfg.batch_size, longest=n, logits="all" if decoder else "none", grad=True
            )
        )
    return out


def apply_prune(pcfg, est: Estimate):
    """``pcfg`` with the batch sizes :func:`~headscope.probes.budget.fit` chose."""
    rows = est.batch_sizes.get("pruning", pcfg.max_rows)
    batch = min(pcfg.batch_size, est.batch_sizes.get("importance", pcfg.batch_size), rows)
    if rows >= max(pcfg.batch_size, pcfg.max_rows) and batch == pcfg.batch_size:
        return pcfg
    return replace(pcfg, batch_size=batch, max_rows=min(pcfg.max_rows, rows))


def patch_stages(shape: Shape, pc, *, longest: int, methods=("activation", "attribution")) -> list[Stage]:
    """Activation patching (``max(batch_size, max_rows)`` sequences per forward, the clean and
    corrupted ``z`` of a batch kept per layer, the last position's logits read) and, for
    attribution, one batch's backward."""
    b = shape.bytes_per
    z = 2 * shape.n_layers * longest * shape.n_heads * shape.d_head * b  # clean and corrupted z, per item
    out = []
    if set(methods) - {"attribution"}:  # activation, ablation and path patching: replicated forwards
        out.append(
            Stage(
                name="patching",
                batch_size=max(pc.batch_size, pc.max_rows),
                longest=longest,
                logits="last" if shape.causal else "none",
                statistics=True,
                cache_per_row=z,
                cache_rows=pc.batch_size,
            )
        )
    if "attribution" in methods:
        out.append(
            Stage(
                name="attribution",
                batch_size=pc.batch_size,
                longest=longest,
                logits="last" if shape.causal else "none",
                grad=True,
                cache_per_row=z,
            )
        )
    return out


def apply_patch(pc, est: Estimate):
    """``pc`` with the batch sizes :func:`~headscope.probes.budget.fit` chose."""
    rows = est.batch_sizes.get("patching", pc.max_rows)
    batch = min(pc.batch_size, est.batch_sizes.get("attribution", pc.batch_size), rows)
    if rows >= max(pc.batch_size, pc.max_rows) and batch == pc.batch_size:
        return pc
    return replace(pc, batch_size=batch, max_rows=min(pc.max_rows, rows))


def task_longest(task: str, seq_len: int, tokenizer=None) -> int:
    """Tokens of a patching task's longest sequence: generated tasks from ``seq_len``; a file
    task (``agreement``, ``coreference``, a JSONL path) from its rows' texts (``clean``,
    ``corrupted``, or ``words``), counted with ``tokenizer`` or bounded by their bytes, plus
    the answer's token."""
    import json
    from pathlib import Path

    if task == "induction":
        return 2 * seq_len + 2
    if task == "duplicate_token":
        return seq_len + 3
    from headscope.data import path

    f = {"agreement": path("tasks/agreement.jsonl"), "coreference": path("coref/coref.jsonl")}.get(task, Path(task))
    texts = []
    try:
        with open(f, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(row, dict):
                    continue
                if isinstance(row.get("words"), list):
                    texts.append(" ".join(map(str, row["words"])))
                texts.extend(v for k, v in row.items() if k in ("clean", "corrupted", "text") and isinstance(v, str))
    except OSError:
        return 64
    return longest_tokens(texts, tokenizer) + 2


# ----------------------------------------------------------------------------- the plan


@dataclass
class Budget:
    """A run's memory plan: its ``estimate`` (batch sizes fitted), what was ``available``,
    and the batch each stage asked for (``asked``)."""

    command: str
    shape: Shape | None
    stages: list[Stage]
    available: Available
    estimate: Estimate | None
    load: bool = True
    convert: bool = False
    asked: dict[str, int] = field(default_factory=dict)
    emit: object = field(default=None, repr=False)  # where start() printed the plan (refine says a change)

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

    def refine(self, stages: list[Stage], *, uniform: bool = False) -> Budget:
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
        ``batch_sizes``), ``available_bytes``/``available_source``, ``peak_rss_bytes``, and what
        it was computed from (``shape``, ``stages``)."""
        out = self.estimate.record() if self.estimate else {"estimate_bytes": None}
        out["available_bytes"] = self.available.budget
        out["available_source"] = self.available.source
        out["process_bytes"] = self.available.resident  # resident when the batches were last fitted
        out["batch_sizes_asked"] = dict(self.asked)
        out["stages"] = [dataclasses.asdict(st) for st in self.stages]
        out["shape"] = dataclasses.asdict(self.shape) if self.shape is not None else None
        out["peak_rss_bytes"] = int(peak if peak is not None else peak_rss_bytes())
        return out


def _changes(sizes: dict[str, tuple[int, int]]) -> str:
    """``batch 32 -> 9 to fit (text, syntactic)``, one clause per distinct change."""
    by: dict[tuple[int, int], list[str]] = {}
    for stage, change in sizes.items():
        by.setdefault(change, []).append(stage)
    return "; ".join(f"batch {x} -> {y} to fit ({', '.join(names)})" for (x, y), names in by.items())


def _fit(command, shape, stages, avail, *, load, convert, uniform) -> Estimate:
    """:func:`~headscope.probes.budget.fit`, then (``uniform``) every stage at the smallest batch fitted."""
    est = fit(shape, stages, avail, command=command, load=load, convert=convert, remedies=REMEDIES.get(command))
    if uniform and len(set(est.batch_sizes.values())) > 1:
        b = min(est.batch_sizes.values())
        est = estimate(
            shape, [replace(s, batch_size=b) for s in stages], process=avail.resident, load=load, convert=convert
        )
    return est


def plan(
    command: str,
    shape: Shape | None,
    stages: list[Stage],
    *,
    load: bool = True,
    convert: bool = False,
    uniform: bool = False,
) -> Budget:
    """Fit ``stages`` of ``command`` to the memory available now (see the module doc; ``uniform``:
    one batch size for every stage, the smallest fitted); raises
    :class:`~headscope.probes.errors.MemoryBudgetError` when it cannot fit."""
    avail = available_memory()
    asked = {s.name: s.batch_size for s in stages}
    if shape is None:
        return Budget(command, None, stages, avail, None, load, convert, asked)
    est = _fit(command, shape, stages, avail, load=load, convert=convert, uniform=uniform)
    return Budget(command, shape, stages, avail, est, load, convert, asked)


# ----------------------------------------------------------------------------- CLI hooks

#: modules a command imports while it runs, imported before the process is measured so the
#: estimate's ``process`` holds them (scikit-learn and SciPy add ~90 MiB)
PRELOAD = {
    "roles": ("scipy.stats", "sklearn.cluster", "sklearn.manifold", "pyarrow.parquet"),
    "prune": ("scipy.stats", "pyarrow.parquet"),
    "patch": ("scipy.stats", "pyarrow.parquet", "matplotlib.pyplot"),
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


def _on_gpu(device) -> bool:
    return device is not None and str(device).startswith("cuda")


def start(
    command: str, model, *, dtype: str, device, stages_of, emit=None, uniform: bool = False
) -> tuple[Budget, object]:
    """The plan of a run of ``command`` on MODEL ``model`` before it loads: ``stages_of(shape,
    tokenizer)`` gives its stages. Prints :meth:`Budget.line` through ``emit``; raises
    :class:`~headscope.probes.errors.MemoryBudgetError` when the run cannot fit. Returns the
    budget and the tokenizer read for it (or None). On a CUDA device only the load is
    estimated here (a batch's tensors live on the device, bounded by its own free memory)."""
    preload(command)
    got = model_shape(model, dtype) if isinstance(model, str) or hasattr(model, "__fspath__") else None
    if got is None:  # nothing said: the load reports what is wrong with the model, or it loads
        return plan(command, None, []), None
    shape, convert, tokenizer = got
    stages = [] if _on_gpu(device) else stages_of(shape, tokenizer)
    budget = plan(command, shape, stages, convert=convert, uniform=uniform)
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


def roles_timer(progress, groups, inputs: dict, cfg, quiet: bool):
    """``progress`` wrapped to print the estimated time of the run once its first batch is timed."""
    emit = emitter(quiet)
    if emit is None:
        return progress
    from headscope.probes.budget import TimeEstimate

    return TimeEstimate(roles_items(groups, inputs, cfg), emit, inner=progress)


def prune_start(args, cfg, device):
    """``headscope prune``: the plan before the model loads -> ``(budget, cfg)`` with the batch
    and ``max_rows`` that fit (refused in one line when none does)."""
    budget, _tok = start(
        "prune",
        args.model,
        dtype=args.dtype,
        device=device,
        stages_of=lambda shape, tok: prune_stages(shape, cfg, tok),
        emit=emitter(False, "note: "),
    )
    return budget, (apply_prune(cfg, budget.estimate) if budget.estimate else cfg)


def prune_refine(budget: Budget, model, cfg, asked):
    """After the load: the plan again with the model's tokenizer -> ``(budget, cfg)``."""
    if budget.shape is None or not budget.stages:
        return budget, cfg
    budget = budget.refine(prune_stages(budget.shape, asked, model.tokenizer))
    return budget, apply_prune(asked, budget.estimate)


def patch_start(args, cfg, device):
    """``headscope patch``: the plan before the model loads -> ``(budget, cfg)`` with the patching
    batch and ``max_rows`` that fit (refused in one line when none does)."""
    budget, _tok = start(
        "patch",
        args.model,
        dtype=args.dtype,
        device=device,
        stages_of=lambda shape, tok: patch_stages(
            shape, cfg.patch, longest=task_longest(args.task, args.seq_len, tok), methods=cfg.methods
        ),
        emit=emitter(False, "note: "),
    )
    if budget.estimate is None:
        return budget, cfg
    return budget, replace(cfg, patch=apply_patch(cfg.patch, budget.estimate))


def patch_refine(budget: Budget, task, cfg, asked):
    """Once the task is built: the plan again with its longest sequence -> ``(budget, cfg)``."""
    if budget.shape is None or not budget.stages:
        return budget, cfg
    longest = max([len(getattr(it, "clean", ())) for it in getattr(task, "items", ())] or [1])
    budget = budget.refine(patch_stages(budget.shape, asked.patch, longest=longest, methods=asked.methods))
    return budget, replace(asked, patch=apply_patch(asked.patch, budget.estimate))


def add_to_run_json(out, key: str, value) -> None:
    """``value`` under ``key`` in the ``run.json`` a study wrote in ``out`` (nothing when there is none)."""
    import json
    from pathlib import Path

    from headscope.probes.outputs.atomic import write_json

    if out is None:
        return
    run_json = Path(out) / "run.json"
    if run_json.is_file():
        write_json({**json.loads(run_json.read_text(encoding="utf-8")), key: value}, run_json)


def parts_timer(progress, stage: str, total: int | None, quiet: bool, unit: str):
    """``progress`` (may be None) wrapped to print the estimated time once the first unit of
    ``stage`` is done (``total``: None to read it from the first call)."""
    emit = emitter(quiet)
    if emit is None:
        return progress
    from headscope.probes.budget import TimeEstimate

    return TimeEstimate(total or 0, emit, inner=progress, unit=unit, stages={stage})


def _role_corpora(groups, role_inputs: dict | None) -> dict:
    """The corpora the role ``groups`` read, as :func:`roles_stages` takes them: the given
    ``role_inputs`` (paths are read), the shipped files for the others."""
    from pathlib import Path

    from headscope.analyses.roles.pipeline import corpora_for, default_conllu, default_coref, default_text
    from headscope.probes.corpora import read_conllu, read_coref, read_text

    given = dict(role_inputs or {})
    out = {}
    for corpus in corpora_for(groups):
        if corpus == "text":
            t = given.get("text")
            out["text"] = (
                read_text(default_text() if t is None else t) if t is None or isinstance(t, (str, Path)) else t
            )
        elif corpus == "conllu":
            c = given.get("conllu")
            c = default_conllu() if c is None else ([c] if isinstance(c, (str, Path)) else list(c))
            out["conllu"] = [read_conllu(x) if isinstance(x, (str, Path)) else x for x in c]
        elif corpus == "coref":
            c = given.get("coref")
            out["coref"] = (
                read_coref(default_coref() if c is None else c) if c is None or isinstance(c, (str, Path)) else c
            )
    return out


#: the report's patching tasks (:data:`~headscope.reports.pipeline.ROLE_TASKS`) and the seq_len of the generated ones
_REPORT_TASKS = ("induction", "coreference", "agreement", "duplicate_token")


def report_start(model, *, dtype, device, rcfg, pcfg, ccfg, groups, role_inputs, patching: bool, notice=None):
    """``build_report``: the plan before the model loads -> ``(budget, rcfg, pcfg, ccfg)`` with
    the batch sizes that fit (refused in one line when none does). ``model``: a MODEL argument;
    a model already loaded is planned without its load (its weights are in the process)."""
    from headscope.analyses.patching.activation import PatchConfig
    from headscope.analyses.roles.pipeline import check_roles

    groups = check_roles(groups)
    inputs = _role_corpora(groups, role_inputs)
    patch = PatchConfig(batch_size=ccfg.batch_size, max_rows=ccfg.max_rows)

    def stages_of(shape, tok):
        out = roles_stages(shape, rcfg, groups, inputs, tok) + prune_stages(shape, pcfg, tok)
        longest = max(task_longest(t, 10, tok) for t in _REPORT_TASKS)
        return out + (patch_stages(shape, patch, longest=longest) if patching else [])

    if isinstance(model, str) or hasattr(model, "__fspath__"):
        budget, _tok = start("report", str(model), dtype=dtype, device=device, stages_of=stages_of, emit=notice)
    else:
        preload("report")
        shape = _shape_of_model(model, dtype)
        stages = [] if shape is None or _on_gpu(device) else stages_of(shape, None)
        budget = plan("report", shape, stages, load=False)
        budget.emit = notice
        say(budget)
    est = budget.estimate
    if est is None:
        return budget, rcfg, pcfg, ccfg
    roles_names = {s.name for s in budget.stages} - {"pruning", "importance", "patching", "attribution"}
    b = min([rcfg.batch_size, *(v for k, v in est.batch_sizes.items() if k in roles_names)])
    rcfg = replace(rcfg, batch_size=b) if b < rcfg.batch_size else rcfg
    pcfg = apply_prune(pcfg, est)
    fitted = apply_patch(patch, est)
    if (fitted.batch_size, fitted.max_rows) != (ccfg.batch_size, ccfg.max_rows):
        ccfg = replace(ccfg, batch_size=fitted.batch_size, max_rows=fitted.max_rows)
    return budget, rcfg, pcfg, ccfg


def report_timer(progress, budget: Budget, groups, rcfg, role_inputs, notice):
    """The report's ``progress`` wrapped to say the estimated time of its role analyses once
    their first batch is timed (``notice`` None: as is)."""
    if notice is None:
        return progress
    from headscope.analyses.roles.pipeline import _stages, check_roles
    from headscope.probes.budget import TimeEstimate

    groups = check_roles(groups)
    names = {name for name, _corpus, _gs in _stages(groups)}
    n = roles_items(groups, _role_corpora(groups, role_inputs), rcfg)
    return TimeEstimate(n, notice, inner=progress, unit="items of the role analyses", stages=names)
