"""IOI roles (headscope.analyses.roles.ioi): the planted name mover and S-inhibition head are found
and nothing else is; a model without the circuit (planted or random weights) gets no verdict; an
encoder gets no rows and a note; SmolLM2's name movers, measured; the time estimate counts the path
patching when it is asked for."""

from __future__ import annotations

import pytest
import torch

from headscope.analyses.patching.ioi import planted_ioi_task
from headscope.analyses.patching.path import path_deltas
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.ioi import ioi_heads, item_hits, work
from headscope.analyses.roles.pipeline import head_roles, run_role
from headscope.probes.direct_effects import direct_effects
from headscope.probes.models.inhouse.planted import planted_model, writing_ioi

CFG = RolesConfig(n_boot=200, n_perm=500, batch_size=8)


@pytest.fixture(scope="module")
def ioi_model():
    return writing_ioi(planted_model())


@pytest.fixture(scope="module")
def task(ioi_model):
    return planted_ioi_task(ioi_model, n_items=16)


def _verdicts(frame) -> set:
    v = frame[frame.verdict]
    return set(zip(v.layer, v["head"], v.role))


def test_the_planted_name_mover_and_s_inhibition_head_are_found_exactly(ioi_model, task):
    out = run_role("ioi", ioi_model, task, RolesConfig(n_boot=200, n_perm=500, batch_size=8, ioi_s_inhibition=True))
    assert _verdicts(out.frame) == {(1, 2, "ioi:name-mover"), (0, 2, "ioi:s-inhibition")}
    f = out.frame.set_index(["role", "layer", "head"])
    assert f.score["ioi:name-mover", 1, 2] == 1.0 and f.baseline["ioi:name-mover", 1, 2] == 0.0
    assert f.score["ioi:s-inhibition", 0, 2] == 1.0 and out.extra["s_inhibition"]["receivers"] == ["1.2"]
    # the mover is the only head writing into the token block: its direct effect is the whole difference
    stats = out.stats.set_index(["layer", "head"]).value
    assert stats[1, 2] == pytest.approx(1.0, abs=1e-5) and stats.drop((1, 2)).abs().max() < 1e-6
    assert out.extra["clean_logit_diff"] > 5 and out.extra["corrupted_logit_diff"] == pytest.approx(0.0, abs=1e-5)


def test_direct_effect_of_the_mover_equals_the_logit_difference_per_item(ioi_model, task):
    (clean, _x, answer, wrong, _rows), *_ = list(task.batches(4))
    effect, diff = direct_effects(ioi_model, clean, answer, wrong)
    assert effect.shape == (len(clean), 2, 4)
    torch.testing.assert_close(effect[:, 1, 2], diff, rtol=1e-5, atol=1e-5)


def test_no_circuit_no_verdict_planted_and_random_weights(task, smollm):
    bare = run_role("ioi", planted_model(), task, RolesConfig(n_boot=100, n_perm=200, ioi_s_inhibition=True))
    assert not bare.frame.verdict.any() and "no name mover" in bare.extra["notes"][0]
    from headscope.probes.models.backends.inhouse import InHouseModel
    from headscope.probes.models.config import ModelConfig
    from headscope.probes.models.inhouse.transformer import Transformer

    cfg = ModelConfig(
        family="llama",
        n_layers=2,
        d_model=64,
        n_heads=4,
        d_head=16,
        d_mlp=128,
        vocab_size=len(smollm.tokenizer),
        max_positions=64,
        causal=True,
        positional="rope",
        name="random-llama",
    )
    torch.manual_seed(0)
    random_model = InHouseModel(Transformer(cfg), smollm.tokenizer, name="random-llama")
    out = run_role("ioi", random_model, None, RolesConfig(n_boot=100, n_perm=200, ioi_n_items=16))
    assert len(out.frame) == 2 * 2 * 4 and not out.frame.verdict.any() and out.n_items == 16


def test_an_encoder_gives_no_rows_and_says_why(minilm):
    out = run_role("ioi", minilm, None, RolesConfig(n_boot=10, n_perm=10))
    assert out.frame.empty and "no unembedding" in out.extra["notes"][0]


def test_bad_items_are_refused_in_one_line(ioi_model):
    with pytest.raises(ValueError, match="non-empty list of PairItem"):
        run_role("ioi", ioi_model, [1, 2], CFG)
    with pytest.raises(ValueError, match="also: heads"):
        path_deltas(ioi_model, planted_ioi_task(ioi_model, n_items=2), receiver=(1, 2), via="q", also=(9,))
    with pytest.raises(ValueError, match="through their queries"):
        path_deltas(ioi_model, planted_ioi_task(ioi_model, n_items=2), receiver=(1, 2), via="k", also=(1,))


def test_hits_need_a_tenth_of_the_difference_and_its_sign():
    effect = torch.tensor([[0.2, 0.19, -0.2, 0.0], [0.0, 0.0, 0.0, 0.0]])
    diff = torch.tensor([2.0, 0.0])  # an item with no difference has no hit
    assert item_hits(effect, diff).tolist() == [[1, 0, 0, 0], [0, 0, 0, 0]]
    assert item_hits(effect, diff, negative=True).tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]]


def test_progress_counts_the_path_patching_up_to_the_estimated_work(ioi_model, task):
    """The time estimate's total (:func:`work`) is what the progress reaches: the direct-effect pass
    counts its items, the path patching the rest (its senders here are the 4 heads of layer 0)."""
    cfg = RolesConfig(n_boot=50, n_perm=50, batch_size=8, ioi_s_inhibition=True, ioi_n_items=16)
    calls = []
    run_role("ioi", ioi_model, task, cfg, progress=lambda d, t: calls.append((d, t)))
    total = work(cfg, ioi_model.spec, 16)
    assert total > 16 and work(RolesConfig(ioi_n_items=16), ioi_model.spec) == 16
    assert calls[0][0] <= 8 and calls[-1] == (total, total) and all(t == total for _, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


@pytest.fixture(scope="module")
def smollm_ioi(smollm):
    return run_role("ioi", smollm, None, RolesConfig())


def test_smollm2_name_movers_and_negative_name_movers(smollm_ioi):
    """SmolLM2-135M on 32 IOI items (seed 0), measured: clean logit difference 4.55, ABC -0.50;
    name movers L23H3 (1.00 vs 0.16), L29H1 (0.91 vs 0.09), L23H0 (0.66 vs 0.00), L23H2 (0.50 vs 0.03);
    negative name movers L24H4 and L29H0 (0.72 vs 0.03). Margins: 0.3 on the difference, 0.1 on scores."""
    out = smollm_ioi
    assert out.n_items == 32
    assert out.extra["clean_logit_diff"] == pytest.approx(4.55, abs=0.3)
    assert out.extra["corrupted_logit_diff"] == pytest.approx(-0.50, abs=0.3)
    f = out.frame.set_index(["role", "layer", "head"])
    for (l, h), score, base in (((23, 3), 1.0, 0.16), ((29, 1), 0.91, 0.09), ((23, 0), 0.66, 0.0)):
        assert f.score["ioi:name-mover", l, h] == pytest.approx(score, abs=0.1)
        assert f.baseline["ioi:name-mover", l, h] == pytest.approx(base, abs=0.1)
        assert f.verdict["ioi:name-mover", l, h]
    for l, h in ((24, 4), (29, 0)):
        assert f.score["ioi:negative-name-mover", l, h] == pytest.approx(0.72, abs=0.1)
        assert f.verdict["ioi:negative-name-mover", l, h]
    assert not out.frame[out.frame.layer < 20].verdict.any()  # nothing moves names before layer 20
    assert "--s-inhibition" in out.extra["notes"][0]


def test_ioi_heads_joins_the_other_verdicts(smollm_ioi):
    """The IOI verdicts, best first per role, each with the head's other verdicts (here: a
    duplicate-token verdict given to L23H3)."""
    import pandas as pd

    extra = smollm_ioi.frame[(smollm_ioi.frame.layer == 23) & (smollm_ioi.frame["head"] == 3)].iloc[:1]
    joined = ioi_heads(pd.concat([smollm_ioi.frame, extra.assign(role="duplicate-token")], ignore_index=True))
    assert set(joined.role) == {"ioi:name-mover", "ioi:negative-name-mover"} and joined.verdict.all()
    first = joined.iloc[0]
    assert (first.role, first.layer, first["head"], first.also) == ("ioi:name-mover", 23, 3, "duplicate-token")
    assert (joined.also == "").sum() == len(joined) - 1


def test_head_roles_runs_the_group_with_the_others(ioi_model, task):
    res = head_roles(ioi_model, roles=["ioi"], cfg=CFG, options={"ioi": {"items": task}}, examples=False)
    assert set(res.frame.role) == {"ioi:name-mover", "ioi:negative-name-mover"} and res.n_items["ioi"] == 16


def test_roles_s_inhibition_flag_reaches_the_config_and_the_estimate(ioi_model):
    from headscope.reports.cli.app import build_parser
    from headscope.reports.cli.roles import _config
    from headscope.reports.stages.plans import roles_items

    on = _config(build_parser().parse_args(["roles", "smollm2-135m", "--roles", "ioi", "--s-inhibition"]))
    off = _config(build_parser().parse_args(["roles", "smollm2-135m", "--roles", "ioi"]))
    assert on.ioi_s_inhibition and not off.ioi_s_inhibition
    assert roles_items(["ioi"], {}, off, ioi_model.spec) == 32
    assert roles_items(["ioi"], {}, on, ioi_model.spec) == work(on, ioi_model.spec) > 32


def test_s_inhibition_through_a_sharded_paths_option_equals_the_single_run(ioi_model, task):
    """The ``paths`` option (what a sharded report passes: the path patching's forwards on its workers)
    run here as three interleaved parts merged cell by cell: the same rows, the planted S-inhibition
    head found as before."""
    from headscope.analyses.patching.path import merge_deltas

    calls = []

    def sharded(model, task, **kw):
        kw.pop("progress", None)
        parts = [path_deltas(model, task, part=(k, 3), **kw) for k in range(3)]
        calls.append(len(parts))
        return merge_deltas([p[0] for p in parts]), *parts[0][1:]

    cfg = RolesConfig(n_boot=200, n_perm=500, batch_size=8, ioi_s_inhibition=True)
    whole = run_role("ioi", ioi_model, task, cfg)
    parts = run_role("ioi", ioi_model, task, cfg, paths=sharded)
    assert calls == [3] and parts.frame.equals(whole.frame)
    f = parts.frame.set_index(["role", "layer", "head"])
    assert f.score["ioi:s-inhibition", 0, 2] == 1.0
