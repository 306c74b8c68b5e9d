"""Mistral (``mistral``): Llama with a sliding window; its attention has no biases (fixed in its code)."""

from __future__ import annotations

from headscope.probes.models.families._common import LLAMA_LIKE, family

FAMILY = family(LLAMA_LIKE, model_type="mistral", reads=frozenset())
