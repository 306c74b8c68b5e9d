"""What a ``--ray`` driver holds: each part's result is pickled on its worker, put into Ray's object
store (mapped into the driver, resident there) and unpickled in the driver, so a result that drags
the model along ships every weight back with each part. The roles stage's successor and
copy-suppression reducers held the model (MiniLM: 87 MiB a part, SmolLM2-135M: 0.5 GiB), which
put the default SmolLM2 report's driver at 4.28 GiB against a 2.5 GiB plan; their parts now carry
their values alone."""

from __future__ import annotations

import pickle

import pytest

ROLES = ("successor", "copy-suppression")


@pytest.fixture(scope="module")
def part(smollm):
    from headscope.analyses.roles.parts import fill_roles

    return fill_roles(smollm, roles=ROLES, part=(0, 2))


def test_a_roles_part_pickles_without_the_model(smollm, part):
    weights = sum(p.numel() * p.element_size() for p in smollm.network.parameters())
    assert weights > 500 * 2**20  # SmolLM2-135M: 0.5 GiB of float32 weights
    for g in ROLES:
        reducer = part.groups[g][0]
        assert reducer.model is smollm  # the worker's reducer still reads its model while it is fed
        size = len(pickle.dumps(part.groups[g], protocol=5))
        assert size < weights / 100, (g, size)  # its values (and a few W_U columns) alone: no weight matrix
    back = pickle.loads(pickle.dumps(part, protocol=5))
    assert all(back.groups[g][0].model is None for g in ROLES)


def test_an_unpickled_part_merges_and_finishes_as_the_one_in_memory(smollm, part):
    """The driver's view (unpickled parts) gives the roles frame of the parts as they were filled."""
    from headscope.analyses.roles.parts import fill_roles, finish_filled, merge_filled

    other = fill_roles(smollm, roles=ROLES, part=(1, 2))
    shipped = [pickle.loads(pickle.dumps(p, protocol=5)) for p in (part, other)]  # before the merge, which is in place
    driver = finish_filled(smollm, merge_filled(shipped), roles=ROLES)
    direct = finish_filled(smollm, merge_filled([part, other]), roles=ROLES)
    assert not direct.frame.empty and driver.frame.equals(direct.frame)


def test_a_ray_plan_holds_the_drivers_objects_in_every_run_phase():
    """Under ``--ray`` each stage's phase of the plan (the driver's) holds the object store's pages the
    driver maps beside what one process holds; the load, before any part, does not."""
    from headscope.probes.budget import Shape, WorkingSet
    from headscope.reports.budget import plan
    from headscope.reports.stages.sharded import RAY_DRIVER_OBJECTS

    shape = Shape(n_layers=2, n_heads=4, d_model=64, d_head=16, d_mlp=256, vocab_size=1000, n_params=10**6)
    sets = [WorkingSet(name="a", batch_size=8, longest=16), WorkingSet(name="b", batch_size=2, longest=64)]
    one = plan("report", shape, sets).estimate
    budget = plan("report", shape, sets, beside={"ray objects": RAY_DRIVER_OBJECTS})
    driver = budget.estimate
    assert driver.phases["load"] == one.phases["load"]
    budget.settings["ray"] = {"workers": 2, "worker_peak_rss_bytes": [1, 2]}  # what the pool records
    rec = budget.record()  # run.json's memory: the driver's plan and peak beside the workers'
    assert rec["ray"]["driver_estimate_bytes"] == rec["estimate_bytes"] == driver.total
    assert rec["ray"]["driver_peak_rss_bytes"] == rec["peak_rss_bytes"] and rec["ray"]["workers"] == 2
    for name in ("a", "b"):
        assert driver.phases[name] - one.phases[name] == RAY_DRIVER_OBJECTS
        assert driver.parts[name]["ray objects"] == RAY_DRIVER_OBJECTS


def test_the_pool_records_each_workers_peak_beside_its_ask(minilm_pool, minilm):
    """run.json's ``memory.ray``: every worker's measured resident peak (it holds MiniLM's weights,
    under the 4 GiB no MiniLM worker comes near), its threads and no GPU on a CPU run."""
    assert len(minilm_pool.pids()) == 2  # the workers exist and have loaded MiniLM
    rec = minilm_pool.record()
    weights = sum(p.numel() * p.element_size() for p in minilm.network.parameters())
    assert rec["workers"] == 2 and rec["threads"] == 1 and rec["gpus_per_worker"] is None
    assert len(rec["worker_peak_rss_bytes"]) == 2
    assert all(weights < p < 4 * 2**30 for p in rec["worker_peak_rss_bytes"]), rec
