"""The "From static to contextual" section: self-similarity and anisotropy by depth, sense
separation, norm-based against raw attention, saturation under the model's scale and under none,
and attention distance by depth with its trend verdict (:mod:`headscope.analyses.context`).
Built from the stage's frames and summary alone.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from headscope.reports import figures as F
from headscope.reports.document import Figure, Note, Paragraph, Section, Table


def _depth_label(d: int) -> str:
    return "static row" if d == -1 else "layer-0 input" if d == 0 else f"layer {d - 1} output"


def similarity_figure(sim: pd.DataFrame, senses: pd.DataFrame):
    """Self-similarity, anisotropy and corrected self-similarity by depth (CI bands), and sense accuracy."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for metric, colour in (("self_similarity", "C0"), ("anisotropy", "C1"), ("corrected_self_similarity", "C2")):
        s = sim[sim.metric == metric].sort_values("depth")
        ax.plot(s.depth, s.value, marker="o", color=colour, label=metric.replace("_", " "))
        if s.ci_low.notna().any():
            ax.fill_between(s.depth, s.ci_low, s.ci_high, color=colour, alpha=0.2)
    if senses is not None and len(senses):
        s = senses.sort_values("depth")
        ax.plot(s.depth, s.value, marker="s", color="C3", label="sense accuracy (LOO centroid)")
        ax.plot(s.depth, s.baseline, ls="--", color="C3", alpha=0.6, label="sense accuracy, shuffled labels")
    ax.set_xlabel("depth (-1: static row, 0: layer-0 input, l+1: layer l output)")
    ax.set_ylabel("cosine / accuracy")
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title("From the static row to contextual representations")
    return fig


def distance_figure(heads: pd.DataFrame, summary: dict):
    """Mean attention distance per head by layer, raw and norm-based, with the trend verdicts."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for metric, colour, dx in (("distance_raw", "C0", -0.12), ("distance_norm", "C1", 0.12)):
        s = heads[heads.metric == metric]
        ax.scatter(s.layer + dx, s.value, s=10, color=colour, alpha=0.6, label=metric.replace("_", " "))
        m = s.groupby("layer").value.mean()
        ax.plot(m.index, m.values, color=colour)
    t = summary.get("distance_trend", {}).get("raw", {})
    ax.set_title(f"Attention distance by depth (raw: ρ = {t.get('rho', float('nan')):.2f})", fontsize=9)
    ax.set_xlabel("layer")
    ax.set_ylabel("distance / available context")
    ax.legend(fontsize=7)
    return fig


def saturation_figure(heads: pd.DataFrame):
    """Share of saturated rows (max weight > 0.9) by layer under the model's scale and under scale 1."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for metric, label in (("saturated_actual", "model's scale"), ("saturated_scale1", "scale 1 (no division)")):
        m = heads[heads.metric == metric].groupby("layer").value.mean()
        ax.plot(m.index, m.values, marker="o", label=label)
    ax.set_xlabel("layer")
    ax.set_ylabel("share of rows with max > 0.9")
    ax.legend(fontsize=7)
    ax.set_title("Saturation of the softmax with and without the scale")
    return fig


def layer_table(heads: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """One row per layer: head means of the attention statistics beside ``qk_std`` and ``reversals``."""
    wide = heads.pivot_table(index="layer", columns="metric", values="value", aggfunc="mean", observed=True)
    return layers.set_index("layer").join(wide).reset_index().round(4)


def context_section(frames, meta) -> Section | None:
    """The section, or None when the run has no contextualisation frames."""
    sim, heads = frames.get("context_similarity"), frames.get("context_heads")
    if sim is None or heads is None:
        return None
    summary = meta.get("context_summary", {})
    senses = frames.get("context_senses")
    layers = frames.get("context_layers")
    trends = summary.get("distance_trend", {})
    first = summary.get("senses_first_depth_beyond_chance")
    blocks = [
        Paragraph(
            "A token's embedding row is the same in every sentence; the layers build a contextual "
            "representation from it. Self-similarity (Ethayarajh 2019) is the mean cosine between one word's "
            "representations in different sentences, anisotropy the mean cosine between different words; "
            f"states: {summary.get('states', '')}; pooling: {summary.get('pooling', '')}."
        ),
        Paragraph(
            "Senses first separate beyond chance at "
            + (_depth_label(first) if first is not None else "no depth")
            + f" (words: {len(summary.get('words', []))}, sentences: {summary.get('n_sentences')})."
        ),
    ]
    blocks += [Paragraph(f"{k}: {v['verdict']}.") for k, v in trends.items()]
    blocks.append(
        Note(
            f"Scale: {', '.join(summary.get('scale', []))}; key pairs whose order the scale reverses: "
            f"{summary.get('reversals')} (the ranking is invariant)."
        )
    )
    blocks.append(
        Figure(
            "context_similarity",
            F.png_bytes(similarity_figure(sim, senses)),
            "Lines by depth: self-similarity, anisotropy and their difference with 95% bands; sense accuracy "
            "beside its shuffled-label baseline.",
            "Self-similarity is 1 at the static row for a single-piece word; context lowers it layer by layer.",
        )
    )
    blocks.append(
        Figure(
            "context_distance",
            F.png_bytes(distance_figure(heads, summary)),
            "Points per head by layer: mean attention distance over the available context, raw and norm-based.",
            "Distance: weighted |i - j| divided by the furthest key the query may read.",
        )
    )
    blocks.append(
        Figure(
            "context_saturation",
            F.png_bytes(saturation_figure(heads)),
            "Lines by layer: share of attention rows whose largest weight exceeds 0.9, with and without the scale.",
            "Scale 1: the same raw q·k without the division by sqrt(d_k).",
        )
    )
    wide = sim.pivot_table(index="depth", columns="metric", values="value", observed=True).round(4).reset_index()
    blocks.append(Table("context_similarity", wide, "Self-similarity, anisotropy, MEV by depth"))
    if senses is not None:
        blocks.append(Table("context_senses", senses.round(4), "Sense separation by depth (CI over words)"))
    if layers is not None:
        blocks.append(Table("context_layers", layer_table(heads, layers), "Attention by layer: raw vs norm-based"))
    return Section(id="context", title="From static to contextual", blocks=blocks)


def _ranked(g: pd.DataFrame, top: int) -> str:
    g = g[g["rank"] <= top].sort_values("rank")
    return ", ".join(f"{c} {v:.2f}" for c, v in zip(g.context, g.value))


def describe_context(frames, summary, *, top: int = 3) -> str | None:
    """What ``headscope context`` prints: for ``--sentence``/``--word``, the ``top`` context words
    of the word per layer by norm-based contribution and by rollout (raw and norm-based), as
    shares of its row; else the verdicts by depth. None when the stage wrote nothing."""
    c, sim = frames.get("context_contributions"), frames.get("context_similarity")
    if c is not None and len(c):
        cfg = summary.get("config", {})
        lines = [
            f"Context words of {cfg.get('word')!r} in {cfg.get('sentence')!r} (share of its row; top {top}):",
            f"{'layer':>5}  {'norm-based':<36}  {'rollout, norm-based':<36}  rollout, raw",
        ]
        by = {m: dict(tuple(g.groupby("layer"))) for m, g in c.groupby("method")}
        for layer in sorted(by["norm"]):
            cells = [_ranked(by[m][layer], top) for m in ("norm", "rollout_norm", "rollout_raw")]
            lines.append(f"{layer:>5}  {cells[0]:<36}  {cells[1]:<36}  {cells[2]}")
        return "\n".join(lines)
    if sim is None:
        return None
    ss = sim[sim.metric == "self_similarity"].set_index("depth").value
    first = summary.get("senses_first_depth_beyond_chance")
    lines = [
        "self-similarity by depth: " + ", ".join(f"{_depth_label(int(d))} {v:.3f}" for d, v in ss.items()),
        "senses first separate beyond chance at " + (_depth_label(first) if first is not None else "no depth"),
    ]
    lines += [f"{k}: {v['verdict']}" for k, v in summary.get("distance_trend", {}).items()]
    return "\n".join(lines)
