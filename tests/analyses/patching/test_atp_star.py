"""AtP*'s corrections (``PatchConfig.atp_fix``) on planted circuits where plain attribution
patching fails the way Kramár et al. (2024) describe.

* QK-fix: the planted induction head (1, 1) saturates on its match (a logit gap of 30), so at
  the clean run the gradient through its keys is ~0 and the previous-token head (0, 0), whose
  whole noising effect runs through those keys, gets ~0 from the plain estimate. The QK-fix
  recomputes (1, 1)'s pattern exactly and gives (0, 0) its activation-patching effect.
* GradDrop: a head whose direct effect on the metric a later head cancels exactly gets ~0 from
  the plain gradient; GradDrop (the gradient through the cancelling layer dropped) gives the
  magnitude of its direct effect, measured here by a forward with the later layer frozen.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from headscope.analyses.patching import PatchConfig, activation_patching, attribution_patching
from headscope.analyses.patching.activation import capture_z, patch_units, readout
from headscope.analyses.patching.atp_star import atp_star_estimates
from headscope.analyses.patching.attribution import z_gradients
from headscope.analyses.patching.items import PairItem, Task
from headscope.analyses.patching.tasks import induction_task
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.inhouse.planted import (
    D_HEAD,
    D_MODEL,
    N_POS,
    SHARP,
    VOCAB,
    _layout,
    planted_model,
    writing_induction,
)

CFG = PatchConfig(n_perm=200, n_boot=50)
FREE = D_MODEL - 2  # a residual dimension no planted head reads (the last one carries BIAS)
BIAS = 20.0  # a constant residual component: the final RMSNorm then barely depends on what the heads write


def _saturated_circuit():
    """The planted induction circuit, (1, 1) writing weakly, every residual carrying a constant
    ``BIAS`` in its last dimension (the norms' weights follow it, so every planted pattern is as
    built): metrics read through the final RMSNorm are then nearly linear in the heads' writes,
    and what is left of attribution's error is (1, 1)'s saturated softmax."""
    model = writing_induction(planted_model(), 1.0)
    mod = model.module
    with torch.no_grad():
        mod.pos_embed.weight[:, D_MODEL - 1] = BIAS
        for layer, block in enumerate(mod.blocks):
            block.ln1.weight.fill_(((2.0 + layer + BIAS**2) / D_MODEL) ** 0.5)
    return model


def _logit_diff_induction(model, n_items=12):
    task = induction_task(model.tokenizer, n_items=n_items, seq_len=8, seed=0)
    items = [PairItem(it.clean, it.corrupted, it.answer, it.clean[2]) for it in task.items]
    return Task(name="induction_logit_diff", items=items, metric="logit_diff", source=task.source)


@pytest.fixture(scope="module")
def saturated():
    model = _saturated_circuit()
    task = _logit_diff_induction(model)
    act, _ = activation_patching(model, task, CFG)
    att = {fix: attribution_patching(model, task, dataclasses.replace(CFG, atp_fix=fix))[0] for fix in ("none", "qk")}
    return act, att


def _effect(frame, method, head):
    return float(frame[frame["method"] == method].set_index(["layer", "head"])["effect"][head])


def test_qk_fix_recovers_the_effect_a_saturated_head_hides(saturated):
    act, att = saturated
    real = _effect(act, "activation_noising", (0, 0))
    plain = _effect(att["none"], "attribution_noising", (0, 0))
    fixed = _effect(att["qk"], "attribution_qk_fix_noising", (0, 0))
    assert real == pytest.approx(1.0, abs=0.01)  # (0, 0) carries the whole gap, through (1, 1)'s keys
    assert abs(plain) < 0.01  # ... and the saturated softmax passes the gradient none of it
    assert fixed == pytest.approx(real, abs=0.01)
    # denoising (the corrupted run, (1, 1) not saturated): the fix still moves the estimate onto the effect
    real_d = _effect(act, "activation_denoising", (0, 0))
    assert _effect(att["qk"], "attribution_qk_fix_denoising", (0, 0)) == pytest.approx(real_d, abs=1e-3)
    assert abs(_effect(att["none"], "attribution_denoising", (0, 0)) - real_d) > 0.04
    # (1, 1) itself has no later layer: the fix leaves its estimate as it is
    assert _effect(att["qk"], "attribution_qk_fix_noising", (1, 1)) == pytest.approx(
        _effect(att["none"], "attribution_noising", (1, 1)), abs=1e-5
    )
    assert set(att["qk"]["definition"].str.contains("QK-fix")) == {True}


def test_qk_fix_tends_to_the_gradient_for_a_small_step():
    """A finite-difference check of the correction: for ``Δz`` scaled by ε the exact pattern
    change is a finite difference of the pattern, and it tends to the gradient's first-order
    term the fix takes out, so fixed / ε − plain / ε shrinks like ε (float64 model; the
    softmax stays float32, so ε stays ≥ 1e-3)."""
    from headscope.analyses.patching.tasks import metric_fn

    model = _saturated_circuit()
    model.module.double()
    task = _logit_diff_induction(model, 4)
    clean, corrupted, answer, wrong, _ = next(task.batches(4))
    metric = metric_fn("logit_diff")
    _, z_x = capture_z(model, corrupted)
    _, z_c = capture_z(model, clean)
    units = patch_units(model.spec)
    _, grads = z_gradients(model, corrupted, metric, answer, wrong)
    gaps = []
    for eps in (1e-2, 1e-3):
        dz = {l: eps * (z_c[l] - z_x[l]) for l in z_c}
        fixed = atp_star_estimates(model, corrupted, dz, metric, answer, wrong, units, "qk", 64) / eps
        plain = torch.stack([sum((dz[l][:, h] * grads[l][:, h]).sum((1, 2)) for l, h in u) for u in units], 1) / eps
        gaps.append(float((fixed - plain).abs().max()))
    assert float(plain.abs().max()) > 0.1  # the estimates have something to compare
    assert gaps[1] < 2e-3 * float(plain.abs().max())
    assert 5 < gaps[0] / gaps[1] < 20  # first-order convergence: the fix changes only the remainder


def _cancelling_circuit():
    """(0, 3) attends uniformly and writes a random read of the earlier tokens into ``FREE``,
    which the metric reads (the logit of [UNK], whose embedding gets a 1 there); (1, 3)
    attends each position to itself (saturated) and writes the negative of ``FREE``: (0, 3)'s
    direct effect and its effect through (1, 3) cancel."""
    model = _saturated_circuit()
    mod, unk = model.module, model.tokenizer.convert_tokens_to_ids("[UNK]")
    gen, v = torch.Generator().manual_seed(3), len(VOCAB)
    _, first_pos, _ = _layout()
    with torch.no_grad():
        mod.embed.weight[unk, FREE] = 1.0
        a0, a1 = mod.blocks[0].attn, mod.blocks[1].attn
        s = slice(3 * D_HEAD, 4 * D_HEAD)
        a0.q_proj.weight[s] = 0.0  # uniform over the earlier tokens
        a0.v_proj.weight[s] = 0.0
        a0.v_proj.weight[s][:v, :v] = torch.eye(v)  # the token block
        a0.o_proj.weight[:, s] = 0.0
        a0.o_proj.weight[FREE, s] = torch.randn(D_HEAD, generator=gen)
        a1.q_proj.weight[s] = 0.0
        a1.k_proj.weight[s] = 0.0
        for i in range(N_POS):
            a1.q_proj.weight[s][i, first_pos + i] = SHARP
            a1.k_proj.weight[s][i, first_pos + i] = 1.0
        a1.v_proj.weight[s] = 0.0
        a1.v_proj.weight[s][N_POS, FREE] = 1.0
        a1.o_proj.weight[:, s] = 0.0
        a1.o_proj.weight[FREE, 3 * D_HEAD + N_POS] = -1.0
    return model, unk


def test_graddrop_sees_the_direct_effect_a_later_head_cancels():
    model, unk = _cancelling_circuit()
    task = _logit_diff_induction(model, 8)
    clean, corrupted, answer, wrong, _ = next(task.batches(8))

    def metric(logits, answer, wrong):
        return logits[:, unk].float()

    _, z_c = capture_z(model, clean)
    _, z_x = capture_z(model, corrupted)
    units = patch_units(model.spec)
    dz = {l: z_c[l] - z_x[l] for l in z_c}
    dropped = atp_star_estimates(model, corrupted, dz, metric, answer, wrong, units, "graddrop", 64)
    _, grads = z_gradients(model, corrupted, metric, answer, wrong)
    plain = (dz[0][:, 3] * grads[0][:, 3]).sum((1, 2))  # (0, 3)'s plain estimate per item
    i = units.index([(0, 3)])

    def run(fns):
        with torch.no_grad(), model.head_hooks(fns):
            return metric(readout(model, corrupted), None, None)

    base = run({})
    patched = run({0: lambda z: torch.cat([z[:, :3], z_c[0][:, 3:4]], 1)})
    direct = run({0: lambda z: torch.cat([z[:, :3], z_c[0][:, 3:4]], 1), 1: lambda z: z_x[1]}) - base
    assert direct.abs().max() > 0.1  # (0, 3) moves the metric directly ...
    assert (patched - base).abs().max() < 1e-2 * direct.abs().max()  # ... and (1, 3) takes it back
    assert plain.abs().max() < 1e-2 * direct.abs().max()  # the plain gradient sees the cancellation only
    torch.testing.assert_close(dropped[:, i], direct.abs(), rtol=1e-2, atol=1e-4)
    # a last-layer head: no later layer to drop, GradDrop is |the plain estimate|
    j = units.index([(1, 1)])
    assert dropped[:, j] == pytest.approx((dz[1][:, 1] * grads[1][:, 1]).sum((1, 2)).abs(), rel=1e-4, abs=1e-6)


def test_atp_fix_is_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match="atp_fix must be"):
        PatchConfig(atp_fix="qkv")
    with pytest.raises(ValueError, match="corrects the total-gradient"):
        PatchConfig(atp_fix="qk", gradient="bypass_heads")
    with pytest.raises(ValueError, match="corrects the total-gradient"):
        PatchConfig(atp_fix="graddrop", per_position=True)


def test_qk_fix_refuses_a_post_norm_model():
    from headscope.analyses.patching.atp_star import check_atp_model

    model = planted_model(causal=False)
    model.module.cfg = dataclasses.replace(model.module.cfg, post_norm=True)
    with pytest.raises(ModelIncompatibleError, match="post-norm"):
        check_atp_model(model, "qk")
    check_atp_model(model, "graddrop")  # GradDrop only detaches outputs: any layout


def test_cli_atp_fix_names_the_estimate_in_the_table(tmp_path, monkeypatch, capsys):
    import json

    import headscope.probes.models.loading as loading
    from headscope.reports.cli.app import main
    from headscope.reports.runs import read_frame

    model = _saturated_circuit()
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: model)
    model.backend_choice = "inhouse (test)"
    out = tmp_path / "patch"
    args = ["patch", "planted", "--task", "induction", "--n-items", "4", "--seq-len", "6", "--out", str(out)]
    assert (
        main(
            [*args, "--method", "activation", "attribution", "--atp-fix", "both", "--direction", "denoising", "--json"]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    frame = read_frame(out / "patch.parquet")
    attribution = frame[frame["method"].str.startswith("attribution")]
    assert set(attribution["method"]) == {"attribution_qk_fix_graddrop_denoising"}
    assert (
        attribution["definition"].str.contains("QK-fix").all()
        and attribution["definition"].str.contains("GradDrop").all()
    )
    assert (attribution["effect"] >= 0).all()  # GradDrop's figures are magnitudes
    assert summary["config"]["patch"]["atp_fix"] == "both" and summary["agreement"]["denoising"]["n_heads"] == 8
    assert main([*args, "--method", "attribution", "--atp-fix", "qk", "--per-position"]) == 2
    assert "corrects the total-gradient" in capsys.readouterr().err
