"""``headscope sweep``: families checked before anything runs, one row per family whatever happens to
it, ``--update`` keeping the other rows, a folder's files that are not a sweep's left alone."""

from __future__ import annotations

import pytest

from headscope.reports.cli.app import main
from headscope.reports.tools.sweep.run import COLUMNS, read_sweep
from headscope.reports.tools.sweep.table import BEGIN, END, render


def test_an_unknown_family_is_refused_in_one_line(capsys, tmp_path):
    assert main(["sweep", "--families", "gpt2,no_such_family", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and "'no_such_family' is not a model type of this transformers' registry" in err[0]
    assert not (tmp_path / "s").exists()


@pytest.mark.slow  # every stage on gpt2: ~10 s of CPU, ~60 s on the loaded 2-core machine
def test_a_sweep_writes_a_row_per_family_and_update_keeps_the_others(capsys, tmp_path):
    out = tmp_path / "s"
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{BEGIN}\nold\n{END}\n\nafter\n", encoding="utf-8")
    assert main(["sweep", "--families", "gpt2,vit", "--out", str(out), "--page", str(readme), "--quiet"]) == 0
    rows = {r["family"]: r for r in read_sweep(out / "sweep.csv")}
    assert set(rows) == {"gpt2", "vit"}
    assert rows["vit"]["built"].startswith("skipped: not a text model") and rows["vit"]["card"] == ""
    assert rows["gpt2"]["built"] == "ok" and rows["gpt2"]["backend"] == "inhouse"
    assert all(rows["gpt2"][s] == "ok" for s in ("card", "capture", "roles", "prune", "report")), rows["gpt2"]
    assert (out / "sweep.md").read_text(encoding="utf-8") == render(list(rows.values()))
    assert readme.read_text(encoding="utf-8") == f"# x\n\n{BEGIN}\n{render(list(rows.values()))}{END}\n\nafter\n"
    assert main(["sweep", "--families", "vit,clip", "--out", str(out), "--update", "--quiet"]) == 0
    assert [r["family"] for r in read_sweep(out / "sweep.csv")] == ["clip", "gpt2", "vit"]


def test_a_file_in_out_that_is_not_a_sweeps_is_left_alone(capsys, tmp_path):
    (tmp_path / "sweep.csv").write_text("my,own\n1,2\n", encoding="utf-8")
    assert main(["sweep", "--families", "vit", "--out", str(tmp_path)]) == 2
    assert "sweep.csv is there and is not a headscope sweep's" in capsys.readouterr().err
    assert (tmp_path / "sweep.csv").read_text(encoding="utf-8") == "my,own\n1,2\n"
    assert COLUMNS[0] == "family"


def test_render_rewrites_the_table_from_a_committed_sweep_without_running(capsys, tmp_path):
    """``--render``: sweep.md and the page from DIR/sweep.csv (and the committed weights study), nothing run;
    without a sweep.csv, one line and exit 2."""
    import shutil
    from pathlib import Path

    committed = Path(__file__).resolve().parents[4] / "data" / "sweep" / "sweep.csv"
    out = tmp_path / "s"
    out.mkdir()
    shutil.copy(committed, out / "sweep.csv")
    page = tmp_path / "models.md"
    page.write_text(f"# x\n\n{BEGIN}\nold\n{END}\n", encoding="utf-8")
    assert main(["sweep", "--render", "--out", str(out), "--page", str(page)]) == 0
    expected = render(read_sweep(out / "sweep.csv"))
    assert (out / "sweep.md").read_text(encoding="utf-8") == expected and expected in page.read_text(encoding="utf-8")
    assert "per-head weights (hf, checked)" in expected
    capsys.readouterr()
    assert main(["sweep", "--render", "--out", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sweep.csv not found" in err[0]
