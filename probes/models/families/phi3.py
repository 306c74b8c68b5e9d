"""Phi-3 (``phi3``): Llama whose fused ``qkv_proj`` and ``gate_up_proj`` are split on loading
(``[q + k + v, d_model]``; ``[2 * d_mlp, d_model]``, gate first as its ``chunk(2)``); no
attention biases (fixed in its code)."""

from __future__ import annotations

from headscope.probes.models.families._common import LLAMA_LIKE, family
from headscope.probes.models.families.base import Fused
from headscope.probes.models.families.gguf_record import GGUF

FAMILY = family(
    LLAMA_LIKE,
    model_type="phi3",
    reads=frozenset(),
    hf_fused=(
        Fused(suffix="attn.qkv_proj", into=("q_proj", "k_proj", "v_proj")),
        Fused(suffix="mlp.gate_up_proj", into=("gate_proj", "up_proj")),
    ),
    qkv=None,
    gguf=GGUF(arch="phi3", hf_class="Phi3ForCausalLM", common_layout=True, ffn_up_blocks=2),  # ffn_up: gate and up
)
