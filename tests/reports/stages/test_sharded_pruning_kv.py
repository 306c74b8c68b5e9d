"""The pruning stage sharded by items on Ray workers (:mod:`headscope.reports.stages.prune_shards`):
the study runs in the driver and each of its forwards (scores under head masks, gate gradients, the
mean of z) is a round over two MiniLM workers, each on every other batch of the metric's items; the
per-item values, per-batch gradients and per-batch sums come back and are put together in item and
batch order, and the means, bootstrap SEs, orders and summaries run on them in the driver. Every
table ``DataFrame.equals`` the single-process run (tolerance 0 on every table).

Single-head ablation (zero and mean), importance, role ablation and curves in three orders (the
iterative importance order a round per step) on 8 sentences in batches of 4 (one batch per worker),
curves to 20% in steps of 10%. The cluster and the workers are conftest.py's (``minilm_pool``)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from headscope.analyses.pruning.study import PruneConfig, pruning_study, study_metric
from headscope.reports.stages.base import RunContext
from headscope.reports.stages.prune_shards import PruneRequest, ShardedMetric, serve
from headscope.reports.stages.registry import STAGES
from headscope.reports.stages.sharded import Interleaved

CFG = PruneConfig(
    n_items=8,
    batch_size=4,
    orders=("importance", "ablation", "random"),
    ablation_modes=("zero", "mean"),
    studies=("ablation", "importance", "curves"),
    max_fraction=0.2,
    n_random_seeds=1,
    role_draws=2,
    n_boot=50,
)
#: a roles frame (input of the role ablation): two roles, their heads by score
ROLES = pd.DataFrame(
    {
        "layer": [0, 0, 3, 5, 2],
        "head": [1, 4, 2, 7, 9],
        "role": ["positional", "positional", "special", "special", "special"],
        "score": [0.9, 0.8, 0.7, 0.95, 0.6],
        "verdict": [True, True, True, True, False],
    }
)


@pytest.fixture(scope="module")
def ctx(minilm):
    return RunContext(name="minilm-l6", model=minilm, frames={"roles": ROLES})


@pytest.fixture(scope="module")
def whole(ctx):
    """The pruning stage of MiniLM in this process."""
    return STAGES["pruning"].run(ctx, CFG)


def _assert_equal(sharded, whole):
    assert set(sharded.frames) == set(whole.frames)
    for name, frame in whole.frames.items():  # exact: each item's value from the same batches' forwards
        assert sharded.frames[name].equals(frame), name
    assert dict(sharded.summary) == dict(whole.summary)


def test_pruning_sharded_by_items_equals_the_single_process_run(minilm_pool, ctx, whole):
    stage = STAGES["pruning"]
    parts = stage.split(ctx, CFG, minilm_pool.workers)
    assert parts == [Interleaved(0, 2), Interleaved(1, 2)]
    sharded = minilm_pool.run(replace(ctx, shards=minilm_pool), stage, CFG, parts)
    _assert_equal(sharded, whole)
    f = sharded.frames
    assert set(f["prune_ablation"].study) == {"ablation:zero", "ablation:mean"} and len(f["prune_ablation"]) == 72 * 4
    assert set(f["prune_curves"].study) == {"curve:importance", "curve:ablation", "curve:random"}
    assert f["prune_curves"].step.max() == 2 and len(f["roles_vs_importance"]) == 2  # 14 of 72 heads in 2 steps
    assert (f["prune_importance"].value > 0).all() and f["prune_importance"].n.eq(8).all()


def test_the_sharded_metric_merges_exactly_in_process(minilm, whole):
    """The merge alone (no Ray): three parts served in this process (the third holds no batch)."""
    from headscope.reports.stages.frames import prune_frames

    metric = study_metric(minilm, CFG, None)
    sharded = ShardedMetric(metric, lambda reqs: [serve(minilm, CFG, r) for r in reqs], 3, minilm.spec)
    pr = pruning_study(minilm, CFG, None, metric=sharded, roles=ROLES)
    for name, frame in prune_frames(pr.tables).items():
        assert frame.equals(whole.frames[name]), name


def test_one_part_alone_is_not_the_whole(minilm, ctx, whole):
    """A part scores its own batches' items only; the driver refuses parts that miss items."""
    import torch

    mask = torch.ones(1, 6, 12)
    mask[0, 0, 0] = 0.0  # L0H0 ablated
    one = serve(minilm, CFG, PruneRequest("score", 1, 2, masks=mask))
    other = serve(minilm, CFG, PruneRequest("score", 0, 2, masks=mask))
    assert one["units"] == [1] and len(one["items"]) == len(other["items"]) == 4
    assert sorted(one["items"] + other["items"]) == list(range(8))
    metric = study_metric(minilm, CFG, None)
    alone = float(metric.aggregate(one["values"], one["weights"])[0])
    abl = whole.frames["prune_ablation"]
    row = abl[(abl.study == "ablation:zero") & (abl.metric == metric.name) & (abl["layer"] == 0) & (abl["head"] == 0)]
    assert alone != row.value.iloc[0]  # half the items' mean is not the whole's
    stage = STAGES["pruning"]
    half = stage.merge([stage.run_part(ctx, CFG, Interleaved(1, 2))])
    with pytest.raises(RuntimeError, match="not each of the metric's 8 once"):
        stage.finish(ctx, CFG, half)
