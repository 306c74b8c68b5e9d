"""load_run checks every table a registered report stage writes, from the committed
data/schemas/report_tables.json, which must say what the registry says."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from headscope.reports.runs import load_run, schema_of


def test_the_committed_table_file_is_the_registrys():
    from headscope.data import path as data_path
    from headscope.reports.stages.registry import STAGES
    from headscope.reports.tools.stage_tables import tables_json

    committed = data_path("schemas/report_tables.json").read_text(encoding="utf-8")
    assert committed == tables_json(), "a stage's schemas changed: run make schemas and commit the file"
    frames = {f for s in STAGES.values() for f in s.schemas}
    assert frames == set(json.loads(committed)["tables"]) and len(frames) >= 25
    assert all(schema_of("report", f) is not None for f in frames)  # none is read unchecked


def _report(tmp_path, name: str, frame: pd.DataFrame):
    out = tmp_path / "report"
    (out / "tables").mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"output": {"kind": "report", "format": 2}}))
    frame.to_csv(out / "tables" / f"{name}.csv", index=False)
    return out


def _row(stage: str, frame: str) -> dict:
    """One valid row of a stage's frame, a value of each column's dtype."""
    from headscope.reports.stages.registry import STAGES

    def value(dtype: str):
        d = dtype.lower()
        return 1 if d.startswith("int") else 0.5 if d.startswith("float") else True if d.startswith("bool") else "x"

    return {c: value(t) for c, t in STAGES[stage].schemas[frame].items()}


def _weights_heads(**change) -> pd.DataFrame:
    return pd.DataFrame([{**_row("weights", "weights_heads"), **change}])


def test_a_weights_table_is_checked_against_its_stages_columns(tmp_path):
    run = load_run(_report(tmp_path, "weights_heads", _weights_heads()))
    assert run.tables["weights_heads"]["layer"].tolist() == [1]
    bad = _report(tmp_path / "bad", "weights_heads", _weights_heads(layer="first"))
    with pytest.raises(
        ValueError, match=r"weights_heads\.csv: column 'layer' must hold integers; got 'first' in row 1"
    ):
        load_run(bad)
    short = _report(tmp_path / "short", "weights_heads", _weights_heads().drop(columns=["value"]))
    with pytest.raises(ValueError, match=r"not a weights_heads table \(the weights stage\) \(missing column 'value'\)"):
        load_run(short)


def test_a_nullable_flag_takes_empty_cells_and_refuses_other_text(tmp_path):
    from headscope.reports.stages.registry import STAGES

    assert STAGES["kv"].schemas["long_context_roles"]["bos"] == "boolean"
    row = _row("kv", "long_context_roles")
    frame = pd.DataFrame([{**row, "bos": True}, {**row, "bos": None}])
    got = load_run(_report(tmp_path, "long_context_roles", frame)).tables["long_context_roles"]["bos"]
    assert str(got.dtype) == "boolean" and got.tolist()[0] is True and got.isna().tolist() == [False, True]
    bad = _report(tmp_path / "bad", "long_context_roles", frame.assign(bos=["True", "maybe"]))
    with pytest.raises(ValueError, match=r"column 'bos' must hold True, False or empty cells; got 'maybe' in row 2"):
        load_run(bad)
