"""Qwen3 (``qwen3``): Llama with an RMSNorm over ``d_head`` on each query and key head, before RoPE."""

from __future__ import annotations

from headscope.probes.models.families._common import LLAMA_LIKE, family

FAMILY = family(LLAMA_LIKE, model_type="qwen3", qk_norm=True)
