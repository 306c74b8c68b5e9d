"""A whole report with ``--ray --workers 2`` writes the tables one process writes: MiniLM-L6 with
every stage on (stage_cases.py's small settings, the report's frames and columns in a fraction of
its time), once in this process on one torch thread (as each worker runs) and once through the
report's own pool of two one-thread workers in the session's cluster. Every table file equals the
other run's: the CSV byte for byte, the Parquet ``DataFrame.equals``. run.json records the same
statuses, the encoder's KV and circuits stages blocked with the same reason in both, and each
stage that shards ran in two parts."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("ray")

from stage_cases import small_config  # noqa: E402

#: the stages that shard (the rest of MiniLM's are blocked: an encoder has no KV cache nor next-token logits)
SHARDED = ("roles", "pruning", "patching", "weights", "context")


@pytest.mark.slow  # two small reports of every stage: 263 s on the shared 2-core machine
def test_the_report_on_two_ray_workers_writes_the_single_process_tables(minilm_pool, one_thread, tmp_path):
    from headscope.reports.pipeline import build_report
    from headscope.reports.stages.sharded import RayConfig

    minilm_pool.close()  # its 2 Ray CPUs to the report's pool (it starts again on its next use)
    one = build_report("minilm-l6", small_config(), out_dir=tmp_path / "one", quiet=True)
    two = build_report(
        "minilm-l6", small_config(ray=RayConfig(workers=2, threads=1)), out_dir=tmp_path / "ray", quiet=True
    )
    files = sorted(p.name for p in one.paths["tables"].iterdir())
    assert files == sorted(p.name for p in two.paths["tables"].iterdir()) and len(files) > 20
    for name in files:
        a, b = one.paths["tables"] / name, two.paths["tables"] / name
        if name.endswith(".csv"):
            assert a.read_bytes() == b.read_bytes(), name
        else:
            assert pd.read_parquet(b).equals(pd.read_parquet(a)), name
    run1, run2 = (json.loads(r.paths["run_json"].read_text()) for r in (one, two))
    status = {k: v["status"] for k, v in run1["stages"].items()}
    assert status == {k: v["status"] for k, v in run2["stages"].items()}
    assert status == dict.fromkeys(SHARDED, "ran") | {"kv": "blocked", "circuits": "blocked"}
    assert run1["absent"] == run2["absent"] and "an encoder" in run2["absent"]["kv"]
    assert {k: run2["stages"][k].get("shards") for k in SHARDED} == dict.fromkeys(SHARDED, 2)
    assert all("shards" not in v for v in run1["stages"].values())
