"""What the registry sweep found in :func:`~headscope.probes.models.arch.arch_from_hf_config`: configs that
spell their sizes with their own keys (T5's ``num_layers`` / ``num_heads`` / ``d_kv`` / ``d_ff``, MPT's and
XLM's ``n_layers`` / ``n_heads``, ChatGLM's ``multi_query_group_num``) were refused as having "no
layer/head/hidden-size fields", so ``card`` and every stage after it failed on them."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from headscope.probes.models.arch import arch_from_hf_config


def test_t5_sizes_are_read_from_its_own_keys():
    cfg = AutoConfig.for_model("t5", d_model=64, num_layers=3, num_heads=4, d_kv=8, d_ff=96, vocab_size=600)
    a = arch_from_hf_config(cfg.to_dict(), "t5")
    assert (a.n_layers, a.d_model, a.n_heads, a.n_kv_heads, a.d_head, a.d_mlp) == (3, 64, 4, 4, 8, 96)


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({"n_layers": 2, "d_model": 64, "n_heads": 4}, (2, 64, 4, 4, 16)),  # MPT / XLM style
        (  # ChatGLM style: KV groups and a head size of their own
            {
                "num_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "multi_query_group_num": 2,
                "kv_channels": 16,
            },
            (2, 64, 4, 2, 16),
        ),
    ],
)
def test_other_spellings_of_the_sizes(keys, expected):
    a = arch_from_hf_config({"model_type": "some_decoder", **keys}, "config")
    assert (a.n_layers, a.d_model, a.n_heads, a.n_kv_heads, a.d_head) == expected


def test_the_usual_keys_win_over_the_aliases():
    a = arch_from_hf_config(
        {
            "model_type": "some_decoder",
            "num_hidden_layers": 2,
            "num_layers": 9,
            "hidden_size": 64,
            "num_attention_heads": 4,
        },
        "config",
    )
    assert a.n_layers == 2


@pytest.mark.parametrize("mtype", ["clip_text_model", "yoso", "bros"])
def test_a_type_with_no_causal_lm_class_is_an_encoder(mtype):
    """transformers has no AutoModelForCausalLM class for these: read as decoders, the hf backend loaded
    them with it and failed ("Unrecognized configuration class ... AutoModelForCausalLM")."""
    cfg = AutoConfig.for_model(mtype, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
    assert arch_from_hf_config(cfg.to_dict(), mtype).encoder


@pytest.mark.parametrize("mtype", ["olmo2", "some_decoder_transformers_does_not_know"])
def test_a_decoder_stays_a_decoder(mtype):
    a = arch_from_hf_config({"model_type": mtype, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4})
    assert not a.encoder


def test_convbert_attends_with_its_heads_over_head_ratio():
    """ConvBERT's attention has num_attention_heads // head_ratio heads, each d_model / num_attention_heads
    wide (the rest of the width is its span-based convolution): read as 4 heads, roles refused the
    patterns' shape ("values must be [n_items, n_layers*n_heads] = [n, 8]; got shape (1, 4)")."""
    cfg = AutoConfig.for_model("convbert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_ratio=2)
    a = arch_from_hf_config(cfg.to_dict(), "convbert")
    assert (a.n_heads, a.n_kv_heads, a.d_head, a.encoder) == (2, 2, 16, True)


@pytest.mark.parametrize("mtype", ["xlm", "xglm", "trocr", "prophetnet", "flaubert"])
def test_more_spellings_found_by_the_sweep(mtype):
    """XLM/FlauBERT's emb_dim, XGLM's attention_heads, TrOCR's decoder_layers, ProphetNet's
    num_encoder_layers: each refused as having no layer/head/hidden-size fields before."""
    a = arch_from_hf_config(AutoConfig.for_model(mtype).to_dict(), mtype)
    assert a.n_layers > 0 and a.d_model > 0 and a.n_heads > 0 and a.d_model % a.n_heads == 0
