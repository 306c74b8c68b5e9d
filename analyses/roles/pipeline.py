"""The roles pipeline: every registered role group over its corpus, assembled into one frame.

Each role group is a :class:`~headscope.analyses.roles.base.Role` defined by its own
module and registered by :mod:`.shipped` (:data:`~headscope.analyses.roles.base.REGISTRY`,
in registration order = the order of :data:`ROLE_GROUPS`). :func:`head_roles` reads each corpus the wanted groups
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

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from headscope.analyses.frames import ROLE_COLUMNS, STAT_COLUMNS, empty_roles
from headscope.analyses.roles import shipped  # noqa: F401  (registers the shipped role groups)
from headscope.analyses.roles.base import REGISTRY, Role, RoleContext
from headscope.analyses.roles.clustering import CLUSTER_DTYPES, empty_clusters
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.examples import build_examples
from headscope.analyses.roles.inputs import default_conllu, default_coref, default_text, read_inputs
from headscope.analyses.stats.verdicts import apply_family
from headscope.probes.capture import stream

log = logging.getLogger(__name__)

#: the shipped role groups, in pipeline order (``roles=`` takes a subset; a group
#: registered later is in :data:`~headscope.analyses.roles.base.REGISTRY` and
#: :func:`check_roles` accepts it)
ROLE_GROUPS = tuple(REGISTRY)
#: the shipped groups that read the plain-text corpus
TEXT_GROUPS = tuple(g for g, r in REGISTRY.items() if r.corpus == "text")

__all__ = [
    "ROLE_GROUPS",
    "TEXT_GROUPS",
    "CLUSTER_DTYPES",
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
    #: how each stage reduced its patterns (``{stage: "chunked (query chunk 128)" or
    #: "materialised (<why>)"}``, run.json's ``pattern_statistics``)
    pattern_statistics: dict = field(default_factory=dict)
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


# ------------------------------------------------------------------------------ pipeline


def check_roles(roles) -> tuple[str, ...]:
    """``roles`` (None = every group run by default, a name, or names) -> the role groups in pipeline
    order (registration order, :data:`~headscope.analyses.roles.base.REGISTRY`; a group with
    ``default=False`` runs only when named). Raises ``ValueError`` naming the valid groups for an
    unknown one.

    >>> check_roles(["syntactic", "positional"])
    ('positional', 'syntactic')
    """
    groups = tuple(REGISTRY)
    if roles is None:
        return tuple(g for g in groups if REGISTRY[g].default)
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


def _run_stage(model, corpus: str, roles: list[Role], items, cfg: RolesConfig, options: dict, progress, modes=None):
    """Run ``roles`` (all of ``corpus``) and finish them -> ``{group: RoleOutput}``; ``modes``
    (a dict) gets the stage's ``StreamReport.patterns`` under the stage's first group."""
    modes = {} if modes is None else modes
    ctxs = _contexts(model, corpus, roles, items, cfg, options)
    filled = _fill(corpus, roles, ctxs, cfg, progress)
    modes[roles[0].name] = getattr(filled[roles[0].name][1], "patterns", "materialised")
    return {r.name: r.finish(*filled[r.name], ctxs[r.name]) for r in roles}


def _contexts(model, corpus: str, roles: list[Role], items, cfg: RolesConfig, options: dict, part=None) -> dict:
    """``{group: RoleContext}`` of one stage's ``roles``: ``items`` of ``corpus``, or a generated
    group's own (``role.items``); ``part``: a sharded run's ``(k, n)`` (None: every batch)."""
    if corpus == "generated":
        (role,) = roles
        ctx = RoleContext(model, cfg, options=options.get(role.name, {}), part=part)
        ctx.items = role.items(ctx)
        return {role.name: ctx}
    return {r.name: RoleContext(model, cfg, items, options.get(r.name, {}), part) for r in roles}


def _fill(corpus: str, roles: list[Role], ctxs: dict, cfg: RolesConfig, progress) -> dict:
    """One stage's pass: ``{group: (filled reducer, StreamReport)}`` (the corpus groups share
    the report of their one stream). Under a part (``ctx.part``) only its batches run; a
    generated group whose feed does not shard (:attr:`Role.shards`) runs whole on part 0 and
    is None on the others."""
    if corpus == "generated":
        (role,) = roles
        ctx = ctxs[role.name]
        if ctx.part is not None and not role.shards and ctx.part[0] != 0:
            return {role.name: None}
        red = role.reducer(ctx)
        return {role.name: (red, role.feed(ctx, [red], progress))}
    reducers = [r.reducer(ctxs[r.name]) for r in roles]
    first = ctxs[roles[0].name]
    words = corpus != "text"  # dependency sentences and coreference items stream as word lists
    items = first.items
    report = stream(
        first.model,
        [list(it.words) for it in items] if words else items,
        reducers,
        quantities=("pattern",),
        batch_size=cfg.batch_size,
        words=True if words else None,
        progress=progress,
        query_chunk=cfg.query_chunk,
        part=first.part,
    )
    return {r.name: (red, report) for r, red in zip(roles, reducers)}


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
    inputs = read_inputs(corpora_for(wanted), {"text": text, "conllu": conllu, "coref": coref}, cfg, file_skips)
    timings["read"] = time.perf_counter() - t0

    outputs: dict[str, RoleOutput] = {}
    modes: dict[str, str] = {}
    for stage, corpus, groups in _stages(wanted):
        t0 = time.perf_counter()
        roles_ = [REGISTRY[g] for g in groups]
        stage_modes: dict[str, str] = {}
        outputs.update(
            _run_stage(
                model, corpus, roles_, inputs.get(corpus), cfg, opts, _stage_progress(progress, stage), stage_modes
            )
        )
        modes[stage] = next(iter(stage_modes.values()), "materialised")
        timings[stage] = time.perf_counter() - t0

    result = _assemble(model, cfg, {g: outputs[g] for g in wanted}, file_skips, timings)
    result.pattern_statistics = modes
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
    clusters = empty_clusters()
    for o in outputs.values():  # the role that clusters the heads hands its map over
        clusters = o.extra.get("clusters", clusters)
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
