"""Tiny random causal LMs written as real GGUF files, for end-to-end tests of the GGUF path.

:func:`write_tiny_gguf` builds a small random model from transformers' own config class of a
family (llama, qwen2, gemma2, gemma3), and writes it with ``gguf.GGUFWriter`` the way
llama.cpp's ``convert_hf_to_gguf.py`` would: tensor names from gguf's own
``get_tensor_name_map`` (the map transformers inverts on load), float32 tensors, the
reshapes transformers undoes applied (Llama's q/k rows permuted for llama.cpp's RoPE, Gemma's
RMSNorm weights stored as ``1 + w``), and a small tokenizer in the metadata that transformers
rebuilds: byte-level BPE (``tokenizer.ggml.model = "gpt2"``, as Llama 3 and Qwen2 files hold it)
for llama and qwen2, SentencePiece BPE with byte fallback (``"llama"``, Gemma's) for gemma2/3.

Every weight is chosen so the round trip is exact in float32 (norm weights are multiples of
1/64, so ``(1 + w) - 1 == w``): transformers reads back the very tensors of the source model.

>>> from gguf_writer import FAMILIES
>>> sorted(FAMILIES)
['gemma2', 'gemma3', 'llama', 'qwen2']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class Family:
    """How one GGUF architecture is written: its HF ``model_type``, whether llama.cpp permutes
    q/k rows (llama's interleaved RoPE), whether it stores RMSNorm weights as ``1 + w`` (Gemma),
    whether the LM head is tied, and config values beyond the shared sizes."""

    gguf_arch: str
    model_type: str
    permute_qk: bool = False
    norm_plus_one: bool = False
    tie: bool = True
    tokenizer: str = "gpt2"  # tokenizer.ggml.model
    pre: str = "default"  # tokenizer.ggml.pre
    extra: dict = field(default_factory=dict)


FAMILIES = {
    "llama": Family("llama", "llama", permute_qk=True, tie=False, pre="llama-bpe"),
    "qwen2": Family("qwen2", "qwen2", pre="qwen2"),
    # soft-caps and the query scale off Gemma2Config's defaults (50, 30, 256), as a converted
    # checkpoint may have them: transformers' GGUF reader reads none of them, headscope does
    # (a real Gemma's query_pre_attn_scalar is its d_head, 16 here, except on the 27B models)
    "gemma2": Family(
        "gemma2",
        "gemma2",
        norm_plus_one=True,
        tokenizer="llama",
        extra={
            "sliding_window": 5,
            "query_pre_attn_scalar": 16,
            "attn_logit_softcapping": 20.0,
            "final_logit_softcapping": 15.0,
        },
    ),
    "gemma3": Family(
        "gemma3",
        "gemma3_text",
        norm_plus_one=True,
        tokenizer="llama",
        extra={"sliding_window": 5, "query_pre_attn_scalar": 16},
    ),
}

# shared sizes: 4 query heads sharing 2 KV heads of 16 dims
SIZES = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    max_position_embeddings=512,
    rms_norm_eps=float(np.float32(1e-6)),  # GGUF stores it as float32
    rope_theta=10000.0,
)

# byte-level BPE (``tokenizer.ggml.model = "gpt2"``: Llama 3, Qwen2, SmolLM2): ids 0, 1, 2 are
# pad, bos, eos
GPT2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# SentencePiece-style BPE with byte fallback (``"llama"``; Gemma's own layout): pad, eos, bos, unk, mask
SPM_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
# words whose spelling becomes one token each (merged left to right); Ġ: a leading space
WORDS = [
    "Ġthe", "Ġa", "Ġto", "Ġof", "Ġand", "Ġin", "Ġis", "Ġit", "Ġwas", "Ġthat", "Ġhe", "Ġshe",
    "Ġthey", "Ġon", "Ġfor", "Ġwith", "Ġbecause", "The", "ing", "ed", "er", "Ġcat",
    "Ġdog", "Ġheads", "Ġhead", "Ġmodel", "Ġtable", "Ġtired", "Ġclimb",
]  # fmt: skip
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6  # llama.cpp's token types


@dataclass(frozen=True)
class Vocab:
    """A tokenizer as GGUF metadata holds it; ``merges`` is None for SentencePiece (transformers
    derives them from the token order)."""

    model: str  # tokenizer.ggml.model
    tokens: list[str]
    types: list[int]
    merges: list[str] | None
    special: dict[str, int]  # pad / bos / eos / unk -> id


def _chain(tokens: list[str], types: list[int], words, merges: list[str] | None = None) -> None:
    """Append each word's prefixes (``▁t``, ``▁th``, ``▁the``), each made of a known token and one
    character, and the merge that makes it."""
    known = set(tokens)
    for word in words:
        left = word[0]
        for ch in word[1:]:
            new = left + ch
            if new not in known:
                if merges is not None:
                    merges.append(f"{left} {ch}")
                tokens.append(new)
                types.append(NORMAL)
                known.add(new)
            left = new


def tiny_vocab(model: str = "gpt2") -> Vocab:
    """The tiny vocabulary of a tokenizer kind: ``"gpt2"`` (byte-level BPE: the control tokens,
    the 256 bytes in GPT-2's byte-to-unicode spelling, then one token per merge) or ``"llama"``
    (SentencePiece BPE as Gemma's files hold it: control tokens, ``<unk>``, the 256
    ``<0xNN>`` byte-fallback tokens, the printable ASCII characters and ``▁``, then the words)."""
    if model == "gpt2":
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        tokens = list(GPT2_SPECIALS) + [bytes_to_unicode()[b] for b in range(256)]
        types = [CONTROL] * len(GPT2_SPECIALS) + [NORMAL] * 256
        merges: list[str] = []
        _chain(tokens, types, WORDS, merges)
        return Vocab("gpt2", tokens, types, merges, {"pad": 0, "bos": 1, "eos": 2})
    if model == "llama":
        tokens = list(SPM_SPECIALS) + [f"<0x{b:02X}>" for b in range(256)]
        types = [CONTROL, CONTROL, CONTROL, UNKNOWN, CONTROL] + [BYTE] * 256
        chars = ["\u2581"] + [chr(c) for c in range(0x21, 0x7F)]
        tokens += chars
        types += [NORMAL] * len(chars)
        _chain(tokens, types, [w.replace("Ġ", "\u2581") for w in WORDS])
        return Vocab("llama", tokens, types, None, {"pad": 0, "eos": 1, "bos": 2, "unk": 3})
    raise ValueError(f"unknown tokenizer model {model!r}")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf.py): the rows of each head's q/k
    from HF's half-split RoPE order to GGML's interleaved pairs; transformers' loader undoes it
    (``LlamaTensorProcessor._reverse_permute_weights``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_hf_model(family: str, *, seed: int = 0, **overrides):
    """The random source model of ``family``: float32, eager attention, in eval mode. Weights
    are drawn with std 0.2 (not 0.02) so that attention patterns are far from uniform, and every
    norm weight is set to a multiple of 1/64 near its neutral value. ``overrides`` replace
    config values (sizes, ``rope_parameters``, soft-caps...)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fam = FAMILIES[family]
    vocab = tiny_vocab(fam.tokenizer)
    settings = {**SIZES, **fam.extra, **overrides}
    cfg = AutoConfig.for_model(
        fam.model_type,
        vocab_size=len(vocab.tokens),
        tie_word_embeddings=fam.tie,
        initializer_range=0.2,
        pad_token_id=vocab.special["pad"],
        bos_token_id=vocab.special["bos"],
        eos_token_id=vocab.special["eos"],
        **settings,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(p + torch.randint(-12, 13, p.shape, generator=gen).float() / 64)
            elif name.endswith(".bias"):  # qwen2's q/k/v biases start at zero
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model.eval()


def _full_rope(cfg) -> dict:
    """The RoPE parameters of the full-attention layers (Gemma 3 keeps one set per layer type)."""
    rope = dict(cfg.rope_parameters)
    return rope.get("full_attention", rope)


#: ``metadata=`` value types of :func:`write_tiny_gguf` spelled by name (a ``(value, type)`` pair)
VALUE_TYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float32", "bool", "string")


def _set_metadata(w, key: str, value) -> None:
    """``key`` = ``value`` in the writer's metadata, replacing what it holds: an int as uint32
    (GGUFWriter's own choice for sizes), a list as an array, None removes the key, a
    ``(value, "int32")`` pair writes that type (a wrapped or negative count, say)."""
    import gguf

    w.kv_data[0].pop(key, None)  # replaced, not "overwritten" with a warning
    if value is None:
        return
    if isinstance(value, tuple):
        value, kind = value
        if kind not in VALUE_TYPES:
            raise ValueError(f"unknown GGUF value type {kind!r}; valid: {', '.join(VALUE_TYPES)}")
        if (
            "int" in kind
        ):  # the bits of a value outside the type's range, as a wrap leaves them (2**32 - 1 as int32: -1)
            bits = int(kind.lstrip("uint"))
            value = int(value) % (1 << bits)
            if not kind.startswith("u") and value >= 1 << (bits - 1):
                value -= 1 << bits
        getattr(w, f"add_{kind}")(key, value)
        return
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_key_value(key, value, gguf.GGUFValueType.UINT32)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, list):
        w.add_array(key, value)
    else:
        w.add_string(key, str(value))


def write_tiny_gguf(
    path, family: str, *, seed: int = 0, metadata: dict | None = None, edit=None, source=None, **overrides
):
    """Write a tiny random ``family`` model (see :data:`FAMILIES`; ``overrides`` as in
    :func:`tiny_hf_model`) to ``path`` as an F32 GGUF, with the RoPE scaling llama.cpp's
    converter writes: ``rope.scaling.type``/``factor`` (and the original context for yarn)
    for linear and yarn scaling, and Llama 3's as the
    per-frequency factors of a ``rope_freqs`` tensor. Returns ``(path, hf_model)``: the file
    and the source model it holds, float32, eager, eval.

    Files that lie (for tests of what a reader refuses): ``metadata`` replaces
    ``<arch>.KEY`` values after the honest ones are written (see :func:`_set_metadata`;
    ``{"attention.head_count": [4, 4]}``); ``edit(name, array)`` sees each tensor as written
    (GGUF name, float32 array in GGUF's row order) and returns it, another array, None (the
    tensor is left out) or ``(array, ggml_type)``: the array's bytes written under a declared
    type (an F32 array declared ``Q4_0``: a tensor whose type lies about its bytes). ``source``:
    a model :func:`tiny_hf_model` built before for ``family`` (and these ``overrides``), written
    again instead of building a new one (a property test writes many files of one model)."""
    import gguf

    fam = FAMILIES[family]
    path = Path(path)
    hf = source if source is not None else tiny_hf_model(family, seed=seed, **overrides)
    cfg = hf.config
    rope = _full_rope(cfg)
    vocab = tiny_vocab(fam.tokenizer)

    w = gguf.GGUFWriter(str(path), fam.gguf_arch)
    w.add_name(f"tiny-{family}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(rope["rope_theta"])
    if rope["rope_type"] == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    elif rope["rope_type"] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_vocab_size(cfg.vocab_size)
    if fam.gguf_arch == "llama":
        w.add_rope_dimension_count(cfg.head_dim)  # transformers: llama's head_dim
    else:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    if fam.gguf_arch.startswith("gemma"):
        w.add_sliding_window(cfg.sliding_window)
    if fam.gguf_arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    w.add_tokenizer_model(vocab.model)
    w.add_tokenizer_pre(fam.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    if vocab.merges is not None:
        w.add_token_merges(vocab.merges)
    else:  # SentencePiece: a score per token, best first
        w.add_token_scores([-float(i) for i in range(len(vocab.tokens))])
        w.add_unk_token_id(vocab.special["unk"])
        w.add_add_space_prefix(False)
    w.add_pad_token_id(vocab.special["pad"])
    w.add_bos_token_id(vocab.special["bos"])
    w.add_eos_token_id(vocab.special["eos"])
    w.add_add_bos_token(vocab.model == "llama")  # Gemma prepends <bos>; the byte-level vocabularies here do not

    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == fam.gguf_arch)
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    state = hf.state_dict()
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for hf_name, t in state.items():
        stem, suffix = hf_name.rsplit(".", 1)
        name = names.get_name(stem)
        if name is None:
            raise KeyError(f"{family}: no GGUF name for {hf_name!r}")
        a = t.detach().float().numpy().copy()
        if fam.permute_qk and name.endswith(".attn_q"):
            a = _permute(a, cfg.num_attention_heads)
        elif fam.permute_qk and name.endswith(".attn_k"):
            a = _permute(a, cfg.num_key_value_heads)
        if fam.norm_plus_one and name.endswith("norm"):
            a = a + np.float32(1.0)
        _add_tensor(w, f"{name}.{suffix}", a.astype(np.float32), edit)
    if rope["rope_type"] == "llama3":  # the factors by which transformers' own llama3 RoPE divides each frequency
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg)
        plain = 1.0 / rope["rope_theta"] ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
        _add_tensor(w, "rope_freqs.weight", (plain / scaled).float().numpy(), edit)
    for key, value in (metadata or {}).items():
        _set_metadata(w, f"{fam.gguf_arch}.{key}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, hf


def _add_tensor(w, name: str, a: np.ndarray, edit) -> None:
    """Add tensor ``name`` to the writer, through ``edit`` (see :func:`write_tiny_gguf`)."""
    out = a if edit is None else edit(name, a)
    if out is None:
        return
    if isinstance(out, tuple):  # the bytes of one array under another declared type
        arr, kind = out
        w.add_tensor(name, np.ascontiguousarray(arr), raw_shape=arr.shape, raw_dtype=kind)
        return
    w.add_tensor(name, np.ascontiguousarray(out))
