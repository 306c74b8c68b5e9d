"""Llama (``llama``: SmolLM2, Llama 3): a causal decoder returning logits: RoPE, pre-RMSNorm
blocks, a SwiGLU MLP, grouped-query attention when ``n_kv_heads < n_heads``. Its config must
give every size (an even ``d_head``: RoPE rotates pairs); ``mlp_bias`` must stay off."""

from __future__ import annotations

from headscope.probes.errors import CheckpointError
from headscope.probes.models.families._common import LLAMA_LIKE, family
from headscope.probes.models.families.gguf_record import GGUF


def _check_sizes(hf: dict, where: str) -> None:
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    d_head = hf.get("head_dim") or d_model // n_heads
    if d_head < 1:
        raise CheckpointError(
            f"{where}: num_attention_heads={n_heads} exceeds hidden_size={d_model} (d_head would be 0); "
            "fix one of them or set head_dim"
        )
    if d_head % 2:
        raise CheckpointError(f"{where}: head_dim {d_head} is odd; RoPE rotates pairs of dimensions")


FAMILY = family(
    LLAMA_LIKE,
    model_type="llama",
    label="Llama",
    fixed_options={"mlp_bias": False},
    required_sizes=("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"),
    optional_sizes=("num_key_value_heads", "head_dim", "max_position_embeddings"),
    check_sizes=_check_sizes,
    # llama.cpp's d_head is the rotated width; the defaults the in-house reader has always applied
    gguf=GGUF(
        arch="llama",
        hf_class="LlamaForCausalLM",
        required=("attention.head_count", "feed_forward_length"),
        rope_dim_is_head_dim=True,
        vocab_required=True,
        defaults=(("max_position_embeddings", 2048), ("rope_theta", 10000.0), ("rms_norm_eps", 1e-6)),
        rope_freqs=True,
        common_layout=True,
    ),
)
