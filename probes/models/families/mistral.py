"""Mistral (``mistral``): Llama with a sliding window; its attention has no biases (fixed in its code).
Its GGUF files read as Llama's; llama.cpp files some under ``llama`` (named Mistral)."""

from __future__ import annotations

from dataclasses import replace

from headscope.probes.models.families import llama
from headscope.probes.models.families._common import LLAMA_LIKE, family


def _gguf_names(hf: dict, get, arch: str, n_heads: int | None) -> None:
    hf.setdefault("sliding_window", None)  # not MistralConfig's default of 4096: the file says none


FAMILY = family(
    LLAMA_LIKE,
    model_type="mistral",
    reads=frozenset(),
    gguf=replace(
        llama.FAMILY.gguf,
        arch="mistral",
        hf_class="MistralForCausalLM",
        model_type="",
        files_under=("llama",),
        named="mistral",
        config_names=_gguf_names,
    ),
)
