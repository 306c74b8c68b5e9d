"""Roles and importance per head across many checkpoints, built on ``headscope diff``.

Each checkpoint's report folder is read as ``headscope diff`` reads a run
(:func:`~headscope.reports.diff_input.read_run`: its checked ``roles`` table, its per-head
importance and its layers × heads). The frames:

* ``checkpoint_heads`` (:data:`HEAD_COLUMNS`): one row per checkpoint, head and role — the role's
  ``score`` and ``verdict`` there and the head's ``importance`` (:func:`head_importance`), with how
  the head is matched to the reference checkpoint: ``matching`` is ``position`` (same layers ×
  heads: ``matched_layer``, ``matched_head`` are the head's own) or ``depth fraction`` (another
  size: the layer's centre ``depth = (layer + 0.5) / n_layers`` falls in the reference's layer
  ``matched_layer = floor(depth × reference layers)``; heads are not matched one to one there,
  ``matched_head`` is empty). The reference is the first checkpoint with the most layers.
* ``checkpoint_role_changes`` and ``checkpoint_importance_changes``: ``headscope diff``'s
  ``role_changes`` and ``importance_changes`` (:func:`~headscope.reports.diff.compare`) of each
  checkpoint against the one before it (``from_checkpoint`` → ``to_checkpoint``), for consecutive
  checkpoints of the same architecture (another size is compared through ``checkpoint_heads`` only).
* ``role_emergence``: per checkpoint, role and reference layer, the share of the heads there that
  hold the role (:func:`emergence`): what the emergence figure draws.

>>> depth_match(layer=1, n_layers=3, ref_layers=6)
(0.5, 3)
"""

from __future__ import annotations

import math

import pandas as pd

from headscope.reports.diff import IMPORTANCE_CHANGE_COLUMNS, ROLE_CHANGE_COLUMNS, compare, role_key
from headscope.reports.diff_input import Run, read_run

__all__ = [
    "HEAD_COLUMNS",
    "POSITION",
    "DEPTH",
    "depth_match",
    "emergence",
    "head_importance",
    "head_table",
    "pair_changes",
    "read_runs",
    "reference",
]

POSITION, DEPTH = "position", "depth fraction"
HEAD_COLUMNS = [
    "checkpoint",
    "step",
    "layer",
    "head",
    "role",
    "score",
    "verdict",
    "importance",
    "importance_metric",
    "n_layers",
    "n_heads",
    "depth",
    "matched_layer",
    "matched_head",
    "matching",
]
#: per-head importance, in the order looked for: (study, metric prefix); the value's magnitude is taken
IMPORTANCE_SOURCES = (("ablation:zero", "delta_"), ("ablation:mean", "delta_"), ("importance", "grad_importance_"))


def read_runs(results) -> tuple[dict[str, Run], dict[str, str]]:
    """``({label: Run}, {label: why it failed})`` for the jobs' results (a report that ran but holds
    nothing diff can read counts as failed, with the reason)."""
    runs, failed = {}, {}
    for r in results:
        if not r.ok:
            failed[r.checkpoint.label] = r.error or "failed"
            continue
        try:
            runs[r.checkpoint.label] = read_run(r.out_dir)
        except (ValueError, FileNotFoundError) as e:
            failed[r.checkpoint.label] = (str(e).splitlines() or ["unreadable"])[0]
    return runs, failed


def head_importance(impact: pd.DataFrame | None) -> pd.DataFrame:
    """``layer, head, importance, importance_metric``: the first of :data:`IMPORTANCE_SOURCES` the
    run holds per head — ``|delta|`` of the single-head zero (or mean) ablation (how far removing the
    head alone moves the metric), else the gradient importance; empty when the run has none."""
    cols = ["layer", "head", "importance", "importance_metric"]
    if impact is None or impact.empty:
        return pd.DataFrame(columns=cols).astype({"layer": "int64", "head": "int64", "importance": "float64"})
    per_head = impact.dropna(subset=["layer", "head"])
    for study, prefix in IMPORTANCE_SOURCES:
        d = per_head[(per_head["study"] == study) & per_head["metric"].astype(str).str.startswith(prefix)]
        if d.empty:
            continue
        metric = sorted(d["metric"].astype(str).unique())[0]
        d = d[d["metric"] == metric].groupby(["layer", "head"], as_index=False)["value"].mean()
        return pd.DataFrame(
            {
                "layer": d["layer"].astype("int64"),
                "head": d["head"].astype("int64"),
                "importance": d["value"].astype(float).abs(),
                "importance_metric": f"|{metric}| ({study})",
            }
        )
    return pd.DataFrame(columns=cols).astype({"layer": "int64", "head": "int64", "importance": "float64"})


def reference(runs: dict[str, Run]) -> str | None:
    """The label of the reference checkpoint: the first with the most layers (None: no run)."""
    if not runs:
        return None
    most = max(r.n_layers for r in runs.values())
    return next(k for k, r in runs.items() if r.n_layers == most)


def depth_match(*, layer: int, n_layers: int, ref_layers: int) -> tuple[float, int]:
    """``(depth, matched layer)``: the centre of ``layer`` as a fraction of the depth, and the
    reference layer that holds that fraction."""
    depth = (layer + 0.5) / n_layers
    return depth, min(ref_layers - 1, math.floor(depth * ref_layers))


def head_table(checkpoints, runs: dict[str, Run]) -> pd.DataFrame:
    """``checkpoint_heads`` (:data:`HEAD_COLUMNS`) of the checkpoints that ran, in their order."""
    ref = reference(runs)
    frames = []
    for ck in checkpoints:
        run = runs.get(ck.label)
        if run is None or run.roles is None:
            continue
        ref_run = runs[ref]
        roles = run.roles.assign(**{c: "" for c in ("relation", "direction") if c not in run.roles})
        d = pd.DataFrame(
            {
                "layer": roles["layer"].astype("int64"),
                "head": roles["head"].astype("int64"),
                "role": role_key(roles).astype(str),
                "score": roles["score"].astype(float),
                "verdict": roles["verdict"].astype("boolean").fillna(False).astype(bool),
            }
        )
        d = d.merge(head_importance(run.impact), on=["layer", "head"], how="left")
        same = (run.n_layers, run.n_heads) == (ref_run.n_layers, ref_run.n_heads)
        match = [depth_match(layer=int(x), n_layers=run.n_layers, ref_layers=ref_run.n_layers) for x in d["layer"]]
        d = d.assign(
            checkpoint=ck.label,
            step=pd.array([ck.step] * len(d), dtype="Int64"),
            n_layers=run.n_layers,
            n_heads=run.n_heads,
            depth=[m[0] for m in match],
            matched_layer=d["layer"] if same else [m[1] for m in match],
            matched_head=pd.array(d["head"] if same else [None] * len(d), dtype="Int64"),
            matching=POSITION if same else DEPTH,
        )
        frames.append(d)
    if not frames:
        return pd.DataFrame(columns=HEAD_COLUMNS)
    out = pd.concat(frames, ignore_index=True)[HEAD_COLUMNS]
    out["importance_metric"] = out["importance_metric"].fillna("")
    return out.astype({"matched_layer": "int64", "n_layers": "int64", "n_heads": "int64"})


def pair_changes(checkpoints, runs: dict[str, Run], *, top: int = 3) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """``(checkpoint_role_changes, checkpoint_importance_changes, notes)``: ``headscope diff`` of each
    checkpoint that ran against the one before it, where both have the same layers × heads."""
    done = [ck for ck in checkpoints if ck.label in runs]
    roles, imps, notes = [], [], []
    for a, b in zip(done, done[1:]):
        ra, rb = runs[a.label], runs[b.label]
        if (ra.n_layers, ra.n_heads) != (rb.n_layers, rb.n_heads):
            notes.append(
                f"{a.label} ({ra.n_layers} × {ra.n_heads}) → {b.label} ({rb.n_layers} × {rb.n_heads}): different "
                f"sizes, matched by layer depth fraction in checkpoint_heads, not diffed head by head"
            )
            continue
        try:
            frames = compare(ra, rb, top=top)
        except ValueError as e:  # nothing in common (e.g. neither ran the roles nor the pruning stage)
            notes.append(f"{a.label} → {b.label}: {str(e).splitlines()[0]}")
            continue
        pair = {"from_checkpoint": a.label, "to_checkpoint": b.label}
        if "role_changes" in frames:
            roles.append(frames["role_changes"].assign(**pair))
        imps.append(frames["importance_changes"].assign(**pair))
    pair_cols = ["from_checkpoint", "to_checkpoint"]
    rc = pd.concat(roles, ignore_index=True) if roles else pd.DataFrame(columns=ROLE_CHANGE_COLUMNS)
    ic = pd.concat(imps, ignore_index=True) if imps else pd.DataFrame(columns=IMPORTANCE_CHANGE_COLUMNS)
    return (
        rc.reindex(columns=pair_cols + ROLE_CHANGE_COLUMNS),
        ic.reindex(columns=pair_cols + IMPORTANCE_CHANGE_COLUMNS),
        notes,
    )


def emergence(heads: pd.DataFrame) -> pd.DataFrame:
    """``checkpoint, step, role, matched_layer, share, n``: per checkpoint, role and reference layer,
    the share of the checkpoint's heads matched there that hold the role (``n`` heads)."""
    cols = ["checkpoint", "step", "role", "matched_layer", "share", "n"]
    if heads.empty:
        return pd.DataFrame(columns=cols)
    g = heads.groupby(["checkpoint", "role", "matched_layer"], sort=False)
    out = g.agg(share=("verdict", "mean"), n=("verdict", "size")).reset_index()
    steps = heads.drop_duplicates("checkpoint").set_index("checkpoint")["step"]
    out["step"] = pd.array(out["checkpoint"].map(steps), dtype="Int64")
    out["share"] = out["share"].astype(float)
    return out[cols]


def changed_roles(heads: pd.DataFrame, k: int = 8) -> list[str]:
    """The roles to draw: those some head holds in some checkpoint, the ones whose share of heads
    changes most across checkpoints first (at most ``k``)."""
    if heads.empty:
        return []
    share = heads.groupby(["role", "checkpoint"], sort=False)["verdict"].mean().unstack()
    spread = (share.max(axis=1) - share.min(axis=1)).fillna(0)
    held = share.max(axis=1).fillna(0) > 0
    order = pd.DataFrame({"spread": spread, "held": held}).sort_values(
        ["held", "spread"], ascending=[False, False], kind="stable"
    )
    return list(order.index[order["held"]][:k])
