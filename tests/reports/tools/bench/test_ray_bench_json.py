"""Issue #45's bench row, read from ``data/figures/ray_bench.json`` (written by ``make ray-bench``:
SmolLM2-135M's roles stage in one process, on one Ray worker and on two, one thread each): the
three rows ran, each Ray row's tables equal the single-process stage's, and both targets are met
(one worker within 1.15x of one process; two workers faster than one process). Never a timed
test: it reads what the bench measured."""

from __future__ import annotations

import json

from headscope.data import path

DOC = json.loads(path("figures/ray_bench.json").read_text(encoding="utf-8"))
ROWS = {r["path"]: r for r in DOC["paths"]}
TARGETS = {t["target"]: t for t in DOC["targets"] if t["value"] is not None}


def test_the_three_rows_ran_on_the_same_sentences():
    assert set(ROWS) == {"roles_stage", "roles_ray1", "roles_ray2"}
    assert all(r["status"] == "ok" and r["seconds"] > 0 for r in ROWS.values())
    for name in ("roles_ray1", "roles_ray2"):
        assert "tables equal to the single-process stage's: yes" in ROWS[name]["note"], ROWS[name]["note"]


def test_ray_overhead_and_speed_up_targets_are_met():
    one, two = TARGETS["Ray 1 worker / one process <= 1.15"], TARGETS["one process / Ray 2 workers > 1"]
    assert one["met"] and one["value"] <= 1.15, one
    assert two["met"] and two["value"] > 1.0, two
