"""What families share: the BERT-style encoder's and the Llama-style decoder's defaults and
tensor names, as keyword sets a family file starts from (:func:`family`).

>>> family(LLAMA_LIKE, model_type="toy").options()["mlp"]
'gated'
"""

from __future__ import annotations

from typing import Any

from headscope.probes.models.families.base import Family

#: the in-house defaults and HF tensors every BERT-style encoder shares
ENCODER: dict[str, Any] = dict(
    encoder=True,
    causal=False,
    positional="learned",
    norm="layernorm",
    post_norm=True,
    mlp="plain",
    activation="gelu",
    attention_bias=True,
    mlp_bias=True,
    default_norm_eps=1e-12,
    hf_drop=("pooler.*", "cls.*", "lm_head.*", "vocab_*", "*position_ids"),
)
#: HF BERT / RoBERTa -> in-house, applied in order
BERT_NAMES = (
    ("embeddings.word_embeddings.", "embed."),
    ("embeddings.position_embeddings.", "pos_embed."),
    ("embeddings.token_type_embeddings.", "type_embed."),
    ("embeddings.LayerNorm.", "embed_ln."),
    ("encoder.layer.", "blocks."),
    ("attention.self.query.", "attn.q_proj."),
    ("attention.self.key.", "attn.k_proj."),
    ("attention.self.value.", "attn.v_proj."),
    ("attention.output.dense.", "attn.o_proj."),
    ("attention.output.LayerNorm.", "ln1."),
    ("intermediate.dense.", "mlp.up."),
    ("output.dense.", "mlp.down."),
    ("output.LayerNorm.", "ln2."),
)
#: BERT and RoBERTa: their tensor names and HF modules
BERT_LIKE: dict[str, Any] = dict(
    ENCODER,
    hf_names=BERT_NAMES,
    attn_out="attention.output.dense",
    qkv=("attention.self.query", "attention.self.key", "attention.self.value"),
)
#: HF Llama and its kin (Mistral, Qwen2/3, Phi-3 after splitting, Gemma 2/3) -> in-house, in order
LLAMA_NAMES = (
    ("model.embed_tokens.", "embed."),
    ("model.layers.", "blocks."),
    ("self_attn.", "attn."),
    ("input_layernorm.", "ln1."),
    ("post_attention_layernorm.", "ln2."),
    ("mlp.gate_proj.", "mlp.gate."),
    ("mlp.up_proj.", "mlp.up."),
    ("mlp.down_proj.", "mlp.down."),
    ("model.norm.", "ln_final."),
    ("lm_head.", "unembed."),
)
#: the rotary tables a decoder checkpoint may hold (recomputed in-house)
DECODER_DROP = ("*rotary_emb.inv_freq",)
#: the in-house defaults of a Llama-style decoder, its tensor names and HF modules
LLAMA_LIKE: dict[str, Any] = dict(
    causal=True,
    positional="rope",
    norm="rmsnorm",
    post_norm=False,
    mlp="gated",
    activation="silu",
    attention_bias=False,
    mlp_bias=False,
    default_max_positions=2048,
    hf_drop=DECODER_DROP,
    hf_base="model.",
    hf_names=LLAMA_NAMES,
)


def encoder_prefixes(model_type: str) -> tuple[tuple[str, str], ...]:
    """An encoder's tensor prefixes dropped: its own (``bert.`` in a ``BertForMaskedLM``) and ``model.``."""
    return ((f"{model_type}.", ""), ("model.", ""))


def family(template: dict[str, Any], **own: Any) -> Family:
    """The :class:`Family` of ``template``'s fields, with the family's ``own`` fields over them."""
    return Family(**{**template, **own})
