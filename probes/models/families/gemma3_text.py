"""Gemma 3's text model (``gemma3_text``): Gemma 2 with QK-norm, no attention soft-capping, every
6th layer global, and its own RoPE base on the sliding layers. The multimodal ``gemma3`` is read
alike but runs only through hf / bridge."""

from __future__ import annotations

from headscope.probes.models.families._common import family
from headscope.probes.models.families.gemma2 import GEMMA_LIKE

FAMILY = family(
    GEMMA_LIKE,
    model_type="gemma3_text",
    qk_norm=True,
    sliding_pattern=6,
    aliases={"gemma3": "the multimodal Gemma 3 (model_type 'gemma3'; its text model 'gemma3_text' is covered)"},
    reads=frozenset({"attention_bias", "final_softcap", "query_pre_attn_scalar", "rope_local_theta"}),
)
