"""Qwen2 (``qwen2``): Llama with biases on q, k and v (not on o), fixed in its code; the layers
from ``max_window_layers`` on slide when ``use_sliding_window``."""

from __future__ import annotations

from headscope.probes.models.families._common import LLAMA_LIKE, family

FAMILY = family(LLAMA_LIKE, model_type="qwen2", attention_bias=True, o_bias=False, reads=frozenset())
