"""The pruning stage sharded by items on Ray workers (:mod:`headscope.reports.stages.prune_shards`):
the study runs in the driver and each of its forwards (scores under head masks, gate gradients, the
mean of z) is a round over two MiniLM workers, each on every other batch of the metric's items; the
per-item values, per-batch gradients and per-batch sums come back and are put together in item and
batch order, and the means, bootstrap SEs, orders and summaries run on them in the driver. Every
table ``DataFrame.equals`` the single-process run (tolerance 0 on every table).

Single-head ablation (zero and mean), importance, role ablation and curves in three orders (the
iterative importance order a round per step) on 8 sentences in batches of 4 (one batch per worker),
curves to 20% in steps of 10%. The cluster and the workers are conftest.py's (``minilm_pool``).

The KV-cache stage sharded by KV groups (:mod:`headscope.reports.stages.kv_shards`) on two workers
of a tiny random Llama (``llama_pool``, this module's: the MiniLM workers are stopped first, as the
shared cluster's 4 CPUs may all be held): each round of cache configurations is cut in contiguous
runs over the workers, the greedy choice and the frames in the driver. ``kv_study``, ``long_context_roles`` and
``long_context_causal`` ``DataFrame.equals`` the single-process run (tolerance 0), and the summary's
evaluations, forwards and layers run add up to one process's."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from headscope.analyses.kvcache.stage import KVStageConfig
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


def test_all_but_one_sharded_by_items_equals_the_single_process_run(minilm_pool, ctx):
    """The full report's keep-one-head-per-layer study, not among the quick studies above: 72 masks
    in one score round, 4 items in 2 batches, one a worker."""
    stage, cfg = STAGES["pruning"], replace(CFG, n_items=4, batch_size=2, studies=("all_but_one",), orders=("random",))
    whole = stage.run(ctx, cfg)
    sharded = minilm_pool.run(replace(ctx, shards=minilm_pool), stage, cfg, stage.split(ctx, cfg, minilm_pool.workers))
    _assert_equal(sharded, whole)
    abo = sharded.frames["prune_all_but_one"]
    assert len(abo) == 6 * 2 and sorted(abo.layer.unique()) == list(range(6))  # a layer's best head: value, delta


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


# ----------------------------------------------------------------------------- the KV-cache stage
#: the study at 64 tokens, the long-context roles on 2 needle items, their causal check on 2
KV_CFG = KVStageConfig(tokens=64, role_items=2, role_tokens=64, causal_items=2)


def _load_spec(path) -> dict:
    return {"model": str(path), "backend": "inhouse", "dtype": "fp32", "trust_remote_code": False}


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    """The tiny random Llama (2 layers of 4 query heads over 2 KV heads), in this process."""
    from headscope.probes.models import checkpoints
    from headscope.probes.models.loading import load_model

    return load_model(checkpoints.resolve(str(tiny_llama_dir)), "inhouse", dtype="fp32", trust_remote_code=False)


@pytest.fixture(scope="module")
def llama_pool(minilm_pool, tiny_llama_dir):
    """Two one-thread tiny-Llama workers for this module's KV tests. The shared cluster's 4 CPUs are
    held by the MiniLM and SmolLM2 pools where both have started, so MiniLM's workers are stopped
    first (the MiniLM pool starts them again on its next use), and these are stopped after the
    module: never more workers asking for CPUs than the cluster has."""
    from headscope.reports.stages.sharded import RayConfig, ShardPool

    minilm_pool.close()
    pool = ShardPool(RayConfig(workers=2, threads=1), _load_spec(tiny_llama_dir)).connect()
    yield pool
    pool.close()


def test_kv_sharded_by_kv_groups_equals_the_single_process_run(llama_pool, llama, tiny_llama_dir):
    stage = STAGES["kv"]
    ctx = RunContext(name=str(tiny_llama_dir), model=llama)
    whole = stage.run(ctx, KV_CFG)
    parts = stage.split(ctx, KV_CFG, llama_pool.workers)
    assert parts == [Interleaved(0, 2), Interleaved(1, 2)]
    sharded = llama_pool.run(replace(ctx, shards=llama_pool), stage, KV_CFG, parts)
    assert set(sharded.frames) == set(whole.frames) >= {"kv_study", "long_context_roles", "long_context_causal"}
    for name, frame in whole.frames.items():  # exact: each configuration measured alone, as one process does
        assert sharded.frames[name].equals(frame), name
    a, b = dict(sharded.summary), dict(whole.summary)
    for key in ("full", "greedy_order", "evaluations", "forwards", "layers_run", "groups", "savings_at_tolerance"):
        assert a[key] == b[key], key
    study = sharded.frames["kv_study"]
    assert set(study.study) == {"single", "greedy", "random"} and a["groups"] == 4  # 2 layers x 2 KV heads
    assert len(study[study.study == "single"]) == a["units"] * 2  # each unit alone: lm_loss, copy_accuracy


def test_kv_one_worker_measures_only_what_it_is_sent(llama, tiny_llama_dir):
    """A worker's reply holds its configurations alone; the driver puts the runs back in order."""
    from headscope.analyses.kvcache.stage import report_config
    from headscope.reports.stages.kv_shards import ShardedEvaluator, serve_kv

    kcfg = report_config(llama, 0, KV_CFG.tokens)
    configs = [{(0, 0): (kcfg.sink, kcfg.window)}, {(1, 1): (kcfg.sink, kcfg.window)}]
    first = serve_kv(llama, kcfg, None, ())
    ev = ShardedEvaluator(lambda reqs: [serve_kv(llama, kcfg, None, r.configs) for r in reqs], 2, first)
    both = ev.many(configs)
    alone = serve_kv(llama, kcfg, None, configs[1:])
    assert alone["results"] == both[1:] and len(alone["results"]) == 1
    assert both[0] != both[1] and both[0]["lm_loss"] != first["full"]["lm_loss"]
