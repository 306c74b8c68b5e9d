"""A checkpoint's architecture, read once from an HF ``config.json`` dict.

:func:`arch_from_hf_config` is the only reader of an HF configuration: the card
(:func:`~headscope.probes.models.card.card_from_hf_config`), the analyses' spec
(:class:`~headscope.probes.models.backend.ModelSpec` of the HF and bridge backends) and
the in-house configuration (:func:`~headscope.probes.models.config.config_from_hf`) all
derive from its :class:`ArchSpec`, so they cannot disagree (an encoder is an encoder in
all three). A GGUF file's metadata goes through the same reader
(:func:`~headscope.probes.models.gguf.arch_from_gguf` maps it to HF field names first).

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

from typing import Any

from headscope.probes.models.families import FAMILIES, family_of
from headscope.probes.models.quiet import quiet_transformers
from headscope.probes.models.spec import ArchSpec

#: model types whose attention is bidirectional (encoders): the encoder families and these
#: others; every other type is a causal decoder. ``is_decoder: true`` in the config (a BERT
#: trained as a decoder) makes one causal.
ENCODER_TYPES = frozenset(t for t, f in FAMILIES.items() if f.encoder) | frozenset(
    {
        "albert",
        "big_bird",
        "camembert",
        "canine",
        "convbert",
        "data2vec-text",
        "deberta",
        "deberta-v2",
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
        "roberta-prelayernorm",
        "reformer",
        "roc_bert",
        "roformer",
        "squeezebert",
        "t5",  # T5 and kin: the hf backend loads an encoder–decoder as its encoder (T5EncoderModel)
        "mt5",
        "umt5",
        "xlm",
        "xlm-roberta",
        "xlm-roberta-xl",
        "xmod",
    }
)
#: decoders with learned absolute positions: the families' and these others (every other decoder
#: without ALiBi rotates: RoPE)
_LEARNED_DECODERS = frozenset(
    t for t, f in FAMILIES.items() if not f.encoder and f.positional == "learned"
) | frozenset({"gpt_bigcode", "opt", "biogpt", "gpt_neo", "xglm", "imagegpt"})
_ALIBI = frozenset({"bloom", "mpt", "falcon_alibi"})
#: decoders that rotate (RoPE) even where the config names no RoPE key: the families' and Gemma 1
_ROPE_DECODERS = frozenset(t for t, f in FAMILIES.items() if not f.encoder and f.positional == "rope") | {"gemma"}
#: model types whose query and key heads are normalised before the dot product: the families'
#: (with their aliases) and these others
_QK_NORM_TYPES = frozenset(t for f in FAMILIES.values() if f.qk_norm for t in (f.model_type, *f.aliases)) | frozenset(
    {"qwen3_moe", "olmoe", "chameleon"}
)


#: fact -> the config keys that spell it, the first truthy one wins (``num_layers`` / ``num_heads`` /
#: ``d_kv`` / ``d_ff``: T5 and its kin; ``n_layers`` / ``n_heads``: MPT, XLM;
#: ``multi_query_group_num``: ChatGLM; ``kv_channels``: the head size Megatron-style configs name; an
#: encoder-decoder's encoder sizes, else its decoder's (TrOCR); ``emb_dim``: XLM; ``attention_heads``: XGLM)
_KEYS = {
    "layers": (
        "num_hidden_layers",
        "n_layer",
        "n_layers",
        "num_layers",
        "encoder_layers",
        "num_encoder_layers",
        "decoder_layers",
    ),
    "d_model": ("hidden_size", "n_embd", "d_model", "emb_dim"),
    "heads": (
        "num_attention_heads",
        "n_head",
        "n_heads",
        "num_heads",
        "encoder_attention_heads",
        "num_encoder_attention_heads",
        "attention_heads",
        "decoder_attention_heads",
    ),
    "kv_heads": ("num_key_value_heads", "multi_query_group_num"),
    "d_head": ("head_dim", "d_kv", "kv_channels"),
    "d_mlp": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "encoder_ffn_dim"),
}


def is_encoder_type(mtype: str) -> bool:
    """True for a bidirectional model type: one of :data:`ENCODER_TYPES`, or a type of transformers'
    registry that has no causal-LM class (``AutoModelForCausalLM`` cannot build it: an encoder or an
    embedder, loaded with ``AutoModel``); a type the registry does not know is a decoder."""
    if mtype in ENCODER_TYPES:
        return True
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    return mtype in CONFIG_MAPPING_NAMES and mtype not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def _layer_kinds_count(hf: dict) -> int | None:
    """The depth of a config that has no layer count but lists its layers' kinds (Nemotron-H's
    ``layers_block_type``: Mamba, MoE, attention, MLP)."""
    kinds = hf.get("layers_block_type") or hf.get("layer_types")
    return len(kinds) if isinstance(kinds, list) and kinds else None


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
    return "rope" if mtype in _ROPE_DECODERS else None


def _sliding(hf: dict, mtype: str, n_layers: int, where: str = "config") -> tuple[int | None, ...] | None:
    """The window of each layer (``None``: global), as transformers decides it: ``layer_types``
    when the config lists them; else Gemma's pattern (every ``sliding_window_pattern``-th layer
    global: 2 for Gemma 2, 6 for Gemma 3); else Qwen's ``max_window_layers`` (the layers from it
    on slide, when ``use_sliding_window``); else every layer (Mistral, Phi-3)."""
    window = _int_or_none(hf.get("sliding_window"))
    if not window or hf.get("use_sliding_window") is False:
        return None
    if n_layers > MAX_LAYERS:
        from headscope.probes.errors import CheckpointError

        raise CheckpointError(
            f"{where}: num_hidden_layers={n_layers:,} layers with a sliding window is past {MAX_LAYERS:,} (the "
            "largest released transformers have a few hundred; each layer's window is listed); is the layer count "
            "right?"
        )
    types = hf.get("layer_types")
    pattern = hf.get("sliding_window_pattern")
    family = family_of(mtype)
    every = _int_or_none(pattern) or (family.sliding_pattern if family else None)  # every n-th layer global
    if isinstance(types, list) and len(types) == n_layers:
        slides = [t == "sliding_attention" for t in types]
    elif isinstance(pattern, list) and len(pattern) == n_layers:  # GGUF: one flag per layer
        slides = [bool(p) for p in pattern]
    elif every:
        slides = [bool((i + 1) % every) for i in range(n_layers)]
    elif hf.get("use_sliding_window") and _int_or_none(hf.get("max_window_layers")) is not None:
        slides = [i >= hf["max_window_layers"] for i in range(n_layers)]
    else:
        slides = [True] * n_layers
    per_layer = tuple(window if slide else None for slide in slides)
    return per_layer if any(per_layer) else None


#: model types whose config counts no layers because they are no single stack of layers over the tokens: why
_NO_LAYER_STACK = {
    "funnel": "Funnel Transformer: each block after the first attends from positions mean-pooled by 2, "
    "so no pattern past its first block is over the tokens",
}


def _core_sizes(hf: dict, family, where: str) -> tuple[dict, int, int, int]:
    """``(hf, layers, d_model, heads)``: the config under the family's own names (and, for an
    encoder-decoder holding its sizes in its parts, T5Gemma, its encoder's), its three sizes; a
    :class:`~headscope.probes.errors.ModelIncompatibleError` naming the ones it lacks."""
    from headscope.probes.errors import ModelIncompatibleError

    own_names = family.config_names if family else {}
    hf = {**{ours: hf[theirs] for theirs, ours in own_names.items() if theirs in hf}, **hf}
    if not _first(hf, *_KEYS["layers"]) and isinstance(hf.get("encoder"), dict):  # T5Gemma: sizes in its parts
        hf = {**hf["encoder"], **hf}
    sizes = {
        "layer count": _first(hf, *_KEYS["layers"]) or _layer_kinds_count(hf),
        "hidden size": _first(hf, *_KEYS["d_model"]),
        "head count": _first(hf, *_KEYS["heads"]),
    }
    facts = {"layer count": "layers", "hidden size": "d_model", "head count": "heads"}
    lacks = [f"{what} ({', '.join(_KEYS[facts[what]][:3])}, …)" for what, v in sizes.items() if not v]
    if lacks:  # Funnel: its layers in pooling blocks (block_sizes), no count
        why = _NO_LAYER_STACK.get(hf.get("model_type"))
        raise ModelIncompatibleError(
            f"config of {where!r} has no layer/head/hidden-size fields (model_type {hf.get('model_type')!r}): "
            f"no {' and no '.join(lacks)}" + (f"; {why}" if why else "")
        )
    return hf, sizes["layer count"], sizes["hidden size"], sizes["head count"]


def arch_from_hf_config(hf: dict[str, Any], where: str = "config") -> ArchSpec:
    """The :class:`ArchSpec` of an HF ``config.json`` dict (or ``PretrainedConfig.to_dict()``).

    Sizes are checked first (:func:`check_hf_config`: ``CheckpointError`` naming ``where``
    and the key); a config without layer, head and hidden-size fields raises
    :class:`~headscope.probes.errors.ModelIncompatibleError`.
    """
    check_hf_config(hf, where)
    mtype = hf.get("model_type") or "?"
    family = FAMILIES.get(mtype)
    hf, n_layers, d_model, n_heads = _core_sizes(hf, family, where)
    # an encoder–decoder is read as its encoder, the part the hf backend analyses (BART, T5, …)
    encoder = (is_encoder_type(mtype) or bool(hf.get("is_encoder_decoder"))) and not hf.get("is_decoder")
    d_head = _first(hf, *_KEYS["d_head"]) or d_model // n_heads
    if mtype == "convbert" and isinstance(hf.get("head_ratio"), int) and hf["head_ratio"] > 1:
        n_heads = max(1, n_heads // hf["head_ratio"])  # ConvBERT: 1/head_ratio of the heads attend, each as wide
    n_kv = (None if encoder else _first(hf, *_KEYS["kv_heads"])) or n_heads  # encoders: MHA
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
        d_head=d_head,
        d_mlp=_int_or_none(_first(hf, *_KEYS["d_mlp"])),
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
        sliding_window=_sliding(hf, mtype, n_layers, where),
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
            f"{k}={hf[k]!r}"
            for k, default in (family.fixed_options if family else {}).items()
            if k in hf and hf[k] != default
        ),
        **_per_layer_fields(hf),
    )


#: key of :func:`~headscope.probes.models.gguf.gguf_hf_config`'s dict (``strict=False``: the card) holding
#: the sizes of a file whose layers differ: ``{HF key: [one per layer]}`` (``num_attention_heads``,
#: ``num_key_value_heads``, ``intermediate_size``)
PER_LAYER = "headscope_per_layer"


def _per_layer_fields(hf: dict) -> dict:
    """The :class:`ArchSpec` per-layer fields of ``hf[PER_LAYER]`` (checked by :func:`check_hf_config`)."""
    per = hf.get(PER_LAYER) or {}
    names = {
        "num_attention_heads": "heads_per_layer",
        "num_key_value_heads": "kv_heads_per_layer",
        "intermediate_size": "d_mlp_per_layer",
    }
    return {field: tuple(per[key]) for key, field in names.items() if key in per}


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


# -- checking a config.json's sizes before anything is built -------------------------------

# keys that hold a size (a family adds the ones its config must hold: Family.required_sizes); any
# of _ANY_SIZE_KEYS present is checked too
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
#: most layers a config with per-layer sliding windows may declare: the windows are one entry
#: per layer, so 10**8 layers hung the card building them (a config without them stays
#: arithmetic at any layer count)
MAX_LAYERS = 4096


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
    rules = FAMILIES.get(family)
    required, optional = (rules.required_sizes, rules.optional_sizes) if rules else ((), ())
    for key in required:
        if key not in hf:
            raise CheckpointError(f"{where}: {key} is missing (a {family!r} config needs it); add it to the config")
    for key in dict.fromkeys((*required, *optional, *_ANY_SIZE_KEYS)):
        if key not in hf or (hf[key] is None and key in _NULL_MEANS_UNSET):
            continue
        v = hf[key]
        if isinstance(v, list) and v and key == "intermediate_size":  # one per layer (Gemma 3n)
            v = next((x for x in v if isinstance(x, bool) or not isinstance(x, int) or x <= 0), max(v))
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise CheckpointError(f"{where}: {key} must be a positive integer; got {v!r}")
        if v >= _MAX_SIZE:
            raise CheckpointError(f"{where}: {key}={v} is past 2**63, more than any tensor can index")

    n_heads = hf.get("num_attention_heads") or hf.get("n_head")
    n_kv = hf.get("num_key_value_heads") if family not in ENCODER_TYPES else None  # encoders: no KV heads of their own
    if PER_LAYER in hf:  # a GGUF file's layers differ: gguf_hf_config checked each layer's heads
        _check_per_layer(hf, where)
    elif n_heads and n_kv and n_heads % n_kv:
        raise CheckpointError(
            f"{where}: num_key_value_heads={n_kv} does not divide num_attention_heads={n_heads} "
            "(each KV head serves an equal group of query heads)"
        )
    if rules is not None and rules.check_sizes is not None:  # the family's own rule (BERT, Llama)
        rules.check_sizes(hf, where)
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
