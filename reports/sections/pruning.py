"""The "Pruning" section: the unpruned baseline, the pruning curves (figure and three points),
how much can be pruned within each tolerance, the single-head ablation map and the
roles-vs-importance figure.

>>> [type(b).__name__ for b in pruning_section({}, None, 2, 2, None).blocks]
['Paragraph']
"""

from __future__ import annotations

import pandas as pd

from headscope.reports import figures as F
from headscope.reports.document import Figure, Note, Paragraph, Section, Table, fmt, head_name

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


def _ablation_map(frames: dict[str, pd.DataFrame], n_layers: int, n_heads: int) -> Figure | None:
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
        f"the largest change is {head_name(worst['layer'], worst['head'])} ({worst['value']:+.4f}).",
        caption=f"Importance of single heads: {metric} when one head is zero-ablated (the rest intact). "
        "Most heads matter little alone; redundancy is why pruning curves stay flat at first.",
    )


def pruning_section(
    frames: dict[str, pd.DataFrame],
    rvi: pd.DataFrame | None,
    n_layers: int,
    n_heads: int,
    metric: str | None,
    summary: dict | None = None,
) -> Section:
    """The section from ``frames``' ``prune_baseline``, curves (:func:`curves_frame` of
    ``metric``), ``prune_prunable`` and ``prune_ablation``, and ``rvi`` (roles vs importance:
    role, k, metric, value_role, value_random_mean, value_random_std, n_draws); ``summary`` (the
    study's): what the metric measures, in words, and its caveat (an LM metric worse than
    uniform: a caveat box, repeated on the curves)."""
    s = Section(id="pruning", title="Pruning")
    summary = summary or {}
    caveat = summary.get("caveat")
    if caveat:
        s.blocks.append(Note(f"Caveat: {caveat}."))
    if summary.get("measures"):
        s.blocks.append(Paragraph(f"The metric, {summary.get('metric', metric)}, measures the {summary['measures']}."))
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
        s.blocks += _curve_blocks(curves, caveat)
    pr = frames.get("prune_prunable")
    if pr is not None and not pr.empty:
        s.blocks.append(_prunable_table(pr))
    amap = _ablation_map(frames, n_layers, n_heads)
    if amap is not None:
        s.blocks.append(amap)
    if rvi is not None and not rvi.empty:
        s.blocks.append(_roles_vs_importance_figure(rvi))
    return s


def _curve_blocks(curves: pd.DataFrame, caveat: str | None = None) -> list[Figure | Table]:
    """The curves' figure (its alt text: each curve's first and last point) and a table of
    the first, middle and last fraction pruned; a ``caveat`` ends the figure's caption."""
    fig = F.pruning_figure(curves, summarised=True)
    ends = []
    for (study, m), d in curves.groupby(["study", "metric"], observed=True):
        d = d.sort_values("fraction_pruned")
        ends.append(
            f"{study}: {m} {d['value'].iloc[0]:.3f} at {d['fraction_pruned'].iloc[0]:.0%} → {d['value'].iloc[-1]:.3f} at {d['fraction_pruned'].iloc[-1]:.0%}"
        )
    figure = Figure(
        name="pruning_curves",
        png=F.png_bytes(fig),
        alt="Line chart of the metric against the fraction of heads pruned, one line per pruning order. "
        + "; ".join(ends)
        + ".",
        caption="Pruning curves: heads are removed in the order each study ranks them; shaded bands are ± the spread "
        "(for random orders, the standard deviation over seeds; otherwise the bootstrap SE over items)."
        + (f" Caveat: {caveat}." if caveat else ""),
    )
    fr = sorted(curves["fraction_pruned"].unique())
    pick = [fr[0], fr[len(fr) // 2], fr[-1]] if len(fr) >= 3 else fr
    t = curves[curves["fraction_pruned"].isin(pick)].copy()
    t["fraction_pruned"] = t["fraction_pruned"].map(lambda v: f"{v:.0%}")
    table = Table(
        name="pruning_points",
        frame=t.rename(columns={"study": "order", "n_seeds": "curves averaged"}),
        caption="Pruning curves at the first, middle and last fraction pruned",
    )
    return [figure, table]


def _prunable_table(pr: pd.DataFrame) -> Table:
    t = pr.copy()
    for c in ("query_heads_pruned", "kv_heads_pruned"):
        if c in t:
            t[c] = t[c].round().astype("Int64")
    t["tolerance"] = t["tolerance"].map(lambda v: f"{v:.0%}")
    t["fraction_pruned"] = t["fraction_pruned"].map(lambda v: f"{v:.0%}")
    return Table(
        name="prunable",
        frame=t,
        caption="Largest fraction of heads prunable while the metric stays within the tolerance of the unpruned model",
    )


def _roles_vs_importance_figure(rvi: pd.DataFrame) -> Figure:
    fig = F.causal_figure(rvi)
    return Figure(
        name="causal_evidence",
        png=F.png_bytes(fig),
        alt="Bar chart per role: metric after ablating the role's top heads versus random heads. "
        + "; ".join(f"{r.role}: {r.value_role:.3f} vs {r.value_random_mean:.3f}" for r in rvi.itertuples())
        + ".",
        caption="Roles vs importance: ablating a role's top-k heads (red) against k random heads (grey, mean ± sd over draws).",
    )


def pruning_absent_section(why: str) -> Section:
    """The section when the pruning studies could not run on the model, saying why.

    >>> pruning_absent_section("no gates").blocks[0].text
    'The pruning studies did not run on this model: no gates.'
    """
    return Section(
        id="pruning",
        title="Pruning",
        blocks=[Paragraph(f"The pruning studies did not run on this model: {why}.")],
    )
