"""Attention variants on the hf backend (#25 part 4), each on a tiny random model built from
transformers' own config class and loaded with the default backend: relative position bias
(MPNet; T5, an encoder–decoder checkpoint whose encoder is analysed; BART's encoder, learned
positions, for an encoder–decoder with no encoder-only class), disentangled attention (DeBERTa-v2), ALiBi (BLOOM, Falcon with ``alibi``), partial
rotary (GPT-NeoX ``rotary_pct``, Phi ``partial_rotary_factor``), parallel attention + MLP (GPT-J,
Falcon ``parallel_attn``).

For each: the patterns equal those of an HF eager model loaded independently from the same
folder (≤ 1e-5); ``z`` at the head hook equals pattern × V, V read here from the family's own
value projection (or its slice of the fused QKV); and zeroing a head through the hook equals
zeroing that head's columns of the output projection's weight in the independent model."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import tokenizer

from headscope.probes.models.loading import load_model

TEXTS = ["The cat sat on the mat .", "A dog ran to the park and back ."]
SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
H, D = 4, 16


def _split_heads(t, n):  # [b, pos, n × d] -> [b, pos, n, d]
    return t.view(*t.shape[:2], n, -1)


def _fused_per_head(t):  # [b, pos, head × (q, k, v) × d]: BLOOM, GPT-NeoX, Falcon without multi-query
    return t.view(*t.shape[:2], H, 3, D)[..., 2, :]


#: case -> (model_type, encoder?, config options, (V module path with {layer}, V [b, pos, kv, d] from its output),
#: output projection path with {layer})
VARIANTS = {
    "mpnet": (
        "mpnet",
        True,
        {},
        ("encoder.layer.{layer}.attention.attn.v", lambda t: _split_heads(t, H)),
        "encoder.layer.{layer}.attention.attn.o",
    ),
    "t5": (  # an encoder–decoder checkpoint: its encoder's self-attention (relative bias) is analysed
        "t5",
        True,
        dict(d_model=64, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=16, d_ff=128),
        ("encoder.block.{layer}.layer.0.SelfAttention.v", lambda t: _split_heads(t, H)),
        "encoder.block.{layer}.layer.0.SelfAttention.o",
    ),
    "bart": (  # an encoder–decoder with no encoder-only class: loaded whole, its encoder kept and analysed
        "bart",
        True,
        dict(
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=128,
        ),
        ("layers.{layer}.self_attn.v_proj", lambda t: _split_heads(t, H)),
        "layers.{layer}.self_attn.out_proj",
    ),
    "deberta-v2": (
        "deberta-v2",
        True,
        dict(
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=16,
            max_relative_positions=32,
            position_biased_input=False,
        ),
        ("encoder.layer.{layer}.attention.self.value_proj", lambda t: _split_heads(t, H)),
        "encoder.layer.{layer}.attention.output.dense",
    ),
    "bloom": (
        "bloom",
        False,
        {},
        ("transformer.h.{layer}.self_attention.query_key_value", _fused_per_head),
        "transformer.h.{layer}.self_attention.dense",
    ),
    "falcon:alibi": (
        "falcon",
        False,
        dict(alibi=True, new_decoder_architecture=False, multi_query=False, parallel_attn=False, bias=True),
        ("transformer.h.{layer}.self_attention.query_key_value", _fused_per_head),
        "transformer.h.{layer}.self_attention.dense",
    ),
    "gpt_neox:partial_rotary": (
        "gpt_neox",
        False,
        dict(rotary_pct=0.25),
        ("gpt_neox.layers.{layer}.attention.query_key_value", _fused_per_head),
        "gpt_neox.layers.{layer}.attention.dense",
    ),
    "phi:partial_rotary": (
        "phi",
        False,
        dict(partial_rotary_factor=0.5),
        ("model.layers.{layer}.self_attn.v_proj", lambda t: _split_heads(t, H)),
        "model.layers.{layer}.self_attn.dense",
    ),
    "gptj:parallel": (
        "gptj",
        False,
        dict(rotary_dim=8),
        ("transformer.h.{layer}.attn.v_proj", lambda t: _split_heads(t, H)),
        "transformer.h.{layer}.attn.out_proj",
    ),
    "falcon:parallel": (  # multi-query: [q heads | k | v], one KV head
        "falcon",
        False,
        dict(parallel_attn=True, new_decoder_architecture=False, multi_query=True),
        ("transformer.h.{layer}.self_attention.query_key_value", lambda t: t[..., -D:].unsqueeze(2)),
        "transformer.h.{layer}.self_attention.dense",
    ),
}


def variant_dir(root, case):
    """A tiny random model of ``case`` saved with a small tokenizer under ``root``; returns the folder."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    model_type, encoder, options, _, _ = VARIANTS[case]
    out = root / case.replace(":", "_")
    if (out / "config.json").exists():
        return out
    tok = tokenizer(encoder)
    seq2seq = model_type in ("t5", "bart")
    sizes = {} if seq2seq else dict(SIZES, max_position_embeddings=128)
    kw = dict(sizes, vocab_size=len(tok), pad_token_id=tok.pad_token_id, **options)
    if not encoder:
        kw.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    cfg = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(0)
    klass = AutoModelForSeq2SeqLM if seq2seq else AutoModel if encoder else AutoModelForCausalLM
    model = klass.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():  # weights large enough for peaked patterns
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def variants_root(tmp_path_factory):
    return tmp_path_factory.mktemp("variants")


def _eager(folder, encoder):
    """The independent reference: HF eager straight from the folder (T5: ``T5EncoderModel``; BART: the
    encoder of ``BartModel``)."""
    from transformers import AutoModel, AutoModelForCausalLM, T5EncoderModel

    model_type = json.loads((folder / "config.json").read_text(encoding="utf-8"))["model_type"]
    if model_type == "bart":
        return AutoModel.from_pretrained(str(folder), attn_implementation="eager").get_encoder().eval()
    klass = T5EncoderModel if model_type == "t5" else AutoModel if encoder else AutoModelForCausalLM
    return klass.from_pretrained(str(folder), attn_implementation="eager").eval()


def _forward(hf, batch, encoder, **kw):
    with torch.inference_mode():
        if encoder:
            res = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **kw)
            return res, res.last_hidden_state
        res = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **kw)
        return res, res.logits


@pytest.mark.parametrize("case", list(VARIANTS))
def test_patterns_and_head_hooks_equal_hf_eager(case, variants_root):
    _, encoder, _, (v_path, v_of), o_path = VARIANTS[case]
    folder = variant_dir(variants_root, case)
    model = load_model(str(folder))
    assert model.backend == "hf", model.backend_choice
    assert model.head_modules["attn_out"] == o_path and model.head_modules["check"].startswith("pattern×V")
    batch = model.encode(TEXTS)
    got = model.run(batch, ("pattern", "z"))

    ref = _eager(folder, encoder)
    modules = dict(ref.named_modules())  # the same class as the loaded model's: the same paths
    v_out = {}
    handles = [
        modules[v_path.format(layer=l)].register_forward_hook(lambda m, a, o, l=l: v_out.__setitem__(l, o.detach()))
        for l in range(2)
    ]
    res, plain = _forward(ref, batch, encoder, output_attentions=True)
    for h in handles:
        h.remove()
    for l in range(2):
        pattern = res.attentions[l]
        assert (got["pattern", l] - pattern).abs().max() <= 1e-5, (case, l)
        v = v_of(v_out[l]).repeat_interleave(H // v_of(v_out[l]).shape[2], dim=2)  # [b, pos, heads, d]
        z = torch.einsum("bhqk,bkhd->bhqd", pattern, v)
        assert got["z", l].shape == z.shape and (got["z", l] - z).abs().max() <= 1e-5, (case, l)

    layer, head = 1, 2
    keep = torch.ones(H)
    keep[head] = 0.0
    with model.head_hooks({layer: lambda z: z * keep[None, :, None, None]}):
        with torch.inference_mode():
            hooked = model.forward(batch.input_ids, batch.attention_mask)
    with torch.no_grad():  # nn.Linear weight [out, in]: the head's input columns
        modules[o_path.format(layer=layer)].weight[:, head * D : (head + 1) * D] = 0.0
    zeroed = _forward(ref, batch, encoder)[1]
    assert (hooked - zeroed).abs().max() <= 1e-5, case
    assert (zeroed - plain).abs().max() > 1e-4  # the head mattered


#: the done-when's tiny models: ALiBi, relative bias, disentangled, partial rotary
REPORTED = ("bloom", "mpnet", "deberta-v2", "gpt_neox:partial_rotary")


@pytest.mark.parametrize("case", REPORTED)
def test_report_runs_on_the_default_backend(case, variants_root, tmp_path):
    """``report`` with the default backend (auto) completes on each variant (the smallest inputs
    the report takes, as tests/reports/test_families_report.py runs it): roles for every head,
    pruning curves, run.json naming hf and the head modules found; the patterns of the model it
    loads equal HF eager's ≤ 1e-5."""
    import pandas as pd

    from headscope.analyses.pruning.study import PruneConfig
    from headscope.analyses.roles.pipeline import default_text
    from headscope.reports.pipeline import build_report
    from headscope.reports.stages.quick import QUICK_STUDIES

    folder = variant_dir(variants_root, case)
    text = tmp_path / "text.txt"
    text.write_text("".join(open(default_text(), encoding="utf-8").readlines()[:24]), encoding="utf-8")
    out = tmp_path / "report"
    build_report(
        str(folder),
        out_dir=out,
        quiet=True,
        role_groups=("positional", "special"),
        role_inputs={"text": str(text)},
        prune_config=PruneConfig(quick=True, n_items=8, ablation_modes=("zero",), studies=QUICK_STUDIES),
    )
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["backend"] == "hf", run["backend_choice"]
    assert not set(run["absent"]) & {"roles", "pruning", "patching"}, run["absent"]  # the head stages all ran
    assert run["head_modules"]["attn_out"] == VARIANTS[case][4]
    assert run["head_modules"]["check"].startswith("pattern×V max err ")
    roles = pd.read_csv(out / "tables" / "roles.csv")
    assert len(roles[["layer", "head"]].drop_duplicates()) == 2 * H
    assert {"curve:importance", "curve:ablation"} <= set(pd.read_csv(out / "tables" / "prune_curves.csv")["study"])
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "pruning_curves" in html and "The pruning studies did not run" not in html

    model, encoder = load_model(str(folder)), VARIANTS[case][1]
    batch = model.encode(TEXTS)
    got = model.run(batch, ("pattern",))
    res, _ = _forward(_eager(folder, encoder), batch, encoder, output_attentions=True)
    for l in range(2):
        assert (got["pattern", l] - res.attentions[l]).abs().max() <= 1e-5, (case, l)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["deberta-v2"])  # one (about 20 s); the four run in-process above
def test_report_cli_with_default_flags(case, variants_root, tmp_path):
    """``headscope report DIR`` exactly as a user types it (default flags: auto, quick, patching on)."""
    from headscope.reports.cli.app import main

    out = tmp_path / "report"
    assert main(["report", str(variant_dir(variants_root, case)), "--out", str(out), "--quiet"]) == 0
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["backend"] == "hf" and run["config"]["pruning"]["quick"] is True
    assert not set(run["absent"]) & {"roles", "pruning", "patching"}, run["absent"]
    assert run["head_modules"]["check"].startswith("pattern×V max err ")


def test_an_encoder_saved_alone_loads_as_one(variants_root, tmp_path):
    """A T5 encoder saved alone (``T5EncoderModel``: its config says ``is_encoder_decoder`` false) loads
    the same encoder; an encoder–decoder with no encoder-only class is left to the config reader."""
    from transformers import T5EncoderModel

    from headscope.probes.models.backends.hf import _encoder_only

    folder = variant_dir(variants_root, "t5")
    alone = tmp_path / "t5_encoder"
    T5EncoderModel.from_pretrained(str(folder)).save_pretrained(alone)
    tokenizer(True).save_pretrained(alone)
    from headscope.probes.models.arch import arch_from_hf_config

    full, enc = load_model(str(folder)), load_model(str(alone))
    for d in (folder, alone):  # the card reads it as what is analysed: an encoder
        assert arch_from_hf_config(json.loads((d / "config.json").read_text(encoding="utf-8"))).encoder
    assert enc.backend == "hf" and enc.spec.causal is False and enc.head_modules == full.head_modules
    batch = full.encode(TEXTS)
    a, b = full.run(batch, ("pattern", "z")), enc.run(batch, ("pattern", "z"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not _encoder_only({"model_type": "bart", "is_encoder_decoder": True})  # BART: its decoder (BartForCausalLM)
