"""``headscope bench MODEL --report``: where a default report's time goes, stage by stage (#25 part 6)."""

from __future__ import annotations

import json

from tiny_models import tiny_model_dir

from headscope.reports.cli.app import main
from headscope.reports.tools.bench.stage_clock import StageClock


def test_bench_report_times_every_stage_of_the_default_report(tmp_path, capsys):
    """A tiny decoder's default report run through the bench: one row per stage in the order they
    ran (card, load, the role stages, pruning with its parts named, patching, figures, write), each
    with wall and CPU seconds, and the memory the plan estimated against the peak reached."""
    model = tiny_model_dir(tmp_path, "llama")
    assert main(["bench", str(model), "--report", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stages = [r["stage"] for r in out["stages"] if not r["part"]]
    assert stages[:2] == ["card", "load"] and stages[-2:] == ["figures", "write"]
    assert {"text", "pruning", "patching"} <= set(stages)
    parts = [r["part"] for r in out["stages"] if r["stage"] == "pruning" and r["part"]]
    assert parts[:4] == ["baseline", "ablation:zero", "importance", "role ablation"], parts
    assert all(r["seconds"] >= 0 and r["cpu_seconds"] >= 0 for r in out["stages"])
    whole = sum(r["seconds"] for r in out["stages"] if not r["part"])
    assert whole <= out["seconds"] + 0.5  # the stages are inside the run's wall time
    assert out["memory"]["estimate_bytes"] > 0 and out["memory"]["peak_rss_bytes"] > 0
    assert out["quick"]["leaves_out"].startswith("pruning: mean ablation; all-but-one")


def test_stage_clock_keeps_parts_and_says_each_as_it_ends():
    """Parts of a stage with few of them are timed one by one and named; a stage that counts items
    keeps its item count; a stage that never ended is listed as unfinished."""
    ticks = iter(range(100))
    lines = []
    clock = StageClock(clock=lambda: float(next(ticks)), cpu=lambda: 0.0, rss=lambda: 1.0, emit=lines.append)
    clock.part_names["pruning"] = ["baseline", "importance"]  # only the stages named here keep parts
    clock("pruning", 0, 2)
    clock("pruning", 1, 2)
    clock("pruning", 2, 2)
    clock("text", 0, 300)
    clock("text", 300, 300)
    clock("induction", 0, 2)
    clock("induction", 1, 2)
    clock("induction", 2, 2)
    clock("patching", 0, None)
    frame = clock.frame()
    assert frame[["stage", "part", "seconds"]].values.tolist() == [
        ["pruning", "", 2.0],
        ["pruning", "baseline", 1.0],
        ["pruning", "importance", 1.0],
        ["text", "", 1.0],
        ["induction", "", 2.0],
    ]
    assert frame.loc[frame.stage == "text", "items"].iloc[0] == 300
    assert lines == ["pruning part 1/2 (baseline): 1.0 s, 0.0 CPU s", "pruning part 2/2 (importance): 1.0 s, 0.0 CPU s"]
    assert clock.unfinished() == ["patching"]
