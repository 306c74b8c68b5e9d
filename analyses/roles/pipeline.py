"""The roles pipeline: every role analysis over its corpus, assembled into one frame.

:func:`head_roles` reads the three probe corpora and streams each through the model
once, with every reducer that needs that corpus attached:

=================  ==========================  ==========================================
corpus             default (shipped)           roles
=================  ==========================  ==========================================
plain text         ``data/text/sentences.txt``  positional, special/sink/punctuation,
                                               rare-word, summary statistics, clustering
CoNLL-U            ``data/syntax/*.conllu``     syntactic (:mod:`.syntactic`)
coreference JSONL  ``data/coref/coref.jsonl``   coreference (:mod:`.coreference`)
(generated)        random repeated sequences   induction (:mod:`.induction`)
=================  ==========================  ==========================================

The verdict table is long-form (:data:`~headscope.analyses.frames.ROLE_COLUMNS`): one row
per (head, role[, relation, direction]), so a head can hold several roles;
:func:`roles_by_head` lists each head's roles. :func:`summary` gives the top heads per role.

Coreference rows carry the better of the nearest-mention and first-candidate baselines
(:mod:`.coreference`); rows against each are in ``outputs["coreference"].extra["by_baseline"]``.
Syntactic rows carry the best fixed-offset baseline per relation and direction
(:mod:`.syntactic`); the offsets are in ``outputs["syntactic"].extra["offsets"]``.

The text-corpus reducers are built by :data:`TEXT_ADAPTERS` from each module's reducer
class and frame function (``PositionalReducer``/``frame_from``, ``SpecialReducer``/
``frame_from``, ``RareWordReducer``, ``SummaryReducer``, ``JSReducer``/``embed_and_cluster``),
so the corpus is run once; each adapter mirrors its module's ``run``.

>>> res = head_roles(load_model("minilm-l6"), roles=["syntactic"])  # doctest: +SKIP
>>> summary(res, top=1).query("relation == 'det'")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from headscope.analyses.frames import ROLE_COLUMNS, STAT_COLUMNS, empty_roles
from headscope.analyses.roles import coreference as coref_mod
from headscope.analyses.roles import induction as induction_mod
from headscope.analyses.roles import syntactic as syn_mod
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.wordlevel import pooling_matrices, word_patterns
from headscope.probes.capture import stream
from headscope.probes.tokens import display_token

log = logging.getLogger(__name__)

#: role groups :func:`head_roles` can run (``roles=`` takes a subset)
ROLE_GROUPS = ("positional", "special", "rare-word", "summary", "clustering", "induction", "syntactic", "coreference")
TEXT_GROUPS = ("positional", "special", "rare-word", "summary", "clustering")
#: columns of ``RolesResult.clusters`` (from :func:`headscope.analyses.roles.clustering.embed_and_cluster`)
CLUSTER_DTYPES = {"layer": "int64", "head": "int64", "x": "float64", "y": "float64", "cluster": "int64"}

__all__ = [
    "ROLE_GROUPS",
    "RolesResult",
    "head_roles",
    "check_roles",
    "summary",
    "roles_by_head",
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
    * ``config``: the :class:`RolesConfig` as a dict; ``model``: the model's name.
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
    from headscope.probes.corpora import DependencyCorpus, read_conllu

    sources = default_conllu() if conllu is None else conllu
    if isinstance(sources, (str, Path, DependencyCorpus)):
        sources = [sources]
    sources = list(sources)
    names = [Path(str(s.path or "corpus") if isinstance(s, DependencyCorpus) else str(s)).name for s in sources]
    sentences = []
    for src, name in zip(sources, names):
        if isinstance(src, DependencyCorpus):
            corpus = src
        elif isinstance(src, (str, Path)):
            corpus = read_conllu(src, full_labels=cfg.full_labels)
        else:
            raise TypeError(f"conllu must be a path, a DependencyCorpus or a list of them; got {type(src).__name__}")
        if corpus.skipped.total:
            _add_file_skips(
                file_skips, corpus.path or "corpus", dict(corpus.skipped.counts), full_path=names.count(name) > 1
            )
        sentences.extend(corpus.sentences)
    return sentences


def _read_coref(coref, file_skips: dict) -> list:
    from headscope.probes.corpora import CorefSet, read_coref

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


# ------------------------------------------------------------------ text-corpus reducers
# Each adapter: (model, cfg, texts) -> (reducer, finish(report) -> RoleOutput).


def _positional(model, cfg, texts):
    from headscope.analyses.roles import positional as m

    red = m.PositionalReducer(causal=model.spec.causal)

    def finish(rep):
        values, base, layers = red.result()
        frame, top = m.frame_from(values, base, layers, cfg, causal=model.spec.causal)
        return RoleOutput(frame=frame, skipped=Counter(rep.skipped), n_items=rep.n_used, extra={"top_bucket": top})

    return red, finish


def _special(model, cfg, texts):
    from headscope.analyses.roles import special as m

    red = m.SpecialReducer(causal=model.spec.causal)

    def finish(rep):
        values, base, layers = red.result()
        frame, left_out = m.frame_from(values, base, layers, cfg)
        skipped = Counter(rep.skipped)
        for role, n in left_out.items():
            if n:
                skipped[f"no {role} token visible"] += n
        return RoleOutput(frame=frame, skipped=skipped, n_items=rep.n_used, extra={"left_out": left_out})

    return red, finish


def _rareword(model, cfg, texts):
    from headscope.analyses.frames import roles_frame
    from headscope.analyses.roles import rareword as m
    from headscope.analyses.stats.verdicts import layered_rows

    counts = m.count_tokens(model.tokenizer, texts)
    red = m.RareWordReducer(counts, causal=model.spec.causal, vocab_size=len(model.tokenizer))

    def finish(rep):
        v, b, layers = red.result()
        rows = []
        if v.numel():
            ok = ~torch.isnan(b)
            rows = layered_rows(
                v[ok], b[ok], layers, role=m.ROLE, cfg=cfg, threshold_kind="absolute", threshold=cfg.rare_threshold
            )
        return RoleOutput(
            frame=roles_frame(rows),
            skipped=Counter(rep.skipped),
            n_items=rep.n_used,
            extra={"n_token_types": len(counts)},
        )

    return red, finish


def _summary(model, cfg, texts):
    from headscope.analyses.roles import pattern_stats as m

    red = m.SummaryReducer(causal=model.spec.causal, smoothing=cfg.entropy_smoothing)

    def finish(rep):
        return RoleOutput(frame=empty_roles(), stats=red.result(), skipped=Counter(rep.skipped), n_items=rep.n_used)

    return red, finish


def _clustering(model, cfg, texts, k: int = 6):
    from headscope.analyses.roles import clustering as m

    red = m.JSReducer(rows_per_item=cfg.js_rows_per_item, seed=cfg.seed)

    def finish(rep):
        js, labels = red.result()
        frame = m.embed_and_cluster(js, labels, k=min(k, len(labels)), seed=cfg.seed)
        return RoleOutput(
            frame=empty_roles(), skipped=Counter(rep.skipped), n_items=rep.n_used, extra={"clusters": frame, "js": js}
        )

    return red, finish


TEXT_ADAPTERS: dict[str, Callable] = {
    "positional": _positional,
    "special": _special,
    "rare-word": _rareword,
    "summary": _summary,
    "clustering": _clustering,
}


# ------------------------------------------------------------------------------ pipeline


def check_roles(roles) -> tuple[str, ...]:
    """``roles`` (None = all, a name, or names) -> the role groups in pipeline order.
    Raises ``ValueError`` naming the valid groups for an unknown one.

    >>> check_roles(["syntactic", "positional"])
    ('positional', 'syntactic')
    """
    if roles is None:
        return ROLE_GROUPS
    if isinstance(roles, str):
        roles = [roles]
    bad = [r for r in roles if r not in ROLE_GROUPS]
    if bad:
        raise ValueError(f"unknown role group {bad[0]!r}; choose from {list(ROLE_GROUPS)}")
    return tuple(r for r in ROLE_GROUPS if r in roles)


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
) -> RolesResult:
    """Run the role analyses of ``model`` and assemble them (see module doc).

    ``conllu``: a path, a :class:`~headscope.probes.corpora.DependencyCorpus`, or a list of
    them (default: the shipped ``data/syntax/*.conllu``); ``coref``: a path or
    :class:`~headscope.probes.corpora.CorefSet`; ``text``: a path or a list of strings;
    ``roles``: a subset of :data:`ROLE_GROUPS`; ``progress(stage, done, total)`` is called
    after each batch. Raises :class:`~headscope.probes.errors.InputFileError` (a
    ``ValueError``: ``file:line:col: message``) for a malformed input file, ``ValueError``
    for an unknown role group.
    """
    if not isinstance(cfg, RolesConfig):
        raise TypeError(f"cfg must be a RolesConfig; got {type(cfg).__name__}")
    wanted = check_roles(roles)
    timings: dict[str, float] = {}
    file_skips: dict[str, dict] = {}
    outputs: dict[str, RoleOutput] = {}
    inputs: dict = {}

    t0 = time.perf_counter()
    if any(g in wanted for g in TEXT_GROUPS):
        inputs["text"] = _read_text(text, file_skips)
    if "syntactic" in wanted:
        inputs["conllu"] = _read_conllu(conllu, cfg, file_skips)
    if "coreference" in wanted:
        inputs["coref"] = _read_coref(coref, file_skips)
    timings["read"] = time.perf_counter() - t0

    # plain text: one pass, every text reducer attached
    text_groups = [g for g in TEXT_GROUPS if g in wanted]
    if text_groups:
        t0 = time.perf_counter()
        texts = inputs["text"]
        reducers, finishers = [], {}
        for g in text_groups:
            red, fin = TEXT_ADAPTERS[g](model, cfg, texts)
            reducers.append(red)
            finishers[g] = fin
        if reducers:
            rep = stream(
                model,
                texts,
                reducers,
                quantities=("pattern",),
                batch_size=cfg.batch_size,
                progress=_stage_progress(progress, "text"),
            )
            for g, fin in finishers.items():
                outputs[g] = fin(rep)
        timings["text"] = time.perf_counter() - t0

    if "induction" in wanted:
        t0 = time.perf_counter()
        outputs["induction"] = induction_mod.run(model, None, cfg, progress=_stage_progress(progress, "induction"))
        timings["induction"] = time.perf_counter() - t0

    if "syntactic" in wanted:
        t0 = time.perf_counter()
        sentences = inputs["conllu"]
        red = syn_mod.SyntacticReducer(sentences, model.spec.n_layers, model.spec.n_heads, full_labels=cfg.full_labels)
        rep = stream(
            model,
            [list(s.words) for s in sentences],
            [red],
            quantities=("pattern",),
            batch_size=cfg.batch_size,
            words=True,
            progress=_stage_progress(progress, "syntactic"),
        )
        outputs["syntactic"] = syn_mod.finish(red, rep, cfg)
        timings["syntactic"] = time.perf_counter() - t0

    if "coreference" in wanted:
        t0 = time.perf_counter()
        items = inputs["coref"]
        red = coref_mod.CorefReducer(items, model.spec.n_layers, model.spec.n_heads)
        rep = stream(
            model,
            [list(it.words) for it in items],
            [red],
            quantities=("pattern",),
            batch_size=cfg.batch_size,
            words=True,
            progress=_stage_progress(progress, "coreference"),
        )
        outputs["coreference"] = coref_mod.finish(red, rep, cfg)
        timings["coreference"] = time.perf_counter() - t0

    frames = [o.frame for o in outputs.values() if o.frame is not None and len(o.frame)]
    frame = empty_roles()
    if frames:
        frame = (
            pd.concat(frames, ignore_index=True)[ROLE_COLUMNS]
            .sort_values(["role", "relation", "direction", "layer", "head"], kind="stable")
            .reset_index(drop=True)
        )
    stats_list = [o.stats for o in outputs.values() if o.stats is not None and len(o.stats)]
    stats = pd.concat(stats_list, ignore_index=True)[STAT_COLUMNS] if stats_list else pd.DataFrame(columns=STAT_COLUMNS)
    clusters = pd.DataFrame({c: pd.Series(dtype=t) for c, t in CLUSTER_DTYPES.items()})
    if "clustering" in outputs:
        clusters = outputs["clustering"].extra["clusters"]
    skipped = {g: dict(o.skipped) for g, o in outputs.items()}
    skipped.update(file_skips)
    result = RolesResult(
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
    if examples:
        t0 = time.perf_counter()
        result.examples = build_examples(model, result, inputs)
        timings["examples"] = time.perf_counter() - t0
    return result


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


def _pick_syntactic(out: RoleOutput, row) -> tuple[int | None, list]:
    arcs = out.extra["arcs"]
    col = int(row["layer"]) * arcs.n_heads + int(row["head"])
    sel = (arcs.relation == row["relation"]) & (arcs.direction == row["direction"])
    hit = sel & arcs.hits[:, col].numpy()
    cand = hit if hit.any() else sel
    idx = [int(i) for i in cand.nonzero()[0]]
    if not idx:
        return None, []
    item = int(arcs.sentence[idx[0]])
    marks = [(int(arcs.query[i]), int(arcs.partner[i])) for i in sel.nonzero()[0] if int(arcs.sentence[i]) == item]
    return item, marks


def _pick_coref(out: RoleOutput, row, items) -> tuple[int | None, list]:
    res = out.extra["hits"]
    if len(res) == 0:
        return None, []
    col = int(row["layer"]) * res.n_heads + int(row["head"])
    hit = res.hits[:, col].numpy()
    k = int(hit.nonzero()[0][0]) if hit.any() else 0
    it = items[int(res.item[k])]
    return int(res.item[k]), [(it.pronoun, it.antecedent_head)]


def _induction_roles() -> tuple[str, ...]:
    return induction_mod.ROLES


def _text_item(texts: list[str]) -> int | None:
    """A readable text item: the first with 8-20 words, else the first."""
    for i, t in enumerate(texts):
        if 8 <= len(t.split()) <= 20:
            return i
    return 0 if texts else None


def build_examples(model, result: RolesResult, inputs: dict) -> dict:
    """For each role's top head (see :func:`_example_keys`): one item with its word-level and
    token-level pattern of that head (lists, JSON-ready). Examples that share an item
    share one forward pass (capturing only the layers they need)."""
    plan = []  # (key, row, source, item, words, marks)
    for key, row in _example_keys(result.frame):
        role = row["role"]
        marks: list = []
        if role == "syntactic":
            item, marks = _pick_syntactic(result.outputs["syntactic"], row)
            words = list(inputs["conllu"][item].words) if item is not None else None
            source = "conllu"
        elif role == "coreference":
            item, marks = _pick_coref(result.outputs["coreference"], row, inputs["coref"])
            words = list(inputs["coref"][item].words) if item is not None else None
            source = "coref"
        elif (
            "induction" in result.outputs
            and role in _induction_roles()
            and "sequences" in result.outputs["induction"].extra
        ):
            item, words, source = 0, None, "induction"
        elif "text" in inputs:
            item = _text_item(inputs["text"])
            words, source = None, "text"
        else:
            continue
        if item is not None:
            plan.append((key, row, source, item, words, marks))

    captured: dict = {}  # (source, item) -> (TokenBatch, {layer: pattern [1, head, q, k]})
    for source, item in dict.fromkeys((p[2], p[3]) for p in plan):
        layers = sorted({int(p[1]["layer"]) for p in plan if (p[2], p[3]) == (source, item)})
        words = next(p[4] for p in plan if (p[2], p[3]) == (source, item))
        if source == "induction":
            from headscope.analyses.roles.induction import capture_ids

            cap = capture_ids(model, result.outputs["induction"].extra["sequences"][:1], layers=layers)
            captured[source, item] = (cap.tokens, {l: cap["pattern", l] for l in layers})
            continue
        try:
            batch = model.encode(words=[words]) if words is not None else model.encode(texts=[inputs["text"][item]])
        except ValueError:
            continue
        data = model.run(batch, ("pattern",), layers)
        captured[source, item] = (batch, {l: data[("pattern", l)] for l in layers})

    out = {}
    for key, row, source, item, _, marks in plan:
        if (source, item) not in captured:
            continue
        batch, pats = captured[source, item]
        layer, head = int(row["layer"]), int(row["head"])
        pat = pats[layer]
        wp = word_patterns(pat, pooling_matrices(batch))[0, head] if batch.words[0] else torch.zeros(0, 0)
        n = batch.lengths[0]
        tokens = [display_token(model.tokenizer, t) for t in batch.tokens[0][:n]]
        tp = [[round(float(x), 6) for x in r[:n]] for r in pat[0, head, :n]]
        wpl = [[round(float(x), 6) for x in r] for r in wp]
        word_level = source in ("conllu", "coref")
        out[key] = {
            "role": row["role"],
            "label": key,
            "relation": row["relation"],
            "direction": row["direction"],
            "layer": layer,
            "head": head,
            "score": float(row["score"]),
            "verdict": bool(row["verdict"]),
            "source": source,
            "item": int(item),
            "sentence": " ".join(batch.words[0]) if batch.words[0] else " ".join(tokens),
            "words": list(batch.words[0]),
            "word_pattern": wpl,
            "tokens": tokens,
            "token_pattern": tp,
            "pattern": wpl if word_level else tp,
            "query_words": list(batch.words[0]) if word_level else tokens,
            "key_words": list(batch.words[0]) if word_level else tokens,
            "marks": [list(m) for m in marks],
        }
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
    label = held.role.where(held.relation == "", held.role + "/" + held.relation + "/" + held.direction)
    g = held.assign(label=label).groupby(["layer", "head"], sort=True)["label"]
    out = g.agg(lambda s: ", ".join(sorted(s))).reset_index(name="roles")
    out.insert(2, "n_roles", g.size().values)
    return out
