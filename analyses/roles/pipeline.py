"""The roles pipeline: every registered role group over its corpus, assembled into one frame.

Each role group is a :class:`~headscope.analyses.roles.base.Role` registered by its own
module (:data:`~headscope.analyses.roles.base.REGISTRY`, in registration order = the
order of :data:`ROLE_GROUPS`). :func:`head_roles` reads each corpus the wanted groups
need once and streams it through the model once, with the reducers of every group of
that corpus attached; a ``"generated"`` group runs its own items through its ``feed``;
then each group's ``finish`` makes its :class:`RoleOutput`. :func:`run_role` runs one
group through that same code.

=================  ==========================  ==========================================
corpus             default (shipped)           groups
=================  ==========================  ==========================================
plain text         ``data/text/sentences.txt``  positional, special (+ sink, punctuation),
                                               rare-word, summary, clustering
CoNLL-U            ``data/syntax/*.conllu``     syntactic (:mod:`.syntactic`)
coreference JSONL  ``data/coref/coref.jsonl``   coreference (:mod:`.coreference`)
(generated)        random repeated sequences   induction (:mod:`.induction`)
=================  ==========================  ==========================================

The verdict table is long-form (:data:`~headscope.analyses.frames.ROLE_COLUMNS`): one row
per (head, role[, relation, direction]), so a head can hold several roles;
:func:`roles_by_head` lists each head's roles, :func:`summary` gives the top heads per
role, :func:`verdict_overlap` how many heads two roles share.

Coreference rows carry the better of the nearest-mention and first-candidate baselines
(:mod:`.coreference`); rows against each are in ``outputs["coreference"].extra["by_baseline"]``.
Syntactic rows carry the best fixed-offset baseline per relation and direction
(:mod:`.syntactic`); the offsets are in ``outputs["syntactic"].extra["offsets"]``.

>>> res = head_roles(load_model("minilm-l6"), roles=["syntactic"])  # doctest: +SKIP
>>> summary(res, top=1).query("relation == 'det'")  # doctest: +SKIP
>>> run_role("rare-word", model, texts, frequencies=counts).frame  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from headscope.analyses.frames import ROLE_COLUMNS, STAT_COLUMNS, empty_roles
from headscope.analyses.roles.base import REGISTRY, Role, RoleContext
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.wordlevel import pooling_matrices, word_patterns
from headscope.analyses.stats.verdicts import apply_family
from headscope.probes.capture import stream
from headscope.probes.tokens import display_token

log = logging.getLogger(__name__)

#: the modules that register the shipped role groups; imported in this order, which is
#: the pipeline order (registration order)
ROLE_MODULES = (
    "positional",
    "special",
    "rareword",
    "pattern_stats",
    "clustering",
    "induction",
    "syntactic",
    "coreference",
)
for _name in ROLE_MODULES:
    importlib.import_module(f"headscope.analyses.roles.{_name}")

#: the shipped role groups, in pipeline order (``roles=`` takes a subset; a group
#: registered later is in :data:`~headscope.analyses.roles.base.REGISTRY` and
#: :func:`check_roles` accepts it)
ROLE_GROUPS = tuple(REGISTRY)
#: the shipped groups that read the plain-text corpus
TEXT_GROUPS = tuple(g for g, r in REGISTRY.items() if r.corpus == "text")
#: columns of ``RolesResult.clusters`` (from :func:`headscope.analyses.roles.clustering.embed_and_cluster`)
CLUSTER_DTYPES = {"layer": "int64", "head": "int64", "x": "float64", "y": "float64", "cluster": "int64"}
#: corpora read from a file (or given): :func:`head_roles` takes one keyword each
READ_CORPORA = ("text", "conllu", "coref")

__all__ = [
    "ROLE_GROUPS",
    "TEXT_GROUPS",
    "RolesResult",
    "head_roles",
    "run_role",
    "check_roles",
    "corpora_for",
    "summary",
    "roles_by_head",
    "verdict_overlap",
    "default_conllu",
    "default_coref",
    "default_text",
]


@dataclass
class RolesResult:
    """Everything :func:`head_roles` measured.

    * ``frame``: all role rows (ROLE_COLUMNS), every role in one frame;
    * ``stats``: per-head statistics (STAT_COLUMNS);
    * ``clusters``: the clustering module's frame (empty when not run);
    * ``skipped``: ``{role group or "file:<name>": {reason: count}}`` — items each
      analysis could not use, and units each reader left out of each file (keyed by the
      path as given when two input files share a name);
    * ``n_items``: items each role group used; ``timings``: seconds per stage;
    * ``examples``: ``{role key: example}`` for the report: the role's top head and one
      item to draw — ``words``, ``word_pattern`` [word][word], ``tokens``,
      ``token_pattern`` [q][k] of that head; ``pattern`` with ``query_words``/``key_words``
      is the one to draw (word level for syntactic/coreference, token level for the
      token roles, whose [CLS]/[SEP]/BOS would drop out of a word pattern); ``marks``: the
      gold (query, key) word pairs where the role defines them. Keys: the role, or
      ``syntactic:<relation>:<direction>`` (relations with a verdict, largest margins);
    * ``outputs``: each group's :class:`RoleOutput` (with its ``extra``);
    * ``config``: the :class:`RolesConfig` as a dict; ``model``: the model's name;
    * :attr:`coref_pairs`: pair consistency of every head on the coreference minimal pairs.
    """

    frame: pd.DataFrame
    stats: pd.DataFrame
    clusters: pd.DataFrame
    skipped: dict
    n_items: dict
    timings: dict
    examples: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    model: str = ""

    @property
    def coref_pairs(self) -> pd.DataFrame:
        """Columns :data:`~headscope.analyses.roles.coreference.PAIR_COLUMNS`: per head and
        item kind, pairs with both / one / neither item right (empty when coreference did
        not run or its items carry no pairs)."""
        out = self.outputs.get("coreference")
        pairs = out.extra.get("pairs") if out is not None else None
        if pairs is None:
            from headscope.analyses.roles.coreference import PAIR_COLUMNS

            return pd.DataFrame(columns=PAIR_COLUMNS)
        return pairs


def default_conllu() -> list[Path]:
    """The shipped CoNLL-U files (``data/syntax/*.conllu``), sorted."""
    from headscope.data import path

    return sorted(path("syntax").glob("*.conllu"))


def default_coref() -> Path:
    from headscope.data import path

    return path("coref/coref.jsonl")


def default_text() -> Path:
    from headscope.data import path

    return path("text/sentences.txt")


# ---------------------------------------------------------------------------------- inputs


def _add_file_skips(file_skips: dict, path, counts: dict, *, full_path: bool = False) -> None:
    """Record ``counts`` under ``file:<name>``, or ``file:<path as given>`` when ``full_path``
    (several inputs share the name) or the name is taken; never overwrite another file's
    counts (the same path given twice gets `` (2)``, `` (3)``, ...)."""
    key = f"file:{path}" if full_path else f"file:{Path(path).name}"
    if key in file_skips:
        key = f"file:{path}"
    base, n = key, 2
    while key in file_skips:
        key, n = f"{base} ({n})", n + 1
    file_skips[key] = counts


def _read_conllu(conllu, cfg: RolesConfig, file_skips: dict) -> list:
    from headscope.probes.corpora import DependencyCorpus, DependencySentence, read_conllu

    sources = default_conllu() if conllu is None else conllu
    if isinstance(sources, (str, Path, DependencyCorpus)):
        sources = [sources]
    sources = list(sources)
    if sources and all(isinstance(s, DependencySentence) for s in sources):
        return sources  # sentences given as they are
    names = [Path(str(s.path or "corpus") if isinstance(s, DependencyCorpus) else str(s)).name for s in sources]
    sentences = []
    for src, name in zip(sources, names):
        if isinstance(src, DependencyCorpus):
            corpus = src
        elif isinstance(src, (str, Path)):
            corpus = read_conllu(src, full_labels=cfg.full_labels)
        else:
            raise TypeError(
                "conllu must be a path, a DependencyCorpus, a list of them or a list of DependencySentence; "
                f"got {type(src).__name__}"
            )
        if corpus.skipped.total:
            _add_file_skips(
                file_skips, corpus.path or "corpus", dict(corpus.skipped.counts), full_path=names.count(name) > 1
            )
        sentences.extend(corpus.sentences)
    return sentences


def _read_coref(coref, file_skips: dict) -> list:
    from headscope.probes.corpora import CorefItem, CorefSet, read_coref

    if isinstance(coref, Sequence) and not isinstance(coref, str) and all(isinstance(i, CorefItem) for i in coref):
        return list(coref)  # items given as they are
    cs = read_coref(default_coref() if coref is None else coref) if not isinstance(coref, CorefSet) else coref
    if cs.skipped.total:
        _add_file_skips(file_skips, cs.path or "coref", dict(cs.skipped.counts))
    return list(cs.items)


def _read_text(text, file_skips: dict) -> list[str]:
    from headscope.probes.corpora import TextSet, read_text

    if isinstance(text, TextSet):
        if text.skipped.total:
            _add_file_skips(file_skips, "text", dict(text.skipped.counts))
        return list(text.lines)
    if text is None or isinstance(text, (str, Path)):
        ts = read_text(default_text() if text is None else text)
        if ts.skipped.total:
            _add_file_skips(file_skips, str(text or default_text()), dict(ts.skipped.counts))
        return list(ts.lines)
    if isinstance(text, Sequence) and all(isinstance(t, str) for t in text):
        return list(text)
    raise TypeError(f"text must be a path or a list of strings; got {type(text).__name__}")


def _read_inputs(corpora, given: dict, cfg: RolesConfig, file_skips: dict) -> dict[str, list]:
    """The items of each corpus in ``corpora`` that is read (text, conllu, coref), in that
    order (so ``file_skips`` keeps it)."""
    readers = {
        "text": lambda: _read_text(given["text"], file_skips),
        "conllu": lambda: _read_conllu(given["conllu"], cfg, file_skips),
        "coref": lambda: _read_coref(given["coref"], file_skips),
    }
    return {c: readers[c]() for c in READ_CORPORA if c in corpora}


# ------------------------------------------------------------------------------ pipeline


def check_roles(roles) -> tuple[str, ...]:
    """``roles`` (None = all, a name, or names) -> the role groups in pipeline order
    (registration order, :data:`~headscope.analyses.roles.base.REGISTRY`). Raises
    ``ValueError`` naming the valid groups for an unknown one.

    >>> check_roles(["syntactic", "positional"])
    ('positional', 'syntactic')
    """
    groups = tuple(REGISTRY)
    if roles is None:
        return groups
    if isinstance(roles, str):
        roles = [roles]
    bad = [r for r in roles if r not in REGISTRY]
    if bad:
        raise ValueError(f"unknown role group {bad[0]!r}; choose from {list(groups)}")
    return tuple(r for r in groups if r in roles)


def corpora_for(groups) -> tuple[str, ...]:
    """The corpora the role ``groups`` read, in :data:`~headscope.analyses.roles.base.CORPORA` order.

    >>> corpora_for(["syntactic", "summary", "positional"])
    ('text', 'conllu')
    """
    from headscope.analyses.roles.base import CORPORA

    used = {REGISTRY[g].corpus for g in check_roles(groups)}
    return tuple(c for c in CORPORA if c in used)


def _check_options(options) -> dict[str, dict]:
    """``{group: {option: value}}`` -> a checked copy (``TypeError`` for an option the
    group does not take, ``ValueError`` for an unknown group)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict {{role group: {{option: value}}}}; got {type(options).__name__}")
    out = {}
    for group, opts in options.items():
        check_roles([group])
        role = REGISTRY[group]
        bad = [k for k in opts if k not in role.options]
        if bad:
            takes = ", ".join(role.options) or "none"
            raise TypeError(f"role group {group!r} takes no option {bad[0]!r} (its options: {takes})")
        out[group] = dict(opts)
    return out


def _stages(wanted) -> list[tuple[str, str, list[str]]]:
    """``(stage, corpus, groups)``: one stage per corpus (its groups share one pass, in
    pipeline order), one per ``"generated"`` group; stages in the order of their first
    group. A stage is named ``text``, or by its groups (``syntactic``, ``a+b``)."""
    by_corpus: dict[str, list[str]] = {}
    order: list[tuple[str, list[str]]] = []
    for g in wanted:
        corpus = REGISTRY[g].corpus
        if corpus == "generated":
            order.append((corpus, [g]))
        elif corpus in by_corpus:
            by_corpus[corpus].append(g)
        else:
            by_corpus[corpus] = [g]
            order.append((corpus, by_corpus[corpus]))
    return [("text" if c == "text" else "+".join(gs), c, gs) for c, gs in order]


def _run_stage(model, corpus: str, roles: list[Role], items, cfg: RolesConfig, options: dict, progress):
    """Run ``roles`` (all of ``corpus``) and finish them -> ``{group: RoleOutput}``."""
    if corpus == "generated":
        (role,) = roles
        ctx = RoleContext(model, cfg, options=options.get(role.name, {}))
        ctx.items = role.items(ctx)
        red = role.reducer(ctx)
        return {role.name: role.finish(red, role.feed(ctx, [red], progress), ctx)}
    ctxs = [RoleContext(model, cfg, items, options.get(r.name, {})) for r in roles]
    reducers = [r.reducer(c) for r, c in zip(roles, ctxs)]
    words = corpus != "text"  # dependency sentences and coreference items stream as word lists
    report = stream(
        model,
        [list(it.words) for it in items] if words else items,
        reducers,
        quantities=("pattern",),
        batch_size=cfg.batch_size,
        words=True if words else None,
        progress=progress,
    )
    return {r.name: r.finish(red, report, c) for r, red, c in zip(roles, reducers, ctxs)}


def _stage_progress(progress, stage):
    if progress is None:
        return None
    return lambda done, total: progress(stage, done, total)


def head_roles(
    model,
    *,
    conllu=None,
    coref=None,
    text=None,
    roles: Sequence[str] | None = None,
    cfg: RolesConfig = RolesConfig(),
    progress: Callable[[str, int, int], None] | None = None,
    examples: bool = True,
    options: Mapping[str, Mapping] | None = None,
) -> RolesResult:
    """Run the role groups of ``model`` and assemble them (see module doc).

    ``conllu``: a path, a :class:`~headscope.probes.corpora.DependencyCorpus`, a list of
    them, or a list of :class:`~headscope.probes.corpora.DependencySentence` (default: the
    shipped ``data/syntax/*.conllu``); ``coref``: a path, a
    :class:`~headscope.probes.corpora.CorefSet` or a list of ``CorefItem``; ``text``: a
    path or a list of strings; ``roles``: a subset of the registered groups
    (:func:`check_roles`); ``options``: per-run options by group,
    ``{"rare-word": {"frequencies": counts}}`` (each :class:`~headscope.analyses.roles.base.Role`
    lists the ones it takes; options of groups not run are ignored);
    ``progress(stage, done, total)`` is called after each batch. Raises
    :class:`~headscope.probes.errors.InputFileError` (a ``ValueError``:
    ``file:line:col: message``) for a malformed input file, ``ValueError`` for an unknown
    role group, ``TypeError`` for an option a group does not take.
    """
    if not isinstance(cfg, RolesConfig):
        raise TypeError(f"cfg must be a RolesConfig; got {type(cfg).__name__}")
    wanted = check_roles(roles)
    opts = _check_options(options)
    timings: dict[str, float] = {}
    file_skips: dict[str, dict] = {}

    t0 = time.perf_counter()
    inputs = _read_inputs(corpora_for(wanted), {"text": text, "conllu": conllu, "coref": coref}, cfg, file_skips)
    timings["read"] = time.perf_counter() - t0

    outputs: dict[str, RoleOutput] = {}
    for stage, corpus, groups in _stages(wanted):
        t0 = time.perf_counter()
        roles_ = [REGISTRY[g] for g in groups]
        outputs.update(
            _run_stage(model, corpus, roles_, inputs.get(corpus), cfg, opts, _stage_progress(progress, stage))
        )
        timings[stage] = time.perf_counter() - t0

    result = _assemble(model, cfg, {g: outputs[g] for g in wanted}, file_skips, timings)
    if examples:
        t0 = time.perf_counter()
        result.examples = build_examples(model, result, inputs)
        timings["examples"] = time.perf_counter() - t0
    return result


def _assemble(model, cfg: RolesConfig, outputs: dict, file_skips: dict, timings: dict) -> RolesResult:
    """Every group's output -> one :class:`RolesResult` (rows sorted by role, relation,
    direction, layer, head; statistics in group order)."""
    frames = [o.frame for o in outputs.values() if o.frame is not None and len(o.frame)]
    frame = empty_roles()
    if frames:
        frame = (
            pd.concat(frames, ignore_index=True)[ROLE_COLUMNS]
            .sort_values(["role", "relation", "direction", "layer", "head"], kind="stable")
            .reset_index(drop=True)
        )
    frame = apply_family(frame, cfg)  # "role": each role/relation/direction; "global": the whole run
    stats_list = [o.stats for o in outputs.values() if o.stats is not None and len(o.stats)]
    stats = pd.concat(stats_list, ignore_index=True)[STAT_COLUMNS] if stats_list else pd.DataFrame(columns=STAT_COLUMNS)
    clusters = pd.DataFrame({c: pd.Series(dtype=t) for c, t in CLUSTER_DTYPES.items()})
    if "clustering" in outputs:
        clusters = outputs["clustering"].extra["clusters"]
    skipped = {g: dict(o.skipped) for g, o in outputs.items()}
    skipped.update(file_skips)
    return RolesResult(
        frame=frame,
        stats=stats,
        clusters=clusters,
        skipped=skipped,
        n_items={g: int(o.n_items) for g, o in outputs.items()},
        timings=timings,
        outputs=outputs,
        config=cfg.to_dict(),
        model=str(getattr(model.spec, "name", "")),
    )


def run_role(name: str, model, items=None, cfg: RolesConfig = RolesConfig(), *, progress=None, **options) -> RoleOutput:
    """One role group's :class:`RoleOutput`, through :func:`head_roles` (the same code).

    ``items``: the group's corpus, as :func:`head_roles` takes it (texts or a text path;
    CoNLL-U path(s) / ``DependencyCorpus`` / list of ``DependencySentence``; coreference
    path / ``CorefSet`` / list of ``CorefItem``; ``None``: the shipped one); for a
    ``"generated"`` group, the ``items`` option (induction: token-id sequences; ``None``:
    the group makes its own). ``options``: the group's options (``include_special=True``,
    ``frequencies=...``, ``exclude_bos=True``, ...); ``progress(done, total)``.

    >>> run_role("positional", model, texts, include_special=True).extra["notes"]  # doctest: +SKIP
    """
    (group,) = check_roles([name])
    corpus = REGISTRY[group].corpus
    given = {}
    if corpus == "generated":
        if items is not None:
            options = {"items": items, **options}
    elif isinstance(items, Iterator):
        given[corpus] = list(items)  # a generator of texts, sentences or items
    else:
        given[corpus] = items
    res = head_roles(
        model,
        roles=[group],
        cfg=cfg,
        progress=None if progress is None else (lambda stage, done, total: progress(done, total)),
        examples=False,
        options={group: options} if options else None,
        **given,
    )
    return res.outputs[group]


# ------------------------------------------------------------------------------ examples


def _example_keys(frame: pd.DataFrame, max_syntactic: int = 8) -> list[tuple[str, pd.Series]]:
    """(key, top row) per role; for syntactic, per relation/direction with a verdict,
    the ``max_syntactic`` with the largest margin."""
    keys = []
    if not len(frame):
        return keys
    for role, g in frame[frame.role != "syntactic"].groupby("role", sort=True):
        top = g.sort_values(["verdict", "score"], ascending=[False, False], kind="stable").iloc[0]
        keys.append((role, top))
    syn = frame[(frame.role == "syntactic") & frame.verdict]
    if len(syn):
        best = syn.sort_values("margin", ascending=False, kind="stable").drop_duplicates(["relation", "direction"])
        for _, row in best.head(max_syntactic).iterrows():
            keys.append((f"syntactic:{row['relation']}:{row['direction']}", row))
    return keys


def _text_item(texts: list[str]) -> int | None:
    """A readable text item: the first with 8-20 words, else the first."""
    for i, t in enumerate(texts):
        if 8 <= len(t.split()) <= 20:
            return i
    return 0 if texts else None


@dataclass
class _Planned:
    """One example to draw: ``source`` is the corpus, or the group for a generated one."""

    key: str
    row: pd.Series
    source: str
    corpus: str
    item: int
    words: list | None
    marks: list


def _plan_examples(result: RolesResult, inputs: dict) -> list[_Planned]:
    """Which item to draw for each role's top head (see :func:`_example_keys`)."""
    group_of = {role: g for g, o in result.outputs.items() if o.frame is not None for role in o.frame["role"].unique()}
    plan = []
    for key, row in _example_keys(result.frame):
        group = group_of.get(row["role"])
        if group not in REGISTRY:
            continue
        corpus, out = REGISTRY[group].corpus, result.outputs[group]
        item, words, marks, source = None, None, [], corpus
        if REGISTRY[group].example is not None:
            item, marks, words = REGISTRY[group].example(out, row, inputs)
        elif corpus == "generated":
            if "sequences" not in out.extra:
                continue
            item, source = 0, group
        elif corpus == "text":
            item = _text_item(inputs["text"])
        elif inputs.get(corpus):
            item, words = 0, list(inputs[corpus][0].words)
        if item is not None:
            plan.append(_Planned(key, row, source, corpus, item, words, marks))
    return plan


def _capture_examples(model, result: RolesResult, inputs: dict, plan: list[_Planned]) -> dict:
    """``{(source, item): (TokenBatch, {layer: pattern [1, head, q, k]})}``: one forward
    pass per item, capturing only the layers its examples need."""
    captured = {}
    for source, item in dict.fromkeys((p.source, p.item) for p in plan):
        mine = [p for p in plan if (p.source, p.item) == (source, item)]
        layers = sorted({int(p.row["layer"]) for p in mine})
        if mine[0].corpus == "generated":
            from headscope.analyses.roles.induction import capture_ids

            cap = capture_ids(model, result.outputs[source].extra["sequences"][:1], layers=layers)
            captured[source, item] = (cap.tokens, {l: cap["pattern", l] for l in layers})
            continue
        words = mine[0].words
        try:
            batch = model.encode(words=[words]) if words is not None else model.encode(texts=[inputs["text"][item]])
        except ValueError:
            continue
        data = model.run(batch, ("pattern",), layers)
        captured[source, item] = (batch, {l: data[("pattern", l)] for l in layers})
    return captured


def _example_record(model, p: _Planned, batch, pattern) -> dict:
    """The JSON-ready example of one planned head (see :attr:`RolesResult.examples`)."""
    layer, head = int(p.row["layer"]), int(p.row["head"])
    wp = word_patterns(pattern, pooling_matrices(batch))[0, head] if batch.words[0] else torch.zeros(0, 0)
    n = batch.lengths[0]
    tokens = [display_token(model.tokenizer, t) for t in batch.tokens[0][:n]]
    tp = [[round(float(x), 6) for x in r[:n]] for r in pattern[0, head, :n]]
    wpl = [[round(float(x), 6) for x in r] for r in wp]
    word_level = p.source in ("conllu", "coref")
    return {
        "role": p.row["role"],
        "label": p.key,
        "relation": p.row["relation"],
        "direction": p.row["direction"],
        "layer": layer,
        "head": head,
        "score": float(p.row["score"]),
        "verdict": bool(p.row["verdict"]),
        "source": p.source,
        "item": int(p.item),
        "sentence": " ".join(batch.words[0]) if batch.words[0] else " ".join(tokens),
        "words": list(batch.words[0]),
        "word_pattern": wpl,
        "tokens": tokens,
        "token_pattern": tp,
        "pattern": wpl if word_level else tp,
        "query_words": list(batch.words[0]) if word_level else tokens,
        "key_words": list(batch.words[0]) if word_level else tokens,
        "marks": [list(m) for m in p.marks],
    }


def build_examples(model, result: RolesResult, inputs: dict) -> dict:
    """For each role's top head (see :func:`_example_keys`): one item with its word-level and
    token-level pattern of that head (lists, JSON-ready). Examples that share an item
    share one forward pass (capturing only the layers they need)."""
    plan = _plan_examples(result, inputs)
    captured = _capture_examples(model, result, inputs, plan)
    out = {}
    for p in plan:
        if (p.source, p.item) in captured:
            batch, pats = captured[p.source, p.item]
            out[p.key] = _example_record(model, p, batch, pats[int(p.row["layer"])])
    return out


# ------------------------------------------------------------------------------- summaries


def summary(result: RolesResult | pd.DataFrame, top: int = 3, *, only_verdicts: bool = False) -> pd.DataFrame:
    """Top ``top`` heads per (role, relation, direction): heads holding the role first, then by
    score. Columns: ROLE_COLUMNS plus ``rank`` (1-based). ``only_verdicts`` keeps only
    groups where at least one head holds the role.

    >>> f = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "role": ["x"] * 3, "relation": [""] * 3,
    ...                   "direction": [""] * 3, "score": [.2, .9, .5], "baseline": [.1] * 3, "margin": [.1, .8, .4],
    ...                   "ci_low": [0.] * 3, "ci_high": [1.] * 3, "p_value": [.5, .001, .001], "n": [9] * 3,
    ...                   "verdict": [False, True, True]})
    >>> summary(f, top=2)[["layer", "head", "rank"]].values.tolist()
    [[0, 1, 1], [1, 0, 2]]
    """
    frame = result.frame if isinstance(result, RolesResult) else result
    if not len(frame):
        return frame.assign(rank=pd.Series(dtype="int64"))
    keys = ["role", "relation", "direction"]
    df = frame.sort_values(
        keys + ["verdict", "score", "layer", "head"],
        ascending=[True, True, True, False, False, True, True],
        kind="stable",
    )
    if only_verdicts:
        df = df[df.groupby(keys)["verdict"].transform("any")]
    df = df.groupby(keys, sort=True).head(top).copy()
    df["rank"] = df.groupby(keys).cumcount() + 1
    return df.reset_index(drop=True)


def roles_by_head(result: RolesResult | pd.DataFrame) -> pd.DataFrame:
    """Each head's roles (verdict True), one row per head that holds any: columns
    ``layer``, ``head``, ``n_roles``, ``roles`` (``"role[/relation/direction]"`` joined by ``", "``)."""
    frame = result.frame if isinstance(result, RolesResult) else result
    held = frame[frame.verdict]
    if not len(held):
        return pd.DataFrame(columns=["layer", "head", "n_roles", "roles"])
    g = held.assign(label=_role_labels(held)).groupby(["layer", "head"], sort=True)["label"]
    out = g.agg(lambda s: ", ".join(sorted(s))).reset_index(name="roles")
    out.insert(2, "n_roles", g.size().values)
    return out


def _role_labels(frame: pd.DataFrame) -> pd.Series:
    """``role``, or ``role/relation/direction`` for rows with a relation (a frame read back
    from CSV may hold NaN for an empty relation)."""
    relation, direction = frame.relation.fillna(""), frame.direction.fillna("")
    return frame.role.where(relation == "", frame.role + "/" + relation + "/" + direction)


OVERLAP_COLUMNS = ["role_a", "role_b", "n_a", "n_b", "n_both", "jaccard"]


def verdict_overlap(frame: RolesResult | pd.DataFrame, roles: Sequence[str] | None = None) -> pd.DataFrame:
    """How many heads two roles share, for every pair of ``roles``: one row per pair
    (``role_a`` before ``role_b`` in ``roles`` order) with ``n_a``/``n_b`` the heads holding
    each (verdict True), ``n_both`` the heads holding both and ``jaccard`` = ``n_both`` /
    heads holding either (NaN when neither has a head). A role is a ``role`` value, or
    ``role/relation/direction`` for rows with a relation (as :func:`roles_by_head` writes
    them). ``roles``: default every role some head holds, sorted; a role that is not in
    the frame raises ``ValueError``.

    >>> f = pd.DataFrame({"layer": [0, 0, 0, 1, 1], "head": [0, 1, 0, 0, 1], "role": ["a", "a", "b", "b", "c"],
    ...                   "relation": [""] * 5, "direction": [""] * 5, "verdict": [True, True, True, True, False]})
    >>> verdict_overlap(f).values.tolist()
    [['a', 'b', 2, 2, 1, 0.3333333333333333]]
    >>> verdict_overlap(f, ["a", "c"]).values.tolist()
    [['a', 'c', 2, 0, 0, 0.0]]
    """
    frame = frame.frame if isinstance(frame, RolesResult) else frame
    labels = _role_labels(frame)
    verdict = frame.verdict.astype(bool)
    held: dict[str, set] = {}
    for label, layer, head in zip(labels[verdict], frame.layer[verdict], frame["head"][verdict]):
        held.setdefault(label, set()).add((int(layer), int(head)))
    if roles is None:
        roles = sorted(held)
    else:
        roles = [roles] if isinstance(roles, str) else list(roles)
        known = set(labels)
        missing = [r for r in roles if r not in known]
        if missing:
            raise ValueError(f"role {missing[0]!r} is not in the frame; its roles: {sorted(known)}")
    rows = []
    for a, b in itertools.combinations(roles, 2):
        ha, hb = held.get(a, set()), held.get(b, set())
        union = len(ha | hb)
        rows.append(
            {
                "role_a": a,
                "role_b": b,
                "n_a": len(ha),
                "n_b": len(hb),
                "n_both": len(ha & hb),
                "jaccard": len(ha & hb) / union if union else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=OVERLAP_COLUMNS).astype(
        {
            "role_a": "object",
            "role_b": "object",
            "n_a": "int64",
            "n_b": "int64",
            "n_both": "int64",
            "jaccard": "float64",
        }
    )
