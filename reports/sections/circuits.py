"""The "Circuits" section: an edge circuit found by EAP-IG on the stage's task, its faithfulness at
each budget beside random circuits of the same size, and the circuit at one budget drawn as an
inline SVG (:func:`circuit_svg`, plain Python: no graphviz, nothing CI would lack). Built from the
``circuit_edges`` and ``circuit_faithfulness`` frames and the stage's summary alone.
"""

from __future__ import annotations

import html
import math
import re

import pandas as pd

from headscope.reports.document import Figure, Note, Paragraph, Section, Table

#: the most edges the figure draws (the largest ``|score|`` of the chosen circuit); the caption says when fewer
MAX_DRAWN = 120
#: an edge's colour by what it feeds
VIA_COLOURS = {"q": "#1f77b4", "k": "#ff7f0e", "v": "#2ca02c", "mlp": "#7f7f7f", "logits": "#9467bd"}

_HEAD = re.compile(r"L(\d+)H(\d+)$")
_KV = re.compile(r"L(\d+)KV(\d+)$")
_MLP = re.compile(r"MLP(\d+)$")


def _layout(n_layers: int, n_heads: int, n_kv: int):
    """``position(node name) -> (x, y)`` in user units: the input at the bottom, the logits on
    top, per layer a row of KV heads (under their group's query heads), the query heads, and the
    MLP to the right a little higher (it reads the layer's heads)."""
    col, row = 34.0, 44.0
    width = max((n_heads + 1) * col + 60, 320.0)  # room for the legend
    group = n_heads // n_kv

    def y_of(layer: float) -> float:
        return 30 + (n_layers - layer) * row  # layer -1: the input row

    def pos(name: str) -> tuple[float, float]:
        if name == "input":
            return width / 2, y_of(-1) + 10
        if name == "logits":
            return width / 2, 16
        if m := _HEAD.match(name):
            return 40 + int(m[2]) * col, y_of(int(m[1])) - 8
        if m := _KV.match(name):
            g = int(m[2])
            return 40 + (g * group + (group - 1) / 2) * col, y_of(int(m[1])) + 12
        if m := _MLP.match(name):
            return 40 + n_heads * col + 10, y_of(int(m[1])) - 24
        raise ValueError(f"no node {name!r} in a graph of {n_layers} layers x {n_heads} heads")

    return pos, width, y_of(-1) + 30


def circuit_svg(edges: pd.DataFrame, *, n_layers: int, n_heads: int, n_kv_heads: int, title: str) -> str:
    """The circuit ``edges`` (rows of the edges table: ``sender``, ``receiver``, ``via``,
    ``score``) as SVG markup: nodes where their layer and head are, each edge a line from its
    sender to its receiver coloured by ``via`` (:data:`VIA_COLOURS`), its width by ``|score|``
    (the largest 4 units), solid when corrupting it lowers the metric (negative score), dashed
    when it raises it. Raises ``ValueError`` for a node outside the given shape.

    >>> e = pd.DataFrame({"sender": ["L0H0"], "receiver": ["L1KV0"], "via": ["k"], "score": [-1.0]})
    >>> svg = circuit_svg(e, n_layers=2, n_heads=2, n_kv_heads=1, title="t")
    >>> svg.startswith("<svg") and svg.count("<line") == 1 + 5 and "L0H0" in svg  # the edge and the legend
    True
    """
    pos, width, height = _layout(n_layers, n_heads, n_kv_heads)
    top = float(edges["score"].abs().max()) if len(edges) else 1.0
    top = top if top > 0 else 1.0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="9">',
        f"<title>{html.escape(title)}</title>",
    ]
    for layer in range(n_layers):  # faint layer rules and labels
        y = pos(f"L{layer}H0")[1]
        out.append(f'<text x="4" y="{y + 3:.1f}" fill="#888">L{layer}</text>')
    nodes: dict[str, tuple[float, float]] = {"input": pos("input"), "logits": pos("logits")}
    for e in edges.sort_values("score", key=lambda s: s.abs()).itertuples():  # the strongest drawn last
        s_xy, r_xy = pos(str(e.sender)), pos(str(e.receiver))
        nodes[str(e.sender)], nodes[str(e.receiver)] = s_xy, r_xy
        w = 0.4 + 3.6 * abs(float(e.score)) / top
        dash = "" if float(e.score) < 0 else ' stroke-dasharray="4 2"'
        colour = VIA_COLOURS.get(str(e.via), "#000")
        out.append(
            f'<line x1="{s_xy[0]:.1f}" y1="{s_xy[1]:.1f}" x2="{r_xy[0]:.1f}" y2="{r_xy[1]:.1f}" stroke="{colour}" '
            f'stroke-width="{w:.2f}" stroke-opacity="0.7"{dash}>'
            f"<title>{html.escape(f'{e.sender} -> {e.receiver} via {e.via}: {float(e.score):.4g}')}</title></line>"
        )
    for name, (x, y) in nodes.items():
        shape = (
            f'<rect x="{x - 7:.1f}" y="{y - 5:.1f}" width="14" height="10" fill="#eee" stroke="#333"/>'
            if name.startswith("MLP") or name in ("input", "logits")
            else f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{3 if "KV" in name else 5}" fill="#fff" stroke="#333"/>'
        )
        label = name if not _HEAD.match(name) else f"H{_HEAD.match(name)[2]}"
        out.append(shape + f'<text x="{x + 7:.1f}" y="{y - 6:.1f}">{html.escape(label)}</text>')
    legend_y = height - 8
    for i, (via, colour) in enumerate(VIA_COLOURS.items()):
        out.append(
            f'<line x1="{10 + i * 60}" y1="{legend_y}" x2="{26 + i * 60}" y2="{legend_y}" stroke="{colour}" '
            f'stroke-width="2"/><text x="{29 + i * 60}" y="{legend_y + 3}">{via}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _faithfulness_table(faith: pd.DataFrame) -> pd.DataFrame:
    """The budget rows as the report shows them: edges kept (after pruning), faithfulness, the
    random circuits' mean, spread and range."""
    return pd.DataFrame(
        {
            "budget": faith["budget"],
            "edges": faith["n_edges_pruned"],
            "faithfulness": faith["faithfulness"].round(3),
            "random mean": faith["random_mean"].round(3),
            "random std": faith["random_std"].round(3),
            "random range": [
                "—" if math.isnan(lo) else f"[{lo:.3f}, {hi:.3f}]"
                for lo, hi in zip(faith["random_min"], faith["random_max"])
            ],
        }
    )


def circuits_section(frames, meta, summary: dict | None, absent: str | None) -> Section | None:
    """The section, or None when the stage neither ran nor was asked for."""
    edges, faith = frames.get("circuit_edges"), frames.get("circuit_faithfulness")
    if edges is None or faith is None or summary is None:
        if absent is None:
            return None
        return Section(id="circuits", title="Circuits", blocks=[Paragraph(f"No edge circuit: {absent}.")])
    t = summary.get("task", {})
    blocks = [
        Paragraph(
            f"Edges between heads, MLPs, the input and the logits, scored by {summary['method'].upper()}"
            + (f" ({summary['steps']} steps)" if summary.get("steps") else "")
            + f" on the {t.get('name')} task ({t.get('n_items')} items; metric {t.get('metric')}); the top edges "
            f"at each budget (a fraction of the {summary['n_edges_total']:,} edges), pruned of dangling edges, "
            "are evaluated by exact edge patching: every edge outside the circuit reads the corrupted run. "
            "Faithfulness (MIB) is (m(C) − m(∅)) / (m(M) − m(∅)), beside random circuits of the same size."
        ),
        Paragraph(
            f"m(M) {summary['m_full']:.3f}, m(∅) {summary['m_empty']:.3f}; CPR {summary['cpr']:.3f}, "
            f"CMD {summary['cmd']:.3f} (random circuits' CPR {summary['random_cpr']:.3f}). "
            f"Top edges: {', '.join(summary['top_edges'][:5])}."
        ),
        Table(
            "circuit_faithfulness",
            _faithfulness_table(faith),
            "Faithfulness of the top-|score| circuit at each budget beside random circuits of as many edges.",
        ),
    ]
    b = summary.get("figure_budget")
    shape = summary.get("graph", {})
    if b is not None and shape:
        kept = edges[edges["kept_at"] <= b]
        drawn = kept.reindex(kept["score"].abs().sort_values(ascending=False).index).head(MAX_DRAWN)
        f = float(faith.loc[faith["budget"] == b, "faithfulness"].iloc[0])
        title = f"The circuit at budget {b:g}: {len(kept)} edges after pruning, faithfulness {f:.3f}" + (
            f"; the {len(drawn)} of largest |score| drawn" if len(drawn) < len(kept) else ""
        )
        blocks.append(
            Figure(
                "circuit",
                b"",
                title + ". Nodes by layer (bottom: input, top: logits), heads by index, k/v nodes per KV head "
                "below their group, MLPs to the right; lines coloured by what they feed, width by |score|, "
                "solid where corrupting the edge lowers the metric, dashed where it raises it.",
                title + ".",
                svg=circuit_svg(
                    drawn,
                    n_layers=int(shape["n_layers"]),
                    n_heads=int(shape["n_heads"]),
                    n_kv_heads=int(shape["n_kv_heads"]),
                    title=title,
                ),
            )
        )
    if t.get("n_unusable"):
        counts = ", ".join(f"{k} {n}" for k, n in (t.get("unusable_counts") or {}).items())
        blocks.append(Note(f"{t['n_unusable']} items of the task were unusable and skipped ({counts})."))
    return Section(id="circuits", title="Circuits", blocks=blocks)
