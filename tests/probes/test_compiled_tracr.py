"""Compiled tracr models on the in-house backend: the forward equals tracr's, the truth read off the
compiler, the distractors. Skipped without the ``tracr`` extra; three fast programs compile once per
session (cached under ``$HEADSCOPE_CACHE``/``~/.cache/headscope``; every program is checked by
``make validate``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tracr", reason="needs the tracr extra: pip install 'headscope[tracr]'")

from headscope.analyses.validation.tracr import ValidateConfig, validate_model  # noqa: E402
from headscope.probes.models.compiled.cache import cached_export  # noqa: E402
from headscope.probes.models.compiled.check import forward_error  # noqa: E402
from headscope.probes.models.compiled.distractors import DISTRACTORS, N_EXTRA  # noqa: E402
from headscope.probes.models.compiled.loader import load_export  # noqa: E402
from headscope.probes.models.compiled.programs import settings  # noqa: E402

#: causal (previous-token) and bidirectional (SelectorWidth, an MLP, duplicate-token); numerical outputs
#: (frac_prevs, pair_balance) are checked by make validate (tests/analyses/test_validate_tracr_figures.py)
FAST = ("shift_by", "hist")


@pytest.fixture(scope="session")
def exports():
    return {name: cached_export(settings(name)[0]) for name in FAST}


@pytest.mark.parametrize("name", FAST)
@pytest.mark.parametrize("distractors", [False, True])
def test_forward_equals_tracr_at_every_layer_and_output(exports, name, distractors):
    cm = load_export(exports[name], distractors=distractors)
    check = forward_error(cm)
    assert check.max_error <= 1e-5 and check.decoded_equal and check.n_inputs >= 4
    assert cm.model.spec.causal == settings(name)[0].causal


def test_truth_is_read_off_the_compiler(exports):
    (shift,) = exports["shift_by"]["heads"]
    assert (shift["layer"], shift["keys"], shift["queries"], shift["predicate"]) == (0, "indices", "indices", "custom")
    assert shift["relation"] == "k == q - 1" and shift["used"] and not shift["always_bos"]
    (hist,) = exports["hist"]["heads"]
    assert (hist["kind"], hist["keys"], hist["queries"], hist["predicate"]) == (
        "SelectorWidth",
        "tokens",
        "tokens",
        "EQ",
    )
    assert hist["relation"] == "k == q" and hist["always_bos"] and exports["hist"]["mlps"]
    truth = load_export(exports["shift_by"]).truth
    compiled = truth[truth["kind"] == "compiled"]
    assert compiled[["layer", "head", "role", "used"]].values.tolist() == [[0, 0, "previous-token", True]]
    assert truth.loc[truth["kind"] != "compiled", "used"].eq(False).all()


def _patterns(cm, ids):
    net = cm.model.module
    kept = {}
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(net.cfg.n_layers)]
    from headscope.probes.models.inhouse.hooks import hooks

    def keep(name):
        def fn(x, _name=None):
            kept[name] = x.detach()
            return x

        return fn

    with torch.inference_mode(), hooks((net.hook_points[n], keep(n)) for n in names):
        net(ids, need_pattern=True)
    return [kept[n][0] for n in names]  # [head, query_pos, key_pos] per layer


def test_distractors_are_real_negatives(exports):
    plain, cm = load_export(exports["hist"], distractors=False), load_export(exports["hist"])
    net, h = cm.model.module, plain.model.module.cfg.n_heads
    d = plain.model.module.cfg.d_model
    assert net.cfg.d_model == d + N_EXTRA and net.cfg.n_heads == h + len(DISTRACTORS)
    dh = net.cfg.d_head
    for block in net.blocks:
        o = block.attn.o_proj.weight.view(net.cfg.d_model, net.cfg.n_heads, dh)
        q = block.attn.q_proj.weight.view(net.cfg.n_heads, dh, net.cfg.d_model)
        assert bool(o[:d, h:].eq(0).all()) and bool(o[d:, h:].abs().sum((0, 2)).gt(0).all())  # they write only extras
        assert bool(q[h:].abs().sum((1, 2)).gt(0).all())  # non-zero weights
    ids = torch.tensor([cm.encode(["a", "b", "a", "c", "b"])])
    pattern = _patterns(cm, ids)[0]
    prev = pattern[h + 1]  # the previous-token distractor: row i on key i - 1 (the first token on BOS)
    assert torch.allclose(prev[1:].argmax(-1), torch.arange(5)) and float(prev[1:].max(-1).values.min()) > 0.99
    dup = pattern[h + 2]  # the duplicate-token distractor: query "a" at 3 on the two "a"s
    assert abs(float(dup[3, 1] + dup[3, 3]) - 1.0) < 1e-4
    with torch.inference_mode():
        assert torch.equal(cm.model.module(ids)[..., :4], plain.model.module(ids)[..., :4])


def test_validation_finds_the_compiled_previous_token_head(exports):
    cm = load_export(exports["shift_by"])
    table, facts = validate_model(cm, ValidateConfig(n_texts=24, n_items=16, n_boot=100, n_perm=200))
    assert facts["n_items"] == 16 and facts["metric"] == "logprob"
    row = table.set_index(["layer", "head"]).loc[(0, 0)]
    assert "positional:previous" in row["verdicts"].split(",") and row["why"] == ""
    assert row["effect:activation_denoising"] == pytest.approx(1.0, abs=1e-4)
    others = table[(table["layer"] != 0) | (table["head"] != 0)]
    assert others["effect:activation_denoising"].abs().max() < 1e-4  # distractors move nothing


def test_weights_the_loader_does_not_read_are_one_line_naming_the_layer(exports):
    from headscope.probes.errors import ModelIncompatibleError

    export = dict(exports["hist"])
    weights = dict(export["weights"])
    up = weights["transformer/layer_0/mlp/linear_1"]
    weights["transformer/layer_0/mlp/linear_1"] = torch.zeros(up.shape[0], up.shape[1] + 1)  # a wider hidden layer
    export["weights"] = weights
    with pytest.raises(ModelIncompatibleError, match=r"^layer 0: MLP shapes .* are not read"):
        load_export(export)
