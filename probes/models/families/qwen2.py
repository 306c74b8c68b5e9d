"""Qwen2 (``qwen2``): Llama with biases on q, k and v (not on o), fixed in its code; the layers
from ``max_window_layers`` on slide when ``use_sliding_window``."""

from __future__ import annotations

from headscope.probes.models.families._common import LLAMA_LIKE, family
from headscope.probes.models.families.gguf_record import GGUF


def gguf_sliding(hf: dict, get, arch: str, n_heads: int | None) -> None:
    """A Qwen GGUF slides where it gives a window (``use_sliding_window``; Qwen2, Qwen3 and their MoE kin)."""
    hf["use_sliding_window"] = "sliding_window" in hf


FAMILY = family(
    LLAMA_LIKE,
    model_type="qwen2",
    attention_bias=True,
    o_bias=False,
    reads=frozenset(),
    gguf=GGUF(arch="qwen2", hf_class="Qwen2ForCausalLM", common_layout=True, config_names=gguf_sliding),
)
