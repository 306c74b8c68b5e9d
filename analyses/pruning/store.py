"""Where a pruning study keeps its tables: :class:`PruneTables` in memory and, with an
output folder, their CSV + Parquet files and ``state.json`` (:class:`StudyStore`).

Each commit writes the tables first, atomically, then ``state.json`` counting their rows;
a resumed study drops rows past the committed count (from a crash between the two writes).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from headscope.probes.errors import CheckpointError
from headscope.probes.outputs.atomic import write_frame, write_json
from headscope.probes.outputs.kinds import manifest_header

log = logging.getLogger(__name__)

STATE_VERSION = 1

#: the file (CSV + Parquet stem in ``out_dir``, key of ``state.json``'s row counts) of each
#: :class:`PruneTables` field
TABLE_FILES = {
    "baseline": "baseline",
    "ablation": "ablation",
    "all_but_one": "all_but_one",
    "importance": "importance",
    "role_ablation": "roles",
    "curves": "curves",
    "curve_summary": "curve_summary",
    "prunable": "prunable",
}
_FIELD_OF_FILE = {v: k for k, v in TABLE_FILES.items()}


@dataclass
class PruneTables:
    """The study's tables; None for one not (yet) produced."""

    baseline: pd.DataFrame | None = None
    ablation: pd.DataFrame | None = None
    all_but_one: pd.DataFrame | None = None
    importance: pd.DataFrame | None = None
    role_ablation: pd.DataFrame | None = None
    curves: pd.DataFrame | None = None
    curve_summary: pd.DataFrame | None = None
    prunable: pd.DataFrame | None = None

    def by_file(self) -> dict[str, pd.DataFrame]:
        """The produced tables under their file names (:data:`TABLE_FILES`), in field order."""
        return {TABLE_FILES[f.name]: df for f in fields(self) if (df := getattr(self, f.name)) is not None}


class StudyStore:
    """The tables + state of one study on disk (or only in memory when ``out_dir`` is None).
    ``config`` (the study's settings as a dict), ``model_name`` and ``metric_name`` must match
    a ``state.json`` found in ``out_dir``, which is then loaded (:class:`CheckpointError`
    when it does not match or its tables are damaged)."""

    def __init__(self, out_dir, config: dict, model_name: str, metric_name: str):
        self.dir = None if out_dir is None else Path(out_dir)
        self.tables = PruneTables()
        self.state = {
            **manifest_header("prune"),
            "version": STATE_VERSION,
            "config": config,
            "model": model_name,
            "metric": metric_name,
            "done": [],
            "curves": {},
            "rows": {},
            "complete": False,
        }
        if self.dir is not None and (self.dir / "state.json").exists():
            self._load(config, model_name, metric_name)

    def _load(self, config: dict, model_name: str, metric_name: str) -> None:
        path = self.dir / "state.json"
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: unreadable pruning state ({e}); delete it to start over") from None
        if state.get("version") != STATE_VERSION:
            raise CheckpointError(
                f"{path}: state version {state.get('version')!r}, expected {STATE_VERSION}; use a new --out"
            )
        mine = {"config": config, "model": model_name, "metric": metric_name}
        for k, v in mine.items():
            if state.get(k) != v:
                raise CheckpointError(
                    f"{path} holds a run with a different {k} ({state.get(k)!r} vs {v!r}); "
                    "use a new output folder or delete state.json to start over"
                )
        for name, n in state["rows"].items():
            if name not in _FIELD_OF_FILE:
                raise CheckpointError(f"{path} counts rows of an unknown table {name!r}; delete it to start over")
            pq = self.dir / f"{name}.parquet"
            if not pq.exists():
                raise CheckpointError(
                    f"{pq} is missing but state.json says it holds {n} rows; delete state.json to start over"
                )
            try:
                df = pd.read_parquet(pq)
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a damaged file
                raise CheckpointError(
                    f"{pq}: unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                    "delete state.json to start over"
                ) from None
            if len(df) < n:  # rows are written before state.json counts them: fewer means the file was cut or replaced
                raise CheckpointError(
                    f"{pq} holds {len(df)} rows but state.json says {n} were committed (the file was cut "
                    "short or replaced); delete state.json to start over"
                )
            setattr(self.tables, _FIELD_OF_FILE[name], df.iloc[:n].reset_index(drop=True))
        self.state = state
        log.info("resuming pruning study from %s: done %s", path, state["done"])

    def done(self, stage: str) -> bool:
        """Whether ``stage`` was committed (in this call or a previous one)."""
        return stage in self.state["done"]

    def put(self, table: str, df: pd.DataFrame, *, append: bool = False) -> None:
        """Set (or with ``append``, extend) the :class:`PruneTables` field ``table``."""
        old = getattr(self.tables, table)
        if append and old is not None:
            df = pd.concat([old, df], ignore_index=True)
        setattr(self.tables, table, df.reset_index(drop=True))

    def commit(self, stage: str | None = None, tables: tuple[str, ...] = ()) -> None:
        """Write ``tables`` (field names), then ``state.json`` counting their rows."""
        if stage is not None and stage not in self.state["done"]:
            self.state["done"].append(stage)
        for table in tables:
            df, name = getattr(self.tables, table), TABLE_FILES[table]
            self.state["rows"][name] = int(len(df))
            if self.dir is not None:
                write_frame(df, self.dir / name)
        if self.dir is not None:
            write_json(self.state, self.dir / "state.json")
