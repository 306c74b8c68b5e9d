"""The GGUF architectures transformers reads (``GGUF_CONFIG_MAPPING`` in
``transformers/integrations/ggml.py``) that are no family here: their :class:`GGUF` records, read
alike (sizes checked, config built for the hf and bridge backends, the card). A family with GGUF
support holds its own record (``Family.gguf``) instead; one that gains a family file moves there.

>>> sorted({r.model_type for r in GGUF_ONLY if r.named})
['umt5']
"""

from __future__ import annotations

from functools import partial

from headscope.probes.models.families.gemma2 import gguf_names
from headscope.probes.models.families.gguf_record import GGUF
from headscope.probes.models.families.qwen2 import gguf_sliding

__all__ = ["GGUF_ONLY"]


def _falcon_names(hf: dict, get, arch: str, n_heads: int | None) -> None:
    """FalconConfig's own names; its head_dim is derived, not set."""
    n_kv = hf.pop("num_key_value_heads")
    hf.pop("head_dim", None)
    hf.update(num_kv_heads=n_kv, multi_query=n_kv == 1, new_decoder_architecture=n_kv not in (1, n_heads))
    if "intermediate_size" in hf:
        hf["ffn_hidden_size"] = hf.pop("intermediate_size")


#: by llama.cpp's ``general.architecture``; transformers' loader renames the same way
#: (``qwen2moe`` → ``qwen2_moe``, a ``t5`` file named UMT5 → ``umt5``, …)
GGUF_ONLY: tuple[GGUF, ...] = (
    GGUF(
        arch="qwen2moe",
        model_type="qwen2_moe",
        hf_class="Qwen2MoeForCausalLM",
        spelled="qwen2_moe",
        common_layout=True,
        config_names=gguf_sliding,
    ),
    GGUF(
        arch="qwen3moe",
        model_type="qwen3_moe",
        hf_class="Qwen3MoeForCausalLM",
        spelled="qwen3_moe",
        common_layout=True,
        config_names=gguf_sliding,
    ),
    GGUF(arch="gpt-oss", model_type="gpt_oss", hf_class="GptOssForCausalLM", spelled="gpt_oss"),
    GGUF(arch="lfm2", model_type="lfm2", hf_class="Lfm2ForCausalLM", kv_heads_zero_off_attention=True),
    GGUF(
        arch="falcon",
        model_type="falcon",
        hf_class="FalconForCausalLM",
        tied=True,
        common_layout=True,
        config_names=_falcon_names,
    ),
    GGUF(arch="bloom", model_type="bloom", hf_class="BloomForCausalLM", tied=True, common_layout=True),
    GGUF(arch="t5", model_type="t5", hf_class="T5ForConditionalGeneration"),
    GGUF(arch="t5encoder", model_type="t5", hf_class="T5EncoderModel"),
    GGUF(arch="", model_type="umt5", hf_class="UMT5ForConditionalGeneration", files_under=("t5",), named="umt5"),
    GGUF(arch="", model_type="umt5", hf_class="UMT5EncoderModel", files_under=("t5encoder",), named="umt5"),
    GGUF(arch="stablelm", model_type="stablelm", hf_class="StableLmForCausalLM", common_layout=True),
    GGUF(arch="mamba", model_type="mamba", hf_class="MambaForCausalLM", required=(), zero_sizes_unused=True),
    GGUF(arch="nemotron", model_type="nemotron", hf_class="NemotronForCausalLM", common_layout=True),
    GGUF(
        arch="gemma4",
        model_type="gemma4_text",
        hf_class="Gemma4ForCausalLM",
        config_names=partial(gguf_names, every=6, layers_27b=None),
        over_reader=("layer_types",),
    ),
    GGUF(arch="deci", model_type="deci", hf_class="DeciLMForCausalLM"),  # remote code on the hub (Nemotron-51B)
    GGUF(arch="minimax-m2", model_type="minimax_m2", hf_class="MiniMaxM2ForCausalLM", spelled="minimax_m2"),
)
