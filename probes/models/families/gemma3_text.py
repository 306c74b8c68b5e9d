"""Gemma 3's text model (``gemma3_text``): Gemma 2 with QK-norm, no attention soft-capping, every
6th layer global, and its own RoPE base on the sliding layers. The multimodal ``gemma3`` is read
alike but runs only through hf / bridge."""

from __future__ import annotations

from functools import partial

from headscope.probes.models.families._common import family
from headscope.probes.models.families.gemma2 import GEMMA_LIKE, GEMMA_OVER_READER, gguf_names
from headscope.probes.models.families.gguf_record import GGUF

FAMILY = family(
    GEMMA_LIKE,
    model_type="gemma3_text",
    qk_norm=True,
    sliding_pattern=6,
    aliases={"gemma3": "the multimodal Gemma 3 (model_type 'gemma3'; its text model 'gemma3_text' is covered)"},
    reads=frozenset({"attention_bias", "final_softcap", "query_pre_attn_scalar", "rope_local_theta"}),
    # llama.cpp's architecture "gemma3" is this text model; its sliding layers have their own RoPE base
    gguf=GGUF(
        arch="gemma3",
        hf_class="Gemma3ForCausalLM",
        common_layout=True,
        config_names=partial(gguf_names, every=6, layers_27b=62),
        rope_per_layer_type=True,
        over_reader=GEMMA_OVER_READER,
    ),
)
