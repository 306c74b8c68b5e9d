"""The report's figures (seaborn on matplotlib), drawn from tidy frames (never from models or tensors).

Each ``*_figure`` function takes frames (columns named in
:mod:`headscope.analyses.frames`) and returns a matplotlib ``Figure``, or ``None`` when
the frame holds nothing to draw; :func:`png_bytes` turns a figure into PNG bytes and
closes it, :func:`data_uri` into an inline ``data:image/png;base64,...`` string. Every
figure is drawn inside :func:`theme` (seaborn's "ticks" style and "paper" context as a
``matplotlib.rc_context``), so drawing one changes no global matplotlib/seaborn state.

* :func:`role_map_figure` — layer × head grid (a seaborn heatmap of the number of roles
  held); one colour per role, one stripe per role a head holds, intensity by margin.
* :func:`example_figure` — a head's word-level attention on one sentence (EXAMPLE_COLUMNS).
* :func:`stats_by_layer_figure` — per-head statistics (entropy, attention distance) by layer.
* :func:`pruning_figure` — fraction pruned vs metric, one line per order, shaded spread.
* :func:`head_map_figure` — layer × head heatmap of a value (single-head ablation), annotated
  when the grid is small.
* :func:`causal_figure` — ablating a role's top heads vs random heads (roles-vs-importance).
* :func:`gqa_figure` — which query heads share a KV head.
* :func:`diff_figure` — per-role heatmaps of score deltas between two runs.

>>> import pandas as pd
>>> roles = pd.DataFrame({"layer": [0, 0], "head": [1, 1], "role": ["punctuation", "positional:previous"],
...     "margin": [0.3, 0.6], "verdict": [True, True]})
>>> held_roles(roles)[(0, 1)]
[('positional:previous', 0.6), ('punctuation', 0.3)]
>>> png_bytes(role_map_figure(roles, n_layers=1, n_heads=2))[:4]
b'\\x89PNG'
"""

from __future__ import annotations

import base64
import io
import math

import matplotlib

matplotlib.use("Agg")  # no display, deterministic PNGs
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from headscope.analyses.frames import EXAMPLE_COLUMNS  # noqa: E402, F401 - defined with the other tidy frames; F.EXAMPLE_COLUMNS

DPI = 110
# tab10 without its grey (grey means "no role"), then Dark2 and tab20b for more roles
_PALETTE = (
    [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7]
    + list(plt.get_cmap("Dark2").colors)[:7]
    + list(plt.get_cmap("tab20b").colors)
)
_STYLE = {
    **sns.axes_style("ticks"),
    **sns.plotting_context("paper"),
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "axes.spines.top": False,
    "text.parse_math": False,  # names and words from the user are text: "$x$" is not mathtext
    "axes.spines.right": False,
    "figure.dpi": DPI,
    "svg.hashsalt": "headscope",
}
"""The one style of every figure: seaborn's "ticks" style and "paper" context plus a few
overrides; applied per figure by :func:`theme`, never globally."""
ANNOTATE_MAX_CELLS = 144
"""A layer × head heatmap with at most this many cells writes each cell's value in it."""


def theme():
    """Context manager applying :data:`_STYLE` (restores the previous rcParams on exit)."""
    return plt.rc_context(_STYLE)


def role_colours(roles) -> dict[str, tuple]:
    """A fixed colour per role name (sorted, so two runs with the same roles agree)."""
    return {r: _PALETTE[i % len(_PALETTE)] for i, r in enumerate(sorted(set(roles)))}


def png_bytes(fig) -> bytes:
    """Render ``fig`` to PNG bytes (no timestamp metadata, so identical figures give
    identical bytes) and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for inline ``<img src>``.

    >>> data_uri(b"\\x89PNG")
    'data:image/png;base64,iVBORw=='
    """
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def held_roles(roles: pd.DataFrame) -> dict[tuple[int, int], list[tuple[str, float]]]:
    """``{(layer, head): [(role, margin), ...]}`` over rows with ``verdict`` True; a role
    found on several rows (syntactic relations, directions) keeps its largest margin.
    Roles are sorted by name."""
    out: dict[tuple[int, int], list[tuple[str, float]]] = {}
    if roles is None or roles.empty:
        return out
    held = roles[roles["verdict"].astype(bool)]
    best = held.groupby(["layer", "head", "role"], observed=True)["margin"].max().reset_index()
    for r in best.sort_values(["layer", "head", "role"]).itertuples(index=False):
        out.setdefault((int(r.layer), int(r.head)), []).append((str(r.role), float(r.margin)))
    return out


def role_map_figure(roles: pd.DataFrame, *, n_layers: int, n_heads: int, title: str | None = None):
    """Layer × head grid of role verdicts. A cell is split into one vertical stripe per
    role the head holds, coloured by role; opacity grows with the margin over the
    baseline (relative to the largest margin of that role). Grey cells hold no role.

    The grid is a seaborn heatmap of the number of roles each head holds (its array is
    that count; grey behind the stripes); the stripes are drawn over it, one
    ``Rectangle`` per (head, role) with ``gid`` ``"L{layer}H{head}:{role}"``."""
    held = held_roles(roles)
    names = sorted({r for v in held.values() for r, _ in v})
    colours = role_colours(names)
    top = {name: max((m for v in held.values() for r, m in v if r == name), default=1.0) for name in names}
    held = {(l, h): v for (l, h), v in held.items() if l < n_layers and h < n_heads}
    count = pd.DataFrame(0, index=pd.RangeIndex(n_layers, name="layer"), columns=pd.RangeIndex(n_heads, name="head"))
    for (layer, head), v in held.items():
        count.loc[layer, head] = len(v)
    with theme():
        w = min(1.0 + 0.5 * n_heads, 11)
        h = min(1.2 + 0.42 * n_layers, 14)
        fig, ax = plt.subplots(figsize=(w + 2.4, h))
        sns.heatmap(
            count,
            ax=ax,
            cmap=matplotlib.colors.ListedColormap(["#eeeeee"]),
            cbar=False,
            linewidths=1.5,
            linecolor="white",
            square=True,
        )
        for (layer, head), cell in held.items():
            k = len(cell)
            for i, (role, margin) in enumerate(cell):
                alpha = 0.35 + 0.65 * float(np.clip(margin / top[role], 0, 1)) if top[role] > 0 else 1.0
                ax.add_patch(
                    Rectangle(
                        (head + 0.06 + 0.88 * i / k, layer + 0.06),
                        0.88 / k,
                        0.88,
                        facecolor=colours[role],
                        alpha=alpha,
                        lw=0,
                        gid=f"L{layer}H{head}:{role}",
                    )
                )
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.tick_params(length=0, labelrotation=0)
        handles = [Patch(facecolor=colours[n], label=n) for n in names] or [Patch(facecolor="#eeeeee", label="no role")]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, title="role")
        ax.set_title(title or "Head roles (stripe per role held; stronger colour = larger margin)")
    return fig


def example_figure(example: pd.DataFrame, *, title: str | None = None):
    """Heatmap of one head's word-level attention (rows: query word, columns: key word)
    from EXAMPLE_COLUMNS rows of a single example; gold pairs are outlined in red."""
    if example is None or example.empty:
        return None
    q = example.drop_duplicates("query_index").sort_values("query_index")
    k = example.drop_duplicates("key_index").sort_values("key_index")
    mat = example.pivot_table(index="query_index", columns="key_index", values="weight", aggfunc="sum")
    mat = mat.reindex(index=q["query_index"], columns=k["key_index"]).fillna(0.0)
    n = max(len(q), len(k))
    side = float(np.clip(0.26 * n + 1.2, 2.6, 6.5))
    with theme():
        fig, ax = plt.subplots(figsize=(side + 0.6, side))
        sns.heatmap(
            mat.to_numpy(),
            ax=ax,
            cmap="Blues",
            vmin=0,
            vmax=1,
            square=True,
            xticklabels=[str(w) for w in k["key_word"]],
            yticklabels=[str(w) for w in q["query_word"]],
            cbar_kws={"shrink": 0.6, "label": "attention"},
        )
        qpos = {v: i for i, v in enumerate(q["query_index"])}
        kpos = {v: i for i, v in enumerate(k["key_index"])}
        if "gold" in example:
            for r in example[example["gold"].astype(bool)].itertuples():
                ax.add_patch(
                    Rectangle(
                        (kpos[r.key_index], qpos[r.query_index]),
                        1,
                        1,
                        fill=False,
                        edgecolor="#c44e52",
                        lw=1.6,
                    )
                )
        unit = str(example["level"].iloc[0]) if "level" in example else "word"
        ax.set_xlabel(f"attends to (key {unit})")
        ax.set_ylabel(f"query {unit}")
        ax.tick_params(axis="x", labelrotation=90, labelsize=7, length=0)
        ax.tick_params(axis="y", labelrotation=0, labelsize=7, length=0)
        r = example.iloc[0]
        ax.set_title(title or f"L{int(r['layer'])}H{int(r['head'])}")
    return fig


def stats_metrics(stats: pd.DataFrame) -> list[str]:
    """The metrics the by-layer figure shows: entropy and distance ones first, then others."""
    if stats is None or stats.empty:
        return []
    names = sorted(stats["metric"].astype(str).unique())
    pick = [m for m in names if "entropy" in m] + [m for m in names if "distance" in m]
    return pick or names[:2]


def stats_by_layer_figure(stats: pd.DataFrame, metrics: list[str] | None = None):
    """One panel per metric: each head as a dot (``sns.scatterplot``, layers jittered by a
    fixed ± 0.15 so the PNG is deterministic), the layer mean as a line (``sns.lineplot``)."""
    metrics = metrics or stats_metrics(stats)
    if not metrics:
        return None
    with theme():
        fig, axes = plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics), 3.0), squeeze=False)
        rng = np.random.default_rng(0)
        for i, (ax, m) in enumerate(zip(axes[0], metrics)):
            d = stats[stats["metric"].astype(str) == m].sort_values(["layer", "head"])
            d = d.assign(layer=d["layer"].astype(int), x=d["layer"].to_numpy(float) + rng.uniform(-0.15, 0.15, len(d)))
            sns.scatterplot(
                data=d, x="x", y="value", ax=ax, s=12, color="#4c72b0", alpha=0.6, linewidth=0, label="head"
            )
            sns.lineplot(
                data=d,
                x="layer",
                y="value",
                ax=ax,
                estimator="mean",
                errorbar=None,
                color="#dd8452",
                lw=2,
                marker="o",
                ms=4,
                markeredgewidth=0,
                label="layer mean",
            )
            ax.set_xlabel("layer")
            ax.set_ylabel(m)
            ax.set_xticks(sorted(d["layer"].unique()))
            ax.set_title(m.replace("_", " "))
            if i == 0:
                ax.legend(frameon=False, fontsize=8)
            elif ax.get_legend() is not None:
                ax.get_legend().remove()
        fig.tight_layout()
    return fig


def curve_rows(impact: pd.DataFrame) -> pd.DataFrame:
    """Pruning-curve rows of an IMPACT frame (those with a ``fraction_pruned``), averaged
    over seeds: columns study, metric, fraction_pruned, value, spread, n_seeds. Where
    several seeds exist the spread is their standard deviation, else the frame's own;
    rows without a seed (already averaged, as ``curve_summary``) keep their ``n``."""
    if impact is None or impact.empty or "fraction_pruned" not in impact:
        return pd.DataFrame(columns=["study", "metric", "fraction_pruned", "value", "spread", "n_seeds"])
    d = impact[impact["fraction_pruned"].notna()].copy()
    d["spread"] = d["spread"].fillna(0.0)
    g = d.groupby(["study", "metric", "fraction_pruned"], observed=True)
    out = g.agg(
        value=("value", "mean"),
        own_spread=("spread", "mean"),
        sd=("value", "std"),
        rows=("value", "size"),
        own_n=("n", "max"),
        seedless=("seed", lambda s: bool(s.isna().all())),
    )
    out["spread"] = np.where(out["rows"] > 1, out["sd"].fillna(0.0), out["own_spread"])
    # a row without a seed is already a mean over curves (curve_summary): its n counts them
    out["n_seeds"] = np.where(out["rows"] > 1, out["rows"], np.where(out["seedless"], out["own_n"], 1)).astype(int)
    return out.reset_index()[["study", "metric", "fraction_pruned", "value", "spread", "n_seeds"]]


def pruning_figure(impact: pd.DataFrame, *, summarised: bool = False):
    """Fraction of heads pruned vs each metric; one line per pruning order (``study``,
    ``sns.lineplot`` of :func:`curve_rows`' seed means), a shaded band of ± spread
    (random orders: the standard deviation over seeds; else the frame's own spread).
    ``summarised``: ``impact`` is already :func:`curve_rows`' output. Each band is a
    ``fill_between`` collection labelled ``"_band:{study}"``."""
    curves = impact if summarised else curve_rows(impact)
    if curves.empty:
        return None
    curves = curves.assign(study=curves["study"].astype(str), metric=curves["metric"].astype(str))
    metrics = sorted(curves["metric"].unique())
    studies = sorted(curves["study"].unique())
    colours = role_colours(studies)
    with theme():
        fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.2), squeeze=False)
        for i, (ax, m) in enumerate(zip(axes[0], metrics)):
            d = curves[curves["metric"] == m].sort_values(["study", "fraction_pruned"])
            sns.lineplot(
                data=d,
                x="fraction_pruned",
                y="value",
                hue="study",
                hue_order=[s for s in studies if s in set(d["study"])],
                palette=colours,
                estimator=None,
                errorbar=None,
                sort=True,
                lw=1.8,
                marker="o",
                ms=4,
                markeredgewidth=0,
                ax=ax,
                legend=i == len(metrics) - 1,
            )
            for study, s in d.groupby("study", sort=True):
                if (s["spread"] > 0).any():
                    ax.fill_between(
                        s["fraction_pruned"],
                        s["value"] - s["spread"],
                        s["value"] + s["spread"],
                        color=colours[study],
                        alpha=0.2,
                        lw=0,
                        label=f"_band:{study}",
                    )
            ax.set_xlabel("fraction of heads pruned")
            ax.set_ylabel(m)
            ax.set_title(m.replace("_", " "))
            ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        leg = axes[0][-1].get_legend()
        if leg is not None:
            leg.set_title("order")
            leg.set_frame_on(False)
        fig.tight_layout()
    return fig


def _annotation_format(lim: float) -> str:
    """A format showing two significant digits of the largest |value| ``lim``.

    >>> _annotation_format(0.5), _annotation_format(0.012), _annotation_format(3.0)
    ('.2f', '.3f', '.1f')
    """
    return f".{int(np.clip(1 - math.floor(math.log10(lim)), 0, 4))}f" if lim > 0 else ".2f"


def _annotation(v: float, fmt: str) -> str:
    """``v`` formatted for a heatmap cell: blank for NaN, no minus sign on a rounded zero.

    >>> _annotation(-0.0004, ".3f"), _annotation(-0.012, ".3f"), _annotation(float("nan"), ".3f")
    ('0.000', '-0.012', '')
    """
    if pd.isna(v):
        return ""
    text = format(v, fmt)
    return text.lstrip("-") if float(text) == 0 else text


def head_map_figure(frame: pd.DataFrame, *, n_layers: int, n_heads: int, label: str, title: str):
    """Layer × head heatmap (``sns.heatmap``) of ``value`` (diverging colours centred at 0),
    e.g. the metric change when each head is ablated alone; each cell's value is written
    in it when the grid has at most :data:`ANNOTATE_MAX_CELLS` cells. Heads without a
    value are left blank."""
    mat = frame.pivot_table(index="layer", columns="head", values="value", aggfunc="mean")
    mat = mat.reindex(index=range(n_layers), columns=range(n_heads))
    mat.index.name, mat.columns.name = "layer", "head"
    arr = mat.to_numpy(float)
    lim = max(float(np.nanmax(np.abs(arr))) if np.isfinite(arr).any() else 0.0, 1e-9)
    fmt = _annotation_format(lim)
    annot = mat.map(lambda v: _annotation(v, fmt)) if n_layers * n_heads <= ANNOTATE_MAX_CELLS else False
    with theme():
        fig, ax = plt.subplots(figsize=(min(1.6 + 0.45 * n_heads, 11), min(1.0 + 0.38 * n_layers, 13)))
        sns.heatmap(
            mat,
            ax=ax,
            cmap="RdBu_r",
            vmin=-lim,
            vmax=lim,  # symmetric: centred at 0 (seaborn's center= would rebuild the colormap)
            square=True,
            annot=annot,
            fmt="",
            annot_kws={"fontsize": 6},
            cbar_kws={"shrink": 0.7, "label": label},
        )
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.tick_params(length=0, labelrotation=0)
        ax.set_title(title)
    return fig


def patching_effect_figure(
    frame: pd.DataFrame, *, n_layers: int, n_heads: int, title: str, marked: list[tuple[int, int]] = ()
):
    """Layer × head heatmap of a patching frame's ``effect`` (one method and task:
    :func:`head_map_figure`, colours centred at 0), the heads in ``marked`` (e.g. a role's
    heads by attention) outlined in black."""
    fig = head_map_figure(
        frame[["layer", "head", "effect"]].rename(columns={"effect": "value"}),
        n_layers=n_layers,
        n_heads=n_heads,
        label="normalised effect",
        title=title,
    )
    ax = fig.axes[0]
    for layer, head in marked:
        ax.add_patch(Rectangle((head, layer), 1, 1, fill=False, edgecolor="black", linewidth=1.6))
    return fig


def causal_figure(rvi: pd.DataFrame, *, metric: str | None = None):
    """Per role: the metric after ablating its top-k heads vs the mean (± std) over random
    draws of k heads. One panel per metric (or only ``metric``)."""
    if rvi is None or rvi.empty:
        return None
    metrics = [metric] if metric else sorted(rvi["metric"].astype(str).unique())
    with theme():
        n_roles = rvi["role"].nunique()
        fig, axes = plt.subplots(1, len(metrics), figsize=(4.4 * len(metrics), 0.9 + 0.42 * n_roles), squeeze=False)
        for ax, m in zip(axes[0], metrics):
            d = rvi[rvi["metric"].astype(str) == m].sort_values("role", ascending=False).reset_index(drop=True)
            y = np.arange(len(d))
            ax.barh(y + 0.2, d["value_role"], height=0.38, color="#c44e52", label="role's top-k heads ablated")
            ax.barh(
                y - 0.2,
                d["value_random_mean"],
                height=0.38,
                color="#8c8c8c",
                xerr=d["value_random_std"].fillna(0),
                error_kw={"lw": 1, "capsize": 2},
                label="random k heads ablated (mean ± sd)",
            )
            ax.set_yticks(y, [f"{r} (k={int(k)})" for r, k in zip(d["role"], d["k"])])
            ax.set_xlabel(m)
            ax.set_title(
                f"{m.replace('_', ' ')}\nred: role's top-k heads ablated; grey: k random heads (mean ± sd)", fontsize=9
            )
        fig.tight_layout()
    return fig


def gqa_figure(n_heads: int, n_kv_heads: int):
    """Query heads (top row) joined to the KV head they read (bottom row); query head
    ``h`` reads KV head ``h // (n_heads // n_kv_heads)``. ``None`` for MHA."""
    if n_kv_heads >= n_heads or n_kv_heads < 1:
        return None
    g = n_heads // n_kv_heads
    colours = [_PALETTE[i % len(_PALETTE)] for i in range(n_kv_heads)]
    with theme():
        fig, ax = plt.subplots(figsize=(max(4.0, 0.55 * n_heads + 1), 1.9))
        for h in range(n_heads):
            kv = h // g
            kx = (kv + 0.5) * g - 0.5
            ax.plot([h, kx], [1, 0], color=colours[kv], lw=1.2)
            ax.add_patch(Rectangle((h - 0.35, 0.95), 0.7, 0.3, color=colours[kv]))
            ax.text(h, 1.1, f"Q{h}", ha="center", va="center", fontsize=7, color="white")
        for kv in range(n_kv_heads):
            kx = (kv + 0.5) * g - 0.5
            ax.add_patch(Rectangle((kx - 0.5, -0.3), 1.0, 0.3, color=colours[kv]))
            ax.text(kx, -0.15, f"KV{kv}", ha="center", va="center", fontsize=7, color="white")
        ax.set_xlim(-0.6, n_heads - 0.4)
        ax.set_ylim(-0.4, 1.35)
        ax.axis("off")
        ax.set_title(
            f"Grouped-query attention: {n_heads} query heads share {n_kv_heads} KV heads (groups of {g}), every layer"
        )
    return fig


def clusters_figure(clusters: pd.DataFrame):
    """Heads in two dimensions (``x``, ``y``), coloured by ``cluster``, each marked with
    its layer number."""
    with theme():
        fig, ax = plt.subplots(figsize=(5.2, 4.2))
        names = sorted(clusters["cluster"].unique())
        for i, c in enumerate(names):
            d = clusters[clusters["cluster"] == c]
            ax.scatter(d["x"], d["y"], s=120, color=_PALETTE[i % len(_PALETTE)], alpha=0.75, lw=0, label=f"cluster {c}")
            for r in d.itertuples():
                ax.text(r.x, r.y, str(r.layer), ha="center", va="center", fontsize=6, color="white")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.set_title("Head clusters (number: layer)")
    return fig


def diff_figure(diff: pd.DataFrame, *, n_layers: int, n_heads: int, max_roles: int = 12):
    """One heatmap per role of ``delta`` (score in B minus score in A), layer × head,
    diverging colours centred at 0; roles with the largest changes first. Where a
    ``change`` column says so, ``+`` marks a verdict gained and ``−`` one lost."""
    if diff is None or diff.empty:
        return None
    order = diff.groupby("role")["delta"].apply(lambda s: s.abs().max()).sort_values(ascending=False)
    roles = list(order.index[:max_roles])
    lim = max(float(diff["delta"].abs().max()), 1e-6)
    cols = min(4, len(roles))
    rows = math.ceil(len(roles) / cols)
    with theme():
        fig, axes = plt.subplots(
            rows, cols, figsize=(2.2 + 0.3 * n_heads * cols, 0.6 + (0.28 * n_layers + 0.8) * rows), squeeze=False
        )
        for ax, role in zip(axes.flat, roles):
            d = diff[diff["role"] == role]
            mat = d.pivot_table(index="layer", columns="head", values="delta", aggfunc="mean")
            mat = mat.reindex(index=range(n_layers), columns=range(n_heads))
            sns.heatmap(mat, ax=ax, cmap="RdBu_r", vmin=-lim, vmax=lim, square=True, cbar=False)
            ax.tick_params(length=0, labelrotation=0)
            ax.set_xlabel("head", fontsize=7)
            ax.set_ylabel("layer", fontsize=7)
            if "change" in d:
                for r in d[d["change"].isin(["gained", "lost"])].itertuples():
                    ax.text(
                        r.head + 0.5,
                        r.layer + 0.5,
                        "+" if r.change == "gained" else "−",
                        ha="center",
                        va="center",
                        fontsize=9,
                        fontweight="bold",
                        color="black",
                    )
            ax.set_title(role, fontsize=8)
            ax.tick_params(labelsize=6)
        for ax in list(axes.flat)[len(roles) :]:
            ax.axis("off")
        sm = plt.cm.ScalarMappable(cmap="RdBu_r", norm=matplotlib.colors.Normalize(-lim, lim))
        fig.colorbar(sm, ax=axes.ravel().tolist(), shrink=0.6, label="score B − A")
        fig.suptitle("Change in role score per head (red: higher in B; +/−: role gained/lost)")
    return fig
