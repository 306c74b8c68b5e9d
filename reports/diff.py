"""Compare two runs of the same architecture: changes in head roles and in importance.

A run is a report folder (``headscope report``) or a roles / prune output folder: the
role frame is read from ``roles.parquet`` (or ``.csv``) at the top or under ``tables/``;
importance from every table with IMPACT_COLUMNS. Both runs must have the same layers ×
heads (from ``run.json``'s ``architecture`` when present, else from the frames).

Outputs (frames only):

* ``role_changes``: layer, head, role, relation, direction, score_a, score_b, delta
  (B − A), verdict_a, verdict_b, change (``gained`` / ``lost`` / ``kept`` / ``none``),
  one row per head and role found in either run;
* ``importance_changes``: study, layer, head, metric, value_a, value_b, delta — per-head
  importance rows (those with a layer and head);
* ``top_heads``: per role (and relation, direction) in both runs, the ``top`` heads by
  score in each, whether they are the same heads (``same_set``; ``same_order``), the
  largest |score difference| over the role's heads and the verdict counts — the check
  behind "same top-3 heads per role" (e.g. bf16 against fp32, two seeds, two backends).

>>> import pandas as pd
>>> a = pd.DataFrame({"layer": [0], "head": [1], "role": ["punctuation"], "relation": [""], "direction": [""],
...                   "score": [0.2], "verdict": [False]})
>>> b = a.assign(score=0.5, verdict=True)
>>> role_changes(a, b)[["layer", "head", "delta", "change"]].to_dict("records")
[{'layer': 0, 'head': 1, 'delta': 0.3, 'change': 'gained'}]
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

KEYS = ["layer", "head", "role", "relation", "direction"]
ROLE_CHANGE_COLUMNS = KEYS + ["score_a", "score_b", "delta", "verdict_a", "verdict_b", "change"]
IMPORTANCE_CHANGE_COLUMNS = ["study", "layer", "head", "metric", "value_a", "value_b", "delta"]
TOP_HEADS_COLUMNS = ["role", "relation", "direction", "top_a", "top_b", "same_set", "same_order", "max_abs_delta",
                     "verdicts_a", "verdicts_b", "n_a", "n_b"]
ROLE_KEYS = ["role", "relation", "direction"]


@dataclass
class Run:
    path: Path
    roles: pd.DataFrame | None
    impact: pd.DataFrame | None
    n_layers: int
    n_heads: int
    model: str | None


def _read_table(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path, keep_default_na=False, na_values=[""])


def _tables(folder: Path) -> list[Path]:
    """Table files at the top of ``folder`` and under ``tables/``; Parquet preferred over
    a CSV of the same stem."""
    found = {}
    for d in (folder, folder / "tables"):
        if d.is_dir():
            for p in sorted(d.iterdir()):
                if p.suffix in (".parquet", ".csv") and not p.name.startswith("."):
                    key = (d, p.stem)
                    if key not in found or p.suffix == ".parquet":
                        found[key] = p
    return list(found.values())


def read_run(path) -> Run:
    """Read the role and impact frames and the architecture of a run folder."""
    from headscope.analyses.frames import IMPACT_COLUMNS

    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such run folder (pass a report, roles or prune output folder)")
    roles, impacts = None, []
    for p in _tables(folder):
        if p.stem == "roles" and roles is None:
            roles = _read_table(p)
        elif p.stem != "roles":
            cols = set(pd.read_parquet(p).columns if p.suffix == ".parquet" else pd.read_csv(p, nrows=0).columns)
            if set(IMPACT_COLUMNS) <= cols:
                impacts.append(_read_table(p)[IMPACT_COLUMNS])
    impact = pd.concat(impacts, ignore_index=True) if impacts else None
    if roles is None and impact is None:
        raise ValueError(f"{folder}: no roles table (roles.parquet / roles.csv) and no pruning table found; "
                         "pass a folder written by headscope report, roles or prune")
    if roles is not None:
        for c in ("relation", "direction"):
            roles[c] = roles[c].fillna("").astype(str) if c in roles else ""
    n_layers = n_heads = None
    model = None
    run_json = folder / "run.json"
    if run_json.exists():
        meta = json.loads(run_json.read_text())
        arch = meta.get("architecture") or {}
        n_layers, n_heads, model = arch.get("layers"), arch.get("heads"), meta.get("model")
    if n_layers is None or n_heads is None:
        frames = [f for f in (roles, impact) if f is not None]
        both = pd.concat([f[["layer", "head"]].dropna() for f in frames], ignore_index=True)
        n_layers, n_heads = int(both["layer"].max()) + 1, int(both["head"].max()) + 1
    return Run(path=folder, roles=roles, impact=impact, n_layers=int(n_layers), n_heads=int(n_heads), model=model)


def role_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, head, role, relation, direction) in either frame: scores, delta and
    how the verdict changed, largest |delta| first."""
    cols = KEYS + ["score", "verdict"]
    a = a.assign(**{c: "" for c in ("relation", "direction") if c not in a})[cols]
    b = b.assign(**{c: "" for c in ("relation", "direction") if c not in b})[cols]
    m = a.merge(b, on=KEYS, how="outer", suffixes=("_a", "_b"))
    m["delta"] = (m["score_b"] - m["score_a"]).round(12)
    va = m["verdict_a"].astype("boolean").fillna(False).astype(bool)
    vb = m["verdict_b"].astype("boolean").fillna(False).astype(bool)
    m["verdict_a"], m["verdict_b"] = va, vb
    m["change"] = np.select([vb & ~va, va & ~vb, va & vb], ["gained", "lost", "kept"], "none")
    m["layer"], m["head"] = m["layer"].astype(int), m["head"].astype(int)
    m = m.assign(_abs=m["delta"].abs().fillna(np.inf))
    m = m.sort_values(["_abs", "layer", "head", "role"], ascending=[False, True, True, True], kind="stable")
    return m[ROLE_CHANGE_COLUMNS].reset_index(drop=True)


def top_heads_agreement(a: pd.DataFrame, b: pd.DataFrame, top: int = 3) -> pd.DataFrame:
    """Per role found in both frames: each run's ``top`` heads by score (ties by layer,
    head), as ``"L3H2 L1H0 ..."``; ``same_set`` / ``same_order``; ``max_abs_delta``, the
    largest |score_b - score_a| over heads scored in both; verdict counts; ``n_a``/``n_b``,
    the role's items in each run (a role measured on a handful of items flips on a tie).

    >>> a = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "role": "r", "relation": "", "direction": "",
    ...                   "score": [0.9, 0.5, 0.1], "verdict": [True, False, False]})
    >>> b = a.assign(score=[0.5, 0.9, 0.1])
    >>> top_heads_agreement(a, b, top=2)[["top_a", "top_b", "same_set", "same_order", "max_abs_delta"]].to_dict("records")
    [{'top_a': 'L0H0 L0H1', 'top_b': 'L0H1 L0H0', 'same_set': True, 'same_order': False, 'max_abs_delta': 0.4}]
    """
    if top < 1:
        raise ValueError(f"top must be >= 1; got {top}")

    def prep(df):
        df = df.assign(**{c: "" for c in ("relation", "direction") if c not in df})
        return df.dropna(subset=["score"]).sort_values(["score", "layer", "head"], ascending=[False, True, True], kind="stable")

    a, b = prep(a), prep(b)
    both = a.merge(b, on=KEYS, suffixes=("_a", "_b"))
    delta = (both["score_b"] - both["score_a"]).abs().groupby([both[k] for k in ROLE_KEYS]).max()
    ga, gb = a.groupby(ROLE_KEYS, sort=True), b.groupby(ROLE_KEYS, sort=True)
    rows = []
    for key, da in ga:
        if key not in gb.groups:
            continue
        db = gb.get_group(key)
        ta = [f"L{int(r.layer)}H{int(r.head)}" for r in da.head(top).itertuples()]
        tb = [f"L{int(r.layer)}H{int(r.head)}" for r in db.head(top).itertuples()]
        rows.append({**dict(zip(ROLE_KEYS, key)), "top_a": " ".join(ta), "top_b": " ".join(tb), "same_set": set(ta) == set(tb),
                     "same_order": ta == tb, "max_abs_delta": float(delta.get(key, np.nan)),
                     "verdicts_a": int(da["verdict"].astype(bool).sum()), "verdicts_b": int(db["verdict"].astype(bool).sum()),
                     "n_a": int(da["n"].max()) if "n" in da else None, "n_b": int(db["n"].max()) if "n" in db else None})
    return pd.DataFrame(rows, columns=TOP_HEADS_COLUMNS)


def agreement_summary(top_heads: pd.DataFrame, top: int) -> dict:
    """``{"top", "roles", "same_set", "same_order", "max_abs_delta", "max_abs_delta_role", "differ"}``."""
    if top_heads.empty:
        return {"top": top, "roles": 0, "same_set": 0, "same_order": 0, "max_abs_delta": None, "max_abs_delta_role": None, "differ": []}
    key = top_heads["role"] + np.where(top_heads["relation"] != "", ":" + top_heads["relation"], "") + \
        np.where(top_heads["direction"] != "", " " + top_heads["direction"], "")
    worst = top_heads["max_abs_delta"].idxmax() if top_heads["max_abs_delta"].notna().any() else None
    return {"top": top, "roles": len(top_heads), "same_set": int(top_heads["same_set"].sum()),
            "same_order": int(top_heads["same_order"].sum()),
            "max_abs_delta": None if worst is None else float(top_heads.loc[worst, "max_abs_delta"]),
            "max_abs_delta_role": None if worst is None else str(key[worst]),
            "differ": [str(k) for k in key[~top_heads["same_set"]]]}


def importance_changes(a: pd.DataFrame | None, b: pd.DataFrame | None) -> pd.DataFrame:
    """Per-head importance (IMPACT rows with a layer and head), B − A, largest first."""
    if a is None or b is None:
        return pd.DataFrame(columns=IMPORTANCE_CHANGE_COLUMNS)
    keys = ["study", "layer", "head", "metric"]

    def per_head(df):
        d = df[df["layer"].notna() & df["head"].notna()]
        return d.groupby(keys, observed=True, as_index=False)["value"].mean()

    m = per_head(a).merge(per_head(b), on=keys, how="outer", suffixes=("_a", "_b"))
    if m.empty:
        return pd.DataFrame(columns=IMPORTANCE_CHANGE_COLUMNS)
    m["delta"] = m["value_b"] - m["value_a"]
    m["layer"], m["head"] = m["layer"].astype(int), m["head"].astype(int)
    m = m.assign(_abs=m["delta"].abs().fillna(np.inf)).sort_values(["_abs", "study", "layer", "head"], ascending=[False, True, True, True])
    return m[IMPORTANCE_CHANGE_COLUMNS].reset_index(drop=True)


def role_key(changes: pd.DataFrame) -> pd.Series:
    """``role`` or ``role:relation:direction`` for syntactic rows (the figure's panels)."""
    rel = changes["relation"].fillna("").astype(str)
    dirn = changes["direction"].fillna("").astype(str)
    return changes["role"].astype(str) + np.where(rel != "", ":" + rel, "") + np.where(dirn != "", " " + dirn, "")


def compare(run_a: Run, run_b: Run, *, top: int = 3) -> dict[str, pd.DataFrame]:
    """The frames of changes (``role_changes``, ``top_heads`` with ``top`` heads per role,
    ``importance_changes``); refuses runs of different architecture."""
    if (run_a.n_layers, run_a.n_heads) != (run_b.n_layers, run_b.n_heads):
        raise ValueError(
            f"headscope diff needs two runs of the same architecture (layers × heads); got "
            f"{run_a.n_layers} × {run_a.n_heads} in {run_a.path} and {run_b.n_layers} × {run_b.n_heads} in {run_b.path}"
        )
    out = {}
    if run_a.roles is not None and run_b.roles is not None:
        out["role_changes"] = role_changes(run_a.roles, run_b.roles)
        out["top_heads"] = top_heads_agreement(run_a.roles, run_b.roles, top=top)
        out["top_heads"].attrs["top"] = top
    out["importance_changes"] = importance_changes(run_a.impact, run_b.impact)
    if "role_changes" not in out and out["importance_changes"].empty:
        raise ValueError(f"nothing to compare: {run_a.path} and {run_b.path} share neither a roles table nor per-head importance")
    return out


def write_diff(run_a: Run, run_b: Run, frames: dict[str, pd.DataFrame], out_dir, *, top: int = 3) -> dict[str, Path]:
    """Write tables/*.csv|parquet, figures/role_score_deltas.png and diff.json into
    ``out_dir`` (atomically, folder swapped in when complete)."""
    import os
    import shutil

    from headscope.probes.atomic import atomic_write, write_frame, write_json

    from . import figures as F
    from .pipeline import _swap_in

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not (out / "diff.json").exists():
        raise ValueError(f"output folder {out} exists and is not a headscope diff (no diff.json); pass another --out or remove it")
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for name, df in frames.items():
            write_frame(df, tmp / "tables" / name)
        rc = frames.get("role_changes")
        fig_path = None
        if rc is not None and not rc.empty:
            fig = F.diff_figure(rc.assign(role=role_key(rc)).dropna(subset=["delta"]), n_layers=run_a.n_layers, n_heads=run_a.n_heads)
            if fig is not None:
                fig_path = "figures/role_score_deltas.png"
                with atomic_write(tmp / fig_path, "wb") as f:
                    f.write(F.png_bytes(fig))
        counts = rc["change"].value_counts().to_dict() if rc is not None else {}
        write_json({"run_a": str(run_a.path), "run_b": str(run_b.path), "model_a": run_a.model, "model_b": run_b.model,
                    "architecture": {"layers": run_a.n_layers, "heads": run_a.n_heads},
                    "verdict_changes": {k: int(counts.get(k, 0)) for k in ("gained", "lost", "kept", "none")},
                    "top_heads": agreement_summary(frames["top_heads"], top) if "top_heads" in frames else None,
                    "figure": fig_path, "tables": sorted(frames)}, tmp / "diff.json")
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out_dir": out, "figure": out / fig_path if fig_path else None, "tables": out / "tables"}


def diff_runs(a, b, *, out_dir="runs/diff", top: int = 3) -> tuple[dict[str, pd.DataFrame], dict[str, Path]]:
    """Read, compare (``top`` heads per role) and write: ``(frames, paths)``."""
    ra, rb = read_run(a), read_run(b)
    frames = compare(ra, rb, top=top)
    return frames, write_diff(ra, rb, frames, out_dir, top=top)


def largest_changes(frames: dict[str, pd.DataFrame], top: int = 10) -> list[str]:
    """Lines for the terminal: verdicts gained/lost, then the largest score and importance deltas."""
    lines = []
    th = frames.get("top_heads")
    if th is not None and not th.empty:
        k = th.attrs.get("top", 3)
        summ = agreement_summary(th, k)
        lines.append(f"top-{k} heads per role: the same heads in {summ['same_set']} of {summ['roles']} roles "
                     f"({summ['same_order']} in the same order); largest |score difference| {summ['max_abs_delta']:.4f} "
                     f"({summ['max_abs_delta_role']})")
        if summ["differ"]:
            lines.append("  top heads differ in: " + ", ".join(summ["differ"][:top]) + (" …" if len(summ["differ"]) > top else ""))
    rc = frames.get("role_changes")
    if rc is not None and not rc.empty:
        key = role_key(rc)
        for ch in ("gained", "lost"):
            d = rc[rc["change"] == ch]
            if not d.empty:
                heads = ", ".join(f"L{r.layer}H{r.head} {k}" for r, k in zip(d.head(top).itertuples(), key[d.index][:top]))
                lines.append(f"{ch} {len(d)}: {heads}{' …' if len(d) > top else ''}")
        for r, k in zip(rc.head(top).itertuples(), key[:top]):
            if pd.notna(r.delta) and r.delta != 0:
                lines.append(f"L{r.layer}H{r.head} {k}: {r.score_a:.3f} → {r.score_b:.3f} ({r.delta:+.3f})")
    ic = frames.get("importance_changes")
    if ic is not None and not ic.empty:
        for r in ic.head(min(top, 5)).itertuples():
            if pd.notna(r.delta) and r.delta != 0:
                lines.append(f"importance {r.study} L{r.layer}H{r.head} {r.metric}: {r.value_a:.4g} → {r.value_b:.4g} ({r.delta:+.4g})")
    return lines or ["no change"]
