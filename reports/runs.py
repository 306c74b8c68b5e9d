"""Read a headscope output folder back: every table as a frame, its manifest, its JSON files.

:func:`load_run` takes the folder written by ``headscope roles``, ``report``, ``prune``
or ``diff`` and returns a :class:`RunFolder`:

* ``kind``: ``"roles"``, ``"report"``, ``"prune"`` or ``"diff"``
  (:data:`~headscope.probes.outputs.folder.KINDS`), read from the manifest;
* ``format``: the manifest's ``output.format`` (2 today; 1 before the role tables gained their test columns); ``0`` for a folder written
  before manifests recorded it (its kind is then recognised by the manifest's keys);
* ``manifest``: ``run.json`` (``diff.json`` for a diff; ``state.json`` for a pruning
  study still in progress);
* ``tables``: name -> frame, one per table file, the name being the file's stem
  (``roles``, ``head_stats``, ``ablation``...): at the top of a roles or prune folder,
  under ``tables/`` for a report or a diff. Parquet is read where present (it keeps the
  dtypes), else the CSV of the same stem;
* ``files``: the other JSON files at the top, by name (``skipped.json``,
  ``examples.json``, ``state.json``).

The columns of the main tables are those of :mod:`headscope.analyses.frames`
(``ROLE_COLUMNS``, ``STAT_COLUMNS``, ``IMPACT_COLUMNS``); the README's "Reading a run
back" lists the tables of each kind.

Raises ``ValueError`` (one line naming the file) when the folder is not a headscope
output, or a table or JSON file cannot be read.

>>> import tempfile, pathlib, json, pandas as pd
>>> out = pathlib.Path(tempfile.mkdtemp())
>>> _ = (out / "run.json").write_text(json.dumps({"output": {"kind": "roles", "format": 1}}))
>>> pd.DataFrame({"layer": [0], "head": [1], "metric": ["entropy"], "value": [0.5], "n": [4]}).to_parquet(
...     out / "head_stats.parquet", index=False)
>>> run = load_run(out)
>>> run.kind, run.format, sorted(run.tables), run.tables["head_stats"].columns.tolist()
('roles', 1, ['head_stats'], ['layer', 'head', 'metric', 'value', 'n'])
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from headscope.probes.outputs.folder import KINDS, output_kind_of

#: where each kind keeps its tables: at the top of the folder or under ``tables/``
TABLE_DIRS = {"roles": "", "prune": "", "report": "tables", "diff": "tables", "patch": ""}
TABLE_SUFFIXES = (".parquet", ".csv")  # Parquet first: preferred over the CSV of the same stem


@dataclass(frozen=True)
class RunFolder:
    """One headscope output folder, read back (see :func:`load_run`)."""

    path: Path
    kind: str
    format: int
    manifest: dict
    tables: dict[str, pd.DataFrame]
    files: dict[str, Any]


def table_files(*folders: Path) -> dict[str, Path]:
    """Stem -> table file in ``folders`` (the first folder holding a stem wins; in one
    folder Parquet over CSV); hidden files (a killed write's leftovers) are skipped."""
    found: dict[str, Path] = {}
    for d in folders:
        if not d.is_dir():
            continue
        here: dict[str, Path] = {}
        for p in sorted(d.iterdir()):
            if p.suffix in TABLE_SUFFIXES and not p.name.startswith(".") and p.is_file():
                if p.stem not in here or p.suffix == ".parquet":
                    here[p.stem] = p
        for stem, p in here.items():
            found.setdefault(stem, p)
    return dict(sorted(found.items()))


def read_frame(p: Path, what: str = "a table", expected: str = "CSV or Parquet") -> pd.DataFrame:
    """Read a CSV or Parquet file (Parquet by its suffix or its first bytes); any failure
    becomes one ``ValueError`` naming the file: ``{p}: not {what} ({why}); expected {expected}``."""
    fail = f"{p}: not {what}"
    try:
        with p.open("rb") as f:
            parquet = p.suffix == ".parquet" or f.read(4) == b"PAR1"
    except FileNotFoundError:
        raise ValueError(f"{p}: no such file; expected {what}: {expected}") from None
    except OSError as err:
        raise ValueError(f"{fail} (cannot be read: {err.strerror}); expected {expected}") from None
    try:
        if parquet:
            return pd.read_parquet(p)
        return pd.read_csv(p, keep_default_na=False, na_values=[""], encoding="utf-8")
    except UnicodeDecodeError as err:
        why = f"byte 0x{err.object[err.start : err.start + 1].hex()} at offset {err.start} is not UTF-8 text"
    except pd.errors.EmptyDataError:
        why = "the file holds no header line"
    except Exception as err:  # noqa: BLE001 - pyarrow and the CSV parser raise many kinds; all mean "not a table"
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        why = f"cannot be read as {'Parquet' if parquet else 'CSV'}: {first}"
    raise ValueError(f"{fail} ({why}); expected {expected}") from None


_WHAT = {"roles": "a roles table"}  # how an unreadable table is named in the error (else "a table")


def read_tables(paths: dict[str, Path]) -> dict[str, pd.DataFrame]:
    """Name -> frame for each ``paths`` entry (from :func:`table_files`), by :func:`read_frame`."""
    return {stem: read_frame(p, _WHAT.get(stem, "a table")) for stem, p in paths.items()}


def read_json(p: Path) -> Any:
    """A JSON file's content; ``ValueError`` naming the file when it is not JSON."""
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{p}: cannot be read ({err.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"{p}: not valid JSON ({(str(err).splitlines() or ['nested too deeply'])[0][:120]})") from None


def _manifest_path(folder: Path, kind: str) -> Path:
    """run.json when present (a complete pruning study has one), else the kind's manifest."""
    for name in ("run.json", *KINDS[kind].manifests):
        if name in KINDS[kind].entries and (folder / name).is_file():
            return folder / name
    raise ValueError(f"{folder}: no manifest ({' or '.join(KINDS[kind].manifests)})")  # unreachable after the check


def load_run(path) -> RunFolder:
    """Read every table, the manifest and the other JSON files of a headscope output folder.

    Returns a :class:`RunFolder` (see the module docstring for the schema). Raises
    ``ValueError`` (one line) when ``path`` is not a headscope roles, report, prune or diff
    folder, or when one of its tables or JSON files cannot be read (naming the file)."""
    folder = Path(path)
    kind = output_kind_of(folder) if folder.is_dir() else None
    if kind is None:
        why = "no such folder" if not folder.exists() else "not a folder" if not folder.is_dir() else "no manifest"
        raise ValueError(
            f"{folder}: not a headscope output ({why}); expected a folder written by headscope "
            "roles, report, prune, patch or diff (run.json, diff.json or state.json naming its kind)"
        )
    manifest_path = _manifest_path(folder, kind)
    manifest = read_json(manifest_path)
    declared = manifest.get("output") if isinstance(manifest, dict) else None
    fmt = declared.get("format", 0) if isinstance(declared, dict) else 0
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        raise ValueError(f"{manifest_path}: output.format must be an integer; got {json.dumps(fmt)[:60]}")
    sub = TABLE_DIRS[kind]
    tables = read_tables(table_files(folder / sub if sub else folder))
    files = {
        p.name: read_json(p)
        for p in sorted(folder.glob("*.json"))
        if p != manifest_path and not p.name.startswith(".") and p.is_file()
    }
    return RunFolder(path=folder, kind=kind, format=fmt, manifest=manifest, tables=tables, files=files)
