"""OLMo 2 (``olmo2``), through hf / bridge only: RoPE, QK-norm over the whole projection (not per
head, which the in-house stack does not implement), norms after attention and MLP only."""

from __future__ import annotations

from headscope.probes.models.families.base import Family

FAMILY = Family(model_type="olmo2", inhouse=False, positional="rope", qk_norm=True)
