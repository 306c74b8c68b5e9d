"""IOI's S-inhibition path patching sharded on Ray workers (the roles stage's second round, after the
merge, where the name movers are known): its patched forwards interleaved over conftest.py's
``smollm_pool`` (two one-thread SmolLM2 workers), each cell of the per-item, per-sender effects taken
from the worker that computed it, equal the single process's (one torch thread, as each worker runs)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

import torch  # noqa: E402

from headscope.analyses.roles.config import RolesConfig  # noqa: E402
from headscope.reports.stages.base import RunContext  # noqa: E402


def test_s_inhibition_paths_sharded_equal_the_single_process(smollm_pool, smollm):
    """2 IOI items, the 18 heads of layers 21-22 into the queries of two heads of layer 23 (SmolLM2's
    name movers' layer): forwards of at most 8 rows (4 senders of a batch of 2), interleaved."""
    from headscope.analyses.patching.activation import PatchConfig
    from headscope.analyses.patching.path import merge_deltas, path_deltas
    from headscope.analyses.patching.tasks import load_task
    from headscope.reports.stages.roles import _paths_on

    task = load_task(smollm, "ioi", n_items=2, seed=0)
    senders = [(layer, h) for layer in (21, 22) for h in range(9)]
    kw = {
        "receiver": (23, 0),
        "via": "q",
        "also": (1,),
        "senders": senders,
        "cfg": PatchConfig(batch_size=2, max_rows=8),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        delta, run, got_senders, read = path_deltas(smollm, task, **kw)
        half = path_deltas(smollm, task, part=(1, 2), **kw)[0]
    finally:
        torch.set_num_threads(threads)
    assert got_senders == senders and delta.shape == (2, 18) and not delta.isnan().any()
    assert half.isnan().any() and not half.isnan().all()  # a part: its own forwards only, NaN elsewhere
    assert torch.equal(merge_deltas([delta.where(half.isnan(), torch.nan), half]), delta)  # exact, cell by cell

    ctx = RunContext(name="smollm2-135m", model=smollm)
    sharded, run_s, senders_s, read_s = _paths_on(smollm_pool, ctx, RolesConfig(), task, kw)
    assert torch.equal(sharded, delta) and senders_s == senders and read_s == read
    assert torch.equal(run_s.gap, run.gap) and delta.abs().max() > 0
