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
#: config keys a family spells its own way -> the common HF name (DistilBERT: dim, n_layers, …)
_OWN_NAMES = {
    "distilbert": {
        "n_layers": "num_hidden_layers",
        "dim": "hidden_size",
        "n_heads": "num_attention_heads",
        "hidden_dim": "intermediate_size",
        "activation": "hidden_act",
    }
}
#: decoders whose query and key heads are normalised before the dot product
#: options whose non-default value changes what a family computes, in ways the in-house
#: stack does not implement: ``{model_type: {option: default}}`` (the in-house backend refuses
#: a checkpoint that sets one; the HF backend runs it)
_FIXED_OPTIONS = {
    "gpt2": {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False},
    "llama": {"mlp_bias": False},
}
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
    #: Gemma 2/3: queries are scaled by ``query_pre_attn_scalar ** -0.5`` (not ``d_head ** -0.5``)
    query_pre_attn_scalar: float | None = None
    #: Gemma 3: the RoPE base and type of the sliding (local) layers, when they differ from the
    #: global layers' (``rope_local_base_freq``, or ``rope_parameters["sliding_attention"]``)
    rope_local_theta: float | None = None
    rope_local_type: str | None = None
    #: the numeric parameters of a scaled RoPE (``linear``, ``llama3``, ``yarn``...) on the global
    #: layers (``factor``, ``low_freq_factor``, ...), sorted pairs; None: plain RoPE
    rope_scaling: tuple[tuple[str, float], ...] | None = None

    @property
    def rope_factor(self) -> float | None:
        """The scaling factor of a scaled RoPE (None: plain RoPE)."""
        return dict(self.rope_scaling or ()).get("factor")

    #: fraction of each head's dimensions that RoPE rotates (Phi-3 ``partial_rotary_factor``;
    #: None: the config does not say, i.e. all of them)
    rotary_fraction: float | None = None
    #: a decoder family run with bidirectional attention (``use_bidirectional_attention``:
    #: EmbeddingGemma); ``encoder`` still follows the model type
    bidirectional_attention: bool = False
    #: family options set away from their default (``"name=value"``), e.g. GPT-2's
    #: ``scale_attn_by_inverse_layer_idx=True``: see ``_FIXED_OPTIONS``
    off_default: tuple[str, ...] = ()
    #: query heads, KV heads and MLP width of each layer where a GGUF file's layers differ
    #: (:data:`PER_LAYER`; the card only: no backend builds such a model); None: the same in every
    #: layer. ``n_heads``/``n_kv_heads``/``d_mlp`` then hold the widest layer's.
    heads_per_layer: tuple[int, ...] | None = None
    kv_heads_per_layer: tuple[int, ...] | None = None
    d_mlp_per_layer: tuple[int, ...] | None = None

    @property
    def per_layer(self) -> bool:
        """Whether the layers differ in heads, KV heads or MLP width."""
        return any(x is not None for x in (self.heads_per_layer, self.kv_heads_per_layer, self.d_mlp_per_layer))

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


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v else None


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


def _rope_scaling(hf: dict) -> dict:
    """The numeric parameters of the full-attention layers' RoPE scaling (``factor``, ...),
    without ``rope_theta``; empty where there are none."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
        rope = rope["full_attention"]
    if not isinstance(rope, dict):
        return {}
    return {k: float(v) for k, v in rope.items() if k != "rope_theta" and _number(v) is not None}


def _rope_local(hf: dict) -> tuple[float | None, str | None]:
    """``(theta, rope type)`` of the sliding layers where the config gives them their own
    (Gemma 3: ``rope_parameters["sliding_attention"]`` in transformers 5, ``rope_local_base_freq``
    in older ``config.json`` files); ``(None, None)`` otherwise."""
    rope = hf.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("sliding_attention"), dict):
        local = rope["sliding_attention"]
        theta = local.get("rope_theta", hf.get("rope_local_base_freq"))
        return _number(theta), local.get("rope_type", local.get("type", "default"))
    if _number(hf.get("rope_local_base_freq")) is not None:
        return _number(hf["rope_local_base_freq"]), "default"
    return None, None


def _rotary_fraction(hf: dict) -> float | None:
    rope = hf.get("rope_parameters")
    v = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    return _number(v if v is not None else hf.get("partial_rotary_factor"))


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


def _sliding(hf: dict, mtype: str, n_layers: int) -> tuple[int | None, ...] | None:
    """The window of each layer (``None``: global), as transformers decides it: ``layer_types``
    when the config lists them; else Gemma's pattern (every ``sliding_window_pattern``-th layer
    global: 2 for Gemma 2, 6 for Gemma 3); else Qwen's ``max_window_layers`` (the layers from it
    on slide, when ``use_sliding_window``); else every layer (Mistral, Phi-3)."""
    window = _int_or_none(hf.get("sliding_window"))
    if not window or hf.get("use_sliding_window") is False:
        return None
    types = hf.get("layer_types")
    pattern = hf.get("sliding_window_pattern")
    if isinstance(types, list) and len(types) == n_layers:
        slides = [t == "sliding_attention" for t in types]
    elif isinstance(pattern, list) and len(pattern) == n_layers:  # GGUF: one flag per layer
        slides = [bool(p) for p in pattern]
    elif mtype in ("gemma2", "gemma3", "gemma3_text") or _int_or_none(pattern):
        every = _int_or_none(pattern) or (2 if mtype == "gemma2" else 6)
        slides = [bool((i + 1) % every) for i in range(n_layers)]
    elif hf.get("use_sliding_window") and _int_or_none(hf.get("max_window_layers")) is not None:
        slides = [i >= hf["max_window_layers"] for i in range(n_layers)]
    else:
        slides = [True] * n_layers
    per_layer = tuple(window if slide else None for slide in slides)
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
    own_names = _OWN_NAMES.get(mtype, {})
    hf = {**{ours: hf[theirs] for theirs, ours in own_names.items() if theirs in hf}, **hf}
    n_layers = _first(hf, "num_hidden_layers", "n_layer")
    d_model = _first(hf, "hidden_size", "n_embd", "d_model")
    n_heads = _first(hf, "num_attention_heads", "n_head")
    if not (n_layers and d_model and n_heads):
        raise ModelIncompatibleError(
            f"config of {where!r} has no layer/head/hidden-size fields (model_type {hf.get('model_type')!r})"
        )
    encoder = mtype in ENCODER_TYPES and not hf.get("is_decoder")
    n_kv = (None if encoder else hf.get("num_key_value_heads")) or n_heads  # encoders: MHA
    if mtype == "falcon" and not hf.get("num_key_value_heads"):  # Falcon's own names
        n_kv = hf.get("num_kv_heads") if hf.get("new_decoder_architecture") else 1 if hf.get("multi_query") else n_heads
        n_kv = n_kv or n_heads
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
        sliding_window=_sliding(hf, mtype, n_layers),
        qk_norm=bool(hf.get("qk_layernorm") or hf.get("use_qk_norm") or mtype in _QK_NORM_TYPES),
        attn_softcap=_number(hf.get("attn_logit_softcapping")),
        final_softcap=_number(hf.get("final_logit_softcapping")),
        tie_embeddings=bool(tie),
        type_vocab_size=_int_or_none(hf.get("type_vocab_size")),
        pad_token_id=_int_or_none(hf.get("pad_token_id")),
        bos_token_id=_int_or_none(hf.get("bos_token_id")),
        query_pre_attn_scalar=_number(hf.get("query_pre_attn_scalar")),
        rope_local_theta=_rope_local(hf)[0] if positional == "rope" else None,
        rope_local_type=_rope_local(hf)[1] if positional == "rope" else None,
        rotary_fraction=_rotary_fraction(hf) if positional == "rope" else None,
        rope_scaling=tuple(sorted(_rope_scaling(hf).items()))
        if positional == "rope" and rope_type not in (None, "default")
        else None,
        bidirectional_attention=bool(hf.get("use_bidirectional_attention")),
        off_default=tuple(
            f"{k}={hf[k]!r}" for k, default in _FIXED_OPTIONS.get(mtype, {}).items() if k in hf and hf[k] != default
        ),
        **_per_layer_fields(hf),
    )


def _per_layer_fields(hf: dict) -> dict:
    """The :class:`ArchSpec` per-layer fields of ``hf[PER_LAYER]`` (checked by :func:`check_hf_config`)."""
    per = hf.get(PER_LAYER) or {}
    names = {
        "num_attention_heads": "heads_per_layer",
        "num_key_value_heads": "kv_heads_per_layer",
        "intermediate_size": "d_mlp_per_layer",
    }
    return {field: tuple(per[key]) for key, field in names.items() if key in per}


def arch_from_gguf(path: Path) -> ArchSpec:
    """The :class:`ArchSpec` of a GGUF file, from its metadata alone (no tensor is read)."""
    return arch_from_hf_config(gguf_hf_config(Path(path)), str(path))


#: GGUF ``general.architecture`` → (HF ``model_type``, HF model class for ``architectures``), for
#: every architecture transformers reads from GGUF (``GGUF_CONFIG_MAPPING`` in
#: ``transformers/integrations/ggml.py``; its loader renames the same way: ``qwen2moe`` →
#: ``qwen2_moe``, ``gemma3`` → ``gemma3_text``, a ``llama`` file named Mistral → ``mistral``, …).
GGUF_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen2moe": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "gpt-oss": ("gpt_oss", "GptOssForCausalLM"),
    "lfm2": ("lfm2", "Lfm2ForCausalLM"),
    "falcon": ("falcon", "FalconForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "bloom": ("bloom", "BloomForCausalLM"),
    "t5": ("t5", "T5ForConditionalGeneration"),
    "t5encoder": ("t5", "T5EncoderModel"),
    "stablelm": ("stablelm", "StableLmForCausalLM"),
    "gpt2": ("gpt2", "GPT2LMHeadModel"),
    "starcoder2": ("starcoder2", "Starcoder2ForCausalLM"),
    "mamba": ("mamba", "MambaForCausalLM"),
    "nemotron": ("nemotron", "NemotronForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
    "gemma4": ("gemma4_text", "Gemma4ForCausalLM"),
    "deci": ("deci", "DeciLMForCausalLM"),  # remote code on the hub (Nemotron-51B)
    "minimax-m2": ("minimax_m2", "MiniMaxM2ForCausalLM"),
}
_GGUF_ALIASES = {"gpt_oss": "gpt-oss", "minimax_m2": "minimax-m2", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
#: GGUF ``<arch>.KEY`` → HF config key, the same for every architecture (names every HF config
#: class takes, through its ``attribute_map`` where it spells them its own way)
_GGUF_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.sliding_window": "sliding_window",
    "attention.sliding_window_pattern": "sliding_window_pattern",
    "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
    "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.layer_norm_epsilon": "layer_norm_eps",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "vocab_size": "vocab_size",
}


#: key of :func:`gguf_hf_config`'s dict (``strict=False``) that says why the file cannot be loaded
NOT_LOADABLE = "headscope_not_loadable"


def gguf_hf_config(path: Path, *, strict: bool = True) -> dict:
    """An HF-style config dict from a GGUF file's metadata alone (no tensor is read), for every
    architecture in :data:`GGUF_ARCHITECTURES`, with ``architectures`` filled in (e.g.
    ``["Qwen2ForCausalLM"]``) so that any backend can build the model from it. A cut or corrupt
    file is refused first (:func:`~headscope.probes.models.checkpoints.check_gguf`); an
    architecture transformers cannot read either raises
    :class:`~headscope.probes.errors.ModelIncompatibleError`. So does RoPE that no backend
    could build as the file means it (:func:`_gguf_rope_parameters`), unless ``strict`` is
    False (the card: sizes are still worth reading): then ``hf[NOT_LOADABLE]`` says why."""
    from headscope.probes.errors import CheckpointError, ModelIncompatibleError, UnknownGGUFArchitectureError
    from headscope.probes.models.checkpoints import check_gguf

    path = Path(path)
    reader = check_gguf(path)
    f = dict(reader.fields.items())

    def get(key, default=None):
        try:
            return f[key].contents()
        except Exception:  # noqa: BLE001 - absent or unreadable: not said
            return default

    arch = get("general.architecture")
    arch = _GGUF_ALIASES.get(arch, arch)
    if arch not in GGUF_ARCHITECTURES:
        raise UnknownGGUFArchitectureError(
            f"{path}: GGUF architecture {arch!r} is not one transformers reads "
            f"(readable: {', '.join(sorted(GGUF_ARCHITECTURES))})"
        )
    name = get("general.name") or path.stem
    gguf_arch = arch
    if arch == "llama" and "mistral" in str(name).lower():  # llama.cpp files Mistral under llama
        arch = "mistral"
    model_type, cls = GGUF_ARCHITECTURES[arch]
    if gguf_arch.startswith("t5") and "umt5" in str(name).lower():
        model_type, cls = "umt5", cls.replace("T5", "UMT5")
    required = ("block_count", "embedding_length") + (() if model_type == "mamba" else ("attention.head_count",))
    required += ("feed_forward_length",) if model_type in ("llama", "mistral") else ()
    for key in required:
        v = get(f"{gguf_arch}.{key}")
        if not (isinstance(v, int) or (isinstance(v, list) and v and all(isinstance(x, int) for x in v))):
            raise CheckpointError(f"{path}: GGUF metadata {gguf_arch}.{key} is missing or not an integer")
    sizes = _gguf_sizes(f, gguf_arch, model_type, path)

    hf: dict[str, Any] = {"model_type": model_type, "architectures": [cls], "_name_or_path": name}
    if sizes.equal_arrays:
        hf[EQUAL_PER_LAYER] = list(sizes.equal_arrays)
    for key, hf_key in _GGUF_KEYS.items():
        if key in _GGUF_SIZES:
            if key in sizes.per_layer:  # stand-ins for the card's checks; the lists go into hf[PER_LAYER]
                hf[hf_key] = max(sizes.per_layer[key])
            elif key in sizes.values:
                hf[hf_key] = sizes.values[key]
            continue
        v = get(f"{gguf_arch}.{key}")
        if v is None:
            continue
        if isinstance(v, list) and key != "attention.sliding_window_pattern":  # per layer: the widest
            v = max((x for x in v if isinstance(x, (int, float))), default=None)
            if v is None:
                continue
        hf[hf_key] = v
    for key in ("rope_theta", "rms_norm_eps", "layer_norm_eps", "attn_logit_softcapping", "final_logit_softcapping"):
        if key in hf:
            hf[key] = float(hf[key])
    if "head_dim" not in hf and model_type in ("llama", "mistral"):  # llama.cpp: the rotated width is d_head
        rot = get(f"{gguf_arch}.rope.dimension_count")
        if isinstance(rot, int) and not isinstance(rot, bool) and 0 < rot < _MAX_SIZE:
            hf["head_dim"] = rot
    n_heads, d_model = hf.get("num_attention_heads"), hf["hidden_size"]
    if n_heads:
        heads, kv_heads = _gguf_heads(sizes, gguf_arch, path)
        hf.setdefault("num_key_value_heads", n_heads)
        hf.setdefault("head_dim", d_model // next(h for h in heads if h))  # llama.cpp: layer 0's heads
        _per_layer_heads(hf, sizes, heads, kv_heads, gguf_arch, model_type, path, strict)
    if model_type == "falcon":  # FalconConfig's own names; its head_dim is derived, not set
        n_kv = hf.pop("num_key_value_heads")
        hf.pop("head_dim", None)
        hf.update(num_kv_heads=n_kv, multi_query=n_kv == 1, new_decoder_architecture=n_kv not in (1, n_heads))
        if "intermediate_size" in hf:
            hf["ffn_hidden_size"] = hf.pop("intermediate_size")
    if model_type == "mistral":
        hf.setdefault("sliding_window", None)  # not MistralConfig's default of 4096: the file says none
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        hf["use_sliding_window"] = "sliding_window" in hf
    if model_type in ("gemma2", "gemma3_text", "gemma4_text") and "sliding_window" in hf:
        pattern = hf.pop("sliding_window_pattern", None)
        every = 2 if model_type == "gemma2" else 6
        n = hf["num_hidden_layers"]
        slides = (
            [bool(p) for p in pattern]
            if isinstance(pattern, list) and len(pattern) == n
            else [bool((i + 1) % (pattern if isinstance(pattern, int) and pattern > 0 else every)) for i in range(n)]
        )
        hf["layer_types"] = ["sliding_attention" if s else "full_attention" for s in slides]
    if model_type in ("gemma2", "gemma3_text"):
        hf["query_pre_attn_scalar"] = _gguf_query_pre_attn_scalar(get(f"{gguf_arch}.attention.scale"), gguf_arch, hf)
    try:
        rope = _gguf_rope_parameters(reader, get, gguf_arch, model_type, hf, path)
    except ModelIncompatibleError as e:
        if strict:
            raise
        rope = None
        hf.setdefault(NOT_LOADABLE, str(e).removeprefix(f"{path}: "))
    if rope is not None:
        hf["rope_parameters"] = rope
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = hf.get("vocab_size") or (len(tokens.data) if tokens is not None else 0)
    if vocab:
        hf["vocab_size"] = int(vocab)
    elif model_type in ("llama", "mistral"):
        raise CheckpointError(f"{path}: GGUF metadata has neither {gguf_arch}.vocab_size nor tokenizer.ggml.tokens")
    if model_type in ("llama", "mistral"):  # the defaults the in-house reader has always applied
        hf.setdefault("max_position_embeddings", 2048)
        hf.setdefault("rope_theta", 10000.0)
        hf.setdefault("rms_norm_eps", 1e-6)
    hf["tie_word_embeddings"] = gguf_arch in ("falcon", "bloom") or "output.weight" not in {
        t.name for t in reader.tensors
    }
    _check_gguf_tensors(reader, hf, sizes, gguf_arch, path)
    return hf


#: GGUF ``<arch>.KEY`` sizes, checked under the file's own key names before any is used
#: (:func:`_gguf_sizes`); ``block_count`` first, as the per-layer arrays' lengths are checked against it
_GGUF_SIZES = (
    "block_count",
    "embedding_length",
    "context_length",
    "vocab_size",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
)
#: sizes llama.cpp lets a file give per layer, as an array of ``block_count`` entries (``get_key_or_arr``)
_GGUF_PER_LAYER = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")
#: the most layers llama.cpp loads (``LLAMA_MAX_LAYERS``, ``llama-hparams.h``): its per-layer arrays hold so many
GGUF_MAX_LAYERS = 512
#: key of :func:`gguf_hf_config`'s dict (``strict=False``: the card) holding the sizes of a file whose layers
#: differ: ``{HF key: [one per layer]}`` (``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``)
PER_LAYER = "headscope_per_layer"
#: key of :func:`gguf_hf_config`'s dict listing the per-layer arrays whose entries are all equal (full GGUF
#: keys), read as that one number; transformers' reader is shown them so while it reads the file
EQUAL_PER_LAYER = "headscope_equal_per_layer"


@dataclass(frozen=True)
class _GGUFSizes:
    """A GGUF file's sizes, checked: ``values`` by key (without the ``<arch>.`` prefix; a per-layer
    array whose entries are all equal is that entry), ``per_layer`` the arrays whose entries differ,
    ``kinds`` each key's stored value type (to spot a negative count written unsigned)."""

    values: dict[str, int]
    per_layer: dict[str, tuple[int, ...]]
    kinds: dict[str, Any]
    equal_arrays: tuple[str, ...] = ()

    def layers(self, key: str) -> tuple[int, ...] | None:
        """``key``'s value in each layer (None: the file does not give it)."""
        if key in self.per_layer:
            return self.per_layer[key]
        return (self.values[key],) * self.values["block_count"] if key in self.values else None

    def show(self, key: str, v: int) -> str:
        """``v`` as a message states it, with what it reads as signed when it looks like a
        negative count written unsigned (``4294967292 (-4 as a signed 32-bit integer)``)."""
        bits = {"UINT32": 32, "UINT64": 64}.get(getattr(self.kinds.get(key), "name", None))
        if bits and v >= 1 << (bits - 1):
            return f"{v:,} ({v - (1 << bits):,} as a signed {bits}-bit integer: a negative count?)"
        return f"{v:,}"


def _gguf_sizes(fields: dict, gguf_arch: str, model_type: str, path: Path) -> _GGUFSizes:
    """Read and check the sizes of :data:`_GGUF_SIZES` under their GGUF names: each one integer
    (or, for :data:`_GGUF_PER_LAYER`, an array with one non-negative entry per layer), positive,
    below 2**63; at most :data:`GGUF_MAX_LAYERS` layers. Mamba's files write head counts and
    ``feed_forward_length`` 0 ("unused"): those are left out. Raises ``CheckpointError`` naming
    the key and the value."""
    from gguf import GGUFValueType

    from headscope.probes.errors import CheckpointError

    def bad(key: str, msg: str) -> CheckpointError:  # msg: " must be ..." or "=value is ..."
        return CheckpointError(f"{path}: GGUF metadata {gguf_arch}.{key}{msg}")

    values: dict[str, int] = {}
    per_layer: dict[str, tuple[int, ...]] = {}
    kinds: dict[str, Any] = {}
    equal: list[str] = []
    for key in _GGUF_SIZES:
        field = fields.get(f"{gguf_arch}.{key}")
        if field is None:
            continue
        try:
            v = field.contents()
        except Exception:  # noqa: BLE001 - an entry the reader cannot decode
            raise bad(key, " cannot be read") from None
        is_array = bool(field.types) and field.types[0] == GGUFValueType.ARRAY
        kinds[key] = field.types[-1] if field.types else None
        items = v if is_array else [v]
        if is_array and key not in _GGUF_PER_LAYER:
            raise bad(key, f" must be one integer; got an array of {len(items)}")
        if is_array and not items:
            raise bad(key, " is an empty array; expected one entry per layer")
        for x in items:
            if isinstance(x, bool) or not isinstance(x, int):
                raise bad(key, f" must be a positive integer; got {x!r}")
            if x < 0:
                raise bad(key, f" must be a positive integer; got {x:,}")
            if x >= _MAX_SIZE:
                raise bad(key, f"={x:,} is past 2**63, more than any tensor can index")
        if not is_array:
            values[key] = v
            continue
        n = values.get("block_count")
        if n is not None and len(items) != n:
            raise bad(key, f" gives {len(items)} per-layer entries; {gguf_arch}.block_count is {n}")
        if len(set(items)) == 1:
            values[key] = items[0]
            equal.append(f"{gguf_arch}.{key}")
        else:
            per_layer[key] = tuple(items)
    if model_type == "mamba":
        for key in _GGUF_PER_LAYER:
            if values.get(key) == 0:
                del values[key]
    for key, v in values.items():
        if v == 0:
            raise bad(key, " must be a positive integer; got 0")
    if values.get("block_count", 0) > GGUF_MAX_LAYERS:
        raise bad(
            "block_count",
            f"={values['block_count']:,} is past {GGUF_MAX_LAYERS}, the most layers llama.cpp loads (LLAMA_MAX_LAYERS)",
        )
    return _GGUFSizes(values, per_layer, kinds, tuple(equal))


def _gguf_heads(sizes: _GGUFSizes, gguf_arch: str, path: Path) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(query heads, KV heads)`` of each layer, checked: some layer has heads, none more than
    ``embedding_length``; KV heads divide the query heads of their layer; without a
    ``key_length``, the heads (layer 0's, as llama.cpp reads them) divide ``embedding_length``
    (d_head = embedding_length / head_count). A layer may have no heads at all only in a
    per-layer array (attention-free layers: LFM2's convolutions, Nemotron-51B's skipped attention)."""
    from headscope.probes.errors import CheckpointError

    key = f"{gguf_arch}.attention"
    d_model = sizes.values["embedding_length"]
    heads = sizes.layers("attention.head_count")
    kv_heads = sizes.layers("attention.head_count_kv") or heads
    if not any(heads):
        raise CheckpointError(f"{path}: GGUF metadata {key}.head_count is 0 in every layer; expected heads somewhere")
    varies = "attention.head_count" in sizes.per_layer or "attention.head_count_kv" in sizes.per_layer
    for i, (h, kv) in enumerate(zip(heads, kv_heads)):
        where = f" in layer {i}" if varies else ""
        if h > d_model:
            raise CheckpointError(
                f"{path}: GGUF metadata {key}.head_count={sizes.show('attention.head_count', h)}{where} is more than "
                f"{gguf_arch}.embedding_length={d_model:,} (each head reads at least one dimension of the residual stream)"
            )
        if kv and not h:
            raise CheckpointError(
                f"{path}: GGUF metadata {key}.head_count_kv={kv}{where} gives KV heads to a layer without query heads"
            )
        if kv and h % kv:
            raise CheckpointError(
                f"{path}: GGUF metadata {key}.head_count_kv={sizes.show('attention.head_count_kv', kv)} does not divide "
                f"{key}.head_count={h}{where} (each KV head serves an equal group of query heads)"
            )
    first = next(h for h in heads if h)
    if "attention.key_length" not in sizes.values and d_model % first:
        raise CheckpointError(
            f"{path}: GGUF metadata {key}.head_count={first} does not divide {gguf_arch}.embedding_length={d_model:,}, "
            f"and no {key}.key_length gives d_head (llama.cpp takes d_head = embedding_length / head_count)"
        )
    return heads, kv_heads


def _per_layer_heads(hf: dict, sizes: _GGUFSizes, heads, kv_heads, gguf_arch: str, model_type: str, path, strict):
    """A file whose layers differ in heads, KV heads or MLP width: refused for loading (no
    backend here builds layers of different widths), named in one line; for the card
    (``strict=False``), ``hf[PER_LAYER]`` holds the per-layer values and ``hf[NOT_LOADABLE]`` why
    it cannot load. LFM2's KV heads, 0 in its convolution layers and one number in its attention
    layers, are what transformers builds (``full_attn_idxs``): read as that number, as it does."""
    from headscope.probes.errors import ModelIncompatibleError

    varying = dict(sizes.per_layer)
    kv = varying.get("attention.head_count_kv")
    if model_type == "lfm2" and kv is not None and len(set(kv) - {0}) == 1:
        del varying["attention.head_count_kv"]
    if not varying:
        return
    said = "; ".join(f"{gguf_arch}.{k} = {layer_runs(v)}" for k, v in varying.items())
    why = f"per-layer sizes ({said}): no backend here builds layers of different widths"
    if strict:
        raise ModelIncompatibleError(f"{path}: GGUF metadata gives {why}")
    hf[NOT_LOADABLE] = f"the metadata gives {why}"
    hf[PER_LAYER] = {
        "num_attention_heads": list(heads),
        "num_key_value_heads": list(kv_heads),
        **({"intermediate_size": list(varying["feed_forward_length"])} if "feed_forward_length" in varying else {}),
    }


def layer_runs(values) -> str:
    """Per-layer values as runs: ``4, 8`` or ``8 ×3, 4`` (a value repeated in consecutive layers
    once, with its count).

    >>> layer_runs([8, 8, 8, 4])
    '8 ×3, 4'
    """
    values = list(values)
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        out.append(f"{values[i]}" if j - i == 1 else f"{values[i]} ×{j - i}")
        i = j
    return ", ".join(out)


#: GGUF architectures whose layers llama.cpp lays out the common way (``llama-model.cpp``): separate
#: or fused ``attn_q/k/v`` of head_count × key_length rows, ``ffn_gate/up/down`` of feed_forward_length
#: (Phi-3's ``ffn_up`` holds gate and up: twice that); their block tensors' shapes are checked
#: against the metadata (every architecture's embedding, output and layer numbers are)
_COMMON_LAYOUT = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen2moe",
        "qwen3moe",
        "gemma2",
        "gemma3",
        "phi3",
        "starcoder2",
        "stablelm",
        "falcon",
        "bloom",
        "gpt2",
        "nemotron",
    }
)
_NORMS = ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm")


def _check_gguf_tensors(reader, hf: dict, sizes: _GGUFSizes, gguf_arch: str, path: Path) -> None:
    """Refuse a GGUF file whose tensor table disagrees with its metadata, before transformers
    reads it (it would stop on the first mismatch with a ``RuntimeError`` naming neither file nor
    key): a tensor of a layer past ``block_count``, a layer without tensors, or a tensor whose
    shape is not the one the sizes imply: the embedding and the output ``[embedding_length,
    vocab_size]``, GPT-2's positions ``[embedding_length, context_length]`` and, for
    :data:`_COMMON_LAYOUT`, each layer's attention, MLP and norms. Shapes are given as llama.cpp
    prints them (``ne0`` first: a linear map's input width, then its output width)."""
    import re

    from headscope.probes.errors import CheckpointError

    tensors = list(reader.tensors)
    n_layers = sizes.values.get("block_count")
    layer_of = {t.name: int(m.group(1)) for t in tensors if (m := re.match(r"blk\.(\d+)\.", t.name))}
    if n_layers and layer_of:
        past = [name for name, i in layer_of.items() if i >= n_layers]
        if past:
            raise CheckpointError(
                f"{path}: tensor {past[0]!r} belongs to layer {layer_of[past[0]]}, but {gguf_arch}.block_count is "
                f"{n_layers} (layers 0–{n_layers - 1}); the metadata and the tensors disagree"
            )
        empty = sorted(set(range(n_layers)) - set(layer_of.values()))
        if empty:
            raise CheckpointError(
                f"{path}: {gguf_arch}.block_count is {n_layers}, but the file holds no tensor of layer {empty[0]} "
                f"(blk.{empty[0]}.*; {len(empty)} layer(s) without tensors); the metadata and the tensors disagree"
            )
    d_model, vocab = sizes.values.get("embedding_length"), hf.get("vocab_size")
    said_d, said_v = f"{gguf_arch}.embedding_length {d_model}", f"vocab_size {vocab}"
    expected: dict[str, tuple[tuple[int, ...], str]] = {}
    if d_model and vocab:
        for name in ("token_embd.weight", "output.weight"):
            expected[name] = ((d_model, vocab), f"{said_d}, {said_v}")
    if d_model:
        expected["output_norm.weight"] = expected["output_norm.bias"] = ((d_model,), said_d)
    ctx = sizes.values.get("context_length")
    if gguf_arch == "gpt2" and d_model and ctx:
        expected["position_embd.weight"] = ((d_model, ctx), f"{said_d}, {gguf_arch}.context_length {ctx}")
    heads = sizes.layers("attention.head_count")
    if gguf_arch in _COMMON_LAYOUT and d_model and heads and n_layers:
        kv_heads = sizes.layers("attention.head_count_kv") or heads
        d_k = sizes.values.get("attention.key_length") or hf.get("head_dim") or d_model // max(heads)
        d_v = sizes.values.get("attention.value_length") or d_k
        d_mlp = sizes.layers("feed_forward_length")
        for i in range(n_layers):
            h, kv = heads[i], kv_heads[i]
            q, k, v = h * d_k, kv * d_k, kv * d_v
            hs = f"head_count {h} × d_head {d_k}"
            kvs = f"head_count_kv {kv} × d_head {d_k}"
            rows = {
                "attn_q": ((d_model, q), q, f"{said_d}; {hs}"),
                "attn_k": ((d_model, k), k, f"{said_d}; {kvs}"),
                "attn_v": ((d_model, v), v, f"{said_d}; {kvs}"),
                "attn_qkv": ((d_model, q + k + v), q + k + v, f"{said_d}; q, k, v of {hs}, {kvs}"),
                "attn_output": ((h * d_v, d_model), d_model, f"{hs}; {said_d}"),
            }
            if d_mlp:
                f_i = d_mlp[i]
                up = 2 * f_i if gguf_arch == "phi3" else f_i
                ff = f"{gguf_arch}.feed_forward_length {f_i}"
                rows |= {
                    "ffn_gate": ((d_model, f_i), f_i, f"{said_d}; {ff}"),
                    "ffn_up": ((d_model, up), up, f"{said_d}; {'2 × ' if up != f_i else ''}{ff}"),
                    "ffn_down": ((f_i, d_model), d_model, f"{ff}; {said_d}"),
                }
            for stem, (shape, out, why) in rows.items():
                expected[f"blk.{i}.{stem}.weight"] = (shape, why)
                expected[f"blk.{i}.{stem}.bias"] = ((out,), why)
            for stem in _NORMS:
                expected[f"blk.{i}.{stem}.weight"] = expected[f"blk.{i}.{stem}.bias"] = ((d_model,), said_d)
    for t in tensors:
        if t.name not in expected:
            continue
        shape, why = expected[t.name]
        got = tuple(int(n) for n in t.shape)
        if got != shape:
            raise CheckpointError(
                f"{path}: tensor {t.name!r} has shape [{', '.join(map(str, got))}]; the metadata implies "
                f"[{', '.join(map(str, shape))}] ({why}; ne0 first, as llama.cpp prints it)"
            )


#: ``general.architecture`` → layer count of the file's 27B model, on which llama.cpp scales
#: Gemma's queries by 1/√(d_model / heads) instead of 1/√d_head (``llama-model.cpp``)
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
#: the Llama 3 RoPE scaling that ``convert_hf_to_gguf.py`` bakes into a ``rope_freqs`` tensor
#: (low/high frequency factors, original context); only the factor differs between releases
_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _gguf_query_pre_attn_scalar(scale, gguf_arch: str, hf: dict) -> float:
    """Gemma's ``query_pre_attn_scalar``, which llama.cpp's GGUF files do not store: an
    ``attention.scale`` in the metadata where there is one (scalar = scale⁻²), else what
    llama.cpp derives: d_model / heads on the 27B models, d_head on the others (Gemma 2 2B/9B,
    Gemma 3 1B/4B/12B: 256, as their HF configs say)."""
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0:
        value = round(float(scale) ** -2, 3)
    elif hf["num_hidden_layers"] == _GEMMA_27B_LAYERS.get(gguf_arch):
        value = hf["hidden_size"] / hf["num_attention_heads"]
    else:
        value = float(hf["head_dim"])
    return int(value) if float(value).is_integer() else value


def _gguf_rope_parameters(reader, get, gguf_arch: str, model_type: str, hf: dict, path: Path) -> dict | None:
    """``rope_parameters`` (transformers 5) from a GGUF file, where its RoPE is not the plain
    one: ``rope.scaling.type`` linear or yarn with its factor; Gemma 3's per-layer-type pair
    (global layers scaled, sliding layers at ``rope.freq_base_swa``, 10,000 by default); and
    Llama 3's scaling, which llama.cpp stores only as the per-frequency factors of a
    ``rope_freqs`` tensor: read back as ``llama3`` parameters and checked to reproduce every
    factor. None where the RoPE is plain. Factors transformers cannot take from a GGUF (Phi-3's
    long/short ``rope_factors``, a ``rope_freqs`` that is not Llama 3's) are refused by name."""
    from headscope.probes.errors import ModelIncompatibleError

    theta = float(hf.get("rope_theta", 10000.0))
    kind, factor = get(f"{gguf_arch}.rope.scaling.type"), _number(get(f"{gguf_arch}.rope.scaling.factor"))
    tensors = {t.name: t for t in reader.tensors}
    odd = sorted(n for n in tensors if n.startswith("rope_factors"))
    if odd:
        raise ModelIncompatibleError(
            f"{path}: GGUF tensors {', '.join(odd)} (per-frequency RoPE factors, e.g. Phi-3's LongRoPE) are not read "
            "by transformers from a GGUF file; load the model's HF checkpoint instead"
        )
    scaled = None
    if kind in ("linear", "yarn") and factor and factor != 1.0:
        scaled = {"rope_type": kind, "factor": factor, "rope_theta": theta}
        original = _int_or_none(get(f"{gguf_arch}.rope.scaling.original_context_length"))
        if kind == "yarn" and original:
            scaled["original_max_position_embeddings"] = original
    if "rope_freqs.weight" in tensors:
        if model_type not in ("llama", "mistral"):
            raise ModelIncompatibleError(
                f"{path}: a {gguf_arch} GGUF with a rope_freqs tensor (per-frequency RoPE factors) is not read right "
                "by transformers; load the model's HF checkpoint instead"
            )
        dim = _int_or_none(get(f"{gguf_arch}.rope.dimension_count")) or hf["head_dim"]
        factors = [float(x) for x in tensors["rope_freqs.weight"].data.reshape(-1)]
        scaled = {"rope_type": "llama3", **_llama3_rope_from_factors(factors, theta, dim, path), "rope_theta": theta}
    if model_type == "gemma3_text":
        local = _number(get(f"{gguf_arch}.rope.freq_base_swa")) or 10000.0
        return {
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
            "full_attention": scaled or {"rope_type": "default", "rope_theta": theta},
        }
    return scaled


def _llama3_rope_from_factors(factors: list[float], theta: float, dim: int, path: Path) -> dict:
    """Llama 3's RoPE parameters from a ``rope_freqs`` tensor (the factor by which llama.cpp
    divides each frequency): the factor is its largest entry, the band is Llama 3's
    (:data:`_LLAMA3_ROPE`, the same in 3.1, 3.2 and 3.3); refused unless these reproduce every
    factor to 1e-5 (relative) through the in-house RoPE
    (:func:`~headscope.probes.models.attention.scaled_inv_freq`)."""
    import torch

    from headscope.probes.errors import ModelIncompatibleError
    from headscope.probes.models.attention import scaled_inv_freq

    factor = max(factors, default=1.0)
    worst = float("inf")
    if len(factors) == dim // 2 and factor > 0:
        plain = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        expected = (plain / scaled_inv_freq(plain, {"rope_type": "llama3", "factor": factor, **_LLAMA3_ROPE})).double()
        worst = float(((torch.tensor(factors, dtype=torch.float64) - expected).abs() / expected).max())
    if worst > 1e-5:
        raise ModelIncompatibleError(
            f"{path}: its rope_freqs tensor ({len(factors)} factors for d_rot {dim}) is not Llama 3's RoPE scaling "
            f"(factor {factor:g}, band {_LLAMA3_ROPE}; worst relative difference {worst:.2g}), and transformers "
            "ignores it; load the model's HF checkpoint instead"
        )
    return {"factor": factor, **_LLAMA3_ROPE}


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
#: most layers a config may declare: every per-layer list (windows, head counts) is built from
#: the count, so 10**8 layers would hang the card before anything could refuse them
MAX_LAYERS = 4096
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def _check_per_layer(hf: dict, where: str) -> None:
    """``hf[PER_LAYER]``: a list of non-negative integers per key, one per layer."""
    from headscope.probes.errors import CheckpointError

    per, n = hf[PER_LAYER], hf.get("num_hidden_layers")
    keys = ("num_attention_heads", "num_key_value_heads", "intermediate_size")
    if not isinstance(per, dict) or not set(per) <= set(keys):
        raise CheckpointError(f"{where}: {PER_LAYER} must map some of {', '.join(keys)} to per-layer lists")
    for key, values in per.items():
        if (
            not isinstance(values, (list, tuple))
            or len(values) != n
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_SIZE for v in values)
        ):
            raise CheckpointError(f"{where}: {PER_LAYER}.{key} must list one non-negative integer per layer ({n})")


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
        if key in _LAYER_KEYS and v > MAX_LAYERS:
            raise CheckpointError(
                f"{where}: {key}={v:,} layers is past {MAX_LAYERS:,} (the largest released transformers have a few "
                "hundred); is the config's layer count right?"
            )
    n_heads = hf.get("num_attention_heads") or hf.get("n_head")
    d_model = hf.get("hidden_size") or hf.get("n_embd") or hf.get("d_model")
    n_kv = hf.get("num_key_value_heads") if family not in ENCODER_TYPES else None  # encoders: no KV heads of their own
    if PER_LAYER in hf:  # a GGUF file's layers differ: gguf_hf_config checked each layer's heads
        _check_per_layer(hf, where)
    elif n_heads and n_kv and n_heads % n_kv:
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
    _check_rope_types(hf, where)


#: the RoPE types of transformers' ``ROPE_INIT_FUNCTIONS`` (and the plain one): accepted without asking it
_ROPE_TYPES = ("default", "dynamic", "linear", "llama3", "longrope", "proportional", "yarn")


def _rope_type_entries(hf: dict) -> list[tuple[str, Any]]:
    """``(key path, rope type)`` of each RoPE parameter set in the config: ``rope_parameters``
    (one set, or one per layer type) and the older ``rope_scaling`` (``type`` or ``rope_type``)."""
    out = []
    for top in ("rope_parameters", "rope_scaling"):
        rope = hf.get(top)
        if not isinstance(rope, dict):
            continue
        sets = (
            {f"{top}.{k}": v for k, v in rope.items()}
            if rope and all(isinstance(v, dict) or v is None for v in rope.values())
            else {top: rope}
        )
        for key, params in sets.items():
            if isinstance(params, dict):
                for name in ("rope_type", "type"):
                    if name in params:
                        out.append((f"{key}.{name}", params[name]))
                        break
    return out


def _check_rope_types(hf: dict, where: str) -> None:
    """Refuse a config whose RoPE type transformers does not implement (it would fail with a bare
    ``KeyError`` while building the model, after the weights were opened). A type outside
    :data:`_ROPE_TYPES` is put to transformers' own config class of the family, which renames its
    legacy spellings (Phi-3's ``su``, Qwen2-VL's ``mrope``); code shipped with a checkpoint
    (``auto_map``) may define its own and is not judged."""
    from headscope.probes.errors import CheckpointError

    odd = [(k, v) for k, v in _rope_type_entries(hf) if v not in _ROPE_TYPES]
    if not odd or "auto_map" in hf:
        return
    key, value = odd[0]
    valid = _ROPE_TYPES
    try:
        from transformers import CONFIG_MAPPING
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        valid = tuple(sorted({"default", *ROPE_INIT_FUNCTIONS}))
        config_class = CONFIG_MAPPING[hf.get("model_type")]
    except (ImportError, KeyError):
        return  # a family transformers does not know: whatever builds it judges its RoPE
    if isinstance(value, str):
        from headscope.probes.models.checkpoints import quiet_transformers

        try:
            with quiet_transformers():
                config = config_class(
                    **{k: v for k, v in hf.items() if k not in ("model_type", "transformers_version")}
                )
        except Exception as e:  # noqa: BLE001 - the family's config class refuses it: say why
            detail = " ".join(str(e).split())[:200] or type(e).__name__
            raise CheckpointError(
                f"{where}: {key} is {value!r}, and transformers' {config_class.__name__} refuses the config "
                f"({detail}); fix it in the config"
            ) from None
        allowed = {*valid, getattr(config_class, "default_rope_type", "default")}
        if all(v in allowed for _, v in _rope_type_entries(config.to_dict())):
            return  # a legacy spelling the family's config renames
    raise CheckpointError(
        f"{where}: {key} is {value!r}, not a RoPE type transformers implements (valid: {', '.join(valid)}); "
        "fix it in the config"
    )
