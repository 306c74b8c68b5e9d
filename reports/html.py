"""The report's content, built once from frames, and its self-contained HTML rendering.

:func:`build_document` turns the run's frames (roles, stats, examples, pruning
studies, roles-vs-importance, skipped) plus the model card into a :class:`Document`: sections of
paragraphs, notes, preformatted text, figures (PNG bytes with alt text and caption) and
tables (frames with a caption). :func:`render_html` writes it as one HTML file with CSS
inline and every image a ``data:`` URI, so it opens from disk, offline; its one script,
embedded, draws the interactive head view (:class:`HeadView`) and nothing else needs it.
:mod:`headscope.reports.markdown` renders the same document as Markdown.

>>> doc = Document(title="t", sections=[Section(id="s", title="S", blocks=[Paragraph("a < b")])])
>>> "a &lt; b" in render_html(doc)
True
"""

from __future__ import annotations

import html as _html
import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from headscope.reports import figures as F

CAVEAT = (
    "Attention maps are clues, not proofs: where a head looks need not be what the model uses "
    "(Jain & Wallace 2019; Wiegreffe & Pinter 2019). The ablation numbers beside each role are the "
    "causal evidence: the model's behaviour with that role's top heads removed, against removing as "
    "many heads drawn at random."
)


@dataclass
class Paragraph:
    text: str


@dataclass
class Note:
    """A highlighted remark (the attention caveat, warnings)."""

    text: str


@dataclass
class Pre:
    text: str


@dataclass
class Figure:
    name: str  # file stem under figures/ (Markdown) — unique in a document
    png: bytes
    alt: str
    caption: str


@dataclass
class Table:
    name: str
    frame: pd.DataFrame
    caption: str


@dataclass
class Section:
    id: str
    title: str
    blocks: list = field(default_factory=list)
    level: int = 2


@dataclass
class Document:
    title: str
    sections: list[Section]
    subtitle: str = ""

    def figures(self) -> list[Figure]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Figure)]

    def tables(self) -> list[Table]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Table)]


# ----------------------------------------------------------------- formatting helpers
def fmt(v) -> str:
    """Display a cell: floats to 3 decimals (p-values in scientific notation when small),
    NaN as an em dash, booleans as yes/no."""
    if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if v != 0 and abs(v) < 1e-3:
            return f"{v:.1e}"
        return f"{v:.3f}"
    return str(v)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "x"


def _n(k: int, one: str, many: str) -> str:
    return f"{k} {one if k == 1 else many}"


def _head(layer, head) -> str:
    return f"L{int(layer)}H{int(head)}"


# ----------------------------------------------------------------- building the document
def top_heads(roles: pd.DataFrame, top: int = 3) -> dict[str, pd.DataFrame]:
    """Per role, the ``top`` heads by margin among those with a verdict (a head counted
    once per role, on its best relation); roles with no verdict get their best-scoring
    heads instead (the caller says so)."""
    out = {}
    if roles is None or roles.empty:
        return out
    for role, d in roles.groupby("role", sort=True, observed=True):
        held = d[d["verdict"].astype(bool)]
        pool = held if not held.empty else d
        key = "margin" if not held.empty else "score"
        best = pool.sort_values([key, "score"], ascending=False).drop_duplicates(["layer", "head"])
        out[str(role)] = best.head(top).reset_index(drop=True)
    return out


#: a role row as the report shows it (the top-heads tables and the head view)
ROLE_VIEW_COLUMNS = [
    "role",
    "relation",
    "direction",
    "score",
    "baseline",
    "margin",
    "ci_low",
    "ci_high",
    "p_value",
    "n",
    "verdict",
]


def _role_table(best: pd.DataFrame) -> pd.DataFrame:
    cols = ["layer", "head", *ROLE_VIEW_COLUMNS[1:]]  # the head view's columns, role implied by the section
    t = best[[c for c in cols if c in best]].copy()
    for c in ("relation", "direction"):
        if c in t and (t[c].astype(str) == "").all():
            t = t.drop(columns=c)
    t.insert(0, "head_id", [_head(l, h) for l, h in zip(t["layer"], t["head"])])
    return t.drop(columns=["layer", "head"]).rename(
        columns={"head_id": "head", "ci_low": "CI low", "ci_high": "CI high", "p_value": "p (adj.)"}
    )


def role_examples(examples: pd.DataFrame | None, role: str, max_n: int = 3) -> list[pd.DataFrame]:
    """Up to ``max_n`` examples of ``role`` (EXAMPLE_COLUMNS rows, one frame each), in
    the order the analyses gave them (their best first)."""
    if examples is None or examples.empty:
        return []
    d = examples[examples["role"].astype(str) == role]
    keys = list(dict.fromkeys(d["example"]))[:max_n]
    return [d[d["example"] == k] for k in keys]


def _example_alt(ex: pd.DataFrame) -> str:
    layer, head = int(ex["layer"].iloc[0]), int(ex["head"].iloc[0])
    sentence = str(ex["sentence"].iloc[0])
    strongest = ex.sort_values("weight", ascending=False, kind="stable").drop_duplicates("query_index").head(3)
    links = ", ".join(f"'{r.query_word}'→'{r.key_word}' ({r.weight:.2f})" for r in strongest.itertuples())
    gold = ex[ex["gold"].astype(bool)] if "gold" in ex else ex.iloc[:0]
    g = (
        (
            "; expected links: "
            + ", ".join(f"'{r.query_word}'→'{r.key_word}' ({r.weight:.2f})" for r in gold.itertuples())
        )
        if len(gold)
        else ""
    )
    level = str(ex["level"].iloc[0]) if "level" in ex else "word"
    return (
        f'Heatmap of the {level}-level attention of head {_head(layer, head)} on "{sentence}"; '
        f"strongest links: {links}{g}."
    )


def _example_block(ex: pd.DataFrame) -> Figure:
    r = ex.iloc[0]
    what = str(r["role"]) + (f" {r['relation']} ({r['direction']})" if str(r["relation"]) else "")
    head = _head(r["layer"], r["head"])
    gold = " Red outlines: the links the role expects (gold)." if ex["gold"].astype(bool).any() else ""
    if str(r.get("level", "word")) == "token":
        how = (
            "rows are query tokens, columns the tokens they attend to (token level, special tokens included: the "
            "item has no words, or most of this head's attention goes to special tokens, which belong to no word)."
        )
    else:
        how = (
            "on a real sentence; rows are query words, columns the words they attend to (sub-word pieces summed "
            "over keys, averaged over queries; attention to special tokens left out)."
        )
    return Figure(
        name=f"example_{slug(r['example'])}",
        png=F.png_bytes(F.example_figure(ex, title=f"{what}: {head}")),
        alt=_example_alt(ex),
        caption=f"{head}, a top head for {what}; {how}{gold}",
    )


def _relation_table(d: pd.DataFrame, max_rows: int = 15) -> Table | None:
    """Best head per relation and direction (roles that have relations)."""
    if (d["relation"].astype(str) == "").all():
        return None
    best = d.sort_values(["verdict", "margin"], ascending=False, kind="stable").drop_duplicates(
        ["relation", "direction"]
    )
    best = best.sort_values(["verdict", "margin"], ascending=False, kind="stable").head(max_rows)
    t = best[["relation", "direction", "layer", "head", "score", "baseline", "margin", "n", "verdict"]].copy()
    t.insert(2, "best head", [_head(l, h) for l, h in zip(t["layer"], t["head"])])
    return Table(
        name="relations",
        frame=t.drop(columns=["layer", "head"]),
        caption=f"Best head per relation and direction (the {len(t)} with the largest margins; all in tables/roles.csv)",
    )


def _causal_rows(rvi: pd.DataFrame, role: str) -> pd.DataFrame:
    if rvi is None or rvi.empty:
        return pd.DataFrame()
    return rvi[rvi["role"].astype(str) == role]


def _causal_sentence(rows: pd.DataFrame) -> str:
    parts = []
    for r in rows.itertuples(index=False):
        sd = r.value_random_std if not pd.isna(r.value_random_std) else 0.0
        z = (r.value_role - r.value_random_mean) / sd if sd > 0 else float("nan")
        if math.isnan(z):
            zs = ""
        elif abs(z) < 2:
            zs = f", {z:+.1f} sd from random: within 2 sd, so this ablation does not single these heads out"
        else:
            zs = f", {z:+.1f} sd from random"
        parts.append(
            f"ablating its top {_n(int(r.k), 'head', 'heads')} gives {r.metric} = {fmt(r.value_role)}; "
            f"ablating {_n(int(r.k), 'random head', 'random heads')} gives {fmt(r.value_random_mean)} ± {fmt(sd)} "
            f"(mean ± sd over {int(r.n_draws)} draws{zs})"
        )
    return "Causal evidence: " + "; ".join(parts) + "."


def _card_section(card: dict, card_text: str) -> Section:
    s = Section(id="model", title="Model")
    s.blocks.append(Pre(card_text))
    n, kv = int(card.get("heads", 0)), int(card.get("kv_heads", 0) or card.get("heads", 0))
    if kv and kv < n:
        g = n // kv
        fig = F.gqa_figure(n, kv)
        s.blocks.append(
            Figure(
                name="gqa_groups",
                png=F.png_bytes(fig),
                alt=f"Diagram of grouped-query attention: {n} query heads joined to {kv} key-value heads; "
                + "; ".join(f"KV head {k} is read by query heads {k * g}–{k * g + g - 1}" for k in range(kv))
                + ".",
                caption=f"GQA groups: each KV head is shared by {g} query heads (the same grouping in every layer). "
                "Heads in a group see the same keys and values and differ only in their queries.",
            )
        )
        groups = pd.DataFrame(
            [{"kv_head": k, "query_heads": ", ".join(str(h) for h in range(k * g, (k + 1) * g))} for k in range(kv)]
        )
        s.blocks.append(Table(name="gqa_groups", frame=groups, caption="Query heads sharing each KV head"))
    else:
        s.blocks.append(Paragraph("Multi-head attention: every query head has its own key-value head (no GQA groups)."))
    return s


CORRECTIONS = {"bh": "Benjamini-Hochberg", "by": "Benjamini-Yekutieli", "none": "no correction"}
FIRST_TOKEN_ROLES = ("positional:first", "sink:first-token", "special")


def statistics_sentence(roles: pd.DataFrame, roles_config: dict) -> str:
    """How the p-values and intervals of ``roles`` were made, read from its own columns
    (``test``, ``interval``, ``family``) and the run's roles configuration."""
    correction = CORRECTIONS.get(roles_config.get("correction", "bh"), roles_config.get("correction", "bh"))
    family = roles_config.get("family", "role")
    scope = (
        "every row of this run (all heads × roles × relations × directions) is one family"
        if family == "global"
        else "each role (and relation and direction) over the model's heads is one family"
    )
    parts = [f"p-values are one-sided (score above baseline), adjusted by {correction}; {scope}."]
    if "test" in roles and "interval" in roles:
        kinds = roles.assign(_t=roles["test"].astype(str).str.replace(r" \(.*", "", regex=True))
        tests = kinds.groupby("_t")["role"].nunique()
        if len(tests):
            parts.append(
                "Tests: " + "; ".join(f"{t or 'n/a'} ({_n(int(n), 'role', 'roles')})" for t, n in tests.items()) + "."
            )
        tail = int(roles["test"].astype(str).str.contains("normal tail").sum())
        refined = int(roles["test"].astype(str).str.contains("refined").sum())
        if refined or tail:
            parts.append(
                f"{_n(refined, 'head row was', 'head rows were')} redrawn with more permutations so that the "
                f"Monte-Carlo floor sits below what the correction needs; {_n(tail, 'row uses', 'rows use')} the "
                "normal approximation of the sign-flip null where even that was not enough."
            )
        intervals = sorted(set(roles["interval"].astype(str)) - {""})
        if intervals:
            parts.append(
                f"{roles_config.get('ci_level', 0.95):.0%} intervals: "
                + ", ".join(intervals)
                + " (Wilson for 0/1 hits, bootstrap percentile over items for shares)."
            )
    return " ".join(parts)


def overlap_sentence(roles: pd.DataFrame) -> str | None:
    """How many heads the three first-token roles share (they measure different things:
    where the maximum goes, the mass on position 0, the mass on special tokens)."""
    from headscope.analyses.roles.pipeline import verdict_overlap

    present = [r for r in FIRST_TOKEN_ROLES if (roles["role"] == r).any()]
    if len(present) < 2:
        return None
    ov = verdict_overlap(roles, roles=present)
    if ov.empty or int(ov["n_both"].sum()) == 0:
        return None
    pairs = "; ".join(
        f"{a} and {b}: {int(nb)} shared of {int(na)} and {int(nbb)} (Jaccard {j:.2f})"
        for a, b, na, nbb, nb, j in ov[["role_a", "role_b", "n_a", "n_b", "n_both", "jaccard"]].itertuples(index=False)
    )
    return (
        "Three roles look at the first token in different ways: positional:first counts query rows whose maximum "
        "weight lands on position 0, sink:first-token is the attention mass on position 0, special the mass on every "
        "[CLS]/[SEP]/BOS token. On an encoder position 0 is [CLS], so they flag many of the same heads: " + pairs + "."
    )


def pairs_sentence(roles: pd.DataFrame, pairs: pd.DataFrame | None) -> str | None:
    """Pair consistency on the coreference minimal pairs: the best head of each kind."""
    if pairs is None or pairs.empty:
        return None
    out = []
    for kind, g in pairs.groupby("kind", sort=True):
        best = g.sort_values(["pair_accuracy", "layer", "head"], ascending=[False, True, True]).iloc[0]
        role = f"coreference:{kind}" if kind else "coreference"
        rows = roles[(roles["role"] == role)]
        top = rows.sort_values("score", ascending=False).iloc[0] if len(rows) else None
        item = (
            f"; best item accuracy {top['score']:.2f} ({_head(top['layer'], top['head'])}) vs {top['baseline']:.2f}"
            if top is not None
            else ""
        )
        out.append(
            f"{kind or 'no kind'}: best {_head(best['layer'], best['head'])} with both items right in "
            f"{int(best['both_right'])} of {int(best['n_pairs'])} pairs ({best['pair_accuracy']:.2f}){item}"
        )
    return (
        "Coreference is scored per kind of item, each against its own baseline. On minimal pairs (two items that "
        "differ in the word that decides the antecedent) a head that ignores that word gets exactly one item of each "
        "pair right, so pair accuracy is 0 for it (and for both simple rules): " + "; ".join(out) + "."
    )


def _roles_overview(
    roles: pd.DataFrame,
    n_layers: int,
    n_heads: int,
    model: str,
    roles_config: dict | None = None,
    coref_pairs: pd.DataFrame | None = None,
) -> Section:
    s = Section(id="roles", title="Head roles")
    held = F.held_roles(roles)
    counts = roles[roles["verdict"].astype(bool)].drop_duplicates(["layer", "head", "role"])["role"].value_counts()
    multi = sum(1 for v in held.values() if len(v) > 1)
    common = ", ".join(f"{r} ({c} heads)" for r, c in counts.items()) or "none"
    total = n_layers * n_heads
    s.blocks.append(
        Paragraph(
            f"{len(held)} of {model}'s {total} heads hold at least one role at the configured thresholds; "
            f"{_n(multi, 'holds', 'hold')} more than one. Heads per role: {common}."
        )
    )
    s.blocks.append(Note(CAVEAT))
    s.blocks.append(Paragraph(statistics_sentence(roles, roles_config or {})))
    overlap = overlap_sentence(roles)
    if overlap:
        s.blocks.append(Paragraph(overlap))
    pairs = pairs_sentence(roles, coref_pairs)
    if pairs:
        s.blocks.append(Paragraph(pairs))
    fig = F.role_map_figure(roles, n_layers=n_layers, n_heads=n_heads)
    s.blocks.append(
        Figure(
            name="role_map",
            png=F.png_bytes(fig),
            alt=f"Grid of {n_layers} layers by {n_heads} heads coloured by role. {len(held)} heads hold a role, {multi} several. "
            f"Heads per role: {common}.",
            caption="Layer × head map of roles. Each coloured stripe is a role the head holds (verdict: margin over the baseline "
            "and adjusted p below alpha); a cell with several stripes holds several roles; stronger colour means a larger "
            "margin relative to the role's best head. Grey: no role.",
        )
    )
    return s


def _unheld_section(roles: pd.DataFrame, tops: dict[str, pd.DataFrame]) -> Section | None:
    """One table for the roles no head holds: each role's best head, for reference."""
    rows = []
    for role, best in tops.items():
        d = roles[roles["role"].astype(str) == role]
        if d["verdict"].astype(bool).any():
            continue
        r = best.iloc[0]
        rows.append(
            {
                "role": role,
                "best head": _head(r["layer"], r["head"]),
                "score": r["score"],
                "baseline": r["baseline"],
                "margin": r["margin"],
                "p (adj.)": r["p_value"],
                "n": r["n"],
            }
        )
    if not rows:
        return None
    s = Section(id="roles-unheld", title="Roles no head holds", level=3)
    s.blocks.append(
        Paragraph(
            f"No head passes the threshold for {_n(len(rows), 'role', 'roles')} ({', '.join(r['role'] for r in rows)}); "
            "the best-scoring head of each is listed for reference. A role absent here may still be carried by several heads "
            "together, or only on inputs unlike the probe corpora."
        )
    )
    s.blocks.append(
        Table(name="roles_unheld", frame=pd.DataFrame(rows), caption="Best head of each role that no head holds")
    )
    return s


def _role_sections(roles, examples, rvi, top: int) -> list[Section]:
    out = []
    tops = top_heads(roles, top)
    for role, best in tops.items():
        d = roles[roles["role"].astype(str) == role]
        n_held = d[d["verdict"].astype(bool)].drop_duplicates(["layer", "head"]).shape[0]
        if not n_held:
            continue
        s = Section(id=f"role-{slug(role)}", title=f"Role: {role}", level=3)
        s.blocks.append(
            Paragraph(
                f"{_n(n_held, 'head holds', 'heads hold')} this role. Top {len(best)} by margin over the baseline:"
            )
        )
        s.blocks.append(
            Table(
                name=f"top_{slug(role)}",
                frame=_role_table(best),
                caption=f"Top heads for {role}: score, baseline, margin, bootstrap CI of the score, adjusted p",
            )
        )
        rel = _relation_table(d)
        if rel is not None:
            s.blocks.append(rel)
        causal = _causal_rows(rvi, role)
        if not causal.empty:
            s.blocks.append(Paragraph(_causal_sentence(causal)))
        else:
            s.blocks.append(
                Paragraph(
                    "Causal evidence: no ablation of this role's heads was run; the verdict rests on attention alone."
                )
            )
        s.blocks.append(Note("Attention maps are clues, not proofs (Jain & Wallace 2019; Wiegreffe & Pinter 2019)."))
        for ex in role_examples(examples, role):
            s.blocks.append(_example_block(ex))
        out.append(s)
    unheld = _unheld_section(roles, tops)
    if unheld is not None:
        out.append(unheld)
    return out


def _clusters_figure(clusters: pd.DataFrame | None) -> Figure | None:
    if clusters is None or clusters.empty or not {"layer", "head", "x", "y", "cluster"} <= set(clusters.columns):
        return None
    sizes = clusters["cluster"].value_counts().sort_index()
    desc = "; ".join(f"cluster {c}: {n} heads" for c, n in sizes.items())
    return Figure(
        name="head_clusters",
        png=F.png_bytes(F.clusters_figure(clusters)),
        alt=f"Scatter plot of the {len(clusters)} heads in two dimensions, coloured by cluster, labelled by layer; {desc}.",
        caption="Heads embedded in two dimensions by their attention behaviour and clustered (Clark et al. 2019, §6); "
        "marker text is the layer. Heads of one cluster behave alike on the text corpus.",
    )


def _stats_section(stats: pd.DataFrame, clusters: pd.DataFrame | None = None) -> Section | None:
    metrics = F.stats_metrics(stats)
    if not metrics:
        return None
    s = Section(id="stats", title="Attention statistics by layer")
    means = stats[stats["metric"].astype(str).isin(metrics)].groupby(["metric", "layer"], observed=True)["value"].mean()
    desc = "; ".join(f"mean {m} by layer: " + ", ".join(f"{v:.2f}" for v in means.loc[m].values) for m in metrics)
    fig = F.stats_by_layer_figure(stats, metrics)
    s.blocks.append(
        Figure(
            name="stats_by_layer",
            png=F.png_bytes(fig),
            alt=f"Dot plots of {', '.join(metrics)} per head by layer; {desc}.",
            caption="Per-head attention statistics by layer (dots: heads; line: layer mean).",
        )
    )
    wide = means.unstack("metric").reset_index()
    s.blocks.append(Table(name="stats_by_layer", frame=wide, caption="Layer means of the per-head statistics"))
    cl = _clusters_figure(clusters)
    if cl is not None:
        s.blocks.append(cl)
    return s


COUNT_METRICS = ("query_heads_pruned", "kv_heads_pruned", "kv_cache_bytes_saved_per_token")


def curves_frame(frames: dict[str, pd.DataFrame], metric: str | None = None) -> pd.DataFrame | None:
    """The IMPACT rows the pruning figure plots: ``prune_curve_summary`` (seeds already
    averaged) or else ``prune_curves``, restricted to ``metric`` (else to the
    non-count metrics), with the ``curve:`` prefix taken off the study names."""
    for name in ("prune_curve_summary", "prune_curves"):
        df = frames.get(name)
        if df is not None and not df.empty:
            break
    else:
        return None
    d = df[df["fraction_pruned"].notna()]
    keep = (
        d["metric"].astype(str) == metric
        if metric and (d["metric"].astype(str) == metric).any()
        else ~d["metric"].astype(str).isin(COUNT_METRICS)
    )
    d = d[keep].copy()
    d["study"] = d["study"].astype(str).str.removeprefix("curve:")
    return d


def _ablation_map(frames, n_layers, n_heads) -> Figure | None:
    ab = frames.get("prune_ablation")
    if ab is None or ab.empty:
        return None
    d = ab[(ab["study"].astype(str) == "ablation:zero") & ab["metric"].astype(str).str.startswith("delta_")]
    if d.empty:
        return None
    metric = str(d["metric"].iloc[0])
    fig = F.head_map_figure(
        d, n_layers=n_layers, n_heads=n_heads, label=metric, title=f"Single-head zero ablation: {metric} per head"
    )
    worst = d.loc[d["value"].abs().idxmax()]
    return Figure(
        name="ablation_map",
        png=F.png_bytes(fig),
        alt=f"Heatmap of {n_layers} layers by {n_heads} heads: change in the metric when each head alone is zero-ablated; "
        f"the largest change is {_head(worst['layer'], worst['head'])} ({worst['value']:+.4f}).",
        caption=f"Importance of single heads: {metric} when one head is zero-ablated (the rest intact). "
        "Most heads matter little alone; redundancy is why pruning curves stay flat at first.",
    )


def _pruning_section(frames: dict, rvi: pd.DataFrame, n_layers: int, n_heads: int, metric: str | None) -> Section:
    s = Section(id="pruning", title="Pruning")
    curves = F.curve_rows(curves_frame(frames, metric))
    base = frames.get("prune_baseline")
    if base is not None and not base.empty:
        b = base.iloc[0]
        s.blocks.append(
            Paragraph(
                f"Unpruned model: {b['metric']} = {fmt(b['value'])} (bootstrap SE {fmt(b['spread'])}, {int(b['n'])} items)."
            )
        )
    if curves.empty:
        s.blocks.append(Paragraph("No pruning curves in this run."))
    else:
        fig = F.pruning_figure(curves, summarised=True)
        ends = []
        for (study, m), d in curves.groupby(["study", "metric"], observed=True):
            d = d.sort_values("fraction_pruned")
            ends.append(
                f"{study}: {m} {d['value'].iloc[0]:.3f} at {d['fraction_pruned'].iloc[0]:.0%} → {d['value'].iloc[-1]:.3f} at {d['fraction_pruned'].iloc[-1]:.0%}"
            )
        s.blocks.append(
            Figure(
                name="pruning_curves",
                png=F.png_bytes(fig),
                alt="Line chart of the metric against the fraction of heads pruned, one line per pruning order. "
                + "; ".join(ends)
                + ".",
                caption="Pruning curves: heads are removed in the order each study ranks them; shaded bands are ± the spread "
                "(for random orders, the standard deviation over seeds; otherwise the bootstrap SE over items).",
            )
        )
        fr = sorted(curves["fraction_pruned"].unique())
        pick = [fr[0], fr[len(fr) // 2], fr[-1]] if len(fr) >= 3 else fr
        t = curves[curves["fraction_pruned"].isin(pick)].copy()
        t["fraction_pruned"] = t["fraction_pruned"].map(lambda v: f"{v:.0%}")
        s.blocks.append(
            Table(
                name="pruning_points",
                frame=t.rename(columns={"study": "order", "n_seeds": "curves averaged"}),
                caption="Pruning curves at the first, middle and last fraction pruned",
            )
        )
    pr = frames.get("prune_prunable")
    if pr is not None and not pr.empty:
        t = pr.copy()
        for c in ("query_heads_pruned", "kv_heads_pruned"):
            if c in t:
                t[c] = t[c].round().astype("Int64")
        t["tolerance"] = t["tolerance"].map(lambda v: f"{v:.0%}")
        t["fraction_pruned"] = t["fraction_pruned"].map(lambda v: f"{v:.0%}")
        s.blocks.append(
            Table(
                name="prunable",
                frame=t,
                caption="Largest fraction of heads prunable while the metric stays within the tolerance of the unpruned model",
            )
        )
    amap = _ablation_map(frames, n_layers, n_heads)
    if amap is not None:
        s.blocks.append(amap)
    if rvi is not None and not rvi.empty:
        fig = F.causal_figure(rvi)
        s.blocks.append(
            Figure(
                name="causal_evidence",
                png=F.png_bytes(fig),
                alt="Bar chart per role: metric after ablating the role's top heads versus random heads. "
                + "; ".join(f"{r.role}: {r.value_role:.3f} vs {r.value_random_mean:.3f}" for r in rvi.itertuples())
                + ".",
                caption="Roles vs importance: ablating a role's top-k heads (red) against k random heads (grey, mean ± sd over draws).",
            )
        )
    return s


def _skipped_section(skipped: pd.DataFrame, n_items: dict) -> Section:
    s = Section(id="skipped", title="Items skipped")
    used = ", ".join(f"{k}: {v}" for k, v in n_items.items()) if n_items else ""
    if skipped is None or skipped.empty or int(skipped["count"].sum()) == 0:
        s.blocks.append(Paragraph("No item was skipped." + (f" Items used — {used}." if used else "")))
    else:
        s.blocks.append(
            Paragraph(
                f"{int(skipped['count'].sum())} items were skipped, by reason below."
                + (f" Items used — {used}." if used else "")
            )
        )
        s.blocks.append(Table(name="skipped", frame=skipped, caption="Skipped items by analysis and reason"))
    return s


def _run_section(meta: dict) -> Section:
    s = Section(id="run", title="Run")
    rows = [
        ("model", meta.get("model")),
        ("backend", meta.get("backend_choice") or meta.get("backend")),
        ("mode", "full" if meta.get("full") else "quick"),
        ("seed", meta.get("seed")),
        ("model file SHA-256", meta.get("sha256") or "—"),
        ("trust_remote_code", "true" if meta.get("trust_remote_code") else "false"),
    ]
    rows += [(f"version: {k}", v) for k, v in (meta.get("versions") or {}).items()]
    rows += [(f"time: {k}", f"{v:.1f} s") for k, v in (meta.get("timings") or {}).items()]
    s.blocks.append(
        Table(
            name="run",
            frame=pd.DataFrame(rows, columns=["field", "value"]),
            caption="Configuration, versions and timings",
        )
    )
    s.blocks.append(
        Paragraph(
            "Tables are in tables/ (CSV and Parquet, tidy: one observation per row); the full configuration is in run.json."
        )
    )
    return s


def build_document(
    frames: dict[str, pd.DataFrame], *, card: dict, card_text: str, meta: dict, top: int = 3
) -> Document:
    """The report's content from frames. ``frames`` keys used: ``roles`` (ROLE_COLUMNS),
    ``stats`` (STAT_COLUMNS), ``examples`` (EXAMPLE_COLUMNS), ``prune_*`` (IMPACT_COLUMNS; curves from
    ``prune_curve_summary`` / ``prune_curves``, single-head map from ``prune_ablation``,
    ``prune_prunable``, ``prune_baseline``),
    ``roles_vs_importance`` (role, k, metric, value_role, value_random_mean,
    value_random_std, n_draws), ``skipped`` (analysis, reason, count); any may be missing.
    ``card`` is :func:`headscope.probes.models.card.model_card`'s dict, ``card_text`` its rendering;
    ``meta``: model, backend, full, seed, sha256, versions, timings, n_items; with
    ``patching_summary`` or ``absent["patching"]`` the "Causal evidence" section
    (:func:`causal_sections`, from ``frames["patching"]``) follows the roles."""
    roles = frames.get("roles")
    n_layers, n_heads = int(card["layers"]), int(card["heads"])
    model = meta.get("model") or card.get("name", "model")
    sections = [_card_section(card, card_text)]
    if roles is not None and not roles.empty:
        roles_config = (meta.get("config") or {}).get("roles") or {}
        sections.append(_roles_overview(roles, n_layers, n_heads, model, roles_config, frames.get("coref_pairs")))
        sections[-1].blocks.append(head_view_block(frames, n_layers, n_heads))
        sections += _role_sections(roles, frames.get("examples"), frames.get("roles_vs_importance"), top)
    stats = _stats_section(frames.get("stats"), frames.get("clusters"))
    if stats:
        sections.append(stats)
    if meta.get("patching_summary") or (meta.get("absent") or {}).get("patching"):
        sections += causal_sections(frames, meta, n_layers, n_heads)
    why_absent = (meta.get("absent") or {}).get("pruning")
    if why_absent:
        sections.append(
            Section(
                id="pruning",
                title="Pruning",
                blocks=[Paragraph(f"The pruning studies did not run on this model: {why_absent}.")],
            )
        )
    else:
        sections.append(
            _pruning_section(frames, frames.get("roles_vs_importance"), n_layers, n_heads, meta.get("prune_metric"))
        )
    sections.append(_skipped_section(frames.get("skipped"), meta.get("n_items") or {}))
    sections.append(_run_section(meta))
    return Document(
        title=f"What the attention heads of {model} do",
        subtitle=f"{n_layers} layers × {n_heads} heads = {n_layers * n_heads} heads · backend {meta.get('backend')} · "
        f"{'full' if meta.get('full') else 'quick'} pruning studies · seed {meta.get('seed')}",
        sections=sections,
    )


# ----------------------------------------------------------------- causal evidence (patching)
#: attribution is called a trustworthy stand-in for activation patching at and above these
TRUST_SPEARMAN, TRUST_OVERLAP = 0.7, 0.6


def attention_top(roles: pd.DataFrame, role: str, relation: str = "", k: int = 10) -> pd.DataFrame:
    """A role's heads with a verdict (of ``relation`` when given), ranked by attention score
    (a head once, on its best row): ``layer, head, score``, at most ``k`` rows."""
    d = roles[(roles["role"].astype(str) == role) & roles["verdict"].astype(bool)]
    if relation:
        d = d[d["relation"].astype(str) == relation]
    d = d.sort_values(["score", "layer", "head"], ascending=[False, True, True]).drop_duplicates(["layer", "head"])
    return d[["layer", "head", "score"]].head(k).reset_index(drop=True)


def patching_top(patching: pd.DataFrame, task: str, method: str, k: int = 10) -> pd.DataFrame:
    """The ``k`` heads with the largest ``effect`` of ``method`` on ``task``: ``layer, head,
    effect, ci_low, ci_high, significant`` (ties: lower layer, head first)."""
    d = patching[(patching["task"].astype(str) == task) & (patching["method"].astype(str) == method)]
    if "position" in d:
        d = d[d["position"].isna()]
    d = d.dropna(subset=["effect"]).sort_values(["effect", "layer", "head"], ascending=[False, True, True])
    return d[["layer", "head", "effect", "ci_low", "ci_high", "significant"]].head(k).reset_index(drop=True)


def causal_comparison(att: pd.DataFrame, pat: pd.DataFrame) -> pd.DataFrame:
    """Attention's top heads next to patching's, rank by rank (a side shorter than the other
    is left blank), with ``in other`` marking a head both lists hold.

    >>> att = pd.DataFrame({"layer": [1], "head": [1], "score": [0.6]})
    >>> pat = pd.DataFrame({"layer": [1, 0], "head": [1, 0], "effect": [0.9, 0.1], "ci_low": [0.8, 0.0],
    ...     "ci_high": [1.0, 0.2], "significant": [True, False]})
    >>> causal_comparison(att, pat)[["rank", "by attention", "by patching", "in both"]].values.tolist()
    [[1, 'L1H1', 'L1H1', 'yes'], [2, '', 'L0H0', '']]
    """
    a = [_head(l, h) for l, h in zip(att["layer"], att["head"])]
    p = [_head(l, h) for l, h in zip(pat["layer"], pat["head"])]
    both = set(a) & set(p)
    rows = []
    for i in range(max(len(a), len(p))):
        ra = att.iloc[i] if i < len(a) else None
        rp = pat.iloc[i] if i < len(p) else None
        rows.append(
            {
                "rank": i + 1,
                "by attention": a[i] if ra is not None else "",
                "attention score": float(ra["score"]) if ra is not None else math.nan,
                "by patching": p[i] if rp is not None else "",
                "effect": float(rp["effect"]) if rp is not None else math.nan,
                "CI low": float(rp["ci_low"]) if rp is not None else math.nan,
                "CI high": float(rp["ci_high"]) if rp is not None else math.nan,
                "significant": bool(rp["significant"]) if rp is not None else "",
                "in both": "yes" if {a[i] if ra is not None else None, p[i] if rp is not None else None} & both else "",
            }
        )
    return pd.DataFrame(rows)


def causal_sentence(label: str, att: pd.DataFrame, pat: pd.DataFrame, *, k: int, n_heads: int) -> str:
    """What the two top lists mean, in words.

    >>> att = pd.DataFrame({"layer": [1, 2, 3], "head": [1, 1, 1], "score": [0.9, 0.8, 0.7]})
    >>> pat = pd.DataFrame({"layer": [1, 3], "head": [1, 1], "effect": [0.5, 0.2], "significant": [True, False]})
    >>> causal_sentence("induction", att, pat, k=10, n_heads=72)
    '2 of 3 heads labelled induction by attention (L1H1, L3H1) are among the 10 heads with the largest patching effect (of 72); 1 of those 2 is significant.'
    """
    a = [(int(l), int(h)) for l, h in zip(att["layer"], att["head"])]
    sig = {(int(l), int(h)) for l, h, s in zip(pat["layer"], pat["head"], pat["significant"]) if bool(s)}
    p = {(int(l), int(h)) for l, h in zip(pat["layer"], pat["head"])}
    hits = [x for x in a if x in p]
    if not a:
        return (
            f"No head holds {label} by attention, so there is nothing to compare with the heads patching singles out."
        )
    text = (
        f"{len(hits)} of {_n(len(a), f'head labelled {label}', f'heads labelled {label}')} by attention"
        + (f" ({', '.join(_head(*x) for x in hits)})" if hits else "")
        + f" {'is' if len(hits) == 1 else 'are'} among the {k} heads with the largest patching effect (of {n_heads})"
    )
    if hits:
        n_sig = sum(x in sig for x in hits)
        if len(hits) == 1:
            text += "; its effect is significant." if n_sig else "; its effect is not significant."
        else:
            text += f"; {n_sig} of those {len(hits)} {'is' if n_sig == 1 else 'are'} significant."
    else:
        text += ": patching does not single out the heads attention labels for this task."
    return text


def _agreement_sentence(agree: dict | None, k: int) -> str:
    if not agree or agree.get("spearman") is None or math.isnan(float(agree.get("spearman", math.nan))):
        return "Attribution vs activation patching: no agreement figure (too few heads with an effect)."
    rho, ov = float(agree["spearman"]), float(agree["top_k_overlap"])
    trust = (
        "the cheap first-order estimate ranks heads like activation patching here"
        if rho >= TRUST_SPEARMAN and ov >= TRUST_OVERLAP
        else "the cheap first-order estimate is not a reliable stand-in for activation patching on this task"
    )
    return (
        f"Attribution vs activation patching over {agree.get('n_heads')} heads: Spearman {rho:.2f}, top-{agree.get('k', k)} "
        f"overlap {ov:.2f}: {trust}."
    )


def _task_paragraph(task: str, s: dict) -> str:
    t = s.get("task") or {}
    measures = s.get("measures") or f"the {t.get('metric', '?')} metric"
    gap = float(s.get("gap", math.nan))
    text = (
        f"Task {task} ({_n(int(t.get('n_items', 0)), 'item', 'items')}"
        + (f", {t['n_unusable']} unusable" if t.get("n_unusable") else "")
        + f"): the metric is {measures}. Clean run {float(s.get('metric_clean', math.nan)):.3f}, corrupted "
        f"{float(s.get('metric_corrupted', math.nan)):.3f}, gap {gap:.3f}. An effect is the share of that gap a head "
        "restores when its output from the clean run is patched into the corrupted run (0 = corrupted, 1 = clean); "
        "CI: bootstrap over items; significant: sign-flip test, Benjamini-Hochberg adjusted."
    )
    if not gap > 1e-6:
        text += " The task does not separate clean from corrupted on this model, so its effects say nothing."
    return text


def causal_sections(
    frames: dict[str, pd.DataFrame], meta: dict, n_layers: int, n_heads: int, top_k: int = 10
) -> list[Section]:
    """The "Causal evidence" section (and one subsection per role with a task): attention's top
    heads next to patching's, their overlap, the task, the metric gap, attribution vs
    activation agreement and a heatmap of the effect per head. ``frames["patching"]`` (task +
    PATCH_COLUMNS) and ``meta["patching_summary"]`` (``roles``: records of label, role,
    relation, task (:func:`~headscope.reports.pipeline.causal_roles`); ``tasks``:
    per-task summaries, ``refused``); roles without a task are listed."""
    roles = frames.get("roles")
    s = Section(id="causal", title="Causal evidence")
    why = (meta.get("absent") or {}).get("patching")
    if why:
        s.blocks.append(Paragraph(f"No patching on this model: {why}."))
        return [s]
    summ = meta.get("patching_summary") or {}
    patching = frames.get("patching")
    if patching is None or not summ:
        s.blocks.append(Paragraph("No patching in this run."))
        return [s]
    method = summ.get("method", "activation_denoising")
    mapping = {r["label"]: r for r in summ.get("roles") or []}
    tasks = summ.get("tasks") or {}
    refused = summ.get("refused") or {}
    total = n_layers * n_heads
    k = min(int(summ.get("top_k", top_k)), total)
    grouped = summ.get("unit") == "kv_group"
    what = (
        "every KV group: the query heads sharing a key/value head patched together, each head given its group's "
        "effect (quick mode on a GQA model; --full patches each head)"
        if grouped
        else "every head"
    )
    s.blocks.append(
        Paragraph(
            "Attention says where a head looks; patching says whether the model uses it. For each role with a task, "
            f"the task's clean input is run, then its corrupted input with one head's output taken from the clean run "
            f"(activation patching, denoising, {what}; {summ.get('n_items')} items per task), and the head's effect "
            f"is how much of the metric's clean - corrupted gap it restores. The role's top {k} heads by attention score "
            f"(heads with a verdict) stand next to the top {k} by effect; attribution patching (a first-order estimate from "
            "one backward pass) is compared with it."
        )
    )
    all_roles = sorted(set(roles["role"].astype(str))) if roles is not None and not roles.empty else []
    without = [r for r in all_roles if r not in mapping]
    if "syntactic" in without and any(lab.startswith("syntactic:") for lab in mapping):
        without[without.index("syntactic")] = (
            "syntactic (relations other than "
            + ", ".join(lab.split(":", 1)[1] for lab in mapping if lab.startswith("syntactic:"))
            + ")"
        )
    if without:
        s.blocks.append(Paragraph(f"Roles without a patching task: {', '.join(without)}."))
    out = [s]
    first: dict[str, str] = {}  # task -> the label of the subsection that shows it in full
    for label, r in mapping.items():
        task, role, relation = r["task"], r["role"], r.get("relation") or ""
        sub = Section(id=f"causal-{slug(label)}", title=f"Causal evidence: {label}", level=3)
        out.append(sub)
        if task in refused:
            sub.blocks.append(Paragraph(f"Task {task} was refused on this model: {refused[task]}."))
            continue
        if task not in tasks:
            sub.blocks.append(Paragraph(f"Task {task} has no result in this run."))
            continue
        ts = tasks[task]
        att = attention_top(roles, role, relation, k) if roles is not None else pd.DataFrame(columns=["layer", "head"])
        pat = patching_top(patching, task, method, k)
        if task in first:  # the task's figures are shown once; this role adds its own attention heads
            sub.blocks.append(Paragraph(f"Task {task}: the same run as in the subsection on {first[task]}."))
            if len(att):
                sub.blocks.append(_causal_table(label, task, att, pat))
            sub.blocks.append(Paragraph(causal_sentence(label, att, pat, k=k, n_heads=total)))
            continue
        first[task] = label
        sub.blocks.append(Paragraph(_task_paragraph(task, ts)))
        sub.blocks.append(_causal_table(label, task, att, pat))
        sub.blocks.append(Paragraph(causal_sentence(label, att, pat, k=k, n_heads=total)))
        sub.blocks.append(Paragraph(_agreement_sentence((ts.get("agreement") or {}).get("denoising"), k)))
        if ts.get("warnings"):
            sub.blocks.append(Note("; ".join(ts["warnings"])))
        fig = _patching_map(patching, task, method, n_layers, n_heads, att, label, grouped)
        if fig is not None:
            sub.blocks.append(fig)
    return out


def _causal_table(label: str, task: str, att: pd.DataFrame, pat: pd.DataFrame) -> Table:
    return Table(
        name=f"causal_{slug(label)}",
        frame=causal_comparison(att, pat),
        caption=f"{label}: top heads by attention score vs by patching effect on task {task}",
    )


def _patching_map(patching, task, method, n_layers, n_heads, att, label, grouped=False) -> Figure | None:
    d = patching[(patching["task"].astype(str) == task) & (patching["method"].astype(str) == method)]
    if d.empty or d["effect"].isna().all():
        return None
    marked = [(int(l), int(h)) for l, h in zip(att["layer"], att["head"])]
    fig = F.patching_effect_figure(
        d,
        n_layers=n_layers,
        n_heads=n_heads,
        title=f"Activation patching on {task}: effect per {'KV group' if grouped else 'head'}",
        marked=marked,
    )
    best = d.loc[d["effect"].idxmax()]
    return Figure(
        name=f"patching_{slug(task)}",
        png=F.png_bytes(fig),
        alt=f"Heatmap of {n_layers} layers by {n_heads} heads: the normalised effect of patching each head on task "
        f"{task}; the largest is {_head(best['layer'], best['head'])} ({best['effect']:.3f}). Heads labelled {label} by "
        "attention are outlined.",
        caption=f"Effect of each head on task {task} (0 = corrupted run, 1 = clean run); outlined: the heads labelled "
        f"{label} by attention.",
    )


# ----------------------------------------------------------------- HTML rendering
CSS = """
body{font:15px/1.5 Georgia,'DejaVu Serif',serif;color:#222;max-width:980px;margin:2em auto;padding:0 1.2em;background:#fff}
h1{font-size:1.7em;margin-bottom:.1em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
h3{margin-top:1.6em}.subtitle{color:#666;margin-top:0}
nav ul{columns:2;font-size:.9em}
pre{background:#f6f6f4;padding:.8em;overflow-x:auto;font:13px/1.4 'DejaVu Sans Mono',monospace}
figure{margin:1.2em 0;text-align:center}figure img{max-width:100%;height:auto}
figcaption{font-size:.88em;color:#444;text-align:left;margin-top:.4em}
table{border-collapse:collapse;margin:.8em 0;font:13px/1.35 'DejaVu Sans',Arial,sans-serif}
caption{caption-side:top;text-align:left;font-style:italic;color:#555;padding-bottom:.3em}
th,td{border-bottom:1px solid #e2e2e2;padding:.25em .6em;text-align:left}
th{background:#f2f2f2}td.num{text-align:right;font-variant-numeric:tabular-nums}
.note{border-left:4px solid #c44e52;background:#fbf3f3;padding:.5em .8em;font-size:.92em}
"""


def _num(v) -> str:
    return (
        ' class="num"'
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
        else ""
    )


def _table_html(t: Table) -> str:
    head = "".join(f'<th scope="col">{_html.escape(str(c))}</th>' for c in t.frame.columns)
    body = "".join(
        "<tr>" + "".join(f"<td{_num(v)}>{_html.escape(fmt(v))}</td>" for v in row) + "</tr>"
        for row in t.frame.itertuples(index=False)
    )
    return f"<table><caption>{_html.escape(t.caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _block_html(b) -> str:
    if isinstance(b, Paragraph):
        return f"<p>{_html.escape(b.text)}</p>"
    if isinstance(b, Note):
        return f'<p class="note" role="note">{_html.escape(b.text)}</p>'
    if isinstance(b, Pre):
        return f"<pre>{_html.escape(b.text)}</pre>"
    if isinstance(b, Figure):
        return (
            f'<figure id="fig-{_html.escape(b.name)}"><img src="{F.data_uri(b.png)}" alt="{_html.escape(b.alt, quote=True)}">'
            f"<figcaption>{_html.escape(b.caption)}</figcaption></figure>"
        )
    if isinstance(b, Table):
        return _table_html(b)
    if isinstance(b, HeadView):
        return _head_view_html(b)
    raise TypeError(
        f"unknown document block {type(b).__name__}; expected Paragraph, Note, Pre, Figure, Table or HeadView"
    )


def render_html(doc: Document) -> str:
    """One self-contained HTML page: inline CSS, images as data URIs, no external
    resource; the only script is the head view's (embedded, with its data as one JSON
    blob), and the page reads the same without it."""
    toc = "".join(f'<li><a href="#{_html.escape(s.id)}">{_html.escape(s.title)}</a></li>' for s in doc.sections)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_html.escape(doc.title)}</title><style>{CSS}{HEAD_VIEW_CSS}</style></head><body><main>",
        f"<h1>{_html.escape(doc.title)}</h1>",
        f'<p class="subtitle">{_html.escape(doc.subtitle)}</p>' if doc.subtitle else "",
        f'<nav aria-label="contents"><ul>{toc}</ul></nav>',
    ]
    for s in doc.sections:
        h = f"h{s.level}"
        parts.append(f'<section id="{_html.escape(s.id)}"><{h}>{_html.escape(s.title)}</{h}>')
        parts.extend(_block_html(b) for b in s.blocks)
        parts.append("</section>")
    parts.append("</main></body></html>\n")
    return "\n".join(p for p in parts if p)


# ----------------------------------------------------------------- interactive head view
@dataclass
class HeadView:
    """The clickable layer × head grid and the per-head panel (HTML only: data as one JSON
    blob, drawn by a small embedded script; Markdown renders ``text``)."""

    data: dict
    text: str = (
        "The HTML report (report.html) has an interactive head view here: choose a head on a layer × head "
        "grid to see all its rows of the roles table, its attention on the example items and its pruning figures."
    )


def _sig(v, digits: int = 4):
    """A float rounded to ``digits`` significant digits for the embedded JSON (NaN → null)."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    return float(f"{v:.{digits}g}")


def head_view_data(frames: dict[str, pd.DataFrame], n_layers: int, n_heads: int, max_rows: int = 20_000) -> dict:
    """The head view's JSON: for every head ``"L{layer}H{head}"`` its roles rows
    (:data:`ROLE_VIEW_COLUMNS`, verdicts first, then by margin; where the roles frame has
    more than ``max_rows`` rows, each head keeps its first ``max_rows // heads`` and
    ``n_rows`` says how many it has, so a large model's page stays small), the roles it holds and the
    colour of each, its example attention maps (words or tokens, weights to 3 decimals, gold
    pairs) and its single-head pruning figures (``prune_ablation`` deltas, ``prune_importance``)."""
    from matplotlib.colors import to_hex

    roles = frames.get("roles")
    roles = roles if roles is not None else pd.DataFrame(columns=ROLE_VIEW_COLUMNS + ["layer", "head"])
    held = F.held_roles(roles)
    names = sorted({r for v in held.values() for r, _ in v})
    top = {name: max((m for v in held.values() for r, m in v if r == name), default=1.0) for name in names}
    heads: dict[str, dict] = {}
    for layer in range(n_layers):
        for head in range(n_heads):
            cell = held.get((layer, head), [])
            heads[_head(layer, head)] = {
                "layer": layer,
                "head": head,
                "held": [r for r, _ in cell],
                "alpha": [
                    _sig(0.35 + 0.65 * float(np.clip(m / top[r], 0, 1)) if top[r] > 0 else 1.0, 2) for r, m in cell
                ],
                "rows": [],
                "n_rows": 0,
                "examples": [],
                "prune": [],
            }
    if not roles.empty:
        d = roles.assign(_v=roles["verdict"].astype(bool)).sort_values(
            ["layer", "head", "_v", "margin"], ascending=[True, True, False, False], kind="stable"
        )
        cap = max(1, max_rows // max(1, n_layers * n_heads)) if len(d) > max_rows else len(d)
        for r in d.itertuples(index=False):
            h = heads.get(_head(r.layer, r.head))
            if h is None:
                continue
            h["n_rows"] += 1
            if len(h["rows"]) >= cap:
                continue
            row = []
            for c in ROLE_VIEW_COLUMNS:
                v = getattr(r, c)
                if c in ("role", "relation", "direction"):
                    row.append("" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
                else:
                    row.append(bool(v) if c == "verdict" else _sig(v))
            h["rows"].append(row)
    ex = frames.get("examples")
    if ex is not None and not ex.empty:
        for key, e in ex.groupby("example", sort=False):
            h = heads.get(_head(e["layer"].iloc[0], e["head"].iloc[0]))
            if h is None:
                continue
            q = e.drop_duplicates("query_index").sort_values("query_index")
            k = e.drop_duplicates("key_index").sort_values("key_index")
            mat = e.pivot_table(index="query_index", columns="key_index", values="weight", aggfunc="sum")
            mat = mat.reindex(index=q["query_index"], columns=k["key_index"]).fillna(0.0).to_numpy()
            qi = {int(v): i for i, v in enumerate(q["query_index"])}
            ki = {int(v): i for i, v in enumerate(k["key_index"])}
            gold = e[e["gold"].astype(bool)]
            r0 = e.iloc[0]
            h["examples"].append(
                {
                    "name": str(key),
                    "role": str(r0["role"]),
                    "relation": str(r0["relation"]) if not pd.isna(r0["relation"]) else "",
                    "level": str(r0["level"]),
                    "sentence": str(r0["sentence"]),
                    "queries": [str(w) for w in q["query_word"]],
                    "keys": [str(w) for w in k["key_word"]],
                    "w": [[round(float(x), 3) for x in row] for row in mat],
                    "gold": [[qi[int(a)], ki[int(b)]] for a, b in zip(gold["query_index"], gold["key_index"])],
                }
            )
    measures = []
    ab = frames.get("prune_ablation")
    if ab is not None and not ab.empty:
        d = ab[ab["metric"].astype(str).str.startswith("delta_") & ab["layer"].notna()]
        for (study, metric), g in d.groupby(["study", "metric"], sort=True, observed=True):
            measures.append((f"single-head ablation ({study}): {metric}", g))
    imp = frames.get("prune_importance")
    if imp is not None and not imp.empty:
        d = imp[imp["layer"].notna()]
        for (study, metric), g in d.groupby(["study", "metric"], sort=True, observed=True):
            measures.append((f"{study}: {metric}", g))
    for label, g in measures:
        g = g.groupby(["layer", "head"], observed=True)["value"].mean().reset_index()
        rank = g["value"].abs().rank(ascending=False, method="min")
        for r, rk in zip(g.itertuples(index=False), rank):
            h = heads.get(_head(r.layer, r.head))
            if h is not None:
                h["prune"].append([label, _sig(r.value), int(rk), len(g)])
    return {
        "layers": n_layers,
        "heads": n_heads,
        "columns": ROLE_VIEW_COLUMNS,
        "colours": {n: to_hex(c) for n, c in F.role_colours(names).items()},
        "cells": heads,
    }


def head_view_block(frames: dict[str, pd.DataFrame], n_layers: int, n_heads: int) -> HeadView:
    return HeadView(head_view_data(frames, n_layers, n_heads))


HEAD_VIEW_CSS = """
.hv{margin:1em 0}.hv-top{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}
.hv-grid caption{max-width:24em}
.hv-grid td,.hv-grid th{padding:1px;border:0;text-align:center;font-size:11px;background:none}
.hv-cell{width:22px;height:22px;border:1px solid #fff;border-radius:2px;padding:0;cursor:pointer;display:block}
.hv-cell:hover{border-color:#555}.hv-cell:focus-visible{outline:2px solid #000;outline-offset:1px}
.hv-cell[aria-pressed=true]{border:2px solid #000}
.hv-legend{font:12px/1.6 'DejaVu Sans',Arial,sans-serif;max-width:260px}
.hv-legend span{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:middle}
.hv-panel{margin-top:1em;border-top:1px solid #ddd}
.hv-rows{max-height:22em;overflow:auto;border:1px solid #e2e2e2}.hv-rows table{margin:0}
.hv-rows th,.hv-rows td{white-space:nowrap;padding:.15em .45em}
#hv-examples{display:flex;flex-wrap:wrap;gap:1em}.hv-fig{margin:.8em 0;text-align:left;max-width:100%;overflow-x:auto}
.hv-fig figcaption{max-width:34em;margin:0 0 .3em}
tr.hv-held td{font-weight:bold}
.hv-map td{width:15px;height:15px;padding:0;border:1px solid #f4f4f4}
.hv-map td.gold{outline:2px solid #c44e52;outline-offset:-2px}
.hv-map th{font-weight:normal;background:none;padding:0 .3em;border:0;white-space:nowrap}
.hv-map thead th{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;padding:.3em 0}
"""

HEAD_VIEW_JS = r"""
(function(){
"use strict";
var root=document.getElementById("head-view"),src=document.getElementById("head-view-data");
if(!root||!src)return;
var D=JSON.parse(src.textContent),C=D.columns;
var cells=Array.prototype.slice.call(root.querySelectorAll("button.hv-cell"));
var byId={};cells.forEach(function(b){byId[b.getAttribute("data-head")]=b;});
var panel=document.getElementById("hv-panel"),status=document.getElementById("hv-status");
function el(tag,attrs,text){var e=document.createElement(tag);if(attrs)for(var k in attrs)e.setAttribute(k,attrs[k]);if(text!==undefined&&text!==null)e.textContent=text;return e;}
function num(v,isInt){if(v===null||v===undefined)return"\u2014";if(typeof v==="boolean")return v?"yes":"no";if(typeof v!=="number")return String(v);if(isInt)return String(Math.round(v));if(v!==0&&Math.abs(v)<1e-3)return v.toExponential(1);return v.toFixed(3);}
function col(name){return C.indexOf(name);}
function rolesTable(h){
  var rows=h.rows,wrap=el("div",{"class":"hv-rows",tabindex:"0",role:"region","aria-label":"roles of "+h.id});
  var t=el("table",{id:"hv-roles"});
  t.appendChild(el("caption",null,(h.n_rows>rows.length?"The first "+rows.length+" of the "+h.n_rows+" role rows of "+h.id+" (all in tables/roles.csv)":"Every role row of "+h.id)+" (verdicts first, then by margin): score, baseline, margin, CI of the score, adjusted p"));
  var rel=rows.some(function(r){return r[col("relation")];});
  var heads=["role"].concat(rel?["relation","direction"]:[],["score","baseline","margin","CI","p (adj.)","n","verdict"]);
  var tr=el("tr");heads.forEach(function(x){tr.appendChild(el("th",{scope:"col"},x));});
  var th=el("thead");th.appendChild(tr);t.appendChild(th);
  var tb=el("tbody");
  rows.forEach(function(r){
    var v=r[col("verdict")],tr=el("tr",v?{"class":"hv-held"}:null);
    var vals=[r[col("role")]].concat(rel?[r[col("relation")],r[col("direction")]]:[]);
    vals.forEach(function(x){tr.appendChild(el("td",null,x));});
    [num(r[col("score")]),num(r[col("baseline")]),num(r[col("margin")]),num(r[col("ci_low")])+"\u2013"+num(r[col("ci_high")]),num(r[col("p_value")]),num(r[col("n")],true)].forEach(function(x){tr.appendChild(el("td",{"class":"num"},x));});
    tr.appendChild(el("td",null,v?"yes":"no"));
    tb.appendChild(tr);
  });
  t.appendChild(tb);wrap.appendChild(t);return wrap;
}
function heat(ex){
  var top=0;ex.w.forEach(function(r){r.forEach(function(w){if(w>top)top=w;});});top=top>0?top:1;
  var f=el("figure",{"class":"hv-fig"}),t=el("table",{"class":"hv-map","aria-label":"attention of "+ex.name});
  f.appendChild(el("figcaption",null,ex.name+" ("+ex.level+" level): \u201c"+ex.sentence+"\u201d. Rows: query "+ex.level+"s; columns: the "+ex.level+"s they attend to; darker = more attention (full colour: this map's largest weight, "+top.toFixed(3)+")"+(ex.gold.length?"; red outline: the links the role expects.":".")));
  var gold={};ex.gold.forEach(function(g){gold[g[0]+","+g[1]]=1;});
  var th=el("thead"),tr=el("tr");tr.appendChild(el("td"));
  ex.keys.forEach(function(k){tr.appendChild(el("th",{scope:"col"},k));});th.appendChild(tr);t.appendChild(th);
  var tb=el("tbody");
  ex.w.forEach(function(row,i){
    var tr=el("tr");tr.appendChild(el("th",{scope:"row"},ex.queries[i]));
    row.forEach(function(w,j){
      var g=gold[i+","+j],lab=ex.queries[i]+" \u2192 "+ex.keys[j]+": "+w.toFixed(3)+(g?" (expected)":"");
      var td=el("td",{title:lab,"aria-label":lab,style:"background:rgba(8,69,148,"+Math.min(1,Math.max(0,w/top)).toFixed(3)+")"});
      if(g)td.className="gold";tr.appendChild(td);
    });
    tb.appendChild(tr);
  });
  t.appendChild(tb);f.appendChild(t);return f;
}
function show(id,focus){
  var h=D.cells[id];if(!h)return;h.id=id;
  cells.forEach(function(b){var on=b.getAttribute("data-head")===id;b.setAttribute("aria-pressed",on?"true":"false");b.tabIndex=on?0:-1;});
  if(focus)byId[id].focus();
  panel.textContent="";
  panel.appendChild(el("h3",{id:"hv-title"},id));
  panel.appendChild(el("p",{id:"hv-held"},"Layer "+h.layer+", head "+h.head+": "+(h.held.length?"holds "+h.held.join(", ")+".":"holds no role at the configured thresholds.")));
  if(h.prune.length){
    panel.appendChild(el("p",{id:"hv-prune"},"Pruning: "+h.prune.map(function(p){return p[0]+" = "+num(p[1])+" (rank "+p[2]+" of "+p[3]+" heads by size)";}).join("; ")+"."));
  }else{panel.appendChild(el("p",{id:"hv-prune"},"No single-head pruning figures for this head in this run."));}
  panel.appendChild(rolesTable(h));
  var exs=el("div",{id:"hv-examples"});
  if(h.examples.length){h.examples.forEach(function(ex){exs.appendChild(heat(ex));});}
  else exs.appendChild(el("p",null,"No example attention map for this head (the report draws one for each role's top head)."));
  panel.appendChild(exs);
  status.textContent="Showing "+id+": "+(h.held.length?h.held.join(", "):"no role");
}
root.addEventListener("click",function(e){var b=e.target.closest("button.hv-cell");if(b)show(b.getAttribute("data-head"),false);});
root.addEventListener("keydown",function(e){
  var b=e.target.closest&&e.target.closest("button.hv-cell");if(!b)return;
  var h=D.cells[b.getAttribute("data-head")],l=h.layer,k=h.head;
  if(e.key==="ArrowRight")k++;else if(e.key==="ArrowLeft")k--;else if(e.key==="ArrowDown")l++;else if(e.key==="ArrowUp")l--;
  else if(e.key==="Home")k=0;else if(e.key==="End")k=D.heads-1;else return;
  e.preventDefault();
  l=Math.max(0,Math.min(D.layers-1,l));k=Math.max(0,Math.min(D.heads-1,k));
  show("L"+l+"H"+k,true);
});
root.hidden=false;
var first=cells.filter(function(b){var h=D.cells[b.getAttribute("data-head")];return h.held.length&&h.examples.length;})[0]||cells.filter(function(b){return D.cells[b.getAttribute("data-head")].held.length;})[0]||cells[0];
if(first)show(first.getAttribute("data-head"),false);
})();
"""


def _cell_label(hid: str, cell: dict) -> str:
    return f"{hid}: {', '.join(cell['held']) if cell['held'] else 'no role'}"


def _cell_style(cell: dict, colours: dict) -> str:
    if not cell["held"]:
        return "background:#eeeeee"
    k = len(cell["held"])
    stops = ",".join(
        f"{colours[r]}{round(a * 255):02x} {100 * i / k:.4g}% {100 * (i + 1) / k:.4g}%"
        for i, (r, a) in enumerate(zip(cell["held"], cell["alpha"]))
    )
    return f"background:linear-gradient(to right,{stops}),#fff"


def _json_script(data) -> str:
    """JSON safe inside ``<script>``: no ``</script>`` or ``<!--`` can appear."""
    import json

    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _head_view_html(b: HeadView) -> str:
    d = b.data
    colours = d["colours"]
    head_row = "".join(f'<th scope="col">{h}</th>' for h in range(d["heads"]))
    body = []
    for layer in range(d["layers"]):
        tds = []
        for head in range(d["heads"]):
            hid = _head(layer, head)
            cell = d["cells"][hid]
            label = _html.escape(_cell_label(hid, cell), quote=True)
            tds.append(
                f'<td><button type="button" class="hv-cell" data-head="{hid}" aria-label="{label}" title="{label}" '
                f'aria-pressed="false" tabindex="-1" style="{_cell_style(cell, colours)}"></button></td>'
            )
        body.append(f'<tr><th scope="row">{layer}</th>{"".join(tds)}</tr>')
    legend = "".join(f'<span style="background:{c}"></span>{_html.escape(n)}<br>' for n, c in colours.items())
    return (
        '<div class="hv" id="head-view" hidden>'
        '<div class="hv-top"><table class="hv-grid"><caption>Choose a head: click a cell, or Tab to the grid and move with the arrow '
        "keys (rows: layers, columns: heads; stripes: the roles a head holds)</caption>"
        f'<thead><tr><th scope="col">layer</th>{head_row}</tr></thead><tbody>{"".join(body)}</tbody></table>'
        f'<div class="hv-legend"><div aria-hidden="true">{legend or "no head holds a role"}</div>'
        '<p id="hv-status" aria-live="polite"></p></div></div>'
        '<div id="hv-panel" class="hv-panel"></div></div>'
        '<noscript><p class="note">The interactive head view needs JavaScript; the role map figure above and the '
        "tables below hold the same findings.</p></noscript>"
        f'<script type="application/json" id="head-view-data">{_json_script(d)}</script>'
        f"<script>{HEAD_VIEW_JS}</script>"
    )
