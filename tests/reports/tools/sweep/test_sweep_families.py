"""Families the registry sweep found failing on the hf backend, each checked on its tiny model (built from
transformers' own config class by the sweep) against HF eager loaded independently from the same folder:
the patterns (≤ 1e-5) and, through the head hooks, each layer's heads.

* ALBERT shares one layer across its layers: no list held a module per layer ("cannot find its list of
  2 layers") and no hook could tell one layer's heads from another's.
* LiLT splits its hidden size into six layout embeddings: at the tiny width 64 they held 60 features
  and its forward failed ("mat1 and mat2 shapes cannot be multiplied (32x60 and 64x16)").
* MiniMax records its lightning (linear-attention) layers' KV state as their "attentions": every block
  seemed to hold attention, no output projection was common to all and hf refused it; its softmax
  layers (the config's ``layer_types``) are now its attention layers, as in any hybrid.
* LongCat-Flash runs two attention modules per block (``self_attn[0]``, ``self_attn[1]``: own heads, own
  residual, KV cache layers ``2 × layer + i``) and HF returns a pattern for each: 4 patterns for 2 layers,
  so no candidate could be checked. Each attention module is now one layer (4 here).
* ZAYA's CCA projection returns ``(query, key, value)``: the check read the first tensor of a tuple
  only, never saw V, and refused ``o_proj`` (err 1.2).
* ConvBERT's output projection takes its heads concatenated with its span-based convolution's outputs
  (2 × heads × d_head): no map took heads × d_head alone ("cannot find the attention output projection");
  the heads are the first heads × d_head features of its input.

The families that stay out say why in words (``probes/models/unsupported.py``), raised where it is
detected: transformers returns no pattern or none shaped ``[batch, head, query, key]`` (BigBird's blocks:
``IndexError: tuple index out of range``; MRA: ``TypeError: 'NoneType' object is not subscriptable``;
Pegasus-X's dicts: ``AttributeError: 'dict' object has no attribute 'float'``), or a bridge without attention hooks that auto chose and
whose capture then failed (JetMoE, HRM, DeepSeek-V4).
* FSMT's encoder has no ``get_input_embeddings`` (``AttributeError``) and its layers run time-major
  (``[position, batch, features]``): its embedding is found as its first ``nn.Embedding`` and its heads
  are read batch first.
* Longformer returns scores over a window of keys per query (``[batch, head, query, window + 1]``) and pads
  its hidden states to a multiple of the window: capture passed, roles broke with an internal error
  ("The size of tensor a (513) must match the size of tensor b (40)"). The window's scores are laid out as
  the ``[query, key]`` pattern they are (0 outside the window) and the heads read at the input's positions."""

from __future__ import annotations

import pytest
import torch
import transformers

from headscope.probes.models.hf_layout import unbanded
from headscope.probes.models.loading import load_model
from headscope.reports.tools.sweep.tiny_config import save_tiny

TEXTS = ["The cat sat on the mat because it was warm.", "Heads attend."]


def _tiny(family, tmp_path_factory):
    return save_tiny(family, tmp_path_factory.mktemp(family) / "m")[1]


def _eager(folder, klass="AutoModel"):
    return getattr(transformers, klass).from_pretrained(str(folder), attn_implementation="eager").eval()


def _same_patterns(ours: dict, theirs, layers, rows):
    for l, theirs_l in zip(layers, theirs, strict=True):
        diff = float((ours["pattern", l] - theirs_l).abs().permute(0, 2, 1, 3)[rows].max())
        assert diff <= 1e-5, (l, diff)


@pytest.fixture(scope="module")
def albert(tmp_path_factory):
    return _tiny("albert", tmp_path_factory)


def test_albert_shared_layer_is_read_once_per_layer(albert):
    model = load_model(str(albert))
    assert model.backend == "hf"
    rec = model.head_modules
    assert rec["attn_out"] == "encoder.albert_layer_groups.{layer}.albert_layers.0.attention.dense"
    assert rec["check"].startswith("pattern×V max err")
    ref = _eager(albert)
    assert len(ref.encoder.albert_layer_groups) == 1  # one shared layer, applied at each of the 2 layers
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n_params(model.hf) == n_params(ref)  # the per-layer modules hold the same parameters: none copied
    batch = model.encode(TEXTS)
    ours = model.run(batch, ("pattern", "z"))
    with torch.no_grad():
        res = ref(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    _same_patterns(ours, res.attentions, range(2), batch.attention_mask.bool())
    assert (ours["z", 0] - ours["z", 1]).abs().max() > 1e-3  # each layer's own heads, not one module's last call

    # head 2 of layer 1 zeroed through the hook = zeroed in the shared dense's input at its 2nd call only
    layer, head, d = 1, 2, model.spec.d_head
    keep = torch.ones(model.spec.n_heads)
    keep[head] = 0.0
    with model.head_hooks({layer: lambda z: z * keep[None, :, None, None]}), torch.inference_mode():
        hooked = model.forward(batch.input_ids, batch.attention_mask)
    calls = []

    def zero_second_call(module, args):
        calls.append(1)
        if len(calls) == layer + 1:
            x = args[0].clone()
            x[..., head * d : (head + 1) * d] = 0.0
            return (x,)

    dense = ref.encoder.albert_layer_groups[0].albert_layers[0].attention.dense
    handle = dense.register_forward_pre_hook(zero_second_call)
    with torch.inference_mode():
        zeroed = ref(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    handle.remove()
    assert len(calls) == 2 and (hooked - zeroed).abs().max() <= 1e-5
    assert (zeroed - res.last_hidden_state).abs().max() > 1e-4  # the head mattered


def _out(res):
    return res.logits if "logits" in res else res.last_hidden_state


def _heads_equal_hf_eager(
    folder, o_path, klass="AutoModel", blocks=None, layer=1, zeroed_path=None, encoder=False, check="pattern×V max err"
):
    """The default backend's patterns equal HF eager's (``blocks``: the blocks of a hybrid's attention
    layers, whose patterns HF gives among the others'); zeroing head 2 (or the last) of ``layer`` through the head hook
    equals zeroing that head's input columns of the output projection (``o_path``; ``zeroed_path``: its
    path in that layer, where ``o_path`` is no format string) in HF eager."""
    model = load_model(str(folder))
    assert model.backend == "hf" and model.head_modules["attn_out"] == o_path
    assert model.head_modules["check"].startswith(check)
    ref = _eager(folder, klass)
    ref = ref.get_encoder() if encoder else ref  # an encoder-decoder: its encoder, as the hf backend keeps
    batch = model.encode(TEXTS)
    ours = model.run(batch, ("pattern", "z"))
    args = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    if klass == "AutoModelForCausalLM":
        args["use_cache"] = False
    with torch.no_grad():
        res = ref(**args, output_attentions=True)
    theirs = unbanded(res.attentions, getattr(getattr(ref, "config", None), "attention_window", None))  # Longformer
    theirs = theirs if blocks is None else [theirs[b] for b in blocks]
    _same_patterns(ours, theirs, range(model.spec.n_layers), batch.attention_mask.bool())
    head, d = min(2, model.spec.n_heads - 1), model.spec.d_head
    keep = torch.ones(model.spec.n_heads)
    keep[head] = 0.0
    with model.head_hooks({layer: lambda z: z * keep[None, :, None, None]}), torch.inference_mode():
        hooked = model.forward(batch.input_ids, batch.attention_mask)
    with torch.no_grad():
        block = layer if blocks is None else blocks[layer]
        dict(ref.named_modules())[zeroed_path or o_path.format(layer=block)].weight[:, head * d : (head + 1) * d] = 0.0
        zeroed = _out(ref(**args))
    assert (hooked - zeroed).abs().max() <= 1e-5
    assert (zeroed - _out(res)).abs().max() > 1e-4  # the head mattered
    return model


def test_lilt_takes_a_width_its_six_layout_embeddings_split(tmp_path_factory):
    folder = _tiny("lilt", tmp_path_factory)
    model = _heads_equal_hf_eager(folder, "encoder.layer.{layer}.attention.output.dense")
    assert (model.spec.d_model, model.spec.n_heads, model.spec.d_head) == (96, 4, 24)


def test_minimax_lightning_layers_are_no_attention_layers(tmp_path_factory):
    folder = _tiny("minimax", tmp_path_factory)
    model = _heads_equal_hf_eager(folder, "model.layers.{layer}.self_attn.o_proj", "AutoModelForCausalLM", [0], 0)
    rec = model.head_modules
    assert rec["attention_blocks"] == [0] and rec["blocks_without_attention"] == [1]


def test_longcat_flash_two_attention_modules_per_block_are_two_layers(tmp_path_factory):
    folder = _tiny("longcat_flash", tmp_path_factory)
    model = _heads_equal_hf_eager(
        folder,
        "model.layers.{layer // 2}.self_attn.{layer % 2}.o_proj",
        "AutoModelForCausalLM",
        zeroed_path="model.layers.0.self_attn.1.o_proj",  # layer 1: block 0's second attention module
    )
    assert model.spec.n_layers == 4
    with pytest.raises(ValueError, match="several attention layers per block"):
        model.run(model.encode(TEXTS), ("resid_post",))


def test_zaya_v_is_read_from_a_projection_returning_query_key_value(tmp_path_factory):
    folder = _tiny("zaya", tmp_path_factory)
    model = _heads_equal_hf_eager(folder, "model.layers.{layer}.self_attn.o_proj", "AutoModelForCausalLM")
    # V read from the third tensor of the projection's (query, key, value): pattern x V is o_proj's input
    assert float(model.head_modules["check"].split()[-1]) <= 1e-5


@pytest.mark.parametrize(
    "family, why",
    [
        (
            "big_bird",
            "block-sparse attention (window, random and global key blocks): no [query, key] pattern "
            "(transformers returns no attention pattern for it",
        ),
        ("mra", "multi-resolution approximate attention: no softmax pattern is computed (transformers returns no"),
        (
            "pegasus_x",
            "block-local attention with global tokens: local and global score blocks, no [query, key] "
            "pattern (output_attentions gives dict patterns",
        ),
    ],
)
def test_no_query_key_pattern_is_a_clear_error_at_capture(family, why, tmp_path_factory, capsys):
    from headscope.reports.cli.app import main

    folder = _tiny(family, tmp_path_factory)
    assert main(["capture", str(folder), "--quantities", "pattern", "--json"]) == 2
    err = capsys.readouterr().err
    assert f"headscope: error: '{folder.name}' ({family}): {why}" in err, err


def test_a_time_major_attention_is_read_batch_first(tmp_path_factory):
    """FSMT's encoder layers run [position, batch, features] (fairseq's order): the head hooks read that as
    [batch, position, …] (its output projection's input is turned, and turned back after a head hook)."""
    folder = _tiny("fsmt", tmp_path_factory)
    model = _heads_equal_hf_eager(folder, "layers.{layer}.self_attn.out_proj", encoder=True)
    assert model.head_modules["layout"].startswith("its layers hold [position, batch, features]")
    batch = model.encode(TEXTS)
    got = model.run(batch, ("z", "resid_post"))
    assert got["z", 0].shape == (2, 4, batch.input_ids.shape[1], 16)
    assert got["resid_post", 1].shape == (2, batch.input_ids.shape[1], 64)


def test_auto_rejects_a_bridge_without_attention_hooks(tmp_path_factory):
    """transformer-lens wraps JetMoE but has no blocks.0.attn.hook_z: auto chose the bridge and every stage
    after card failed on the missing hook; the bridge is now rejected at load, saying so."""
    model = load_model(str(_tiny("jetmoe", tmp_path_factory)))
    assert model.backend == "hf"
    bridge = next(r["reason"] for r in model.backend_rejected if r["backend"] == "bridge")
    assert "mixture of attention heads" in bridge and "no per-head attention hooks" in bridge


def test_convbert_heads_are_the_first_part_of_its_mixed_output(tmp_path_factory):
    folder = _tiny("convbert", tmp_path_factory)
    model = _heads_equal_hf_eager(folder, "encoder.layer.{layer}.attention.output.dense")
    assert model.head_modules["heads_part"].startswith("the input's first 32 features")
    batch = model.encode(TEXTS)
    assert model.run(batch, ("z",))["z", 0].shape[1:] == (2, batch.input_ids.shape[1], 16)  # 2 heads of 16


def test_longformer_window_scores_are_laid_out_as_query_key_patterns(tmp_path_factory):
    """Longformer returns each query's scores over a window of keys ``[batch, head, query, window + 1]`` and
    pads its hidden states to a multiple of the window: the patterns are laid out as ``[query, key]`` (0
    outside the window) and the heads read at the input's positions alone."""
    folder = _tiny("longformer", tmp_path_factory)
    model = load_model(str(folder))
    batch = model.encode(TEXTS)
    n = batch.input_ids.shape[1]
    got = model.run(batch, ("pattern", "z"))
    assert got["pattern", 0].shape == (2, 4, n, n) and got["z", 0].shape == (2, 4, n, 16)
    ref = _eager(folder)
    with torch.no_grad():
        raw = ref(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True).attentions
    w = ref.config.attention_window
    band, full = raw[0], unbanded(raw, w)[0]
    q, k = 3, 5
    assert band.shape[-1] == w[0] + 1 and full[0, 1, q, k] == band[0, 1, q, k - q + w[0] // 2]
    # found by name; its V runs time-major over the padded positions, no shape the check reads
    _heads_equal_hf_eager(folder, "encoder.layer.{layer}.attention.output.dense", check="shape only: V not capturable")
