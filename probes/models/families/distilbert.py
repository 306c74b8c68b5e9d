"""DistilBERT (``distilbert``): BERT without token types, under its own tensor and config names."""

from __future__ import annotations

from headscope.probes.models.families._common import ENCODER, encoder_prefixes, family

FAMILY = family(
    ENCODER,
    model_type="distilbert",
    token_types=False,
    config_names={
        "n_layers": "num_hidden_layers",
        "dim": "hidden_size",
        "n_heads": "num_attention_heads",
        "hidden_dim": "intermediate_size",
        "activation": "hidden_act",
    },
    hf_prefixes=encoder_prefixes("distilbert"),
    hf_names=(
        ("embeddings.word_embeddings.", "embed."),
        ("embeddings.position_embeddings.", "pos_embed."),
        ("embeddings.LayerNorm.", "embed_ln."),
        ("transformer.layer.", "blocks."),
        ("attention.q_lin.", "attn.q_proj."),
        ("attention.k_lin.", "attn.k_proj."),
        ("attention.v_lin.", "attn.v_proj."),
        ("attention.out_lin.", "attn.o_proj."),
        ("sa_layer_norm.", "ln1."),
        ("ffn.lin1.", "mlp.up."),
        ("ffn.lin2.", "mlp.down."),
        ("output_layer_norm.", "ln2."),
    ),
    attn_out="attention.out_lin",
    qkv=("attention.q_lin", "attention.k_lin", "attention.v_lin"),
)
