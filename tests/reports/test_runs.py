"""load_run: every table of a roles, report or prune folder back as frames, plus its manifest."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from pruning_cases import alternating, planted_copy_model
from test_report import _meta, minilm_card, synthetic_frames  # noqa: F401 - minilm_card is a fixture

from headscope.analyses.frames import ROLE_COLUMNS, STAT_COLUMNS
from headscope.data import path
from headscope.probes.outputs.atomic import write_frame
from headscope.probes.outputs.kinds import OUTPUT_FORMAT
from headscope.reports import load_run
from headscope.reports.cli.app import main


def test_roles_folder_reads_back_every_table_and_json_file(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(
        "".join(path("text/sentences.txt").read_text(encoding="utf-8").splitlines(keepends=True)[:12]),
        encoding="utf-8",
    )
    out = tmp_path / "roles"
    argv = ["roles", "minilm-l6", "--roles", "positional", "--text", str(text), "--out", str(out), "--quiet"]
    assert main(argv) == 0
    run = load_run(out)
    assert (run.kind, run.format, run.path) == ("roles", OUTPUT_FORMAT, out)
    assert set(run.tables) == {"roles", "head_stats", "clusters", "roles_by_head", "coref_pairs"}
    assert set(run.files) == {"skipped.json", "examples.json"}
    assert run.manifest == json.loads((out / "run.json").read_text())
    assert run.files["examples.json"] == json.loads((out / "examples.json").read_text())
    for name, df in run.tables.items():
        pd.testing.assert_frame_equal(df, pd.read_parquet(out / f"{name}.parquet"), check_exact=True, obj=name)
    assert run.tables["roles"].columns.tolist() == ROLE_COLUMNS
    assert run.tables["head_stats"].columns.tolist() == STAT_COLUMNS
    # Parquet is preferred; without it the CSV of the same stem is read
    (out / "head_stats.parquet").unlink()
    from_csv = load_run(out).tables["head_stats"]
    pd.testing.assert_frame_equal(from_csv, run.tables["head_stats"], check_dtype=False, obj="head_stats.csv")


def test_report_folder_reads_back_the_frames_written(tmp_path, minilm_card):  # noqa: F811 - the fixture
    from headscope.reports.pipeline import write_report

    card, text = minilm_card
    frames = synthetic_frames()
    out = tmp_path / "report"
    write_report(frames, card=card, card_text=text, meta=_meta(), out_dir=out)
    run = load_run(out)
    assert (run.kind, run.format, run.files) == ("report", OUTPUT_FORMAT, {})
    assert run.manifest["architecture"]["layers"] == 6
    assert sorted(run.tables) == sorted(frames) == run.manifest["tables"]
    for name, df in frames.items():
        # text columns come back as pandas' str dtype (roles_frame builds object columns)
        expected = df.astype({c: "str" for c in df.columns if df[c].dtype == object})
        pd.testing.assert_frame_equal(run.tables[name], expected, check_exact=True, obj=name)
    assert main(["diff", str(out), str(out), "--out", str(tmp_path / "d")]) == 0  # diff reads it too
    d = load_run(tmp_path / "d")
    assert (
        (d.kind, d.format) == ("diff", OUTPUT_FORMAT)
        and "role_changes" in d.tables
        and d.manifest["tables"] == sorted(d.tables)
    )


def test_prune_folder_in_progress_and_complete(tmp_path):
    from headscope.analyses.pruning.metrics import LMLoss
    from headscope.analyses.pruning.study import PruneConfig, pruning_study

    model = planted_copy_model()
    cfg = PruneConfig(metric="lm_loss", step=0.34, n_random_seeds=2, n_boot=20)
    metric = LMLoss(model, alternating(8, seed=2))
    out = tmp_path / "prune"
    first = pruning_study(model, cfg, out, metric=metric, step_limit=2)
    partial = load_run(out)
    assert not first.complete and (partial.kind, partial.format) == ("prune", OUTPUT_FORMAT)
    assert "done" in partial.manifest and partial.files == {}  # state.json is the manifest until run.json exists
    assert set(partial.tables) <= set(first.frames) | {"curves"}
    done = pruning_study(model, cfg, out, metric=metric)
    run = load_run(out)
    assert done.complete and run.manifest == json.loads((out / "run.json").read_text())
    assert set(run.files) == {"state.json"}
    assert (
        set(run.tables)
        == set(done.frames)
        == {
            "baseline",
            "ablation",
            "all_but_one",
            "importance",
            "curves",
            "curve_summary",
            "prunable",
        }
    )
    for name, df in done.frames.items():
        pd.testing.assert_frame_equal(run.tables[name], df, check_exact=True, obj=name)
    # diff reads the folder through load_run; a pruning study's "roles" table (its role
    # ablation, ROLE_ABLATION_COLUMNS) is not taken for a table of role verdicts
    ablation = {"role": ["r"], "k": [1], "metric": ["lm_loss"], "value_role": [0.1], "value_random_mean": [0.2]}
    write_frame(pd.DataFrame({**ablation, "value_random_std": [0.01], "n_draws": [20]}), out / "roles")
    assert main(["diff", str(out), str(out), "--out", str(tmp_path / "d")]) == 0


def test_legacy_folder_has_format_0(tmp_path):
    # a roles run.json written before manifests recorded {"output": {"kind", "format"}}
    (tmp_path / "run.json").write_text(json.dumps({"roles": ["positional"], "config": {}, "n_items": {}, "model": "m"}))
    pd.DataFrame({"layer": [0], "head": [1], "metric": ["entropy"], "value": [0.5], "n": [3]}).to_csv(
        tmp_path / "head_stats.csv", index=False
    )
    run = load_run(tmp_path)
    assert (run.kind, run.format, list(run.tables)) == ("roles", 0, ["head_stats"])
    pd.testing.assert_frame_equal(
        run.tables["head_stats"],
        pd.DataFrame({"layer": [0], "head": [1], "metric": ["entropy"], "value": [0.5], "n": [3]}),
    )


def test_a_folder_that_is_not_a_headscope_output_is_refused_in_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "roles.csv").write_text("layer,head\n0,0\n")
    for folder, why in [(tmp_path, "no manifest"), (tmp_path / "none", "no such folder")]:
        with pytest.raises(ValueError, match=f"not a headscope output \\({why}\\); expected a folder written by") as e:
            load_run(folder)
        assert "\n" not in str(e.value)


def test_unreadable_table_or_json_names_the_file(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"output": {"kind": "roles", "format": 1}}))
    (tmp_path / "roles.parquet").write_bytes(b"PAR1 not really parquet")
    with pytest.raises(ValueError, match=r"roles\.parquet: not a roles table \(cannot be read as Parquet"):
        load_run(tmp_path)
    (tmp_path / "roles.parquet").unlink()
    (tmp_path / "skipped.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"skipped\.json: not valid JSON \(Expecting property name"):
        load_run(tmp_path)
