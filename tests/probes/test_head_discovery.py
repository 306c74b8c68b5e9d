"""The heads found by structure (#25 part 1): in each layer's block, the linear map inside the
attention taking ``n_heads × d_head`` to ``d_model``, confirmed on a probe input by pattern × V
reproducing its input head by head; names are a fast path checked the same way; run.json says
which module was found and how (``head_modules``).

Real module layouts, tiny and random: an MPNet encoder (its projection ``attention.attn.o``, a
name in no list), a Llama whose projection is renamed, and one whose known name is a decoy (the
query projection, same shape) that fails the check."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import FAMILIES, tiny_hf_model, tiny_model_dir, tiny_mpnet, tokenizer

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.backends.protocol import spec_from_arch
from headscope.probes.models.hf_layout import find_layout

TEXTS = ["The cat sat on the mat .", "A dog ran to the park .", "She gave him the book .", "It was warm today ."]


def _spec(hf, name):
    return spec_from_arch(arch_from_hf_config(hf.config.to_dict(), name), name, "hf")


def _mpnet():
    tok = tokenizer(True)
    return tiny_mpnet(tok).eval(), tok


def _rename(parent: torch.nn.Module, old: str, new: str) -> None:
    """Register ``parent.old`` under ``new`` (what ``named_modules`` lists) while the family's
    forward keeps reaching it as ``parent.old``."""
    mod = parent._modules.pop(old)
    parent._modules[new] = mod
    object.__setattr__(parent, old, mod)


def _mha_llama():
    """A tiny Llama with 4 query and 4 KV heads of 16 on d_model 64: Q, K, V and O all map 64 -> 64."""
    return tiny_hf_model("llama", num_key_value_heads=4)[0]


def test_mpnet_projection_named_o_is_found_by_shape():
    hf, _ = _mpnet()
    layout = find_layout(hf, _spec(hf, "mpnet"))
    names = {id(m): n for n, m in hf.named_modules()}
    assert [names[id(m)] for m in layout.attn_out] == [f"encoder.layer.{l}.attention.attn.o" for l in range(2)]
    rec = layout.record()
    assert rec["attn_out"] == "encoder.layer.{layer}.attention.attn.o" and rec["found_by"] == "shape"
    assert rec["check"].startswith("pattern×V max err ") and float(rec["check"].split()[-1]) <= 1e-5


def test_a_renamed_projection_is_found_by_shape_and_the_hooks_use_it():
    hf = _mha_llama()
    for layer in hf.model.layers:
        _rename(layer.self_attn, "o_proj", "mixer_out")
    layout = find_layout(hf, _spec(hf, "llama"))
    assert layout.record()["attn_out"] == "model.layers.{layer}.self_attn.mixer_out"
    assert layout.found_by == "shape"  # q/k/v_proj have the same shape; only mixer_out passes the check
    assert all(m is layer.self_attn.o_proj for m, layer in zip(layout.attn_out, hf.model.layers))


def test_a_decoy_of_a_known_name_fails_the_check():
    """The query projection registered as ``self_attn.o_proj`` (the name fast path) and the real
    projection as ``mixer_out``: the name's candidate fails pattern × V and the real one is kept."""
    hf = _mha_llama()
    for layer in hf.model.layers:
        _rename(layer.self_attn, "o_proj", "mixer_out")
        _rename(layer.self_attn, "q_proj", "o_proj")
    layout = find_layout(hf, _spec(hf, "llama"))
    assert layout.record()["attn_out"] == "model.layers.{layer}.self_attn.mixer_out"
    assert layout.found_by == "shape" and layout.check.startswith("pattern×V max err ")
    assert all(m is layer.self_attn.__dict__["o_proj"] for m, layer in zip(layout.attn_out, hf.model.layers))


def test_none_passing_is_one_line_naming_what_was_tried():
    """A transform between the heads and the projection that moves each head's output into the
    next head's slice: no candidate's input is pattern × V, so the hooks would not see the heads."""
    hf = tiny_hf_model("llama")[0]  # GQA: only o_proj has the heads' shape
    for layer in hf.model.layers:
        layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a: (a[0].roll(16, dims=-1),))
    with pytest.raises(ModelIncompatibleError) as e:
        find_layout(hf, _spec(hf, "llama"))
    msg = str(e.value)
    assert "\n" not in msg and "pattern × V" in msg and "model.layers.{layer}.self_attn.o_proj (err " in msg


def test_a_positive_gate_after_the_heads_is_kept_shape_only_and_says_so():
    """Each head's pattern × V scaled by a positive gate before the projection (as Beam's and
    AFMoE's sigmoid gates, Granite SWA's sink scale): every head's slice is still that head's, so
    the projection is kept, recorded as shape only with why."""
    hf = tiny_hf_model("llama")[0]
    gate = torch.sigmoid(torch.randn(4 * 16, generator=torch.Generator().manual_seed(0)))
    for layer in hf.model.layers:
        layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a: (a[0] * gate,))
    layout = find_layout(hf, _spec(hf, "llama"))
    assert layout.record()["attn_out"] == "model.layers.{layer}.self_attn.o_proj"
    assert layout.check.startswith("shape only: a per-head transform after pattern × V"), layout.check


def test_where_no_pattern_is_returned_the_shape_decides_and_says_so():
    hf = tiny_hf_model("llama")[0]
    layout = find_layout(hf, _spec(hf, "llama"), probe=lambda m: None)
    assert layout.found_by == "name" and layout.check.startswith("shape only: the model returns no attention pattern")
    odd = find_layout(hf, _spec(hf, "llama"), probe=lambda m: ({"local": None}, {"global": None}))
    assert odd.check.startswith("shape only: output_attentions gives no [batch, head, query, key] pattern per layer")
    mha = _mha_llama()
    for layer in mha.model.layers:
        _rename(layer.self_attn, "o_proj", "mixer_out")  # four candidates of one shape, none by name
    with pytest.raises(
        ModelIncompatibleError, match=r"4 modules take heads × d_head to d_model .* none can be checked"
    ):
        find_layout(mha, _spec(mha, "llama"), probe=lambda m: None)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_tiny_family_keeps_its_named_projection_and_passes_the_check(family):
    hf, _ = tiny_hf_model(family)
    layout = find_layout(hf, _spec(hf, family))
    assert layout.found_by == "name", layout.record()
    assert layout.check.startswith("pattern×V max err ") and float(layout.check.split()[3]) <= 1e-5


def test_minilm_on_hf_finds_the_same_module(minilm_hf):
    rec = minilm_hf.head_modules
    assert rec["attn_out"] == "encoder.layer.{layer}.attention.output.dense" and rec["found_by"] == "name"
    assert rec["check"].startswith("pattern×V max err ")
    names = {id(m): n for n, m in minilm_hf.hf.named_modules()}
    assert [names[id(m)] for m in minilm_hf.layout.attn_out] == [
        f"encoder.layer.{l}.attention.output.dense" for l in range(6)
    ]


def test_run_json_records_the_head_modules(tmp_path):
    from headscope.reports.cli.app import main

    hf, tok = _mpnet()
    src = tmp_path / "mpnet"
    hf.save_pretrained(src)
    tok.save_pretrained(src)
    text = tmp_path / "t.txt"
    text.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["roles", str(src), "--roles", "positional", "--text", str(text), "--out", str(out), "--quiet"]) == 0
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["backend"] == "hf"
    heads = run["head_modules"]
    assert heads["attn_out"] == "encoder.layer.{layer}.attention.attn.o" and heads["found_by"] == "shape"
    assert heads["check"].startswith("pattern×V max err ")
    inhouse = tmp_path / "bert_roles"
    assert main(["roles", str(tiny_model_dir(tmp_path, "bert")), "--roles", "positional", "--text", str(text)]
                + ["--out", str(inhouse), "--quiet"]) == 0  # fmt: skip
    assert json.loads((inhouse / "run.json").read_text(encoding="utf-8"))["head_modules"] is None
