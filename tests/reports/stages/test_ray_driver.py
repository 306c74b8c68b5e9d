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
