"""StarCoder2 (``starcoder2``), through hf / bridge only: RoPE, a sliding window, LayerNorm, a
plain GELU(tanh) MLP (``c_fc``/``c_proj``) and biases switched by ``use_bias``."""

from __future__ import annotations

from headscope.probes.models.families.base import Family

FAMILY = Family(model_type="starcoder2", inhouse=False, positional="rope")
