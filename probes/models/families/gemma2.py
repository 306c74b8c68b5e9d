"""Gemma 2 (``gemma2``): Llama with ``(1 + w)`` RMSNorms before *and* after attention and MLP,
a GELU(tanh)-gated MLP, embeddings × sqrt(d_model), ``query_pre_attn_scalar``, alternating
sliding / global layers (every 2nd global), soft-capped attention scores and final logits."""

from __future__ import annotations

from functools import partial
from typing import Any

from headscope.probes.models.families._common import LLAMA_LIKE, LLAMA_NAMES, family
from headscope.probes.models.families.gguf_record import GGUF

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
#: what transformers' GGUF reader leaves at Gemma's config defaults although the file says otherwise
GEMMA_OVER_READER = ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "layer_types")


def gguf_names(hf: dict, get, arch: str, n_heads: int | None, *, every: int, layers_27b: int | None) -> None:
    """A Gemma GGUF's sliding / global layers (``layer_types``: the file's ``sliding_window_pattern``,
    a list of one flag per layer or every n-th global, else every ``every``-th global) and its
    query scale (:func:`gguf_query_pre_attn_scalar`; ``layers_27b`` None: none read)."""
    if "sliding_window" in hf:
        pattern = hf.pop("sliding_window_pattern", None)
        n = hf["num_hidden_layers"]
        slides = (
            [bool(p) for p in pattern]
            if isinstance(pattern, list) and len(pattern) == n
            else [bool((i + 1) % (pattern if isinstance(pattern, int) and pattern > 0 else every)) for i in range(n)]
        )
        hf["layer_types"] = ["sliding_attention" if s else "full_attention" for s in slides]
    if layers_27b is not None:
        hf["query_pre_attn_scalar"] = gguf_query_pre_attn_scalar(get(f"{arch}.attention.scale"), layers_27b, hf)


def gguf_query_pre_attn_scalar(scale, layers_27b: int, hf: dict) -> float:
    """Gemma's ``query_pre_attn_scalar``, which llama.cpp's GGUF files do not store: an
    ``attention.scale`` in the metadata where there is one (scalar = scale⁻²), else what
    llama.cpp derives: d_model / heads on the 27B model (``layers_27b`` layers; ``llama-model.cpp``),
    d_head on the others (Gemma 2 2B/9B, Gemma 3 1B/4B/12B: 256, as their HF configs say)."""
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0:
        value = round(float(scale) ** -2, 3)
    elif hf["num_hidden_layers"] == layers_27b:
        value = hf["hidden_size"] / hf["num_attention_heads"]
    else:
        value = float(hf["head_dim"])
    return int(value) if float(value).is_integer() else value


FAMILY = family(
    GEMMA_LIKE,
    model_type="gemma2",
    sliding_pattern=2,
    reads=frozenset({"attention_bias", "attn_softcap", "final_softcap", "query_pre_attn_scalar", "rope_local_theta"}),
    gguf=GGUF(
        arch="gemma2",
        hf_class="Gemma2ForCausalLM",
        common_layout=True,
        config_names=partial(gguf_names, every=2, layers_27b=46),
        over_reader=GEMMA_OVER_READER,
    ),
)
