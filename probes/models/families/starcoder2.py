"""StarCoder2 (``starcoder2``), through hf / bridge only: RoPE, a sliding window, LayerNorm, a
plain GELU(tanh) MLP (``c_fc``/``c_proj``) and biases switched by ``use_bias``."""

from __future__ import annotations

from headscope.probes.models.families.base import Family
from headscope.probes.models.families.gguf_record import GGUF

FAMILY = Family(
    model_type="starcoder2",
    inhouse=False,
    positional="rope",
    gguf=GGUF(arch="starcoder2", hf_class="Starcoder2ForCausalLM", common_layout=True),
)
