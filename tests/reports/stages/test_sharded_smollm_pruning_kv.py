"""The pruning and KV-cache stages sharded on Ray workers for SmolLM2-135M (a GQA decoder: 30
layers, 9 query heads on 3 KV heads), as test_sharded_pruning_kv.py shards them for MiniLM (pruning)
and a tiny random Llama (KV): every table ``DataFrame.equals`` the single-process run, tolerance 0.
The workers are conftest.py's ``smollm_pool`` (two one-thread workers); the single-process runs use
the session's ``smollm`` on one torch thread, as the workers run (a float reduction may be cut
differently on more threads).

Pruning runs gradient importance, role ablation and curves (by importance, reverse importance and
at random, the iterative orders a round per step) on SmolLM2's decoder metric (the LM loss) by KV
groups (90 units: the GQA path MiniLM cannot take), on 2 items in 2 batches (one per worker),
curves to 20% in steps of 10%. Single-head ablation (zero and mean) is left to the MiniLM test: on
SmolLM2 its 270 masked forwards per item take over a minute a run, and its round is the same
score round the curves and the role ablation send. The KV stage runs the report's
study (by layers) at 64 tokens, the long-context roles on 2 needle items and their causal check on 2."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

pytest.importorskip("ray")

from headscope.analyses.kvcache.stage import KVStageConfig  # noqa: E402
from headscope.analyses.pruning.study import PruneConfig  # noqa: E402
from headscope.reports.stages.base import RunContext  # noqa: E402
from headscope.reports.stages.registry import STAGES  # noqa: E402
from headscope.reports.stages.sharded import Interleaved  # noqa: E402

PRUNE = PruneConfig(
    n_items=2,
    batch_size=1,
    unit="kv_group",
    orders=("importance", "reverse_importance", "random"),
    studies=("importance", "curves"),
    max_fraction=0.2,
    n_random_seeds=1,
    role_draws=2,
    n_boot=50,
)
#: a roles frame (input of the role ablation): two roles, their heads by score
ROLES = pd.DataFrame(
    {
        "layer": [0, 0, 10, 29, 5],
        "head": [1, 4, 2, 7, 8],
        "role": ["positional", "positional", "special", "special", "special"],
        "score": [0.9, 0.8, 0.7, 0.95, 0.6],
        "verdict": [True, True, True, True, False],
    }
)
#: the study at 64 tokens, the long-context roles on 2 needle items, their causal check on 2
KV = KVStageConfig(tokens=64, role_items=2, role_tokens=64, causal_items=2)


def _assert_tables_equal(sharded, whole):
    assert set(sharded.frames) == set(whole.frames)
    for name, frame in whole.frames.items():  # exact: each value from the same batches' forwards
        assert sharded.frames[name].equals(frame), name


def test_pruning_sharded_by_items_equals_the_single_process_run(smollm_pool, smollm, one_thread):
    ctx, stage = RunContext(name="smollm2-135m", model=smollm, frames={"roles": ROLES}), STAGES["pruning"]
    whole = stage.run(ctx, PRUNE)
    parts = stage.split(ctx, PRUNE, smollm_pool.workers)
    assert parts == [Interleaved(0, 2), Interleaved(1, 2)]
    sharded = smollm_pool.run(replace(ctx, shards=smollm_pool), stage, PRUNE, parts)
    _assert_tables_equal(sharded, whole)
    assert dict(sharded.summary) == dict(whole.summary)
    f = sharded.frames
    assert len(f["prune_importance"]) == 90  # 30 layers x 3 KV groups
    assert set(f["prune_curves"].study) == {"curve:importance", "curve:reverse_importance", "curve:random"}
    assert f["prune_curves"].step.max() == 2 and len(f["roles_vs_importance"]) == 2
    assert f["prune_baseline"].value.iloc[0] > 0  # SmolLM2's LM loss on the items


@pytest.mark.slow  # ~20 CPU s in one process and as much over the workers; 80 s on the shared machine
def test_kv_sharded_by_kv_groups_equals_the_single_process_run(smollm_pool, smollm, one_thread):
    ctx, stage = RunContext(name="smollm2-135m", model=smollm), STAGES["kv"]
    whole = stage.run(ctx, KV)
    parts = stage.split(ctx, KV, smollm_pool.workers)
    assert parts == [Interleaved(0, 2), Interleaved(1, 2)]
    sharded = smollm_pool.run(replace(ctx, shards=smollm_pool), stage, KV, parts)
    assert set(whole.frames) >= {"kv_study", "long_context_roles", "long_context_causal"}
    _assert_tables_equal(sharded, whole)
    a, b = dict(sharded.summary), dict(whole.summary)
    for key in ("full", "greedy_order", "evaluations", "forwards", "layers_run", "groups", "savings_at_tolerance"):
        assert a[key] == b[key], key
    study = sharded.frames["kv_study"]
    # the report's unit: layers (30), each restricting its 3 KV groups
    assert (a["units"], a["groups"]) == (30, 90) and set(study.study) >= {"single", "greedy"}
    assert len(study[study.study == "single"]) == a["units"] * 2  # each unit alone: lm_loss, copy_accuracy
