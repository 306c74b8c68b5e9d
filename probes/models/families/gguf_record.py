"""How a family's GGUF files read: :class:`GGUF`, the record a :class:`~headscope.probes.models.families.base.Family`
holds as ``Family.gguf`` (and :data:`~headscope.probes.models.families.gguf_only.GGUF_ONLY`, the architectures
transformers reads that are no family here). :mod:`~headscope.probes.models.gguf` iterates them.

>>> r = GGUF(arch="toy", hf_class="ToyForCausalLM")
>>> r.required, r.common_layout
(('attention.head_count',), False)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GGUF"]


@dataclass(frozen=True, kw_only=True)
class GGUF:
    """How the GGUF files of a family read (llama.cpp's ``general.architecture`` ``arch``), as
    :func:`~headscope.probes.models.gguf.metadata.gguf_hf_config` means them.

    A :class:`Family` that transformers reads from GGUF holds one (``Family.gguf``; its
    ``model_type`` is the family's); the architectures transformers reads that are no family
    here are in :data:`~headscope.probes.models.families.gguf_only.GGUF_ONLY`.
    """

    #: llama.cpp's ``general.architecture``; empty: only files named so (``named``) are this family's
    arch: str
    #: the HF class that goes into ``architectures`` (``"LlamaForCausalLM"``)
    hf_class: str
    #: the HF ``model_type`` (a family's record: the family's own)
    model_type: str = ""
    #: how some converters spell ``arch`` in ``general.architecture`` (``gpt_oss`` for ``gpt-oss``)
    spelled: str = ""
    #: a file of one of these architectures whose ``general.name`` holds ``named`` (lowercased) is
    #: this family's (llama.cpp files Mistral under ``llama``; a ``t5`` file named UMT5 is UMT5)
    files_under: tuple[str, ...] = ()
    named: str = ""
    #: metadata keys (without ``<arch>.``) the file must give, besides ``block_count`` and ``embedding_length``
    required: tuple[str, ...] = ("attention.head_count",)
    #: head counts and ``feed_forward_length`` written 0 mean "unused" (Mamba: no attention, no MLP)
    zero_sizes_unused: bool = False
    #: without ``attention.key_length``, ``rope.dimension_count`` (the rotated width) is d_head (llama.cpp)
    rope_dim_is_head_dim: bool = False
    #: KV heads written 0 in the layers without attention and one number in the others (LFM2's
    #: convolutions): read as that number, as transformers builds it
    kv_heads_zero_off_attention: bool = False
    #: the family's own HF config names, ``config_names(hf, get, arch, n_heads)`` (Falcon's KV heads,
    #: Gemma's sliding layers and query scale): ``get(key)`` reads the metadata, ``arch`` its prefix
    config_names: Callable[[dict, Callable, str, int | None], None] | None = field(default=None, compare=False)
    #: the file must give the vocabulary's size (``vocab_size`` or ``tokenizer.ggml.tokens``)
    vocab_required: bool = False
    #: HF config values where the file gives none (the defaults the in-house reader has always applied)
    defaults: tuple[tuple[str, Any], ...] = ()
    #: a ``rope_freqs`` tensor is read (as Llama 3's RoPE scaling); other families' files are refused
    rope_freqs: bool = False
    #: RoPE per layer type: the sliding layers at ``rope.freq_base_swa`` (10,000 by default), the
    #: global ones at ``rope.freq_base`` and scaled (Gemma 3)
    rope_per_layer_type: bool = False
    #: the output projection is always the token embedding (no ``output.weight`` read even if present)
    tied: bool = False
    # -- the tensor table, checked against the metadata (gguf.tensors.check_gguf_tensors) ------
    #: llama.cpp's common layer layout: ``attn_q/k/v`` (or fused ``attn_qkv``) of head_count ×
    #: key_length rows, ``ffn_gate/up/down`` of feed_forward_length; each layer's shapes are checked
    common_layout: bool = False
    #: ``ffn_up`` holds this many ``feed_forward_length`` blocks (Phi-3's: gate and up, 2)
    ffn_up_blocks: int = 1
    #: a ``position_embd`` tensor ``[embedding_length, context_length]`` (GPT-2's learned positions)
    positions: bool = False
    #: config keys transformers' GGUF reader leaves at its class's defaults although this family's
    #: files say otherwise; the metadata's value goes into the cached config.json (of every file:
    #: :data:`~headscope.probes.models.gguf.cache.METADATA_OVER_READER` is their union)
    over_reader: tuple[str, ...] = ()
