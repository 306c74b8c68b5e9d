"""Gemma 2 (``gemma2``): Llama with ``(1 + w)`` RMSNorms before *and* after attention and MLP,
a GELU(tanh)-gated MLP, embeddings × sqrt(d_model), ``query_pre_attn_scalar``, alternating
sliding / global layers (every 2nd global), soft-capped attention scores and final logits."""

from __future__ import annotations

from typing import Any

from headscope.probes.models.families._common import LLAMA_LIKE, LLAMA_NAMES, family

#: sandwich norms: HF's post_attention_layernorm is the attention OUTPUT's norm
GEMMA_NAMES = (
    ("post_attention_layernorm.", "ln1_post."),
    ("pre_feedforward_layernorm.", "ln2."),
    ("post_feedforward_layernorm.", "ln2_post."),
) + tuple(p for p in LLAMA_NAMES if p[0] != "post_attention_layernorm.")
#: what Gemma 2 and 3 share
GEMMA_LIKE: dict[str, Any] = dict(
    LLAMA_LIKE,
    rms_offset=True,
    sandwich_norm=True,
    activation="gelu_pytorch_tanh",
    scaled_embeddings=True,
    hf_names=GEMMA_NAMES,
)

FAMILY = family(
    GEMMA_LIKE,
    model_type="gemma2",
    sliding_pattern=2,
    reads=frozenset({"attention_bias", "attn_softcap", "final_softcap", "query_pre_attn_scalar", "rope_local_theta"}),
)
