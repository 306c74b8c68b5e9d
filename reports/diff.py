"""Compare two runs of the same architecture: changes in head roles and in importance.

A run is a report folder (``headscope report``) or a roles / prune output folder, read
by :func:`headscope.reports.load_run` (a folder of tables without a manifest is read
from its table files at the top and under ``tables/``): the role frame is the ``roles``
table (Parquet preferred over CSV); importance every table with IMPACT_COLUMNS. Both runs must have the same layers ×
heads (from ``run.json``'s ``architecture`` when present, else from the frames).

Tables are checked as they are read (:func:`~headscope.reports.table_checks.read_table`): a file that is not CSV or
Parquet, a missing column, or a cell of the wrong type raises ``ValueError`` naming the
file, the row (1 = the first row after the header) and the value, e.g.
``roles.csv:row 2: layer must be an integer in [0, 1023]; got 'x'``. Two runs with no
role in common and no per-head importance in common are refused ("nothing to compare").

Outputs (frames only):

* ``role_changes``: layer, head, role, relation, direction, score_a, score_b, delta
  (B − A), verdict_a, verdict_b, change (``gained`` / ``lost`` / ``kept`` / ``none``, or
  ``unknown (run B has no finite score)`` where a run holds the row with a NaN score: a
  verdict on no measurement is not a verdict), one row per head and role found in either
  run, largest |delta| first and the rows without one last;
* ``importance_changes``: study, layer, head, metric, value_a, value_b, delta — per-head
  importance rows (those with a layer and head);
* ``top_heads``: per role (and relation, direction) in both runs, the ``top`` heads by
  score in each, whether they are the same heads (``same_set``; ``same_order``), the
  largest |score difference| over the role's heads and the verdict counts — the check
  behind "same top-3 heads per role" (e.g. bf16 against fp32, two seeds, two backends).

NaN scores and importance values (a role measured on no item, a study that diverged) are
counted per run (:func:`not_finite`, in ``diff.json``'s ``not_finite``), left out of the
top heads and of the per-head means, and reported in the notes; a role that has no finite
score in one run is named as not compared. When no row has a finite value in both runs
the diff is refused ("nothing to compare", with the counts).

>>> import pandas as pd
>>> a = pd.DataFrame({"layer": [0], "head": [1], "role": ["punctuation"], "relation": [""], "direction": [""],
...                   "score": [0.2], "verdict": [False]})
>>> b = a.assign(score=0.5, verdict=True)
>>> role_changes(a, b)[["layer", "head", "delta", "change"]].to_dict("records")
[{'layer': 0, 'head': 1, 'delta': 0.3, 'change': 'gained'}]
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from headscope.reports.diff_input import Run, read_run

KEYS = ["layer", "head", "role", "relation", "direction"]
ROLE_CHANGE_COLUMNS = KEYS + ["score_a", "score_b", "delta", "verdict_a", "verdict_b", "change"]
IMPORTANCE_CHANGE_COLUMNS = ["study", "layer", "head", "metric", "value_a", "value_b", "delta"]
TOP_HEADS_COLUMNS = [
    "role",
    "relation",
    "direction",
    "top_a",
    "top_b",
    "same_set",
    "same_order",
    "max_abs_delta",
    "verdicts_a",
    "verdicts_b",
    "n_a",
    "n_b",
]
ROLE_KEYS = ["role", "relation", "direction"]
#: ``change`` of a role row that a run holds with a NaN score (by the run(s) lacking a finite one)
UNKNOWN = {
    "a": "unknown (run A has no finite score)",
    "b": "unknown (run B has no finite score)",
    "both": "unknown (neither run has a finite score)",
}
CHANGES = ("gained", "lost", "kept", "none", "unknown")  # diff.json's verdict_changes (unknown: any of UNKNOWN)


def role_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, head, role, relation, direction) in either frame: scores, delta and
    how the verdict changed, largest |delta| first."""
    cols = KEYS + ["score", "verdict"]
    a = a.assign(**{c: "" for c in ("relation", "direction") if c not in a})[cols]
    b = b.assign(**{c: "" for c in ("relation", "direction") if c not in b})[cols]
    m = a.merge(b, on=KEYS, how="outer", suffixes=("_a", "_b"), indicator=True)
    m["delta"] = (m["score_b"] - m["score_a"]).round(12)
    va = m["verdict_a"].astype("boolean").fillna(False).astype(bool)
    vb = m["verdict_b"].astype("boolean").fillna(False).astype(bool)
    m["verdict_a"], m["verdict_b"] = va, vb
    # a row a run holds with a NaN score was not measured there: its verdict says nothing
    nan_a = (m["_merge"] != "right_only") & ~np.isfinite(m["score_a"].astype(float))
    nan_b = (m["_merge"] != "left_only") & ~np.isfinite(m["score_b"].astype(float))
    m["change"] = np.select(
        [nan_a & nan_b, nan_a, nan_b, vb & ~va, va & ~vb, va & vb],
        [UNKNOWN["both"], UNKNOWN["a"], UNKNOWN["b"], "gained", "lost", "kept"],
        "none",
    )
    m["layer"], m["head"] = m["layer"].astype(int), m["head"].astype(int)
    m = m.assign(_abs=m["delta"].abs())
    m = m.sort_values(
        ["_abs", "layer", "head", "role"], ascending=[False, True, True, True], kind="stable", na_position="last"
    )
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
        return df.dropna(subset=["score"]).sort_values(
            ["score", "layer", "head"], ascending=[False, True, True], kind="stable"
        )

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
        rows.append(
            {
                **dict(zip(ROLE_KEYS, key)),
                "top_a": " ".join(ta),
                "top_b": " ".join(tb),
                "same_set": set(ta) == set(tb),
                "same_order": ta == tb,
                "max_abs_delta": float(delta.get(key, np.nan)),
                "verdicts_a": int(da["verdict"].astype(bool).sum()),
                "verdicts_b": int(db["verdict"].astype(bool).sum()),
                "n_a": _max_count(da),
                "n_b": _max_count(db),
            }
        )
    return pd.DataFrame(rows, columns=TOP_HEADS_COLUMNS)


def _max_count(df: pd.DataFrame) -> int | None:
    """Largest ``n`` of a role's rows, None without an ``n`` column or values."""
    n = df["n"].max() if "n" in df else None
    return None if n is None or pd.isna(n) else int(n)


def agreement_summary(top_heads: pd.DataFrame, top: int) -> dict:
    """``{"top", "roles", "same_set", "same_order", "max_abs_delta", "max_abs_delta_role", "differ"}``."""
    if top_heads.empty:
        return {
            "top": top,
            "roles": 0,
            "same_set": 0,
            "same_order": 0,
            "max_abs_delta": None,
            "max_abs_delta_role": None,
            "differ": [],
        }
    key = (
        top_heads["role"]
        + np.where(top_heads["relation"] != "", ":" + top_heads["relation"], "")
        + np.where(top_heads["direction"] != "", " " + top_heads["direction"], "")
    )
    worst = top_heads["max_abs_delta"].idxmax() if top_heads["max_abs_delta"].notna().any() else None
    return {
        "top": top,
        "roles": len(top_heads),
        "same_set": int(top_heads["same_set"].sum()),
        "same_order": int(top_heads["same_order"].sum()),
        "max_abs_delta": None if worst is None else float(top_heads.loc[worst, "max_abs_delta"]),
        "max_abs_delta_role": None if worst is None else str(key[worst]),
        "differ": [str(k) for k in key[~top_heads["same_set"]]],
    }


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
    m = m.assign(_abs=m["delta"].abs()).sort_values(
        ["_abs", "study", "layer", "head"], ascending=[False, True, True, True], kind="stable", na_position="last"
    )
    return m[IMPORTANCE_CHANGE_COLUMNS].reset_index(drop=True)


def not_finite(run: Run) -> dict:
    """What of ``run`` holds no finite number: ``{"roles": {"rows", "nan", "by_role"},
    "importance": {"rows", "nan", "by_study"}}`` (``rows``: role rows / per-head importance
    rows; ``nan``: those whose score / value is NaN; ``by_*``: name -> NaN count), ``None``
    for a table the run does not have."""
    out = {"roles": None, "importance": None}
    if run.roles is not None:
        bad = ~np.isfinite(run.roles["score"].to_numpy(dtype=float))
        names = role_key(run.roles.assign(**{c: "" for c in ("relation", "direction") if c not in run.roles}))
        out["roles"] = {
            "rows": len(run.roles),
            "nan": int(bad.sum()),
            "by_role": {str(k): int(v) for k, v in names[bad].value_counts().sort_index().items()},
        }
    if run.impact is not None:
        d = run.impact[run.impact["layer"].notna() & run.impact["head"].notna()]
        bad = ~np.isfinite(d["value"].to_numpy(dtype=float))
        out["importance"] = {
            "rows": len(d),
            "nan": int(bad.sum()),
            "by_study": {str(k): int(v) for k, v in d["study"][bad].astype(str).value_counts().sort_index().items()},
        }
    return out


def _counts(by: dict) -> str:
    return _few([f"{k} {v}" for k, v in by.items()])


def _nan_notes(name: str, nf: dict) -> list[str]:
    """The notes on run ``name``'s NaN scores and importance values (none when all finite)."""
    notes = []
    r = nf["roles"]
    if r and r["nan"]:
        what = (
            f"none of its {r['rows']} role rows has a finite score"
            if r["nan"] == r["rows"]
            else f"{r['nan']} of {r['rows']} role rows have no finite score"
        )
        notes.append(
            f"run {name}: {what} (NaN: {_counts(r['by_role'])}); those rows are left out of the comparison "
            f"(change '{UNKNOWN[name.lower()]}')"
        )
    i = nf["importance"]
    if i and i["nan"]:
        notes.append(
            f"run {name}: {i['nan']} of {i['rows']} per-head importance rows have no finite value "
            f"(NaN: {_counts(i['by_study'])}); left out (a head's value is the mean of its finite rows)"
        )
    return notes


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
    out, notes = {}, []
    nf = {"A": not_finite(run_a), "B": not_finite(run_b)}
    notes += _nan_notes("A", nf["A"]) + _nan_notes("B", nf["B"])
    role_rows = 0  # rows with a finite score in both runs
    if run_a.roles is not None and run_b.roles is not None:
        ka, kb = _role_names(run_a.roles), _role_names(run_b.roles)
        if ka & kb:
            rc = role_changes(run_a.roles, run_b.roles)
            out["role_changes"] = rc
            role_rows = int((np.isfinite(rc["score_a"]) & np.isfinite(rc["score_b"])).sum())
            out["top_heads"] = top_heads_agreement(run_a.roles, run_b.roles, top=top)
            out["top_heads"].attrs["top"] = top
            for only, name in ((ka - kb, "A"), (kb - ka, "B")):
                if only:
                    notes.append(
                        f"roles only in run {name} (gained/lost there mean measured in one run only): {_few(only)}"
                    )
            fa, fb = _role_names(_finite(run_a.roles)), _role_names(_finite(run_b.roles))
            for name, missing in (("A", (ka & kb) - fa), ("B", (ka & kb) - fb)):
                if missing:
                    notes.append(f"roles with no finite score in run {name}, not compared: {_few(missing)}")
        else:
            notes.append(f"no role in common (A: {_few(ka) or 'none'}; B: {_few(kb) or 'none'})")
    elif run_a.roles is not None or run_b.roles is not None:
        notes.append(f"only {run_a.path if run_a.roles is not None else run_b.path} has a roles table")
    ic = importance_changes(run_a.impact, run_b.impact)
    out["importance_changes"] = ic
    if role_rows == 0 and ic.dropna(subset=["value_a", "value_b"]).empty:
        if "role_changes" in out:
            notes.append("no role row has a finite score in both runs")
        if run_a.impact is not None and run_b.impact is not None:
            notes.append("no per-head importance (study, layer, head, metric) in common")
        raise ValueError(
            f"nothing to compare between {run_a.path} and {run_b.path}: "
            + "; ".join(notes or ["they share neither a roles table nor per-head importance"])
            + "; diff two runs of the same commands (roles, report or prune)"
        )
    for frame in out.values():
        frame.attrs["notes"] = notes
        frame.attrs["not_finite"] = nf
    return out


def _finite(roles: pd.DataFrame) -> pd.DataFrame:
    return roles[np.isfinite(roles["score"].to_numpy(dtype=float))]


def _role_names(roles: pd.DataFrame) -> set[str]:
    """``role`` or ``role:relation direction`` for each role measured in a frame."""
    roles = roles.assign(**{c: "" for c in ("relation", "direction") if c not in roles})
    return set(role_key(roles.drop_duplicates(ROLE_KEYS)))


def _few(names, k: int = 6) -> str:
    names = sorted(names)
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


def write_diff(run_a: Run, run_b: Run, frames: dict[str, pd.DataFrame], out_dir, *, top: int = 3) -> dict[str, Path]:
    """Write tables/*.csv|parquet, figures/role_score_deltas.png and diff.json into
    ``out_dir`` (atomically, folder swapped in when complete)."""
    from headscope.probes.outputs.atomic import atomic_write, write_frame, write_json
    from headscope.probes.outputs.folder import claim_output
    from headscope.probes.outputs.kinds import manifest_header
    from headscope.reports import figures as F

    out = Path(out_dir)
    with claim_output(out, "diff") as folder, folder.staging() as tmp:
        for name, df in frames.items():
            write_frame(df, tmp / "tables" / name)
        rc = frames.get("role_changes")
        fig_path = None
        if rc is not None and not rc.empty:
            fig = F.diff_figure(
                rc.assign(role=role_key(rc)).dropna(subset=["delta"]), n_layers=run_a.n_layers, n_heads=run_a.n_heads
            )
            if fig is not None:
                fig_path = "figures/role_score_deltas.png"
                with atomic_write(tmp / fig_path, "wb") as f:
                    f.write(F.png_bytes(fig))
        counts = change_counts(rc)
        write_json(
            {
                **manifest_header("diff"),
                "run_a": str(run_a.path),
                "run_b": str(run_b.path),
                "model_a": run_a.model,
                "model_b": run_b.model,
                "architecture": {"layers": run_a.n_layers, "heads": run_a.n_heads},
                "verdict_changes": counts,
                "not_finite": not_finite_of(frames),
                "notes": notes_of(frames),
                "top_heads": agreement_summary(frames["top_heads"], top) if "top_heads" in frames else None,
                "figure": fig_path,
                "tables": sorted(frames),
            },
            tmp / "diff.json",
        )
    return {"out_dir": out, "figure": out / fig_path if fig_path else None, "tables": out / "tables"}


def change_counts(rc: pd.DataFrame | None) -> dict[str, int]:
    """Rows per change (:data:`CHANGES`; every ``unknown (...)`` counted as ``unknown``)."""
    if rc is None:
        return dict.fromkeys(CHANGES, 0)
    kinds = rc["change"].astype(str).str.replace(r" \(.*", "", regex=True).value_counts()
    return {k: int(kinds.get(k, 0)) for k in CHANGES}


def notes_of(frames: dict[str, pd.DataFrame]) -> list[str]:
    """The notes :func:`compare` left on its frames: what could not be compared, and why."""
    return next((list(f.attrs["notes"]) for f in frames.values() if f.attrs.get("notes")), [])


def not_finite_of(frames: dict[str, pd.DataFrame]) -> dict | None:
    """``{"run_a": not_finite(A), "run_b": not_finite(B)}`` as :func:`compare` found them."""
    nf = next((f.attrs["not_finite"] for f in frames.values() if "not_finite" in f.attrs), None)
    return None if nf is None else {"run_a": nf["A"], "run_b": nf["B"]}


def diff_runs(a, b, *, out_dir="runs/diff", top: int = 3) -> tuple[dict[str, pd.DataFrame], dict[str, Path]]:
    """Read, compare (``top`` heads per role) and write: ``(frames, paths)``."""
    ra, rb = read_run(a), read_run(b)
    frames = compare(ra, rb, top=top)
    return frames, write_diff(ra, rb, frames, out_dir, top=top)


def largest_changes(frames: dict[str, pd.DataFrame], top: int = 10) -> list[str]:
    """Lines for the terminal: what could not be compared, verdicts gained/lost, then the
    largest score and importance deltas."""
    lines = []
    for frame in frames.values():
        if frame.attrs.get("notes"):
            lines.extend(f"note: {n}" for n in frame.attrs["notes"])
            break
    th = frames.get("top_heads")
    if th is not None and not th.empty:
        k = th.attrs.get("top", 3)
        summ = agreement_summary(th, k)
        largest = (
            f"largest |score difference| {summ['max_abs_delta']:.4f} ({summ['max_abs_delta_role']})"
            if summ["max_abs_delta"] is not None
            else "no head has a finite score in both runs"
        )
        lines.append(
            f"top-{k} heads per role: the same heads in {summ['same_set']} of {summ['roles']} roles "
            f"({summ['same_order']} in the same order); {largest}"
        )
        if summ["differ"]:
            lines.append(
                "  top heads differ in: "
                + ", ".join(summ["differ"][:top])
                + (" …" if len(summ["differ"]) > top else "")
            )
    rc = frames.get("role_changes")
    if rc is not None and not rc.empty:
        key = role_key(rc)
        for ch in ("gained", "lost", *UNKNOWN.values()):
            d = rc[rc["change"] == ch]
            if not d.empty:
                heads = ", ".join(
                    f"L{r.layer}H{r.head} {k}" for r, k in zip(d.head(top).itertuples(), key[d.index][:top])
                )
                lines.append(f"{ch} {len(d)}: {heads}{' …' if len(d) > top else ''}")
        moved = rc[rc["delta"].notna() & (rc["delta"] != 0)].head(top)  # the largest finite deltas
        for r, k in zip(moved.itertuples(), key[moved.index]):
            lines.append(f"L{r.layer}H{r.head} {k}: {r.score_a:.3f} → {r.score_b:.3f} ({r.delta:+.3f})")
    ic = frames.get("importance_changes")
    if ic is not None and not ic.empty:
        for r in ic[ic["delta"].notna() & (ic["delta"] != 0)].head(min(top, 5)).itertuples():
            lines.append(
                f"importance {r.study} L{r.layer}H{r.head} {r.metric}: {r.value_a:.4g} → {r.value_b:.4g} ({r.delta:+.4g})"
            )
    return [_printable(line) for line in lines] or ["no change"]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(line: str) -> str:
    """``line`` with control characters (a role name's line break or terminal escape
    sequence, from a user's file) written as ``\\xNN``, so a printed line is one line
    and cannot drive the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)
