"""The "From the weights" section: what the weights alone say about the heads (OV copying,
K-composition) and whether it agrees with what the run measured on text — one table and one
picture per join (:mod:`headscope.analyses.circuits.weights.joins`).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from headscope.reports import figures as F
from headscope.reports.document import Block, Figure, Note, Paragraph, Section, Table, counted, head_name

#: heads of the top copying table
TOP = 10


def _copying_figure(heads: pd.DataFrame, n_layers: int, n_heads: int) -> Figure:
    cop = heads[heads["statistic"].astype(str) == "ov_copying"][["layer", "head", "value"]]
    fig = F.head_map_figure(
        cop, n_layers=n_layers, n_heads=n_heads, label="OV copying score", title="OV copying score per head"
    )
    best = cop.loc[cop["value"].idxmax()]
    return Figure(
        name="weights_copying",
        png=F.png_bytes(fig),
        alt=f"Heatmap of {n_layers} layers by {n_heads} heads: the OV copying score of each head (share of positive "
        f"eigenvalue mass of its OV circuit); the highest is {head_name(best['layer'], best['head'])} "
        f"({best['value']:.3f}).",
        caption="OV copying score per head: 1 = the head's OV circuit only copies the tokens it attends to, "
        "−1 = it only suppresses them, 0 = neither.",
    )


def _k_figure(comp: pd.DataFrame, row: pd.Series, held: set) -> Figure:
    """K-composition of every earlier head into one receiver, previous-token heads in colour."""
    d = comp[(comp["mode"].astype(str) == "K") & (comp["level"].astype(str) == row["level"])]
    d = d[d["receiver_layer"] == row["receiver_layer"]]
    if row["level"] == "head":
        d = d[d["receiver_head"] == row["receiver_head"]]
    else:
        d = d[d["receiver_kv_head"] == row["receiver_kv_head"]]
    d = d.sort_values(["value", "sender_layer", "sender_head"], ascending=[False, True, True]).head(30)
    names = [head_name(l, h) for l, h in zip(d["sender_layer"], d["sender_head"])]
    colours = [
        "#c0392b" if (int(l), int(h)) in held else "#95a5a6" for l, h in zip(d["sender_layer"], d["sender_head"])
    ]
    with F.theme():
        fig, ax = plt.subplots(figsize=(max(4.0, 0.28 * len(names) + 1.5), 3.0))
        ax.bar(range(len(names)), d["value"].to_numpy(float), color=colours)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        ax.set_ylabel("K-composition")
        ax.set_title(f"K-composition into {row['receiver']} (red: previous-token heads)")
    return Figure(
        name=f"weights_k_{row['receiver'].replace(' ', '_')}",
        png=F.png_bytes(fig),
        alt=f"Bars: the {len(names)} earlier heads with the largest K-composition into {row['receiver']}, "
        f"previous-token heads in red; the first is {names[0] if names else 'none'}.",
        caption=f"K-composition into {row['receiver']} ({row['level']} level), the largest first; red: heads the "
        "roles label previous-token.",
    )


def _scatter(x: np.ndarray, y: np.ndarray, *, xlabel: str, ylabel: str, title: str):
    with F.theme():
        fig, ax = plt.subplots(figsize=(3.6, 3.0))
        ax.scatter(x, y, s=10, color="#2c7fb8")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    return fig


def _copy_figure(heads: pd.DataFrame, patching: pd.DataFrame, task: str, method: str) -> Figure:
    cop = heads[heads["statistic"].astype(str) == "ov_copying"][["layer", "head", "value"]]
    p = patching[(patching["task"].astype(str) == task) & (patching["method"].astype(str) == method)]
    if "position" in p:
        p = p[p["position"].isna()]
    m = p.merge(cop, on=["layer", "head"]).dropna(subset=["effect", "value"])
    fig = _scatter(
        m["value"].to_numpy(float),
        m["effect"].to_numpy(float),
        xlabel="OV copying score",
        ylabel=f"patching effect ({task})",
        title=f"Copying vs causal effect: {task}",
    )
    return Figure(
        name=f"weights_copying_vs_{task}",
        png=F.png_bytes(fig),
        alt=f"Scatter of {len(m)} heads: OV copying score against the {method} effect on task {task}.",
        caption=f"Each dot a head: its OV copying score (weights) against its patching effect on {task} ({method}).",
    )


def _path_figure(comp: pd.DataFrame, patching: pd.DataFrame, row: pd.Series) -> Figure:
    rl, rh = (int(x) for x in row["receiver"][1:].split("H"))
    p = patching[(patching["method"].astype(str) == row["method"]) & (patching["receiver"].astype(str) == f"{rl}.{rh}")]
    c = comp[(comp["mode"].astype(str) == "K") & (comp["level"].astype(str) == row["level"])]
    c = c[c["receiver_layer"] == rl]
    if row["level"] == "head":
        c = c[c["receiver_head"] == rh]
    m = p.merge(c, left_on=["layer", "head"], right_on=["sender_layer", "sender_head"]).dropna(subset=["effect"])
    fig = _scatter(
        m["value"].to_numpy(float),
        m["effect"].to_numpy(float),
        xlabel="K-composition",
        ylabel="path patching effect",
        title=f"Path via K into {row['receiver']}",
    )
    return Figure(
        name=f"weights_path_{row['receiver']}_{row['method']}",
        png=F.png_bytes(fig),
        alt=f"Scatter of {len(m)} senders: K-composition into {row['receiver']} against the path-patching effect.",
        caption=f"Each dot a sender: its K-composition into {row['receiver']} (weights) against its effect through "
        f"the receiver's keys ({row['method']}).",
    )


def _fmt(v: float, nd: int = 2) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def _p(v: float) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2g}"


def _k_blocks(frames: dict, held: set) -> list[Block]:
    join, comp = frames.get("join_k_composition"), frames["weights_composition"]
    title = Paragraph(
        "K-composition and the previous-token heads: an induction head finds the token after an earlier "
        "copy of the current one through its keys, which a previous-token head has shifted by one position: the "
        "weights should show the previous-token heads among the heads that K-compose most into it."
    )
    if join is None or join.empty:
        return [title, Note("The run has no induction scores, so there is no receiver to rank senders for.")]
    blocks: list[Block] = [title]
    for _, r in join.iterrows():
        if r["note"]:
            blocks.append(Paragraph(f"{r['receiver']} ({r['level']}): {r['note']}."))
            continue
        basis = "" if r["receiver_basis"] == "verdict" else f", a receiver by {r['receiver_basis']}"
        best = "" if pd.isna(r["best_role_rank"]) else f", the best at rank {int(r['best_role_rank'])}"
        blocks.append(
            Paragraph(
                f"{r['receiver']} ({r['level']} level{basis}): {r['role_in_top_k']} of its top {r['k']} K-composition "
                f"senders are previous-token heads (expected by chance {_fmt(r['expected_in_top_k'])}; "
                f"{counted(int(r['n_role_senders']), 'previous-token head', 'previous-token heads')} among "
                f"{r['n_senders']} earlier heads{best}); rank-biserial {_fmt(r['rank_biserial'])}, one-sided Mann–Whitney p "
                f"{_p(r['p_value'])}."
            )
        )
    blocks.append(Table("join_k_composition", join, "K-composition into each induction head against the roles."))
    blocks.append(_k_figure(comp, join[join["note"] == ""].iloc[0], held) if (join["note"] == "").any() else None)
    return [b for b in blocks if b is not None]


def _copy_blocks(frames: dict) -> list[Block]:
    join = frames.get("join_copying")
    title = Paragraph(
        "Copying heads and the tasks that need copying: a head whose OV circuit copies should carry the "
        "induction and duplicate-token tasks if the model uses copying there."
    )
    if join is None or join.empty:
        return [title, Note("The run has no patching effect on the induction or duplicate-token task to compare with.")]
    blocks: list[Block] = [title]
    for _, r in join.iterrows():
        blocks.append(
            Paragraph(
                f"{r['task']}: Spearman {_fmt(r['spearman'])} (p {_p(r['spearman_p'])}) between copying score and "
                f"effect over {r['n_heads']} heads; top-{r['k']} overlap {_fmt(r['top_k_overlap'])}; top copying heads "
                f"with a significant effect: {r['copying_heads_significant'] or 'none'}."
            )
        )
    blocks.append(Table("join_copying", join, "OV copying score against the patching effect per task."))
    for task, method in zip(join["task"], join["method"]):
        blocks.append(_copy_figure(frames["weights_heads"], frames["patching"], task, method))
    return blocks


def _path_blocks(frames: dict) -> list[Block]:
    join = frames.get("join_path")
    title = Paragraph("Path patching through K against K-composition:")
    if join is None or join.empty:
        return [
            title,
            Note(
                "The report does not run path patching; `headscope patch MODEL --method path --receiver L.H --via k` "
                "does, and this join then compares its senders with the weights."
            ),
        ]
    blocks: list[Block] = [title, Table("join_path", join, "Path patching via K against K-composition, per receiver.")]
    blocks += [_path_figure(frames["weights_composition"], frames["patching"], r) for _, r in join.iterrows()]
    return blocks


def weights_section(frames: dict, meta: dict, n_layers: int, n_heads: int) -> Section | None:
    """The section, or a short one saying why the stage did not run (``meta["absent"]["weights"]``);
    None when neither (an older run)."""
    why = (meta.get("absent") or {}).get("weights")
    heads = frames.get("weights_heads")
    if heads is None or heads.empty:
        if not why:
            return None
        return Section("weights", "From the weights", [Note(f"Not computed for this model: {why}.")])
    w = meta.get("weights_summary") or {}
    roles = frames.get("roles")
    held = set()
    if roles is not None and not roles.empty:
        d = roles[(roles["role"].astype(str) == "previous-token") & roles["verdict"].astype(bool)]
        held = {(int(l), int(h)) for l, h in zip(d["layer"], d["head"])}
    cop = heads[heads["statistic"].astype(str) == "ov_copying"]
    top = cop.sort_values(["value", "layer", "head"], ascending=[False, True, True]).head(TOP)
    blocks: list[Block] = [
        Paragraph(
            "Read from the weights alone, no text run (Elhage et al. 2021): each head's OV circuit "
            f"W_E W_V W_O W_U ({w.get('copying_method', 'eigenvalues')}; norms: {w.get('folding', '?')}; "
            f"unembedding: {w.get('unembedding', '?')}), and the K-composition of every earlier head into each later "
            "one (per KV group where heads share their keys). Each against Gaussian weights of the same shapes."
        ),
        _copying_figure(heads, n_layers, n_heads),
        Table(
            "weights_top_copying",
            top[["layer", "head", "kv_head", "value", "baseline_mean", "verdict"]].reset_index(drop=True),
            f"The {len(top)} heads with the highest OV copying score.",
        ),
    ]
    blocks += _k_blocks(frames, held) + _copy_blocks(frames) + _path_blocks(frames)
    return Section("weights", "From the weights", blocks)
