"""Read a headscope output folder back: every table as a frame, its manifest, its JSON files.

:func:`load_run` takes the folder written by ``headscope roles``, ``report``, ``prune``
or ``diff`` and returns a :class:`RunFolder`:

* ``kind``: ``"roles"``, ``"report"``, ``"prune"`` or ``"diff"``
  (:data:`~headscope.probes.outputs.kinds.KINDS`), read from the manifest;
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
(``ROLE_COLUMNS``, ``STAT_COLUMNS``, ``IMPACT_COLUMNS``); the docs' "Reading a run back"
(docs/guide/reading-runs.md) lists the tables of each kind. Each table headscope writes is checked against its
schema (:data:`TABLES`, :func:`check_schema`): every column present (a roles table of
format 1 or 0 holds fewer), and each column's cells of its type: integers, numbers (NaN
where none), True/False, text. Numbers stored as text in a Parquet file are refused, not
converted; a CSV cell is a number when it reads as one.

Raises ``ValueError`` (one line naming the file) when the folder is not a headscope
output, a table or JSON file cannot be read, or a table does not hold its schema (naming
the column and what it must hold, e.g. ``roles.parquet: column 'score' must hold numbers
(empty where there is none); got the text '0.5' in row 1``).

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

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from headscope.probes.outputs.kinds import KINDS, output_kind_of

#: where each kind keeps its tables: at the top of the folder or under ``tables/``
TABLE_DIRS = {"roles": "", "prune": "", "report": "tables", "diff": "tables", "patch": "", "qk": ""}
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
        df = pd.read_parquet(p) if parquet else pd.read_csv(p, keep_default_na=False, na_values=[""], encoding="utf-8")
        df.attrs["source"] = "parquet" if parquet else "csv"  # typed cells, or text that reads as numbers
        return df
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


# ------------------------------------------------------------------ the tables' schema
INT, INT_OR_EMPTY, NUMBER, BOOL, BOOL_OR_EMPTY, TEXT = "int", "int?", "number", "bool", "bool?", "text"
#: what a column of each type holds, as the errors say it
RULES = {
    INT: "integers",
    INT_OR_EMPTY: "integers or empty cells",
    NUMBER: "numbers (empty where there is none)",
    BOOL: "True or False",
    BOOL_OR_EMPTY: "True, False or empty cells",
    TEXT: "text",
}
#: a stage's declared pandas dtype -> the type of its column (every other dtype: TEXT)
DTYPE_TYPES = {
    **dict.fromkeys(["int64", "int32", "int16", "int8"], INT),
    **dict.fromkeys(["Int64", "Int32", "Int16", "Int8"], INT_OR_EMPTY),
    **dict.fromkeys(["float64", "float32", "Float64"], NUMBER),
    "bool": BOOL,
    "boolean": BOOL_OR_EMPTY,
}
#: the type of every column headscope writes (by name; a table may override, see TableSchema)
COLUMN_TYPES = {
    **dict.fromkeys(["layer", "head", "n", "cluster", "n_roles", "k", "n_draws", "count"], INT),
    **dict.fromkeys(["n_pairs", "both_right", "one_right", "none_right", "query_index", "key_index"], INT),
    **dict.fromkeys(["verdicts_a", "verdicts_b"], INT),
    **dict.fromkeys(["step", "seed", "position", "n_a", "n_b"], INT_OR_EMPTY),
    **dict.fromkeys(["score", "baseline", "margin", "ci_low", "ci_high", "p_value", "p_raw", "value"], NUMBER),
    **dict.fromkeys(["x", "y", "pair_accuracy", "fraction_pruned", "spread", "tolerance", "base_value"], NUMBER),
    **dict.fromkeys(["query_heads_pruned", "kv_heads_pruned", "value_role", "value_random_mean"], NUMBER),
    **dict.fromkeys(["value_random_std", "effect", "weight", "score_a", "score_b", "delta"], NUMBER),
    **dict.fromkeys(["value_a", "value_b", "max_abs_delta"], NUMBER),
    **dict.fromkeys(["verdict", "meets_threshold", "significant", "gold", "verdict_a", "verdict_b"], BOOL),
    **dict.fromkeys(["same_set", "same_order"], BOOL),
}  # every other column is TEXT


@dataclass(frozen=True)
class TableSchema:
    """One table's documented columns: ``columns`` in order (all required), ``optional``
    ones that may follow; ``types`` overrides :data:`COLUMN_TYPES` for this table."""

    what: str
    columns: tuple[str, ...]
    optional: tuple[str, ...] = ()
    types: tuple[tuple[str, str], ...] = ()

    def type_of(self, column: str) -> str:
        return dict(self.types).get(column) or COLUMN_TYPES.get(column, TEXT)


def _schemas() -> dict[str, TableSchema]:
    """The schema of each table, by a name :data:`TABLES` uses. ROLE, STAT and IMPACT
    columns come from :mod:`headscope.analyses.frames`; the others repeat the lists of the
    modules that write them (importing those would load torch and matplotlib to read a
    folder), and tests/reports/test_results_wave3.py checks that the two agree."""
    from headscope.analyses.frames import IMPACT_COLUMNS, ROLE_COLUMNS, STAT_COLUMNS

    impact = (("layer", INT_OR_EMPTY), ("head", INT_OR_EMPTY), ("n", INT_OR_EMPTY))
    role_ablation = ("role", "k", "metric", "value_role", "value_random_mean", "value_random_std", "n_draws")
    return {
        "roles": TableSchema("a roles table", tuple(ROLE_COLUMNS)),
        "stats": TableSchema("a head statistics table", tuple(STAT_COLUMNS)),
        "impact": TableSchema("a pruning table", tuple(IMPACT_COLUMNS), types=impact),
        "clusters": TableSchema("a clusters table", ("layer", "head", "x", "y", "cluster")),
        "roles_by_head": TableSchema("a roles-by-head table", ("layer", "head", "n_roles", "roles")),
        "coref_pairs": TableSchema(
            "a coreference pairs table",
            ("layer", "head", "kind", "n_pairs", "both_right", "one_right", "none_right", "pair_accuracy"),
        ),
        "role_ablation": TableSchema("a role ablation table", role_ablation),
        "prunable": TableSchema(
            "a prunable-fraction table",
            ("order", "tolerance", "fraction_pruned", "query_heads_pruned", "kv_heads_pruned", "value", "base_value"),
        ),
        "patch": TableSchema(
            "a patching table",
            ("layer", "head", "method", "effect", "ci_low", "ci_high", "p_value", "significant", "n"),
            optional=("p_raw", "unit", "position", "receiver"),
        ),
        "examples": TableSchema(
            "an examples table",
            ("example", "role", "relation", "direction", "layer", "head", "level", "sentence")
            + ("query_index", "key_index", "query_word", "key_word", "weight", "gold"),
        ),
        "skipped": TableSchema("a skipped-items table", ("analysis", "reason", "count")),
        "role_changes": TableSchema(
            "a role changes table",
            ("layer", "head", "role", "relation", "direction", "score_a", "score_b", "delta")
            + ("verdict_a", "verdict_b", "change"),
        ),
        "importance_changes": TableSchema(
            "an importance changes table", ("study", "layer", "head", "metric", "value_a", "value_b", "delta")
        ),
        "top_heads": TableSchema(
            "a top heads table",
            ("role", "relation", "direction", "top_a", "top_b", "same_set", "same_order", "max_abs_delta")
            + ("verdicts_a", "verdicts_b", "n_a", "n_b"),
        ),
        **{f"stage:{name}": schema for name, schema in stage_schemas().items()},
    }


@functools.cache
def stage_schemas() -> dict[str, TableSchema]:
    """Each report stage's frame -> its schema, from ``data/schemas/report_tables.json``: the
    columns and dtypes the stage declares (written from the registry by ``make schemas``; read
    here so that reading a folder imports no stage)."""
    from headscope.data import path as data_path

    tables = json.loads(data_path("schemas/report_tables.json").read_text(encoding="utf-8"))["tables"]
    return {
        name: TableSchema(
            f"a {name} table (the {t['stage']} stage)",
            tuple(t["columns"]),
            types=tuple((c, DTYPE_TYPES.get(d, TEXT)) for c, d in t["columns"].items()),
        )
        for name, t in tables.items()
    }


_IMPACT_STEMS = ("baseline", "ablation", "all_but_one", "importance", "curves", "curve_summary")
#: kind -> table stem -> schema name (in :func:`_schemas`); a stem not listed is read unchecked
TABLES = {
    "roles": {
        "roles": "roles",
        "head_stats": "stats",
        "clusters": "clusters",
        "roles_by_head": "roles_by_head",
        "coref_pairs": "coref_pairs",
    },
    "prune": {**dict.fromkeys(_IMPACT_STEMS, "impact"), "prunable": "prunable", "roles": "role_ablation"},
    "patch": {"patch": "patch"},
    "report": {
        "roles": "roles",
        "stats": "stats",
        "examples": "examples",
        "clusters": "clusters",
        "coref_pairs": "coref_pairs",
        "skipped": "skipped",
        "roles_vs_importance": "role_ablation",
        "patching": "patch",
        "prune_prunable": "prunable",
        **{f"prune_{stem}": "impact" for stem in _IMPACT_STEMS},
        # every other frame a registered stage writes: its declared columns (stage_schemas)
    },
    "diff": {name: name for name in ("role_changes", "importance_changes", "top_heads")},
}
#: a roles table of an older output format holds fewer columns (format 2 added p_raw ... meets_threshold)
LEGACY_ROLE_COLUMNS = {
    1: 13,
    0: 5,
}  # format -> how many of ROLE_COLUMNS it must hold (0: layer, head, role, score, verdict)


def schema_of(kind: str, stem: str, fmt: int = 2) -> TableSchema | None:
    """The schema ``load_run`` checks table ``stem`` of a ``kind`` folder of output format
    ``fmt`` against (None: a table it does not know, read as it is)."""
    name = TABLES.get(kind, {}).get(stem)
    if name is None and kind == "report" and stem in stage_schemas():
        name = f"stage:{stem}"
    if name is None:
        return None
    schema = _schemas()[name]
    if name == "roles" and fmt < 2:
        keep = schema.columns[:13] if fmt == 1 else ("layer", "head", "role", "score", "verdict")
        return TableSchema(schema.what, keep, optional=tuple(c for c in schema.columns if c not in keep))
    return schema


def _empty(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _cell(v) -> str:
    """A cell for an error message."""
    if isinstance(v, np.generic):
        v = v.item()
    return "an empty cell" if _empty(v) else repr(v)[:60]


def _first_row(mask) -> int:
    return int(np.argmax(np.asarray(mask, dtype=bool))) + 1  # row 1: the first after the header


def _as_numbers(s: pd.Series, csv: bool) -> tuple[pd.Series | None, str | None]:
    """``s`` as numbers (float64 or int64), or ``(None, why)``: ``why`` names the first
    cell that is not a number. A CSV cell is text that reads as a number or not; a Parquet
    column is typed, and a text or bool column is refused whatever its text says."""
    if pd.api.types.is_bool_dtype(s):
        return None, f"True/False cells ({_cell(s.iloc[0])} in row 1)"
    if pd.api.types.is_numeric_dtype(s):
        return s, None
    values = s.to_numpy(dtype=object)
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        if _empty(v):
            continue
        if isinstance(v, (bool, np.bool_)):
            return None, f"{_cell(v)} in row {i + 1}"
        if isinstance(v, (int, float, np.integer, np.floating)):
            out[i] = float(v)
            continue
        if isinstance(v, str) and csv:
            try:
                out[i] = float(v)
                continue
            except ValueError:
                pass
        what = f"the text {_cell(v)}" if isinstance(v, str) and not csv else _cell(v)
        return None, f"{what} in row {i + 1}"
    return pd.Series(out, index=s.index, name=s.name), None


def check_schema(df: pd.DataFrame, path, schema: TableSchema) -> pd.DataFrame:
    """Check ``df`` (read from ``path`` by :func:`read_frame`) against ``schema``: every
    required column present, and each known column's cells of its type. Returns ``df``
    (a CSV column of text that all reads as numbers, such as ``NaN``, becomes numbers).

    Raises ``ValueError`` in one line naming the file, the column and what was expected:
    ``roles.parquet: column 'score' must hold numbers (empty where there is none); got the
    text '0.5' in row 1``. Numbers stored as text in a Parquet file are refused, not read
    as numbers; in a CSV file every cell is text, and a cell is a number when it reads as
    one."""
    p = Path(path)
    missing = [c for c in schema.columns if c not in df.columns]
    if missing:
        raise ValueError(
            f"{p}: not {schema.what} (missing column {missing[0]!r}); expected columns {', '.join(schema.columns)}"
        )
    csv = df.attrs.get("source") != "parquet"
    out = df
    for c in (*schema.columns, *(c for c in schema.optional if c in df.columns)):
        s, kind = df[c], schema.type_of(c)
        if kind == TEXT or len(s) == 0 or (kind not in (BOOL, INT) and s.isna().all()):
            if kind == TEXT and not csv and len(s):
                other = [i for i, v in enumerate(s.to_numpy(dtype=object)) if not (_empty(v) or isinstance(v, str))]
                if other:
                    raise ValueError(
                        f"{p}: column {c!r} must hold {RULES[TEXT]}; got {_cell(s.iloc[other[0]])} in row {other[0] + 1}"
                    )
            continue
        fail = f"{p}: column {c!r} must hold {RULES[kind]}; got"
        if kind in (BOOL, BOOL_OR_EMPTY):
            if pd.api.types.is_bool_dtype(s) and (kind == BOOL_OR_EMPTY or not s.isna().any()):
                continue
            flags = []
            for i, v in enumerate(s.to_numpy(dtype=object)):
                if isinstance(v, (bool, np.bool_)):
                    flags.append(bool(v))
                elif csv and isinstance(v, str) and v.strip().lower() in ("true", "false"):
                    flags.append(v.strip().lower() == "true")
                elif kind == BOOL_OR_EMPTY and (_empty(v) or (csv and isinstance(v, str) and not v.strip())):
                    flags.append(None)
                else:
                    raise ValueError(f"{fail} {_cell(v)} in row {i + 1}")
            out = out if out is not df else df.copy()
            out[c] = pd.array(flags, dtype="boolean") if kind == BOOL_OR_EMPTY else np.array(flags, dtype=bool)
            continue
        values, why = _as_numbers(s, csv)
        if why is not None:
            raise ValueError(f"{fail} {why}")
        x = values.to_numpy(dtype="float64", na_value=np.nan)
        if kind in (INT, INT_OR_EMPTY):
            empty = np.isnan(x)
            wrong = ~empty & ((x != np.floor(x)) | np.isinf(x))
            if kind == INT:
                wrong |= empty
            if wrong.any():
                raise ValueError(f"{fail} {_cell(s.iloc[_first_row(wrong) - 1])} in row {_first_row(wrong)}")
        if values is not s:
            out = out if out is not df else df.copy()
            out[c] = values
    return out


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
    ``ValueError`` (one line) when ``path`` is not a headscope roles, report, prune, patch
    or diff folder, when one of its tables or JSON files cannot be read (naming the file),
    or when a table lacks a column or holds cells of the wrong type (:func:`check_schema`)."""
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
    paths = table_files(folder / sub if sub else folder)
    tables = {}
    for stem, frame in read_tables(paths).items():
        schema = schema_of(kind, stem, fmt)
        tables[stem] = frame if schema is None else check_schema(frame, paths[stem], schema)
    files = {
        p.name: read_json(p)
        for p in sorted(folder.glob("*.json"))
        if p != manifest_path and not p.name.startswith(".") and p.is_file()
    }
    return RunFolder(path=folder, kind=kind, format=fmt, manifest=manifest, tables=tables, files=files)
