"""GPT-2 (``gpt2``): a causal decoder with learned positions, pre-LayerNorm blocks, a GELU(tanh)
MLP and biases everywhere. Its ``Conv1D`` weights are ``[in, out]`` (transposed on loading), its
``c_attn`` holds q, k, v in that order; ``scale_attn_weights`` and
``scale_attn_by_inverse_layer_idx`` must stay at their defaults."""

from __future__ import annotations

from headscope.probes.models.families._common import DECODER_DROP, LLAMA_LIKE, family
from headscope.probes.models.families.base import Fused
from headscope.probes.models.families.gguf_record import GGUF

FAMILY = family(
    LLAMA_LIKE,
    model_type="gpt2",
    positional="learned",
    norm="layernorm",
    mlp="plain",
    activation="gelu_new",
    attention_bias=True,
    mlp_bias=True,
    default_norm_eps=1e-5,
    default_max_positions=1024,
    reads=frozenset(),
    fixed_options={"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False},
    # GPT2LMHeadModel: "transformer.h.0.…"; GPT2Model and hub files: "h.0.…"
    hf_base="",  # its prefixes below take either layout
    hf_prefixes=(("transformer.", ""), ("h.", "blocks.")),
    hf_drop=(*DECODER_DROP, "*.attn.bias", "*.attn.masked_bias"),  # the causal-mask buffers
    hf_fused=(
        Fused(suffix="attn.c_attn", into=("q_proj", "k_proj", "v_proj"), conv1d=True),
        Fused(suffix="attn.c_proj", conv1d=True),
        Fused(suffix="mlp.c_fc", conv1d=True),
        Fused(suffix="mlp.c_proj", conv1d=True),
    ),
    hf_names=(
        ("wte.", "embed."),
        ("wpe.", "pos_embed."),
        ("ln_1.", "ln1."),
        ("ln_2.", "ln2."),
        ("attn.c_proj.", "attn.o_proj."),
        ("mlp.c_fc.", "mlp.up."),
        ("mlp.c_proj.", "mlp.down."),
        ("ln_f.", "ln_final."),
        ("lm_head.", "unembed."),
    ),
    attn_out="attn.c_proj",
    qkv=None,
    gguf=GGUF(arch="gpt2", hf_class="GPT2LMHeadModel", common_layout=True, positions=True),
)
