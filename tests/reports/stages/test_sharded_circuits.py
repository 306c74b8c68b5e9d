"""What ran whole in the driver under ``--ray`` now shards by items, on SmolLM2-135M workers
(conftest.py's ``smollm_pool``): the circuits stage's edge scores (each worker sums the EAP-IG
scores over the items of every other batch; the driver adds the batches' sums in batch order, as
one process does, and runs the circuit search; the workers then evaluate every other circuit,
the budgets' and the random ones, over all batches, and the driver makes the faithfulness frame), and the IOI
role group of the roles stage (every other batch of its items; per-item direct effects merged in
item order, the verdicts and intervals after the merge). The function-vector group shards by
groups of tasks (each group's means need all its prompts), checked here in process.

Every table ``DataFrame.equals`` the single-process run: the same batches give the same floats
and the merges add them in the same order (no tolerance is needed for any table). Small settings
(4 circuit items in batches of 2, 2 interpolation steps, 2 budgets; 8 IOI items in batches of 4)."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("ray")

from headscope.analyses.circuits.edges.attribution import model_graph  # noqa: E402
from headscope.analyses.circuits.edges.evaluate import circuit_masks  # noqa: E402
from headscope.analyses.circuits.edges.study import (  # noqa: E402
    CircuitsConfig,
    evaluate_part,
    run_circuits,
    score_part,
)
from headscope.analyses.roles.config import RolesConfig  # noqa: E402
from headscope.reports.stages.base import RunContext  # noqa: E402
from headscope.reports.stages.registry import STAGES  # noqa: E402
from headscope.reports.stages.sharded import Interleaved  # noqa: E402

CIRCUIT = CircuitsConfig(n_items=4, batch_size=2, steps=2, budgets=(0.1, 1.0), seeds=1)
ROLES = RolesConfig(batch_size=4, ioi_n_items=8, n_boot=100, n_perm=200)


def _timeless(summary: dict) -> dict:
    """A summary without its seconds (the only thing in which a sharded run's differs) and its
    faithfulness rows (the faithfulness frame's records, compared as a frame: NaN equals NaN)."""
    return {k: v for k, v in summary.items() if k not in ("seconds", "faithfulness")}


def test_circuits_sharded_by_items_equal_the_single_process_run(smollm_pool, smollm, one_thread, caplog):
    ctx, stage = RunContext(name="smollm2-135m", model=smollm, shards=smollm_pool), STAGES["circuits"]
    whole = stage.run(ctx, CIRCUIT)
    parts = stage.split(ctx, CIRCUIT, smollm_pool.workers)
    assert parts == [Interleaved(0, 2), Interleaved(1, 2)]  # 4 items of one length: 2 batches of 2
    with caplog.at_level(logging.INFO, logger="headscope.reports.stages.sharded"):
        sharded = smollm_pool.run(ctx, stage, CIRCUIT, parts)
    # two rounds on the workers: the scores by batches, then the 6 circuits' evaluation by circuits
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == ["circuits: 2 shards on 2 workers"] * 2
    assert set(sharded.frames) == set(whole.frames) == {"circuit_edges", "circuit_faithfulness"}
    for name, frame in whole.frames.items():  # exact: the batches' sums added in batch order, as one process
        assert sharded.frames[name].equals(frame), name
    assert _timeless(sharded.summary) == _timeless(whole.summary)
    faith = sharded.frames["circuit_faithfulness"].set_index("budget")
    # SmolLM2's induction circuit: 10% of the edges recover part of the gap, a random 10% none of it
    assert faith.loc[1.0, "faithfulness"] == pytest.approx(1.0)
    assert faith.loc[0.1, "faithfulness"] > 0.1 > abs(faith.loc[0.1, "random_mean"])
    assert sharded.summary["n_edges_total"] == len(sharded.frames["circuit_edges"]) > 10_000


def test_one_circuit_part_alone_is_not_the_whole(smollm):
    """A part holds its own batches' sums only; the study refuses scores missing a batch. An
    evaluation part gives the metrics of its own circuits only."""
    part = score_part(smollm, CIRCUIT, (1, 2))
    assert sorted(part) == [1] and float(part[1].abs().sum()) > 0
    with pytest.raises(ValueError, match=r"every one of the task's 2 batches; batches \[0\] are missing"):
        run_circuits(smollm, CIRCUIT, part)
    graph = model_graph(smollm)
    masks = circuit_masks(graph, torch.rand(graph.valid.shape), [0.1], 0)  # full, empty, one circuit
    got = evaluate_part(smollm, CIRCUIT, masks, [1])
    assert list(got) == [1] and got[1] < -5  # the empty circuit: the corrupted run's log-prob of the answer


def test_ioi_roles_sharded_by_items_equal_the_single_process_run(smollm_pool, smollm):
    ctx, stage = RunContext(name="smollm2-135m", model=smollm, role_groups=("ioi",)), STAGES["roles"]
    whole = stage.run(ctx, ROLES)
    sharded = smollm_pool.run(ctx, stage, ROLES, stage.split(ctx, ROLES, smollm_pool.workers))
    assert set(sharded.frames) == set(whole.frames)
    for name, frame in whole.frames.items():
        assert sharded.frames[name].equals(frame), name
    assert dict(sharded.counts) == dict(whole.counts) == {"ioi": 8}
    roles = sharded.frames["roles"]
    assert set(roles.role) == {"ioi:name-mover", "ioi:negative-name-mover"} and len(roles) == 2 * 30 * 9
    assert (roles.n == 8).all()


def test_ioi_part_runs_only_its_batches(smollm):
    from headscope.analyses.roles.parts import fill_roles

    parts = [fill_roles(smollm, cfg=ROLES, roles=("ioi",), part=(k, 2)) for k in range(2)]
    used = [p.groups["ioi"][1].n_used for p in parts]
    assert 0 < used[0] < 8 and sum(used) == 8  # each part its own batches' items, together all of them


def test_function_vector_roles_sharded_by_task_groups_equal_the_single_process_run(smollm):
    """In process (the stage's parts take no per-group options): two tasks of two prompts, in
    batches of two, one task group per part."""
    from dataclasses import replace

    from headscope.analyses.roles.icl_tasks import TASKS
    from headscope.analyses.roles.parts import fill_roles, finish_filled, merge_filled

    cfg, g = replace(ROLES, batch_size=2), ("function-vector",)
    tasks = {k: TASKS[k] for k in ("antonym", "country-capital")}
    opts = {"function-vector": {"tasks": tasks, "n_prompts": 2, "n_demos": 3, "layers": (20,)}}
    kw = dict(cfg=cfg, roles=g, options=opts)
    whole = finish_filled(smollm, fill_roles(smollm, **kw), examples=False, **kw)
    parts = [fill_roles(smollm, part=(k, 2), **kw) for k in range(2)]
    assert [p.groups["function-vector"][1].n_used for p in parts] == [2, 2]
    sharded = finish_filled(smollm, merge_filled(parts), examples=False, **kw)
    assert sharded.frame.equals(whole.frame) and sharded.stats.equals(whole.stats)
    assert len(whole.frame) == 9 and (whole.frame.n == 4).all()  # layer 20's 9 heads, 4 prompts each
