"""A checkpoint's architecture, read once: from an HF ``config.json`` dict or a GGUF file.

:func:`arch_from_hf_config` is the only reader of an HF configuration: the card
(:func:`~headscope.probes.models.card.card_from_hf_config`), the analyses' spec
(:class:`~headscope.probes.models.backend.ModelSpec` of the HF and bridge backends) and
the in-house configuration (:func:`~headscope.probes.models.config.config_from_hf`) all
derive from its :class:`ArchSpec`, so they cannot disagree (an encoder is an encoder in
all three). :func:`arch_from_gguf` reads a GGUF file's metadata through the same reader
(:func:`gguf_hf_config` maps it to HF field names first).

The config's key names differ by family (``num_hidden_layers`` / ``n_layer``,
``hidden_size`` / ``n_embd`` / ``d_model``, ``num_attention_heads`` / ``n_head``); the
spec has one name for each fact.

>>> a = arch_from_hf_config({"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576,
...     "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152})
>>> a.encoder, a.n_kv_heads, a.d_head, a.attention_kind, a.group_size, a.positional
(False, 3, 64, 'GQA', 3, 'rope')
>>> arch_from_hf_config({"model_type": "deberta-v2", "num_hidden_layers": 2, "hidden_size": 64,
...     "num_attention_heads": 4, "num_key_value_heads": 2}).encoder  # encoders are MHA whatever the config says
True
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: model types whose attention is bidirectional (encoders); every other type is a causal
#: decoder. ``is_decoder: true`` in the config (a BERT trained as a decoder) makes one causal.
ENCODER_TYPES = frozenset(
    {
        "albert",
        "bert",
        "big_bird",
        "camembert",
        "canine",
        "convbert",
        "data2vec-text",
        "deberta",
        "deberta-v2",
        "distilbert",
        "electra",
        "ernie",
        "esm",
        "flaubert",
        "funnel",
        "ibert",
        "layoutlm",
        "longformer",
        "luke",
        "megatron-bert",
        "mobilebert",
        "modernbert",
        "mpnet",
        "nomic_bert",
        "nystromformer",
        "rembert",
        "roberta",
        "roberta-prelayernorm",
        "roformer",
        "squeezebert",
        "xlm",
        "xlm-roberta",
        "xlm-roberta-xl",
        "xmod",
    }
)
#: decoders with learned absolute positions (every other decoder without ALiBi rotates: RoPE)
_LEARNED_DECODERS = frozenset({"gpt2", "gpt_bigcode", "opt", "biogpt", "gpt_neo", "xglm", "imagegpt"})
_ALIBI = frozenset({"bloom", "mpt", "falcon_alibi"})
#: decoders whose query and key heads are normalised before the dot product
_QK_NORM_TYPES = frozenset({"gemma3", "gemma3_text", "qwen3", "qwen3_moe", "olmo2", "olmoe", "chameleon"})


@dataclass(frozen=True, kw_only=True)
class ArchSpec:
    """What a checkpoint's configuration says about its architecture, one name per fact.

    ``None`` means the configuration does not say (consumers apply their own default:
    the card a context of 2048, the in-house BERT a LayerNorm epsilon of 1e-12, …).
    ``sliding_window`` holds one entry per layer (``None`` for a layer that attends to
    the whole context), or is ``None`` when no layer slides.
    """

    model_type: str
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int | None
    vocab_size: int | None
    max_positions: int | None
    encoder: bool
    positional: str | None  # "learned" | "rope" | "relative" | "alibi" | "none"; None: not known
    rope_theta: float | None
    rope_type: str | None
    norm: str | None  # "layernorm" | "rmsnorm"
    norm_eps: float | None
    activation: str | None
    attention_bias: bool | None
    sliding_window: tuple[int | None, ...] | None
    qk_norm: bool
    attn_softcap: float | None
    final_softcap: float | None
    tie_embeddings: bool
    type_vocab_size: int | None
    pad_token_id: int | None
    bos_token_id: int | None

    @property
    def causal(self) -> bool:
        return not self.encoder

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 for MHA, ``n_heads`` for MQA)."""
        return self.n_heads // self.n_kv_heads

    @property
    def attention_kind(self) -> str:
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"


def _first(hf: dict, *keys):
    """The first of ``keys`` with a truthy value (HF leaves a derived size null or absent)."""
    for k in keys:
        if hf.get(k):
            return hf[k]
    return None


def _int_or_none(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _rope(hf: dict) -> tuple[float | None, str | None]:
    """``(theta, rope type)`` of full attention: ``rope_parameters`` (transformers 5; per
    layer type for Gemma 3), ``rope_scaling`` or the flat ``rope_theta``."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        rope = {}
    if rope and all(isinstance(v, dict) for v in rope.values()):  # {layer type: parameters}
        rope = rope.get("full_attention") or next(iter(rope.values()))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", hf.get("rope_theta"))
    return (float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) else None), rope_type


def _positional(hf: dict, mtype: str) -> str | None:
    if mtype in ("deberta", "deberta-v2"):
        if hf.get("relative_attention"):
            return "relative"
        return "learned" if hf.get("position_biased_input", True) else "none"
    if mtype in _ALIBI or hf.get("alibi"):
        return "alibi"
    if "position_embedding_type" in hf or mtype in ENCODER_TYPES:
        kind = hf.get("position_embedding_type") or "absolute"
        if kind == "absolute":
            return "learned"
        return "rope" if kind == "rotary" else "relative"
    if mtype in _LEARNED_DECODERS:
        return "learned"
    if any(k in hf for k in ("rope_parameters", "rope_theta", "rope_scaling", "rotary_dim", "rotary_pct")):
        return "rope"
    return "rope" if mtype in ("llama", "mistral", "qwen2", "phi3", "gemma", "gemma2") else None


def _sliding(hf: dict, n_layers: int) -> tuple[int | None, ...] | None:
    window = _int_or_none(hf.get("sliding_window"))
    types = hf.get("layer_types")
    if window and isinstance(types, list) and len(types) == n_layers:
        per_layer = tuple(window if t == "sliding_attention" else None for t in types)
    elif window and hf.get("use_sliding_window", True):
        per_layer = (window,) * n_layers
    else:
        return None
    return per_layer if any(per_layer) else None


def arch_from_hf_config(hf: dict[str, Any], where: str = "config") -> ArchSpec:
    """The :class:`ArchSpec` of an HF ``config.json`` dict (or ``PretrainedConfig.to_dict()``).

    Sizes are checked first (:func:`check_hf_config`: ``CheckpointError`` naming ``where``
    and the key); a config without layer, head and hidden-size fields raises
    :class:`~headscope.probes.errors.ModelIncompatibleError`.
    """
    from headscope.probes.errors import ModelIncompatibleError

    check_hf_config(hf, where)
    mtype = hf.get("model_type") or "?"
    n_layers = _first(hf, "num_hidden_layers", "n_layer")
    d_model = _first(hf, "hidden_size", "n_embd", "d_model")
    n_heads = _first(hf, "num_attention_heads", "n_head")
    if not (n_layers and d_model and n_heads):
        raise ModelIncompatibleError(
            f"config of {where!r} has no layer/head/hidden-size fields (model_type {hf.get('model_type')!r})"
        )
    encoder = mtype in ENCODER_TYPES and not hf.get("is_decoder")
    n_kv = (None if encoder else hf.get("num_key_value_heads")) or n_heads  # encoders: MHA
    theta, rope_type = _rope(hf)
    positional = _positional(hf, mtype)
    if "rms_norm_eps" in hf:
        norm, eps = "rmsnorm", hf["rms_norm_eps"]
    elif "layer_norm_eps" in hf or "layer_norm_epsilon" in hf:
        norm, eps = "layernorm", hf.get("layer_norm_eps", hf.get("layer_norm_epsilon"))
    else:
        norm, eps = None, None
    tie = hf.get("tie_word_embeddings")
    if tie is None:  # LlamaConfig and its kin default to untied; encoders and GPT-2 tie
        tie = encoder or mtype in _LEARNED_DECODERS
    return ArchSpec(
        model_type=mtype,
        name=hf.get("_name_or_path") or "",
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        d_head=hf.get("head_dim") or d_model // n_heads,
        d_mlp=_int_or_none(_first(hf, "intermediate_size", "n_inner", "ffn_dim")),
        vocab_size=_int_or_none(hf.get("vocab_size")),
        max_positions=_int_or_none(_first(hf, "max_position_embeddings", "n_positions")),
        encoder=encoder,
        positional=positional,
        rope_theta=theta if positional == "rope" else None,
        rope_type=rope_type if positional == "rope" else None,
        norm=norm,
        norm_eps=float(eps) if isinstance(eps, (int, float)) else None,
        activation=hf.get("hidden_act") or hf.get("hidden_activation") or hf.get("activation_function"),
        attention_bias=hf.get("attention_bias") if isinstance(hf.get("attention_bias"), bool) else None,
        sliding_window=_sliding(hf, n_layers),
        qk_norm=bool(hf.get("qk_layernorm") or hf.get("use_qk_norm") or mtype in _QK_NORM_TYPES),
        attn_softcap=hf.get("attn_logit_softcapping") or None,
        final_softcap=hf.get("final_logit_softcapping") or None,
        tie_embeddings=bool(tie),
        type_vocab_size=_int_or_none(hf.get("type_vocab_size")),
        pad_token_id=_int_or_none(hf.get("pad_token_id")),
        bos_token_id=_int_or_none(hf.get("bos_token_id")),
    )


def arch_from_gguf(path: Path) -> ArchSpec:
    """The :class:`ArchSpec` of a GGUF file, from its metadata alone (no dequantisation)."""
    return arch_from_hf_config(gguf_hf_config(Path(path)), str(path))


def gguf_hf_config(path: Path) -> dict:
    """Llama-family HF config fields from a GGUF file's metadata (no dequantisation);
    a cut or corrupt file is refused first (:func:`~headscope.probes.models.checkpoints.check_gguf`)."""
    from headscope.probes.errors import CheckpointError, ModelIncompatibleError
    from headscope.probes.models.checkpoints import check_gguf

    reader = check_gguf(path)
    f = {k: v for k, v in reader.fields.items()}

    def get(key, default=None):
        try:
            return f[key].contents()
        except (KeyError, Exception):  # noqa: BLE001
            return default

    arch = get("general.architecture")
    if arch != "llama":
        raise ModelIncompatibleError(f"{path}: GGUF architecture {arch!r}; only 'llama' is read in-house")
    for key in ("block_count", "attention.head_count", "embedding_length", "feed_forward_length"):
        if not isinstance(get(f"{arch}.{key}"), int):
            raise CheckpointError(f"{path}: GGUF metadata {arch}.{key} is missing or not an integer")
    n_heads = int(get(f"{arch}.attention.head_count"))
    d_model = int(get(f"{arch}.embedding_length"))
    tensor_names = {t.name for t in reader.tensors}
    vocab = get(f"{arch}.vocab_size", 0) or (
        len(f["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in f else 0
    )
    if not vocab:
        raise CheckpointError(f"{path}: GGUF metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    return {
        "model_type": "llama",
        "_name_or_path": get("general.name", path.stem),
        "num_hidden_layers": int(get(f"{arch}.block_count")),
        "hidden_size": d_model,
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(get(f"{arch}.attention.head_count_kv", n_heads)),
        "head_dim": int(get(f"{arch}.rope.dimension_count", d_model // n_heads)),
        "intermediate_size": int(get(f"{arch}.feed_forward_length")),
        "vocab_size": int(vocab),
        "max_position_embeddings": int(get(f"{arch}.context_length", 2048)),
        "rope_theta": float(get(f"{arch}.rope.freq_base", 10000.0)),
        "rms_norm_eps": float(get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }


# -- checking a config.json's sizes before anything is built -------------------------------

# keys that hold a size, per family: (required, optional); any of _ANY_SIZE_KEYS present is checked too
_SIZE_KEYS = {
    "bert": (
        (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ),
        ("type_vocab_size",),
    ),
    "llama": (
        ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"),
        ("num_key_value_heads", "head_dim", "max_position_embeddings"),
    ),
}
_ANY_SIZE_KEYS = (
    "num_hidden_layers",
    "n_layer",
    "hidden_size",
    "n_embd",
    "d_model",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "n_inner",
    "vocab_size",
    "max_position_embeddings",
    "n_positions",
)
_NULL_MEANS_UNSET = ("num_key_value_heads", "head_dim", "n_inner")  # HF derives these when null
_MAX_SIZE = 2**63  # torch indexes with int64


def check_hf_config(hf: dict[str, Any], where: str) -> None:
    """Refuse a config whose sizes cannot describe a model: a size missing (for the BERT and
    Llama families), null, not an integer, not positive, or heads that do not divide.
    ``where`` (the config file) starts every message.

    Raises :class:`~headscope.probes.errors.CheckpointError`.

    >>> try:
    ...     check_hf_config({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
    ...         "num_attention_heads": 4, "intermediate_size": 1.5, "vocab_size": 10}, "m/config.json")
    ... except Exception as e:  # CheckpointError
    ...     print(e)
    m/config.json: intermediate_size must be a positive integer; got 1.5
    """
    from headscope.probes.errors import CheckpointError

    family = hf.get("model_type")
    required, optional = _SIZE_KEYS.get(family, ((), _ANY_SIZE_KEYS))
    for key in required:
        if key not in hf:
            raise CheckpointError(f"{where}: {key} is missing (a {family!r} config needs it); add it to the config")
    for key in dict.fromkeys((*required, *optional, *_ANY_SIZE_KEYS)):
        if key not in hf or (hf[key] is None and key in _NULL_MEANS_UNSET):
            continue
        v = hf[key]
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise CheckpointError(f"{where}: {key} must be a positive integer; got {v!r}")
        if v >= _MAX_SIZE:
            raise CheckpointError(f"{where}: {key}={v} is past 2**63, more than any tensor can index")
    n_heads = hf.get("num_attention_heads") or hf.get("n_head")
    d_model = hf.get("hidden_size") or hf.get("n_embd") or hf.get("d_model")
    n_kv = hf.get("num_key_value_heads") if family not in ENCODER_TYPES else None  # encoders: no KV heads of their own
    if n_heads and n_kv and n_heads % n_kv:
        raise CheckpointError(
            f"{where}: num_key_value_heads={n_kv} does not divide num_attention_heads={n_heads} "
            "(each KV head serves an equal group of query heads)"
        )
    if family == "bert" and d_model % n_heads:
        raise CheckpointError(
            f"{where}: hidden_size={d_model} is not divisible by num_attention_heads={n_heads}; fix one of them"
        )
    if family == "llama":
        d_head = hf.get("head_dim") or d_model // n_heads
        if d_head < 1:
            raise CheckpointError(
                f"{where}: num_attention_heads={n_heads} exceeds hidden_size={d_model} (d_head would be 0); "
                "fix one of them or set head_dim"
            )
        if d_head % 2:
            raise CheckpointError(f"{where}: head_dim {d_head} is odd; RoPE rotates pairs of dimensions")
