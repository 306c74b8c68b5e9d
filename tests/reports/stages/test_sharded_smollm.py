"""Stages sharded on Ray workers for SmolLM2-135M (a GQA decoder: 30 layers, 9 query heads on 3 KV
heads), as test_sharded*.py shard them for MiniLM: each stage's tables with 2 workers
``DataFrame.equals`` the single-process run. The workers are conftest.py's ``smollm_pool`` (two
one-thread workers, each loading the shipped GGUF once), which lives in the same Ray cluster as
``minilm_pool``; the single-process runs use the session's ``smollm``."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from headscope.analyses.roles.config import RolesConfig  # noqa: E402
from headscope.analyses.run_weights import WeightsConfig  # noqa: E402
from headscope.reports.stages.base import RunContext  # noqa: E402
from headscope.reports.stages.registry import STAGES  # noqa: E402
from headscope.reports.stages.sharded import Interleaved  # noqa: E402

ROLES = RolesConfig(batch_size=4, induction_n_sequences=8, n_boot=50, n_perm=100)
GROUPS = ("positional", "special", "induction")


def test_smollm_and_minilm_pools_live_in_one_cluster(minilm_pool, smollm_pool, ray_cluster):
    """Both pools' four workers alive at once, one Ray CPU each: neither waits on the other."""
    pids = minilm_pool.pids() + smollm_pool.pids()
    assert len(set(pids)) == 4
    assert minilm_pool.threads == smollm_pool.threads == 1 and smollm_pool.workers == 2
    assert ray_cluster.available_resources().get("CPU", 0) == 0  # the 4 CPUs held, 2 by each pool


#: the weights stage cut down: 4 Gaussian heads a head baseline, 40 null draws in blocks of 16 (SmolLM2's
#: 576 x 64 matrices: 16 draws of 8 bytes is 4.7 MB), so each family's null is stepped over block by block
WEIGHTS = WeightsConfig(draws=4, null=40, null_block_bytes=16 * 576 * 64 * 8)


def test_weights_sharded_equals_single_process(smollm_pool, smollm):
    """Every table of the weights stage, its per-head rows and its composition scores (435 layer pairs
    of SmolLM2, five families' nulls) computed on the workers and merged, equals the single process's
    (one torch thread, as each worker runs): the head rows by contiguous layers, the composition
    scores by receiver layer, the nulls by family, each family's generator stepped over the earlier
    families' blocks."""
    import torch

    from headscope.reports.stages.weights import WeightsPart

    ctx, stage = RunContext(name="smollm2-135m", model=smollm), STAGES["weights"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        whole = stage.run(ctx, WEIGHTS)
    finally:
        torch.set_num_threads(threads)
    parts = stage.split(ctx, WEIGHTS, smollm_pool.workers)
    assert [p.layers for p in parts] == [tuple(range(15)), tuple(range(15, 30))]
    assert sorted(r for p in parts for r in p.receivers) == list(range(1, 30))
    assert sorted(f for p in parts for f in p.families) == [0, 1, 2, 3, 4]
    assert all(isinstance(p, WeightsPart) and p.receivers and p.families for p in parts)
    sharded = smollm_pool.run(ctx, stage, WEIGHTS, parts)
    assert set(sharded.frames) == set(whole.frames) >= {"weights_heads", "weights_composition"}
    for name, frame in whole.frames.items():
        assert sharded.frames[name].equals(frame), name
    heads = sharded.frames["weights_heads"]
    assert sorted(heads.layer.unique()) == list(range(30)) and set(heads["head"]) == set(range(9))
    tested = heads.p_value.notna()  # the adjustment over every head's tests, after the merge
    assert tested.any() and heads.p_adjusted.notna().equals(tested)
    comp = sharded.frames["weights_composition"]
    assert len(comp) == 435 * (3 * 81 + 2 * 27)  # Q, K, V head pairs and K, V kv-group pairs
    assert comp.groupby(["mode", "level"], observed=True).baseline_mean.nunique().eq(1).all()
    assert comp.value.notna().all() and (comp.n == 40).all()


def test_weights_split_covers_every_unit_once(smollm):
    """For 1 to 8 workers: each layer's head rows, each receiver layer and each null family in
    exactly one part; a part missing from the merge is named, not a table with a hole."""
    from headscope.analyses.run_weights import composition_from_parts

    ctx, stage = RunContext(name="smollm2-135m", model=smollm), STAGES["weights"]
    for n in range(1, 9):
        parts = stage.split(ctx, WEIGHTS, n)
        assert len(parts) <= n
        assert sorted(x for p in parts for x in p.layers) == list(range(30))
        assert sorted(x for p in parts for x in p.receivers) == list(range(1, 30))
        assert sorted(x for p in parts for x in p.families) == [0, 1, 2, 3, 4]
    piece = {"scores": {}, "units": {lb: None for lb in range(1, 29)}, "senders": {}, "nulls": {0: None}}
    with pytest.raises(ValueError, match=r"receiver layers \[29\] and null families \[1, 2, 3, 4\]"):
        composition_from_parts(smollm, [piece])


@pytest.fixture(scope="module")
def roles_ctx(smollm):
    """The roles a decoder's report leans on, on 8 sentences (2 batches of 4: one a worker) and
    8 induction sequences."""
    from headscope.analyses.roles.inputs import default_text

    texts = default_text().read_text().splitlines()[:8]
    return RunContext(name="smollm2-135m", model=smollm, role_groups=GROUPS, inputs={"text": texts})


@pytest.fixture(scope="module")
def roles(roles_ctx):
    """The roles stage of SmolLM2 on the cut-down corpora, in this process."""
    return STAGES["roles"].run(roles_ctx, ROLES)


def test_roles_sharded_by_items_equal_the_single_process_run(smollm_pool, roles_ctx, roles):
    stage, whole = STAGES["roles"], roles
    parts = stage.split(roles_ctx, ROLES, smollm_pool.workers)
    assert parts == [Interleaved(0, 2), Interleaved(1, 2)]
    sharded = smollm_pool.run(roles_ctx, stage, ROLES, parts)
    assert set(sharded.frames) == set(whole.frames)
    for name, frame in whole.frames.items():
        assert sharded.frames[name].equals(frame), name
    assert dict(sharded.counts) == dict(whole.counts) == {"positional": 8, "special": 8, "induction": 8}
    frame = sharded.frames["roles"]
    assert len(frame[frame.role == "induction"]) == 270 and (frame.n > 0).all()
    assert frame[frame.role == "sink:first-token"].verdict.sum() > 100  # most of SmolLM2's heads sink on token 0


def test_patching_sharded_by_kv_groups_equals_the_single_process_run(smollm_pool, smollm, roles):
    """Activation patching of SmolLM2's 90 KV groups (quick mode's unit on a GQA model) on the
    induction task, 2 items: 180 patched sequences in 4 forwards of 48, two a worker."""
    from headscope.analyses.run_patching import CausalConfig

    frame = roles.frames["roles"]
    ctx = RunContext(name="smollm2-135m", model=smollm, frames={"roles": frame[frame.role == "induction"]})
    stage, cfg = STAGES["patching"], CausalConfig(n_items=2, n_boot=50, n_perm=100, max_rows=48)
    whole = stage.run(ctx, cfg)
    sharded = smollm_pool.run(ctx, stage, cfg, stage.split(ctx, cfg, smollm_pool.workers))
    assert sharded.frames["patching"].equals(whole.frames["patching"])
    patched = sharded.frames["patching"]
    activation = patched[patched.method == "activation_denoising"]
    assert len(activation) == 270 and set(activation.unit) == {"kv_group"} and activation.effect.notna().all()
    assert activation.effect.max() > 0.1  # a group restoring >10% of the clean-corrupt gap
    got, want = sharded.summary["tasks"]["induction"], whole.summary["tasks"]["induction"]
    assert {k: v for k, v in got.items() if k != "seconds"} == {k: v for k, v in want.items() if k != "seconds"}


def test_context_sharded_by_items_equals_the_single_process_run(smollm_pool, smollm):
    from headscope.analyses.context import ContextConfig

    ctx, stage = RunContext(name="smollm2-135m", model=smollm), STAGES["context"]
    cfg = ContextConfig(max_words=2, max_per_sense=2, attention_sentences=2, n_boot=50, n_perm=10, batch_size=4)
    whole = stage.run(ctx, cfg)
    parts = stage.split(ctx, cfg, smollm_pool.workers)
    assert len(parts) == 2
    sharded = smollm_pool.run(ctx, stage, cfg, parts)
    assert set(sharded.frames) == set(whole.frames) and len(whole.frames) >= 4
    for name, frame in whole.frames.items():
        assert sharded.frames[name].equals(frame), name
    assert sharded.summary == whole.summary
    assert whole.summary["n_sentences"] == 8 and len(whole.frames["context_layers"]) == 30


@pytest.mark.slow  # seven groups, two runs: 260 s on the shared 2-core machine (load ~20)
def test_the_other_default_role_groups_sharded_by_items_equal_the_single_process_run(smollm_pool, smollm):
    """SmolLM2's default role groups the tests above and test_sharded_circuits.py leave out: the
    text groups on 8 sentences, the syntactic ones on the hand-written trees, coreference and the
    generated successor and copy-suppression groups, in batches of 4; the reference on one thread."""
    import torch

    from headscope.analyses.roles.inputs import default_conllu, default_text

    groups = ("rare-word", "summary", "clustering", "successor", "copy-suppression", "syntactic", "coreference")
    texts = default_text().read_text().splitlines()[:8]
    conllu = [p for p in default_conllu() if p.name == "handwritten.conllu"]
    ctx = RunContext(name="smollm2-135m", model=smollm, role_groups=groups, inputs={"text": texts, "conllu": conllu})
    stage, threads = STAGES["roles"], torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker runs
    try:
        whole = stage.run(ctx, ROLES)
    finally:
        torch.set_num_threads(threads)
    sharded = smollm_pool.run(ctx, stage, ROLES, stage.split(ctx, ROLES, smollm_pool.workers))
    assert set(sharded.frames) == set(whole.frames)
    for name, frame in whole.frames.items():
        assert sharded.frames[name].equals(frame), name
    assert dict(sharded.counts) == dict(whole.counts) and set(whole.counts) == set(groups)
    assert all(n > 0 for n in whole.counts.values())
    assert set(sharded.frames["roles"].role.str.split(":").str[0]) >= {"successor", "copy-suppression", "syntactic"}


def test_qk_drivers_sharded_by_roles_equal_the_single_process_run(smollm_pool, smollm):
    """The QK drivers of three roles' top heads (SmolLM2's induction head L18H6 and previous-token
    head L16H0 on the induction task, a duplicate-token head on its own task), every n-th role on
    each worker (roles 0 and 2 on one, 1 on the other), joined in the attribution order: the single
    process's frame."""
    import pandas as pd
    import torch

    from headscope.analyses.qk.roles import role_drivers, top_heads
    from headscope.reports.stages.roles import _qk_drivers

    frame = pd.DataFrame(
        {
            "layer": [18, 16, 3],
            "head": [6, 0, 2],
            "role": ["induction", "previous-token", "duplicate-token"],
            "score": [0.4, 0.9, 0.5],
            "verdict": [True, True, True],
        }
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        whole, notes = role_drivers(smollm, frame, seed=0)
    finally:
        torch.set_num_threads(threads)
    ctx = RunContext(name="smollm2-135m", model=smollm, shards=smollm_pool)
    sharded = _qk_drivers(ctx, frame, 0, ROLES)
    assert sharded.equals(whole.reset_index(drop=True)) and not notes
    assert set(sharded.role) == set(top_heads(frame)) and set(sharded.side) == {"query", "key"}
