"""Tables read from a user's folder, checked cell by cell before anything uses them.

:func:`read_table` reads a CSV or Parquet table and checks it: a file that is not CSV or
Parquet, a missing column, or a cell of the wrong type raises ``ValueError`` naming the
file, the row (1 = the first row after the header) and the value, e.g.
``roles.csv:row 2: layer must be an integer in [0, 1023]; got 'x'``. :func:`check_table`
runs the same checks on a frame already read; :func:`read_roles_table` /
:func:`check_roles_table` are those of a roles table (``headscope diff`` and ``prune
--roles`` read one).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from headscope.reports.runs import read_frame

ROLE_TABLE_COLUMNS = ["layer", "head", "role", "score", "verdict"]  # what a roles table needs (ROLE_COLUMNS has more)
MAX_INDEX = 1023  # largest layer or head index accepted in a table (real models have < 200)
_TRUE, _FALSE = {"true", "1", "1.0"}, {"false", "0", "0.0"}


def _numbers(s: pd.Series, text: bool = True) -> tuple[np.ndarray, int | None]:
    """``s`` as float64 (missing cells NaN) and the position of the first cell that is
    not a number (a bool, a word, a list...), or None. ``text``: the cells are text (a
    CSV file: "0.5" is a number); else they are typed (Parquet), and a string is not a
    number whatever it says."""
    if pd.api.types.is_bool_dtype(s):
        return np.full(len(s), np.nan), 0 if len(s) else None
    if pd.api.types.is_numeric_dtype(s):
        return s.to_numpy(dtype="float64", na_value=np.nan), None
    out = np.full(len(s), np.nan)
    for i, v in enumerate(s.to_numpy(dtype=object)):
        if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            continue
        if isinstance(v, (bool, np.bool_)):
            return out, i
        if isinstance(v, (int, float, np.integer, np.floating)):
            out[i] = float(v)
            continue
        if isinstance(v, str) and text:
            try:
                out[i] = float(v)
            except ValueError:
                return out, i
            continue
        return out, i
    return out, None


def _cell(v) -> str:
    """A cell for an error message: ``'x'`` for text, ``1.5`` for a number."""
    if isinstance(v, np.generic):
        v = v.item()
    return "an empty cell" if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else repr(v)[:60]


def _expected(columns) -> str:
    return f"CSV or Parquet with columns {', '.join(columns)}"


def read_table(
    path, *, what: str = "a table", columns=(), ints=(), ints_or_missing=(), floats=(), bools=(), labels=()
) -> pd.DataFrame:
    """Read a CSV or Parquet table and check it: every name in ``columns`` present;
    ``ints`` integers in [0, MAX_INDEX] in every row (``ints_or_missing`` may also be
    empty); ``floats`` numbers or empty; ``bools`` True/False (or 1/0); ``labels``
    non-empty. Returns the frame with those columns converted (``int64``; ``float64``
    for ``ints_or_missing`` and ``floats``; ``bool``; ``str``).

    Raises ``ValueError``: ``file: not a roles table (missing column 'layer'); expected
    ...`` or ``file:row N: layer must be an integer in [0, 1023]; got 'x'`` (row 1 is the
    first row after the header).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
    >>> _ = p.write_text("layer,score\\n0,0.5\\nx,0.1\\n")
    >>> try:
    ...     read_table(p, columns=["layer", "score"], ints=["layer"], floats=["score"])
    ... except ValueError as err:
    ...     print(str(err).replace(str(p), "t.csv"))
    t.csv:row 2: layer must be an integer in [0, 1023]; got 'x'
    """
    p = Path(path)
    return check_table(
        read_frame(p, what, _expected(columns)),
        p,
        what=what,
        columns=columns,
        ints=ints,
        ints_or_missing=ints_or_missing,
        floats=floats,
        bools=bools,
        labels=labels,
    )


def check_table(
    df: pd.DataFrame,
    path,
    *,
    what: str = "a table",
    columns=(),
    ints=(),
    ints_or_missing=(),
    floats=(),
    bools=(),
    labels=(),
) -> pd.DataFrame:
    """The checks and conversions of :func:`read_table` on a frame already read from
    ``path`` (named in the errors)."""
    p = Path(path)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{p}: not {what} (missing column {missing[0]!r}); expected {_expected(columns)}")
    text = df.attrs.get("source") != "parquet"  # a Parquet column is typed: "0.5" there is text, not a number
    df = df.copy()
    for c in (*ints, *ints_or_missing):
        values, bad = _numbers(df[c], text)
        rule = f"an integer in [0, {MAX_INDEX}]"
        if bad is None:
            wrong = ~np.isnan(values) & ((values != np.floor(values)) | (values < 0) | (values > MAX_INDEX))
            if c in ints:
                wrong |= np.isnan(values)
            bad = int(np.argmax(wrong)) if wrong.any() else None
        if bad is not None:
            raise ValueError(f"{p}:row {bad + 1}: {c} must be {rule}; got {_cell(df[c].iloc[bad])}")
        df[c] = values.astype("int64") if c in ints else values  # float64 keeps the empty cells as NaN
    for c in floats:
        values, bad = _numbers(df[c], text)
        if bad is None and np.isinf(values).any():
            bad = int(np.argmax(np.isinf(values)))
        if bad is not None:
            raise ValueError(f"{p}:row {bad + 1}: {c} must be a finite number (or empty); got {_cell(df[c].iloc[bad])}")
        df[c] = values
    for c in bools:
        s = df[c]
        if not pd.api.types.is_bool_dtype(s):
            flags = []
            for i, v in enumerate(s.to_numpy(dtype=object)):
                typed = (bool, int, float, np.bool_, np.integer, np.floating)
                word = str(v).strip().lower() if isinstance(v, typed) or (text and isinstance(v, str)) else ""
                if word not in _TRUE | _FALSE:
                    raise ValueError(f"{p}:row {i + 1}: {c} must be True or False; got {_cell(v)}")
                flags.append(word in _TRUE)
            df[c] = np.array(flags, dtype=bool)
    for c in labels:
        s = df[c]
        blank = s.isna() | (s.astype(str).str.strip() == "")
        if blank.any():
            raise ValueError(f"{p}:row {int(np.argmax(blank.to_numpy())) + 1}: {c} must not be empty")
        df[c] = s.astype(str)
    return df


def read_roles_table(path) -> pd.DataFrame:
    """A roles frame from CSV or Parquet (``roles.csv`` / ``roles.parquet`` of headscope
    roles or report), checked by :func:`read_table`; ``relation``/``direction`` become
    ``""`` where absent, ``n`` is an optional count."""
    return check_roles_table(read_frame(Path(path), "a roles table", _expected(ROLE_TABLE_COLUMNS)), path)


def check_roles_table(df: pd.DataFrame, path) -> pd.DataFrame:
    """The checks of :func:`read_roles_table` on a frame already read from ``path``."""
    df = check_table(
        df,
        path,
        what="a roles table",
        columns=ROLE_TABLE_COLUMNS,
        ints=["layer", "head"],
        floats=["score"],
        bools=["verdict"],
        labels=["role"],
    )
    for c in ("relation", "direction"):
        df[c] = df[c].fillna("").astype(str) if c in df else ""
    if "n" in df:
        values, bad = _numbers(df["n"], df.attrs.get("source") != "parquet")
        if bad is not None or (~np.isnan(values) & ((values < 0) | (values != np.floor(values)))).any():
            bad = (
                bad
                if bad is not None
                else int(np.argmax(~np.isnan(values) & ((values < 0) | (values != np.floor(values)))))
            )
            raise ValueError(
                f"{Path(path)}:row {bad + 1}: n must be a count (an integer >= 0) or empty; "
                f"got {_cell(df['n'].iloc[bad])}"
            )
        df["n"] = values
    return df
