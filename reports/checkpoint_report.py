"""``headscope report CKPT1 CKPT2 …``: each checkpoint's report, then one comparison in ``<out>``.

:func:`compare_checkpoints` runs the jobs (:mod:`~headscope.reports.checkpoint_jobs`), reads the
reports that ran (:mod:`~headscope.reports.checkpoint_compare`, on ``headscope diff``'s reading and
comparing) and writes, beside the per-checkpoint folders ``<out>/<label>/``::

    comparison.html, comparison.md   the section "Roles and importance across checkpoints"
    figures/role_emergence.png       per role: share of heads holding it per layer, by step
    figures/importance_by_step.png   per head (matched by position): importance, by step
    tables/*.csv, tables/*.parquet   checkpoint_runs, checkpoint_heads, role_emergence,
                                     checkpoint_role_changes, checkpoint_importance_changes
    comparison.json                  the checkpoints, their status, the matching, the notes

:func:`check_out` refuses, before any job runs, an ``<out>`` that holds anything else.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headscope.reports import checkpoint_compare as C
from headscope.reports.checkpoint_inputs import Checkpoint
from headscope.reports.document import Document, Figure, Note, Paragraph, Section, Table, counted

__all__ = ["CheckpointsResult", "check_out", "compare_checkpoints", "compare_results", "summary_lines"]

MANIFEST = "comparison.json"
KIND = {"kind": "checkpoints", "format": 1}
_STAGING = re.compile(r"\.tmp-\d+$")
_OURS = ("comparison.json", "comparison.html", "comparison.md", "tables", "figures")


@dataclass
class CheckpointsResult:
    """``frames``: the comparison's tables; ``paths``: out_dir, html, markdown, json; ``failed``:
    label -> why its report failed (or could not be read); ``results``: the jobs."""

    frames: dict[str, pd.DataFrame]
    paths: dict[str, Path]
    failed: dict[str, str]
    results: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_out(out, checkpoints: list[Checkpoint]) -> Path:
    """``out`` as a Path when the comparison may be written there (it does not exist, is empty, or
    holds an earlier comparison and its checkpoints' reports only), and every checkpoint's subfolder
    may take its report; else ``ValueError`` in one line, before anything runs."""
    import json

    from headscope.probes.outputs.folder import check_output

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; pass another --out (nothing was written)")
    labels = {ck.label for ck in checkpoints}
    if out.is_dir():
        # dot files (locks, atomic writes) and a killed report's staging folder (<label>.tmp-<pid>) are headscope's
        entries = {e.name for e in out.iterdir() if not e.name.startswith(".") and not _STAGING.search(e.name)}
        earlier = out / MANIFEST
        if entries and not earlier.is_file():
            raise ValueError(
                f"--out {out} exists and holds no earlier checkpoint comparison ({MANIFEST}); pass another --out "
                "or empty it (nothing was written)"
            )
        if earlier.is_file():
            try:
                before = {c["label"] for c in json.loads(earlier.read_text(encoding="utf-8"))["checkpoints"]}
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                raise ValueError(
                    f"--out {out}: {MANIFEST} is not a checkpoint comparison's; pass another --out"
                ) from None
            foreign = sorted(entries - set(_OURS) - labels - before)
            if foreign:
                raise ValueError(
                    f"--out {out} holds an earlier comparison but also {', '.join(foreign[:5])}, which headscope "
                    "did not write; move them away or pass another --out (nothing was touched)"
                )
    for label in sorted(labels):
        check_output(out / label, "report")
    return out


def compare_checkpoints(
    checkpoints: list[Checkpoint], config, out, *, ray=None, notice=None, top: int = 3
) -> CheckpointsResult:
    """Run every checkpoint's report (``ray``: on Ray), compare those that ran, write the comparison."""
    from headscope.reports.checkpoint_jobs import run_jobs

    out = check_out(out, checkpoints)
    results = run_jobs(checkpoints, config, out, ray=ray, notice=notice)
    return compare_results(checkpoints, results, out, top=top)


def compare_results(checkpoints: list[Checkpoint], results, out, *, top: int = 3) -> CheckpointsResult:
    """The comparison of the jobs' ``results`` (their report folders under ``out``), written into ``out``."""
    out = Path(out)
    runs, failed = C.read_runs(results)
    heads = C.head_table(checkpoints, runs)
    rc, ic, notes = C.pair_changes(checkpoints, runs, top=top)
    frames = {
        "checkpoint_runs": runs_frame(checkpoints, results, runs, failed),
        "checkpoint_heads": heads,
        "role_emergence": C.emergence(heads),
        "checkpoint_role_changes": rc,
        "checkpoint_importance_changes": ic,
    }
    paths = write_comparison(frames, checkpoints, runs, failed, notes, out)
    return CheckpointsResult(frames=frames, paths=paths, failed=failed, results=results, notes=notes)


def runs_frame(checkpoints, results, runs, failed) -> pd.DataFrame:
    """``checkpoint_runs``: per checkpoint its step, model, status (``ran`` / ``failed``), error,
    seconds, layers × heads and report folder."""
    by_label = {r.checkpoint.label: r for r in results}
    rows = []
    for ck in checkpoints:
        r, run = by_label.get(ck.label), runs.get(ck.label)
        rows.append(
            {
                "checkpoint": ck.label,
                "step": ck.step,
                "model": ck.model,
                "status": "failed" if ck.label in failed else "ran",
                "error": failed.get(ck.label, ""),
                "seconds": float(r.seconds) if r is not None else math.nan,
                "n_layers": run.n_layers if run else None,
                "n_heads": run.n_heads if run else None,
                "report": ck.label,
            }
        )
    df = pd.DataFrame(rows)
    return df.astype({"step": "Int64", "n_layers": "Int64", "n_heads": "Int64"})


def _axis_labels(checkpoints, heads: pd.DataFrame) -> list[tuple[str, str]]:
    """``(label, tick)`` of each checkpoint that ran: its step where known, else its label."""
    ran = set(heads["checkpoint"]) if not heads.empty else set()
    return [(ck.label, str(ck.step) if ck.step is not None else ck.label) for ck in checkpoints if ck.label in ran]


def emergence_figure(em: pd.DataFrame, roles: list[str], axis: list[tuple[str, str]], ref_layers: int):
    """One heatmap per role: reference layer (rows) × checkpoint (columns, by step), colour = the
    share of the heads matched to that layer that hold the role."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from headscope.reports import figures as F

    if em.empty or not roles or not axis:
        return None
    cols = min(4, len(roles))
    rows = math.ceil(len(roles) / cols)
    with F.theme():
        fig, axes = plt.subplots(
            rows,
            cols,
            figsize=(1.2 + (0.45 * len(axis) + 1.0) * cols, 0.8 + (0.3 * ref_layers + 1.0) * rows),
            squeeze=False,
        )
        for ax, role in zip(axes.flat, roles):
            d = em[em["role"] == role].pivot_table(index="matched_layer", columns="checkpoint", values="share")
            d = d.reindex(index=range(ref_layers), columns=[a for a, _ in axis])
            sns.heatmap(d, ax=ax, cmap="Blues", vmin=0, vmax=1, cbar=False, linewidths=0.3, linecolor="white")
            ax.set_xticks([i + 0.5 for i in range(len(axis))], [t for _, t in axis], rotation=90, fontsize=6)
            ax.tick_params(length=0, labelsize=6)
            ax.set_xlabel("step", fontsize=7)
            ax.set_ylabel("layer (reference)", fontsize=7)
            ax.set_title(role, fontsize=8)
        for ax in list(axes.flat)[len(roles) :]:
            ax.axis("off")
        sm = plt.cm.ScalarMappable(cmap="Blues", norm=plt.Normalize(0, 1))
        fig.subplots_adjust(hspace=0.7, wspace=0.5)
        fig.colorbar(sm, ax=axes.ravel().tolist(), shrink=0.6, label="share of the layer's heads holding the role")
        fig.suptitle("How roles emerge over training: heads holding each role, per layer and step")
    return fig


def importance_figure(heads: pd.DataFrame, axis: list[tuple[str, str]]):
    """One layer × head heatmap per checkpoint matched by position (the reference's size): each
    head's importance, on one colour scale, panels in step order."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from headscope.reports import figures as F

    d = heads[(heads["matching"] == C.POSITION) & heads["importance"].notna()]
    if d.empty:
        return None
    d = d.drop_duplicates(["checkpoint", "layer", "head"])
    shown = [(a, t) for a, t in axis if a in set(d["checkpoint"])]
    n_layers, n_heads = int(d["n_layers"].iloc[0]), int(d["n_heads"].iloc[0])
    vmax = max(float(d["importance"].max()), 1e-12)
    cols = min(4, len(shown))
    rows = math.ceil(len(shown) / cols)
    with F.theme():
        fig, axes = plt.subplots(
            rows,
            cols,
            figsize=(1.2 + (0.25 * n_heads + 0.6) * cols, 0.8 + (0.28 * n_layers + 0.9) * rows),
            squeeze=False,
        )
        for ax, (label, tick) in zip(axes.flat, shown):
            mat = d[d["checkpoint"] == label].pivot_table(index="layer", columns="head", values="importance")
            mat = mat.reindex(index=range(n_layers), columns=range(n_heads))
            sns.heatmap(mat, ax=ax, cmap="magma_r", vmin=0, vmax=vmax, square=True, cbar=False)
            for layer, head in zip(*(mat.to_numpy() == 0).nonzero()):  # removing it changes nothing
                ax.text(head + 0.5, layer + 0.5, "×", ha="center", va="center", fontsize=8, color="black")
            ax.tick_params(length=0, labelsize=6, labelrotation=0)
            ax.set_xlabel("head", fontsize=7)
            ax.set_ylabel("layer", fontsize=7)
            ax.set_title(f"step {tick}" if tick != label else label, fontsize=8)
        for ax in list(axes.flat)[len(shown) :]:
            ax.axis("off")
        sm = plt.cm.ScalarMappable(cmap="magma_r", norm=plt.Normalize(0, vmax))
        fig.colorbar(sm, ax=axes.ravel().tolist(), shrink=0.6, label=str(d["importance_metric"].iloc[0]))
        fig.suptitle("Importance per head by step (heads matched by position; ×: importance 0)")
    return fig


def role_counts(heads: pd.DataFrame, axis) -> pd.DataFrame:
    """Heads holding each role (rows: the roles some head holds somewhere) per checkpoint (columns, in order)."""
    if heads.empty:
        return pd.DataFrame()
    c = heads.groupby(["role", "checkpoint"], sort=True)["verdict"].sum().unstack(fill_value=0).astype(int)
    c = c.reindex(columns=[a for a, _ in axis], fill_value=0)
    return c[c.sum(axis=1) > 0].reset_index()


def _matching_text(heads: pd.DataFrame, runs, ref: str | None) -> str:
    if ref is None:
        return "No checkpoint's report could be read, so nothing is compared."
    r = runs[ref]
    text = (
        f"Heads are matched to the reference checkpoint {ref} ({r.n_layers} layers × {r.n_heads} heads): "
        f"by position (the same layer and head) in checkpoints of its size"
    )
    other = sorted(set(heads.loc[heads["matching"] == C.DEPTH, "checkpoint"])) if not heads.empty else []
    if other:
        text += (
            f"; {', '.join(other)} {'has' if len(other) == 1 else 'have'} another size, matched by layer depth "
            "fraction (a layer's centre (layer + 0.5) / layers falls in the reference layer it is drawn with; "
            "heads are not matched one to one there)"
        )
    return (
        text + ". The table checkpoint_heads states the matching of every row (matching, matched_layer, matched_head)."
    )


def build_section(frames, checkpoints, runs, failed: dict[str, str], notes: list[str]) -> Document:
    """The comparison as a document of one section (rendered to comparison.html and .md)."""
    heads = frames["checkpoint_heads"]
    axis = _axis_labels(checkpoints, heads)
    ref = C.reference(runs)
    blocks: list = [
        Paragraph(
            f"{counted(len(checkpoints), 'checkpoint', 'checkpoints')}, each its own report (a subfolder of this "
            f"folder named as in the table below); {len(runs)} ran and {len(failed)} failed. "
            + _matching_text(heads, runs, ref)
        )
    ]
    if failed:
        blocks.append(
            Note(
                f"{counted(len(failed), 'checkpoint', 'checkpoints')} failed and {'is' if len(failed) == 1 else 'are'} "
                "left out of the comparison: " + "; ".join(f"{k} ({v})" for k, v in failed.items())
            )
        )
    blocks.append(Table("checkpoint_runs", frames["checkpoint_runs"], "The checkpoints, in order, and their reports."))
    figs = []
    if ref is not None:
        roles = C.changed_roles(heads)
        fig = emergence_figure(frames["role_emergence"], roles, axis, runs[ref].n_layers)
        if fig is not None:
            figs.append(("role_emergence", fig, "Roles by layer and step", _EMERGENCE_CAPTION))
        fig = importance_figure(heads, axis)
        if fig is not None:
            figs.append(("importance_by_step", fig, "Importance per head by step", _IMPORTANCE_CAPTION))
    from headscope.reports import figures as F

    for name, fig, alt, caption in figs:
        blocks.append(Figure(name=name, png=F.png_bytes(fig), alt=alt, caption=caption))
        if name == "role_emergence":
            rc = role_counts(heads, axis)
            if not rc.empty:
                blocks.append(
                    Table("role_counts", rc, "Heads holding each role, per checkpoint (roles no head holds left out).")
                )
    ic = frames["checkpoint_importance_changes"]
    per_head = ic["metric"].astype(str).str.startswith(tuple(p for _, p in C.IMPORTANCE_SOURCES))
    moved = ic[per_head & ic["delta"].notna() & (ic["delta"] != 0)] if not ic.empty else ic
    if not moved.empty:
        top = moved.reindex(moved["delta"].abs().sort_values(ascending=False, kind="stable").index).head(10)
        blocks.append(
            Table("importance_changes", top, "The largest importance changes between consecutive checkpoints.")
        )
    blocks += [Note(n) for n in notes]
    return Document(
        title="Checkpoints compared",
        subtitle="Roles and importance per head across checkpoints (headscope report CKPT1 CKPT2 …)",
        sections=[Section(id="checkpoints", title="Roles and importance across checkpoints", blocks=blocks)],
    )


_EMERGENCE_CAPTION = (
    "Per role (the roles whose share changes most), the share of each reference layer's heads that hold "
    "the role, per checkpoint by step: a role emerging over training darkens from left to right."
)
_IMPORTANCE_CAPTION = (
    "Each head's importance (how far removing it alone moves the report's metric) per checkpoint, "
    "for the checkpoints of the reference's size; × marks a head whose importance is 0: removing it changes nothing."
)


def write_comparison(frames, checkpoints, runs, failed, notes, out: Path) -> dict[str, Path]:
    """Write the tables, figures, comparison.html, comparison.md and comparison.json into ``out``
    (each file atomically; the per-checkpoint folders are the jobs')."""
    from headscope.probes.outputs.atomic import write_frame, write_json
    from headscope.reports.html import write_document

    doc = build_section(frames, checkpoints, runs, failed, notes)
    out.mkdir(parents=True, exist_ok=True)
    for name, df in frames.items():
        write_frame(df, out / "tables" / name)
    figures = write_document(doc, out, "comparison")
    ref = C.reference(runs)
    run_rows = frames["checkpoint_runs"].astype(object).where(frames["checkpoint_runs"].notna(), None)
    write_json(
        {
            "output": KIND,
            "checkpoints": [
                {
                    "label": r["checkpoint"],
                    "step": r["step"],
                    "model": r["model"],
                    "status": r["status"],
                    "error": r["error"] or None,
                    "seconds": r["seconds"],
                }
                for r in run_rows.to_dict("records")
            ],
            "failed": len(failed),
            "reference": ref,
            "matching": {k: sorted(set(v)) for k, v in frames["checkpoint_heads"].groupby("matching")["checkpoint"]},
            "figures": figures,
            "tables": sorted(frames),
            "notes": notes,
        },
        out / MANIFEST,
    )
    return {"out_dir": out, "html": out / "comparison.html", "markdown": out / "comparison.md", "json": out / MANIFEST}


def summary_lines(result: CheckpointsResult) -> list[str]:
    """What the terminal shows: each checkpoint's status, the roles per checkpoint, where it went."""
    runs = result.frames["checkpoint_runs"]
    lines = [f"{r.checkpoint}: {'failed: ' + r.error if r.status == 'failed' else 'ran'}" for r in runs.itertuples()]
    heads = result.frames["checkpoint_heads"]
    if not heads.empty:
        held = heads[heads["verdict"]].groupby("checkpoint", sort=False).size()
        lines.append(
            "heads × roles held: " + ", ".join(f"{c} {int(held.get(c, 0))}" for c in dict.fromkeys(heads["checkpoint"]))
        )
    lines += [f"note: {n}" for n in result.notes]
    lines.append(f"comparison written to {result.paths['html']} ({len(result.failed)} of {len(runs)} failed)")
    return lines
