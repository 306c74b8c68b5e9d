"""A GGUF file's metadata as an HF config dict (:func:`gguf_hf_config`), and its :class:`ArchSpec`.

The sizes are checked under the file's own key names before any is used; per-layer arrays and
scaled RoPE are read as llama.cpp means them. What differs by architecture (the HF class, required
keys, a family's own config names such as Gemma's query scale and sliding layers, its RoPE, its
tensor layout) is its record, :class:`~headscope.probes.models.families.GGUF`: a family's
``Family.gguf`` or one of :data:`~headscope.probes.models.families.gguf_only.GGUF_ONLY`, all in
:data:`~headscope.probes.models.families.GGUF_RECORDS`; nothing here names an architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope.probes.errors import CheckpointError, ModelIncompatibleError, UnknownGGUFArchitectureError
from headscope.probes.models.arch import (
    _MAX_SIZE,
    PER_LAYER,
    _int_or_none,
    _number,
    arch_from_hf_config,
    layer_runs,
)
from headscope.probes.models.families import GGUF, GGUF_RECORDS
from headscope.probes.models.gguf.tensors import check_gguf, check_gguf_tensors
from headscope.probes.models.spec import ArchSpec


def arch_from_gguf(path: Path) -> ArchSpec:
    """The :class:`~headscope.probes.models.spec.ArchSpec` of a GGUF file, from its metadata alone (no tensor is read)."""
    return arch_from_hf_config(gguf_hf_config(Path(path)), str(path))


#: GGUF ``general.architecture`` → (HF ``model_type``, HF model class for ``architectures``), for
#: every architecture transformers reads from GGUF: the families' records
#: (:data:`~headscope.probes.models.families.GGUF_RECORDS`; a file another record claims by its
#: ``general.name``, a ``llama`` file named Mistral, is read by that one)
GGUF_ARCHITECTURES: dict[str, tuple[str, str]] = {r.arch: (r.model_type, r.hf_class) for r in GGUF_RECORDS if r.arch}
_BY_ARCH: dict[str, GGUF] = {r.arch: r for r in GGUF_RECORDS if r.arch}
_GGUF_ALIASES = {r.spelled: r.arch for r in GGUF_RECORDS if r.spelled}
_NAMED = tuple(r for r in GGUF_RECORDS if r.named)
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
    file is refused first (:func:`~headscope.probes.models.gguf.tensors.check_gguf`); an
    architecture transformers cannot read either raises
    :class:`~headscope.probes.errors.ModelIncompatibleError`. So does RoPE that no backend
    could build as the file means it (:func:`_gguf_rope_parameters`), unless ``strict`` is
    False (the card: sizes are still worth reading): then ``hf[NOT_LOADABLE]`` says why."""
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
    rec = next((r for r in _NAMED if arch in r.files_under and r.named in str(name).lower()), _BY_ARCH[arch])
    model_type, cls = rec.model_type, rec.hf_class
    for key in ("block_count", "embedding_length") + rec.required:
        v = get(f"{gguf_arch}.{key}")
        if not (isinstance(v, int) or (isinstance(v, list) and v and all(isinstance(x, int) for x in v))):
            raise CheckpointError(f"{path}: GGUF metadata {gguf_arch}.{key} is missing or not an integer")
    sizes = _gguf_sizes(f, gguf_arch, rec, path)

    hf: dict[str, Any] = {"model_type": model_type, "architectures": [cls], "_name_or_path": name}
    if sizes.equal_arrays:
        hf[EQUAL_PER_LAYER] = list(sizes.equal_arrays)
    _read_keys(hf, sizes, gguf_arch, get)
    if "head_dim" not in hf and rec.rope_dim_is_head_dim:  # llama.cpp: the rotated width is d_head
        rot = get(f"{gguf_arch}.rope.dimension_count")
        if isinstance(rot, int) and not isinstance(rot, bool) and 0 < rot < _MAX_SIZE:
            hf["head_dim"] = rot
    n_heads, d_model = hf.get("num_attention_heads"), hf["hidden_size"]
    if n_heads:
        heads, kv_heads = _gguf_heads(sizes, gguf_arch, path)
        hf.setdefault("num_key_value_heads", n_heads)
        hf.setdefault("head_dim", d_model // next(h for h in heads if h))  # llama.cpp: layer 0's heads
        _per_layer_heads(hf, sizes, heads, kv_heads, gguf_arch, rec, path, strict)
    if rec.config_names is not None:  # what the family's HF config class names or defaults its own way
        rec.config_names(hf, get, gguf_arch, n_heads)
    try:
        rope = _gguf_rope_parameters(reader, get, gguf_arch, rec, hf, path)
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
    elif rec.vocab_required:
        raise CheckpointError(f"{path}: GGUF metadata has neither {gguf_arch}.vocab_size nor tokenizer.ggml.tokens")
    for key, value in rec.defaults:
        hf.setdefault(key, value)
    hf["tie_word_embeddings"] = rec.tied or "output.weight" not in {t.name for t in reader.tensors}
    check_gguf_tensors(reader, hf, sizes, gguf_arch, path, rec)
    return hf


def _read_keys(hf: dict, sizes: _GGUFSizes, gguf_arch: str, get) -> None:
    """Put into ``hf`` the :data:`_GGUF_KEYS` the file gives, under their HF names: the checked
    sizes (a per-layer array that differs: its widest layer), and the other keys as read (a
    per-layer list: its widest entry, except the sliding-window pattern), floats as floats."""
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


def _gguf_sizes(fields: dict, gguf_arch: str, rec: GGUF, path: Path) -> _GGUFSizes:
    """Read and check the sizes of :data:`_GGUF_SIZES` under their GGUF names: each one integer
    (or, for :data:`_GGUF_PER_LAYER`, an array with one non-negative entry per layer), positive,
    below 2**63; at most :data:`GGUF_MAX_LAYERS` layers. Mamba's files write head counts and
    ``feed_forward_length`` 0 ("unused"): those are left out. Raises ``CheckpointError`` naming
    the key and the value."""
    from gguf import GGUFValueType

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
    if rec.zero_sizes_unused:
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


def _per_layer_heads(hf: dict, sizes: _GGUFSizes, heads, kv_heads, gguf_arch: str, rec: GGUF, path, strict):
    """A file whose layers differ in heads, KV heads or MLP width: refused for loading (no
    backend here builds layers of different widths), named in one line; for the card
    (``strict=False``), ``hf[PER_LAYER]`` holds the per-layer values and ``hf[NOT_LOADABLE]`` why
    it cannot load. LFM2's KV heads, 0 in its convolution layers and one number in its attention
    layers, are what transformers builds (``full_attn_idxs``): read as that number, as it does."""
    varying = dict(sizes.per_layer)
    kv = varying.get("attention.head_count_kv")
    if rec.kv_heads_zero_off_attention and kv is not None and len(set(kv) - {0}) == 1:
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


#: the Llama 3 RoPE scaling that ``convert_hf_to_gguf.py`` bakes into a ``rope_freqs`` tensor
#: (low/high frequency factors, original context); only the factor differs between releases
_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _gguf_rope_parameters(reader, get, gguf_arch: str, rec: GGUF, hf: dict, path: Path) -> dict | None:
    """``rope_parameters`` (transformers 5) from a GGUF file, where its RoPE is not the plain
    one: ``rope.scaling.type`` linear or yarn with its factor; Gemma 3's per-layer-type pair
    (global layers scaled, sliding layers at ``rope.freq_base_swa``, 10,000 by default); and
    Llama 3's scaling, which llama.cpp stores only as the per-frequency factors of a
    ``rope_freqs`` tensor: read back as ``llama3`` parameters and checked to reproduce every
    factor. None where the RoPE is plain. Factors transformers cannot take from a GGUF (Phi-3's
    long/short ``rope_factors``, a ``rope_freqs`` that is not Llama 3's) are refused by name."""
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
        if not rec.rope_freqs:
            raise ModelIncompatibleError(
                f"{path}: a {gguf_arch} GGUF with a rope_freqs tensor (per-frequency RoPE factors) is not read right "
                "by transformers; load the model's HF checkpoint instead"
            )
        dim = _int_or_none(get(f"{gguf_arch}.rope.dimension_count")) or hf["head_dim"]
        factors = [float(x) for x in tensors["rope_freqs.weight"].data.reshape(-1)]
        scaled = {"rope_type": "llama3", **_llama3_rope_from_factors(factors, theta, dim, path), "rope_theta": theta}
    if rec.rope_per_layer_type:
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
    (:func:`~headscope.probes.models.inhouse.attention.scaled_inv_freq`)."""
    import torch

    from headscope.probes.models.inhouse.attention import scaled_inv_freq

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
