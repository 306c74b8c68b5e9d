"""A tiny random checkpoint of any text family in transformers' registry, derived from its config
class alone.

:func:`text_families` sorts every model type of the installed transformers' ``CONFIG_MAPPING``
into the text families ``AutoModelForCausalLM`` (a decoder), ``AutoModelForMaskedLM`` (an
encoder) or ``AutoModel`` (a text task only: an encoder–decoder, an embedder) builds, and the
others with the reason they are left out (vision, audio, multimodal, time series, …).
:func:`tiny_config` shrinks a family's default config through its own attribute names
(``attribute_map`` and the common aliases: ``n_embd``, ``d_model``, ``n_head``, ``n_layer``,
``ffn_dim``, ``d_ff``, …): d_model 64, 2 layers, 4 heads of 16 (a decoder's KV heads 2, or 1 where
the family is MQA), FFN 128, the vocabulary of the tokenizer saved beside it; :func:`save_tiny`
builds the model, draws its weights (seeded) and writes it with that tokenizer. A family that
cannot be shrunk or built raises :class:`TinyBuildError` with the reason in one line.

>>> kind, why = text_families()["llama"]; kind
'decoder'
>>> cfg = tiny_config("llama", vocab_size=600, specials={"pad_token_id": 0})
>>> cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
(64, 2, 4, 2, 16)
>>> text_families()["vit"][0], text_families()["vit"][1][:20]
(None, 'not a text model: in')
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from headscope.reports.tools.sweep.tiny_rules import (
    NOT_STANDALONE,
    UNSHRUNK,
    family_fields,
    fill_unset,
    sub_config_parts,
)

__all__ = ["KINDS", "MAX_PARAMS", "TinyBuildError", "save_tiny", "text_families", "tiny_config"]

#: kind -> the Auto class that builds it (a decoder with its LM head, an encoder as the base model
#: as ``tests/tiny_models.py`` saves one, a text model that has neither head as the base model)
KINDS = {"decoder": "AutoModelForCausalLM", "encoder": "AutoModel", "base": "AutoModel"}
#: the most parameters a tiny model may keep (a family whose sizes do not all shrink is left out)
MAX_PARAMS = 5_000_000
#: the tiny sizes
D_MODEL, N_LAYERS, N_HEADS, D_HEAD, D_FF = 64, 2, 4, 16, 128
#: the depths tried, fewest first, until the model holds an attention layer (a hybrid's first may
#: come late: Jamba's 5th, RecurrentGemma's 3rd)
LAYER_COUNTS = (2, 3, 4, 5, 6, 8)

#: mappings whose model types are text tasks (AutoModel builds the base model of each)
_TEXT_TASKS = (
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES",
    "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES",
)
#: mapping -> what a model type in it takes besides text (checked first: a multimodal decoder is
#: in MODEL_FOR_CAUSAL_LM too)
_NOT_TEXT = {
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES": "image-text-to-text",
    "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES": "multimodal",
    "MODEL_FOR_VISUAL_QUESTION_ANSWERING_MAPPING_NAMES": "visual question answering",
    "MODEL_FOR_DOCUMENT_QUESTION_ANSWERING_MAPPING_NAMES": "document question answering",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES": "speech-to-text",
    "MODEL_FOR_CTC_MAPPING_NAMES": "speech (CTC)",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES": "audio",
    "MODEL_FOR_TEXT_TO_SPECTROGRAM_MAPPING_NAMES": "text-to-speech",
    "MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES": "text-to-speech",
    "MODEL_FOR_IMAGE_MAPPING_NAMES": "vision",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": "vision",
    "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES": "vision-language",
    "MODEL_FOR_TIME_SERIES_PREDICTION_MAPPING_NAMES": "time series",
}
#: config keys whose name says a non-text input
_MODALITY_KEYS = ("vision_config", "audio_config", "speech_config", "image_size", "num_mel_bins", "patch_size")

#: fact -> the keys configs spell it with (resolved through each class's ``attribute_map`` first)
ALIASES = {
    "hidden": ("hidden_size", "n_embd", "n_embed", "d_model", "dim", "embed_dim", "model_dim"),
    "layers": (
        "num_hidden_layers",
        "n_layer",
        "n_layers",
        "num_layers",
        "encoder_layers",
        "decoder_layers",
        "num_decoder_layers",
        "num_encoder_layers",
    ),
    "heads": (
        "num_attention_heads",
        "n_head",
        "n_heads",
        "num_heads",
        "encoder_attention_heads",
        "decoder_attention_heads",
        "num_encoder_attention_heads",
        "num_decoder_attention_heads",
    ),
    "kv_heads": (
        "num_key_value_heads",
        "n_kv_heads",
        "num_kv_heads",
        "multi_query_group_num",
        "n_head_kv",
        "kv_n_heads",
    ),
    "head_dim": ("head_dim", "kv_channels", "d_kv", "attention_head_size", "head_size", "dim_head", "d_head"),
    "ffn": (
        "intermediate_size",
        "ffn_dim",
        "d_ff",
        "n_inner",
        "encoder_ffn_dim",
        "decoder_ffn_dim",
        "ffn_hidden_size",
        "inner_hidden_size",
        "dim_ff",
        "d_inner",
    ),
    "vocab": ("vocab_size", "n_vocab", "padded_vocab_size"),
}
#: mixture-of-experts and low-rank attention sizes: key -> (rule, value); ``max``: at most value,
#: ``set``: value, ``fill``: at most value, and value where the default is None
_SMALL = {
    "num_experts": ("max", 4),
    "num_local_experts": ("max", 4),
    "n_routed_experts": ("max", 4),
    "moe_num_experts": ("max", 4),
    "num_experts_per_tok": ("fill", 2),
    "moe_topk": ("max", 2),
    "moe_k": ("max", 2),
    "n_shared_experts": ("max", 1),
    "n_group": ("max", 1),
    "topk_group": ("max", 1),
    "first_k_dense_replace": ("max", 1),
    "moe_intermediate_size": ("set", 32),
    "shared_expert_intermediate_size": ("set", 64),
    "expert_intermediate_size": ("set", 32),
    "kv_lora_rank": ("set", 16),
    "q_lora_rank": ("set", 16),
    "qk_rope_head_dim": ("set", D_HEAD),  # = head_dim, which MLA configs rotate with
    "qk_nope_head_dim": ("set", D_HEAD),
    "v_head_dim": ("set", D_HEAD),
    "embedding_size": ("set", 32),
    "intra_bottleneck_size": ("set", D_MODEL),  # MobileBERT's attention works in its bottleneck: the tiny width
    "rotary_dim": ("max", D_HEAD // 2),  # GPT-J, CodeGen: a rotary part within the tiny head (partial rotary)
    "linear_num_heads": ("max", N_HEADS),  # Kimi-Linear's, Bailing's linear-attention layers (KDA, 32 × 128)
    "linear_head_dim": ("max", D_HEAD),
    "mamba_n_heads": ("max", 4),  # Falcon-H1's Mamba mixers: 4 heads of its mamba_d_head, d_ssm to match
    "mamba_d_ssm": ("max", 32),
    "mamba_d_state": ("max", 16),
    "mamba_num_heads": ("max", 4),  # Nemotron-H's Mamba-2 mixers: 128 heads of 64, a 128-wide state, 8 groups
    "mamba_head_dim": ("max", D_HEAD),
    "ssm_state_size": ("max", 16),
    "n_groups": ("max", 1),
    "moe_shared_expert_intermediate_size": ("set", 64),
    "max_position_embeddings": ("max", 512),
    "n_positions": ("max", 512),
}

#: family -> a tiny width of its own, where 64 cannot be: LiLT splits the hidden size into its six
#: layout embeddings (``hidden_size // 6`` each, concatenated back to ``hidden_size``) and shrinks it by
#: ``channel_shrink_ratio`` (4) for its layout stream: 96 (4 heads of 24)
_WIDTHS = {"lilt": {"hidden_size": 96}}


class TinyBuildError(Exception):
    """A family that cannot be shrunk or built; the message is the reason in one line."""


def _mapping(name: str) -> dict:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, name, {})


@cache
def text_families() -> dict[str, tuple[str | None, str]]:
    """Every model type of ``CONFIG_MAPPING``: ``model_type -> (kind, why)``, ``kind`` one of
    :data:`KINDS` for a text family, None for one left out, ``why`` the reason either way."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    causal = _mapping("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")
    masked = _mapping("MODEL_FOR_MASKED_LM_MAPPING_NAMES")
    base = _mapping("MODEL_MAPPING_NAMES")
    text_tasks = {t for name in _TEXT_TASKS for t in _mapping(name)}
    out: dict[str, tuple[str | None, str]] = {}
    for mtype in sorted(CONFIG_MAPPING_NAMES):
        other = next((what for name, what in _NOT_TEXT.items() if mtype in _mapping(name)), None)
        if other is not None:
            out[mtype] = (None, f"not a text model: in {other} mappings")
        elif mtype in masked:
            out[mtype] = ("encoder", f"AutoModelForMaskedLM: {masked[mtype]}")
        elif mtype in causal:
            out[mtype] = ("decoder", f"AutoModelForCausalLM: {causal[mtype]}")
        elif mtype in base and mtype in text_tasks:
            out[mtype] = ("base", f"AutoModel: {base[mtype]}")
        elif mtype in base:
            out[mtype] = (None, "no text task: AutoModel only, in no text mapping")
        else:
            out[mtype] = (None, "no model class: AutoModel, AutoModelForCausalLM and AutoModelForMaskedLM lack it")
    return out


#: an attention kind whose layers have sizes of their own (``swa_num_attention_heads``, ``global_head_dim``)
_KIND_PREFIXES = ("swa", "sliding", "global", "local", "full")


def _keys(cls, defaults: dict) -> dict[str, str]:
    """fact -> every key of this config class that spells it (``attribute_map`` resolved; an
    attention kind's own size, :data:`_KIND_PREFIXES`, as the size it prefixes)."""
    amap = getattr(cls, "attribute_map", {}) or {}
    found: dict[str, list[str]] = {}
    for fact, names in ALIASES.items():
        spelt = [amap.get(name, name) for name in names]
        if fact in ("heads", "kv_heads", "head_dim"):
            spelt += [f"{kind}_{key}" for key in spelt for kind in _KIND_PREFIXES]
        for key in spelt:
            if key in defaults and key not in {k for ks in found.values() for k in ks}:
                found.setdefault(fact, []).append(key)
    kinds = amap.get("layer_types", "layer_types")
    if not found.get("layers") and isinstance(defaults.get(kinds), list) and defaults[kinds]:
        found["layer_list"] = [kinds]
    if "hidden_dim" in defaults and "dim" in found.get("hidden", ()):  # DistilBERT: hidden_dim is its FFN
        found.setdefault("ffn", []).append("hidden_dim")
    return found


def _shrink_layer_list(values: list, n: int) -> list:
    """A per-layer list cut to ``n`` layers, keeping a second kind where there is one
    (``["sliding", …, "full"]`` -> ``["sliding", "full"]``: the last layer kept takes it when
    the first ``n`` have none)."""
    first = values[0]
    other = next((v for v in values if v != first), first)
    out = list(values[:n])
    if other not in out:
        out[-1] = other
    return out


def tiny_config(
    model_type: str, *, vocab_size: int, specials: dict[str, int], encoder: bool = False, n_layers: int = N_LAYERS
):
    """The family's config class with its default options and tiny sizes (see the module);
    ``specials``: the tokenizer's special ids (``pad_token_id``, ``bos_token_id``, …); ``encoder``: keep
    an MHA default MHA (a decoder gets 2 KV heads, GQA, where its config has the key). Raises
    :class:`TinyBuildError` for a config with a non-text part or one that refuses the sizes."""
    from transformers import CONFIG_MAPPING

    if model_type in UNSHRUNK:
        raise TinyBuildError(f"cannot shrink: {UNSHRUNK[model_type]}")
    if model_type in NOT_STANDALONE:
        raise TinyBuildError(f"not a text-only model: {NOT_STANDALONE[model_type]}")
    cls = CONFIG_MAPPING[model_type]
    try:
        defaults = cls().to_dict()
    except Exception as e:  # noqa: BLE001 - a config class that needs arguments: the reason, in one line
        raise TinyBuildError(f"default config fails: {_line(e)}") from None
    modal = [k for k in _MODALITY_KEYS if defaults.get(k) is not None]
    parts = sub_config_parts(cls, defaults)
    if modal or parts is None:
        raise TinyBuildError(f"composite config ({', '.join(modal or sorted(cls.sub_configs))}): not a text-only model")
    keys = _keys(cls, defaults)
    missing = [] if parts else [f for f in ("hidden", "layers", "heads") if not keys.get(f)]
    if "layers" in missing and keys.get("layer_list"):  # Nemotron-H: its depth is its list of layer kinds
        missing.remove("layers")
    if missing and missing != ["heads"]:  # no heads key: save_tiny says whether it has attention at all
        raise TinyBuildError(f"cannot shrink: no config key for {', '.join(missing)} ({cls.__name__})")
    picks = isinstance(_mapping("MODEL_MAPPING_NAMES").get(model_type), (list, tuple))  # Funnel: two base models
    kw = _tiny_kwargs(cls, defaults, keys, vocab_size, specials, encoder, n_layers, picks)
    for part in parts:  # DBRX's attn_config and ffn_config, T5Gemma's encoder and decoder
        sub = cls.sub_configs[part]
        sub_defaults = defaults.get(part) or sub().to_dict()
        sub_kw = _tiny_kwargs(sub, sub_defaults, _keys(sub, sub_defaults), vocab_size, specials, encoder, n_layers)
        kw[part] = {**sub_defaults, **sub_kw}
    kw.update(family_fields(model_type, kw, n_layers))
    kw.update(_WIDTHS.get(model_type, {}))
    try:
        config = cls(**kw)
    except Exception as e:  # noqa: BLE001 - a config that refuses the sizes: the reason, in one line
        raise TinyBuildError(f"config refuses tiny sizes: {_line(e)}") from None
    config._attn_implementation = "eager"
    return config


def has_heads_key(model_type: str) -> bool:
    """Whether the family's config has a key for its attention heads (in a sub-config's part, too)."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    defaults = cls().to_dict()
    return bool(_keys(cls, defaults).get("heads")) or bool(sub_config_parts(cls, defaults))


def _tiny_kwargs(cls, defaults, keys, vocab_size, specials, encoder, n_layers, picks=False) -> dict:
    """The tiny sizes of one config class (a whole model's, or a part's: a sub-config without the
    hidden, layer or head keys takes those it has)."""
    kw = _sizes(keys, defaults, encoder, n_layers)
    for key in keys.get("layer_list", ()):  # the first layer kinds of the list (save_tiny adds some until one attends)
        kw[key] = defaults[key][:n_layers]
    kw.update(_small_extras(defaults, kw, getattr(cls, "attribute_map", None)))
    for key in keys.get("vocab", ()):
        kw[key] = vocab_size
    kw.update(_token_ids(defaults, vocab_size, specials))
    depth = defaults[keys["layers"][0]] if keys.get("layers") else None
    kw.update(_layer_lists(defaults, depth, kw, n_layers))
    kw.update(_layer_overrides(defaults, kw, n_layers))
    kw.update(_defaults_chosen(defaults))
    sizes = {"d_model": D_MODEL, "d_head": D_HEAD, "vocab": vocab_size, "hidden_keys": keys.get("hidden", ())}
    kw.update(fill_unset(defaults, kw, {**sizes, "picks_architecture": picks}, n_layers))
    return kw


def _layer_lists(defaults: dict, depth, kw: dict, n_layers: int) -> dict:
    """Per-layer lists (``layer_types``, …) cut to the tiny depth; a list of one size per layer that
    a shrunk key's name begins (``num_attention_heads_per_layer``: ``num_attention_heads``) and whose
    every entry is that key's default takes the key's tiny size."""
    out = {}
    for key, value in defaults.items():
        if not (isinstance(value, list) and value and isinstance(depth, int) and len(value) == depth):
            continue
        out[key] = _shrink_layer_list(value, n_layers)
        same = all(isinstance(v, int) for v in value) and len(set(value)) == 1  # one size, every layer
        if same and isinstance(kw.get(key), int):  # the size key itself per layer (Gemma 3n's intermediate_size)
            out[key] = [kw[key]] * n_layers
            continue
        sized = [k for k in kw if same and key.startswith(k) and isinstance(kw[k], int) and value[0] == defaults.get(k)]
        if sized:
            out[key] = [kw[sized[0]]] * n_layers
    return out


def _layer_overrides(defaults: dict, kw: dict, n_layers: int) -> dict:
    """A per-layer override dict (``per_layer_config``: Gemma 4's ``{"05": {"head_dim": 512}, …}``,
    built at creation from ``global_head_dim``, a kwarg no attribute keeps) for the tiny layers: on
    those of the kind its layers are (``layer_types``), else those of its indices below the tiny depth;
    each size the tiny config shrinks (``head_dim``) takes its tiny value."""
    out = {}
    for key, value in defaults.items():
        if not (isinstance(value, dict) and value and all(str(i).isdigit() for i in value)):
            continue
        if not all(isinstance(v, dict) for v in value.values()):
            continue
        old, new = defaults.get("layer_types"), kw.get("layer_types")
        kinds = {old[int(i)] for i in value} if old and all(int(i) < len(old) for i in value) else set()
        tiny = [l for l, t in enumerate(new) if t in kinds] if kinds and new else [int(i) for i in value]
        width = len(str(next(iter(value))))
        entry = next(iter(value.values()))
        sizes = {k: kw.get(k, v) for k, v in entry.items()}
        if _is_split(
            {**{k: defaults.get(k) for k in _MLA_SPLIT}, **entry}
        ):  # the sizes it does not override: the config's  # MLA's head = its no-rotary part + its rotary part (Dots3's sliding layers)
            sizes["head_dim"] = kw.get("qk_nope_head_dim", D_HEAD) + kw.get("qk_rope_head_dim", D_HEAD)
        out[key] = {f"{l:0{width}d}": dict(sizes) for l in tiny if l < n_layers}
    return out


_MLA_SPLIT = ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim")


def _is_split(entry: dict) -> bool:
    parts = [entry.get(k) for k in _MLA_SPLIT]
    return all(isinstance(p, int) for p in parts) and parts[0] == parts[1] + parts[2]


def _defaults_chosen(defaults: dict) -> dict:
    """A ``default_<x>`` left None where the config lists the ``<x>s`` to choose from: the first
    (X-MOD's ``default_language``: its forward refuses to run without a language)."""
    out = {}
    for key, value in defaults.items():
        options = defaults.get(key.removeprefix("default_") + "s")
        if key.startswith("default_") and value is None and isinstance(options, (list, tuple)) and options:
            out[key] = options[0]
    return out


def _sizes(keys: dict[str, list[str]], defaults: dict, encoder: bool, n_layers: int = N_LAYERS) -> dict:
    kw = {}
    for key in keys.get("hidden", ()):
        kw[key] = D_MODEL
    for key in keys.get("layers", ()):
        kw[key] = n_layers
    for key in keys.get("heads", ()):
        kw[key] = N_HEADS
    heads = defaults[keys["heads"][0]] if keys.get("heads") else None
    for key in keys.get("kv_heads", ()):
        kv = heads if defaults[key] is None else defaults[key]  # None: as many as the heads (Nemotron's model needs it)
        if isinstance(kv, int):  # MQA stays MQA, a decoder gets 2 groups (GQA), an encoder's and MLA's MHA stay MHA
            mha = kv == heads and (encoder or defaults.get("kv_lora_rank") is not None)
            kw[key] = 1 if kv == 1 else N_HEADS if mha else 2
    for key in keys.get("head_dim", ()):
        if defaults[key] is not None:
            kw[key] = D_HEAD
    for key in keys.get("ffn", ()):
        kw[key] = D_FF
    return kw


def _small_extras(defaults: dict, kw: dict, amap: dict | None = None) -> dict:
    """:data:`_SMALL`'s sizes under this config's own keys (``attribute_map``: Bailing's
    ``num_expert_group`` for ``n_group``); a ``fill`` size also where the default is None (DeepSeek-V2
    routes to ``num_experts_per_tok=None`` experts by default, which its forward cannot run)."""
    out = {}
    for name, (rule, value) in _SMALL.items():
        key = (amap or {}).get(name, name)
        old = defaults.get(key)
        if rule == "fill" and old is None and key in defaults:
            out[key] = value
            continue
        if key in kw or not isinstance(old, int) or isinstance(old, bool):
            continue
        out[key] = min(old, value) if rule in ("max", "fill") else value
    return out


def _token_ids(defaults: dict, vocab_size: int, specials: dict[str, int]) -> dict:
    """The tokenizer's special ids where the config has the key; any other token id past the tiny
    vocabulary moved onto the pad id."""
    pad = specials.get("pad_token_id", 0)
    out = {}
    for key, value in defaults.items():
        if not key.endswith("_token_id"):
            continue
        if key in specials:
            out[key] = specials[key]
        elif key == "decoder_start_token_id" and value is not None:
            out[key] = specials.get("bos_token_id", pad)
        elif isinstance(value, int) and not 0 <= value < vocab_size:
            out[key] = pad
    return out


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200]}" if text else type(e).__name__


def save_tiny(model_type: str, out: Path, *, seed: int = 0) -> tuple[str, Path]:
    """``(kind, folder)``: the tiny random model of ``model_type`` built by its :data:`KINDS`
    Auto class with eager attention, its weights drawn from ``seed`` (matrices N(0, 0.2) so the
    patterns are peaked, vectors near their init), saved with safetensors and a tokenizer under
    ``out``. Raises :class:`TinyBuildError` (the reason in one line) for a family left out of the
    sweep, one that cannot be shrunk or built, or one whose model stays over :data:`MAX_PARAMS`."""
    import torch
    import transformers

    from headscope.reports.tools.sweep.tokenizer import train_tokenizer

    kind, why = text_families().get(model_type, (None, "not in this transformers' CONFIG_MAPPING"))
    if kind is None:
        raise TinyBuildError(why)
    tok = _tokenizer(kind == "encoder", train_tokenizer)
    specials = {
        f"{name}_token_id": getattr(tok, f"{name}_token_id")
        for name in ("pad", "bos", "eos", "sep", "cls", "mask", "unk")
        if getattr(tok, f"{name}_token_id", None) is not None
    }
    for depth in LAYER_COUNTS:  # the fewest layers holding an attention layer (a hybrid's may come late)
        config = tiny_config(
            model_type, vocab_size=len(tok), specials=specials, encoder=kind == "encoder", n_layers=depth
        )
        torch.manual_seed(seed)
        try:
            model = getattr(transformers, KINDS[kind]).from_config(config, attn_implementation="eager")
        except Exception as e:  # noqa: BLE001 - a model class that cannot be built from its config: why
            raise TinyBuildError(f"{KINDS[kind]} cannot build it: {_line(e)}") from None
        headless = not has_heads_key(model_type)
        if _has_attention(model, kind, by_class=not headless):
            break
        if headless:  # no heads in its config, no attention in its model: one depth says it
            raise TinyBuildError(
                "no attention layer: its config has no attention heads and its output_attentions no [batch, heads, query, key] "
                "pattern (recurrent, state-space or Fourier-mixing layers only)"
            )
    else:
        raise TinyBuildError(
            f"no attention layer: at up to {LAYER_COUNTS[-1]} layers its default config has none "
            "(no attention module, output_attentions gives no pattern: recurrent or state-space layers only)"
        )
    if not has_heads_key(model_type):
        raise TinyBuildError(f"cannot shrink: no config key for heads ({type(config).__name__})")
    other = _other_input(model, kind)
    if other is not None:
        raise TinyBuildError(f"not a text-only model: its forward needs {other}")
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        raise TinyBuildError(f"cannot shrink: {n / 1e6:.1f}M parameters at the tiny sizes (> {MAX_PARAMS / 1e6:g}M)")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
            else:
                p.add_(0.1 * torch.randn_like(p))
    folder = Path(out)
    try:
        model.eval().save_pretrained(folder)
    except Exception as e:  # noqa: BLE001 - a model transformers cannot save: why
        raise TinyBuildError(f"save_pretrained fails: {_line(e)}") from None
    tok.save_pretrained(folder)
    return kind, folder


#: the inputs of a text model's forward (and an encoder-decoder's decoder_*): any other one a
#: forward on token ids alone asks for is a non-text input (BROS's bbox, LXMERT's visual_feats)
_TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds", "labels")


def _other_input(model, kind: str) -> str | None:
    """The non-text input a forward on token ids alone raises for, named by its forward's own
    parameter (``'bbox' (ValueError: You have to specify bbox)``); None where it runs or fails otherwise."""
    import inspect
    import re

    import torch

    ids = torch.arange(1, 9)[None]
    try:
        with torch.no_grad():
            model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                **({"use_cache": False} if kind == "decoder" else {}),
            )
    except Exception as e:  # noqa: BLE001 - why it fails: a non-text input it names, or not this check's
        params = set(inspect.signature(model.base_model.forward).parameters) | set(
            inspect.signature(model.forward).parameters
        )
        text = str(e)
        for name in sorted(params - set(_TEXT_INPUTS)):
            if not name.startswith(("decoder_", "past_", "use_", "output_", "return_", "cache_")) and re.search(
                rf"\b{re.escape(name)}\b", text
            ):
                return f"{name!r} ({_line(e)})"
    return None


def _has_attention(model, kind: str, by_class: bool = True) -> bool:
    """False only where the model holds no module of an attention class (``by_class``; a config without
    heads is not asked: RWKV's time mixing is its ``RwkvSelfAttention``) and returns no attention pattern
    (``output_attentions``, on a few tokens, a ``[batch, heads, query, key]`` map): recurrent or
    state-space layers alone. A forward that fails says nothing here (the sweep's stages say why)."""
    import torch

    if by_class and any("attention" in type(m).__name__.lower() for m in model.modules()):
        return True
    ids = torch.arange(1, 9)[None]
    kw = {"use_cache": False} if kind == "decoder" else {}
    try:
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True, **kw)
    except Exception:  # noqa: BLE001 - a forward that fails: not for this check to say
        return True
    maps = getattr(out, "attentions", None) or getattr(out, "encoder_attentions", None) or ()
    if by_class:
        return bool(maps)
    return any(getattr(a, "dim", lambda: 0)() == 4 for a in maps)  # RWKV's "attentions": [batch, pos, d_model]


@cache
def _tokenizer(encoder: bool, train):
    return train(encoder, 600)
