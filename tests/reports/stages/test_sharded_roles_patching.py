"""The roles stage sharded by items and the patching stage by heads on Ray workers
(:mod:`headscope.reports.stages.sharded`): two MiniLM workers each run every other batch of every
role group's corpus (cut as one process cuts them), or every other patched forward of activation
patching (each patching the heads one process patches in it); the driver merges the per-item
values or per-head effects and runs the verdicts, bootstrap intervals, permutation p-values and
adjustments on them; attribution patching runs every other batch of items on each worker, its
per-item estimates joined in the driver. Every table ``DataFrame.equals`` the single-process run.

Cut-down corpora (60 sentences, the hand-written trees, the coreference set, 24 induction
sequences) in batches of 8, so each part runs several batches of each; the cluster and the
workers are conftest.py's (``minilm_pool``)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from headscope.analyses.roles.config import RolesConfig  # noqa: E402
from headscope.analyses.roles.inputs import default_conllu, default_text  # noqa: E402
from headscope.analyses.run_patching import CausalConfig  # noqa: E402
from headscope.reports.stages.base import RunContext  # noqa: E402
from headscope.reports.stages.registry import STAGES  # noqa: E402
from headscope.reports.stages.sharded import Interleaved  # noqa: E402

CFG = RolesConfig(batch_size=8, induction_n_sequences=24, n_boot=200, n_perm=400)
GROUPS = ("positional", "special", "rare-word", "summary", "clustering", "induction", "syntactic", "coreference")


@pytest.fixture(scope="module")
def ctx(minilm):
    texts = default_text().read_text().splitlines()[:60]
    conllu = [p for p in default_conllu() if p.name == "handwritten.conllu"]
    return RunContext(name="minilm-l6", model=minilm, role_groups=GROUPS, inputs={"text": texts, "conllu": conllu})


@pytest.fixture(scope="module")
def roles(ctx):
    """The roles stage of MiniLM on the cut-down corpora, in this process."""
    return STAGES["roles"].run(ctx, CFG)


def test_roles_sharded_by_items_equal_the_single_process_run(minilm_pool, ctx, roles):
    stage, whole = STAGES["roles"], roles
    parts = stage.split(ctx, CFG, minilm_pool.workers)
    assert parts == [Interleaved(0, 2), Interleaved(1, 2)]
    sharded = minilm_pool.run(ctx, stage, CFG, parts)
    assert set(sharded.frames) == set(whole.frames)
    for name, frame in whole.frames.items():  # exact: the same batches, per-item values merged in item order
        assert sharded.frames[name].equals(frame), name
    assert dict(sharded.counts) == dict(whole.counts)
    assert sharded.counts["positional"] == 60 and sharded.counts["induction"] == 24
    roles = sharded.frames["roles"]
    assert set(roles.role.str.split(":").str[0]) >= {"positional", "induction", "syntactic", "coreference"}
    assert roles.verdict.any() and (roles.n > 0).all()
    assert len(sharded.frames["stats"]) > 0 and len(sharded.frames["clusters"]) == 6 * 12


def test_one_part_alone_is_not_the_whole(minilm, ctx):
    """The merge is what makes the tables whole: one part's reducers finished alone see half the items."""
    from headscope.analyses.roles.parts import fill_roles, finish_filled

    one = fill_roles(minilm, cfg=CFG, roles=("positional",), inputs=ctx.inputs, part=(1, 2))
    red, report = one.groups["positional"]
    assert report.n_items == 60 and 0 < report.n_used < 60 and report.n_batches == 4  # 8 batches of 60: every other
    alone = finish_filled(minilm, one, cfg=CFG, roles=("positional",), inputs=ctx.inputs, examples=False)
    assert set(alone.frame.n) == {report.n_used}


def test_patching_sharded_by_heads_equals_the_single_process_run(minilm_pool, minilm, roles):
    """Activation patching of MiniLM's 72 heads on the induction task (8 items in 2 batches of 4,
    each batch's patched forwards split between the workers), attribution patching by
    batches of items (one batch per worker); the statistics in the driver."""
    frame = roles.frames["roles"]
    ctx = RunContext(name="minilm-l6", model=minilm, frames={"roles": frame[frame.role == "induction"]})
    stage, cfg = STAGES["patching"], CausalConfig(n_items=8, batch_size=4, n_boot=200, n_perm=400)
    whole = stage.run(ctx, cfg)
    parts = stage.split(ctx, cfg, minilm_pool.workers)
    sharded = minilm_pool.run(ctx, stage, cfg, parts)
    assert sharded.frames["patching"].equals(whole.frames["patching"])
    patched = sharded.frames["patching"]
    activation = patched[patched.method == "activation_denoising"]
    assert list(patched.task.unique()) == ["induction"] and len(activation) == 72 and activation.effect.notna().all()
    assert activation.effect.max() > 0.1 and (activation.ci_low > 0).any()  # heads restoring >10% of the gap
    attribution = patched[patched.method == "attribution_denoising"]
    assert len(attribution) == 72 and attribution.effect.notna().all() and (attribution.n == 8).all()
    timing = {"seconds"}  # the summaries differ only in how long each part took
    for t, summary in whole.summary["tasks"].items():
        got = sharded.summary["tasks"][t]
        assert {k: v for k, v in got.items() if k not in timing} == {
            k: v for k, v in summary.items() if k not in timing
        }
