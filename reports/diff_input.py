"""What ``headscope diff`` reads: a run folder's role and importance frames and its architecture.

:func:`read_run` reads a report, roles or prune output folder (or a folder of tables
written by hand) into a :class:`Run`; every table is checked as it is read
(:mod:`headscope.reports.table_checks`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from headscope.reports.table_checks import MAX_INDEX, check_roles_table, check_table


@dataclass
class Run:
    path: Path
    roles: pd.DataFrame | None
    impact: pd.DataFrame | None
    n_layers: int
    n_heads: int
    model: str | None


def _check_impact(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    from headscope.analyses.frames import IMPACT_COLUMNS

    return check_table(
        df, path, what="a pruning table", columns=IMPACT_COLUMNS, ints_or_missing=["layer", "head"], floats=["value"]
    )[IMPACT_COLUMNS]


def _read_architecture(run_json: Path) -> tuple[int | None, int | None, str | None]:
    """``(layers, heads, model)`` from a run.json (None where absent); one-line errors."""
    try:
        meta = json.loads(run_json.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(
            f"{run_json}: not valid JSON ({(str(err).splitlines() or ['nested too deeply'])[0][:120]}); "
            "fix or remove it (diff then takes the architecture from the tables)"
        ) from None
    if not isinstance(meta, dict):  # a malformed file: ValueError like every other one
        raise ValueError(  # noqa: TRY004
            f"{run_json}: must hold a JSON object; got a {type(meta).__name__}"
        )
    arch = meta.get("architecture") or {}
    if not isinstance(arch, dict):
        raise ValueError(  # noqa: TRY004
            f"{run_json}: 'architecture' must be an object with 'layers' and 'heads'; got {json.dumps(arch)[:60]}"
        )
    for key in ("layers", "heads"):
        v = arch.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_INDEX + 1):
            raise ValueError(
                f"{run_json}: architecture.{key} must be an integer in [1, {MAX_INDEX + 1}]; got {json.dumps(v)[:60]}"
            )
    model = meta.get("model")
    return arch.get("layers"), arch.get("heads"), None if model is None else str(model)


def read_run(path) -> Run:
    """Read the role and impact frames and the architecture of a run folder.

    A headscope roles, report or prune output is read by
    :func:`~headscope.reports.runs.load_run`; a folder without a manifest (tables written
    by hand) is read from its table files at the top and under ``tables/``. The ``roles``
    table (not a prune folder's: that one is its role ablation) is checked by
    :func:`~headscope.reports.table_checks.check_roles_table`; every other table holding
    IMPACT_COLUMNS is a pruning table, checked row by row."""
    from headscope.analyses.frames import IMPACT_COLUMNS
    from headscope.probes.outputs.kinds import output_kind_of
    from headscope.reports.runs import TABLE_DIRS, load_run, read_tables, table_files

    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such run folder (pass a report, roles or prune output folder)")
    kind = output_kind_of(folder)
    if kind is not None:
        run = load_run(folder)
        paths = table_files(folder / TABLE_DIRS[kind])
        frames = run.tables
    else:
        paths = table_files(folder, folder / "tables")
        frames = read_tables(paths)
    roles, impacts = None, []
    for stem, df in frames.items():
        if stem == "roles" and kind != "prune":  # a pruning study's "roles" is its role ablation, not verdicts
            roles = check_roles_table(df, paths[stem])
        elif set(IMPACT_COLUMNS) <= set(df.columns):
            impacts.append(_check_impact(df, paths[stem]))
    impact = pd.concat(impacts, ignore_index=True) if impacts else None
    if roles is None and impact is None:
        raise ValueError(
            f"{folder}: no roles table (roles.parquet / roles.csv) and no pruning table found; "
            "pass a folder written by headscope report, roles or prune"
        )
    n_layers = n_heads = None
    model = None
    run_json = folder / "run.json"
    if run_json.is_file():
        n_layers, n_heads, model = _read_architecture(run_json)
    if n_layers is None or n_heads is None:
        frames = [f for f in (roles, impact) if f is not None]
        both = pd.concat([f[["layer", "head"]].dropna() for f in frames], ignore_index=True)
        if both.empty:
            raise ValueError(
                f"{folder}: its tables hold no row with a layer and head, and there is no run.json "
                "giving the architecture; pass the folder of a completed run"
            )
        n_layers, n_heads = int(both["layer"].max()) + 1, int(both["head"].max()) + 1
    else:
        for f in (roles, impact):
            if f is not None and ((f["layer"] >= n_layers) | (f["head"] >= n_heads)).any():
                r = f[(f["layer"] >= n_layers) | (f["head"] >= n_heads)].iloc[0]
                raise ValueError(
                    f"{folder}: a table holds L{int(r['layer'])}H{int(r['head'])}, outside the {n_layers} "
                    f"× {n_heads} heads of {run_json}; the tables and run.json come from different runs"
                )
    return Run(path=folder, roles=roles, impact=impact, n_layers=int(n_layers), n_heads=int(n_heads), model=model)
