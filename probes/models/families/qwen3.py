"""Qwen3 (``qwen3``): Llama with an RMSNorm over ``d_head`` on each query and key head, before RoPE."""

from __future__ import annotations

from headscope.probes.models.families._common import LLAMA_LIKE, family
from headscope.probes.models.families.gguf_record import GGUF
from headscope.probes.models.families.qwen2 import gguf_sliding

FAMILY = family(
    LLAMA_LIKE,
    model_type="qwen3",
    qk_norm=True,
    gguf=GGUF(arch="qwen3", hf_class="Qwen3ForCausalLM", common_layout=True, config_names=gguf_sliding),
)
