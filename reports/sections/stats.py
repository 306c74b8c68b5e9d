"""The "Attention statistics by layer" section: per-head statistics by layer (figure and
layer means) and, when the run clustered the heads, their two-dimensional map.

>>> stats_section(pd.DataFrame(columns=["layer", "head", "metric", "value"])) is None
True
"""

from __future__ import annotations

import pandas as pd

from headscope.reports import figures as F
from headscope.reports.document import Figure, Section, Table


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


def stats_section(stats: pd.DataFrame | None, clusters: pd.DataFrame | None = None) -> Section | None:
    """``stats``: STAT_COLUMNS; ``clusters``: layer, head, x, y, cluster (drawn when present).
    ``None`` when ``stats`` is missing or empty."""
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
