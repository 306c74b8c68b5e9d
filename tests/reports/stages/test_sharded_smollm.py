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


def test_weights_sharded_by_layers_equals_single_process(smollm_pool, smollm, monkeypatch):
    """The per-head rows, computed by layer on the workers, merged and adjusted over all 270 heads,
    equal the single process's. The composition scores are left out of both runs (an empty
    frame): the driver computes them after the merge from its own model, the same call with or
    without Ray (test_sharded.py compares them on MiniLM), and on SmolLM2's 30 layers they take
    about 40 s a run."""
    import pandas as pd

    from headscope.analyses.circuits.weights import composition
    from headscope.analyses.circuits.weights.frames import COMPOSITION_COLUMNS

    monkeypatch.setattr(composition, "composition_scores", lambda *a, **k: pd.DataFrame(columns=COMPOSITION_COLUMNS))
    ctx, stage, cfg = RunContext(name="smollm2-135m", model=smollm), STAGES["weights"], WeightsConfig(draws=4, null=8)
    whole = stage.run(ctx, cfg)
    parts = stage.split(ctx, cfg, smollm_pool.workers)
    assert parts == [tuple(range(15)), tuple(range(15, 30))]
    sharded = smollm_pool.run(ctx, stage, cfg, parts)
    assert set(sharded.frames) == set(whole.frames)
    for name, frame in whole.frames.items():
        assert sharded.frames[name].equals(frame), name
    heads = sharded.frames["weights_heads"]
    assert sorted(heads.layer.unique()) == list(range(30)) and set(heads["head"]) == set(range(9))
    tested = heads.p_value.notna()  # the adjustment over every head's tests, after the merge
    assert tested.any() and heads.p_adjusted.notna().equals(tested)
    assert (heads.p_adjusted[tested] >= heads.p_value[tested]).all()


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
