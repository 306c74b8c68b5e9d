"""A model's spec sheet, from its config alone.

Reports layers, heads, d_head, KV heads, the attention kind (MHA / GQA with its group
size / MQA), whether ``n_heads × d_head`` equals ``d_model``, attention vs total
parameters and the KV-cache bytes per token and at a context length; and, where the config
says so, the sliding-window layers (how many, their window) against the global ones,
QK-norm, attention-logit and final-logit soft-capping and Gemma's query scale.

KV cache per token = 2 (K and V) × layers × kv_heads × d_head × bytes per value. A sliding
layer caches at most its window, so at a context of C tokens the cache holds
(global layers × C + sliding layers × min(window, C)) × 2 × kv_heads × d_head × bytes; the
card gives it at the context asked (default: the model's maximum) and, in 16-bit, at a few
contexts up to the maximum.

>>> card = card_from_hf_config({"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576,
...     "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
...     "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True}, name="smollm2")
>>> card["attention"], card["group_size"], card["heads_x_d_head"], card["kv_cache_bytes_per_token"]
('GQA', 3, 576, 46080)
"""

from __future__ import annotations

import dataclasses

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config, check_hf_config, layer_runs
from headscope.probes.models.checkpoints import ModelSource, read_config_file, read_hf_config, resolve
from headscope.probes.models.config import config_from_arch, param_counts
from headscope.probes.models.gguf import NOT_LOADABLE, gguf_hf_config, settle_cached_config
from headscope.probes.models.source import cache_dir, file_sha256
from headscope.probes.models.spec import ArchSpec

BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "int8": 1, "fp8": 1}


def source_hf_config(source: ModelSource) -> dict:
    """HF config of ``source`` without loading weights (GGUF: from metadata, or the cache)."""
    if source.kind == "gguf":
        cached = cache_dir() / "gguf" / file_sha256(source.path)[:16] / "config.json"
        if cached.exists():
            settle_cached_config(cached, source.path)
            return read_config_file(cached)
        hf = gguf_hf_config(source.path, strict=False)  # a card of a file no backend loads still has its sizes
        check_hf_config(hf, str(source.path))
        return hf
    if source.kind == "hub":
        from headscope.probes.models.checkpoints import hf_dir

        return read_hf_config(ModelSource(name=source.name, kind="hf-dir", path=hf_dir(source)))
    return read_hf_config(source)


def _count_params(arch: ArchSpec) -> tuple[int | None, int | None]:
    """(attention params, total params): exact for the in-house families, by arithmetic
    (:func:`~headscope.probes.models.config.param_counts`: nothing allocated, whatever the sizes);
    layer by layer where the layers differ (None if one has no attention); None otherwise."""
    if arch.per_layer:
        return _count_params_per_layer(arch)
    try:
        cfg = config_from_arch(arch)
    except ModelIncompatibleError:
        return None, None
    return param_counts(cfg)


def _count_params_per_layer(arch: ArchSpec) -> tuple[int | None, int | None]:
    """The counts of a model whose layers differ: each layer's by the arithmetic of a one-layer
    model of its sizes, the embeddings and final norm once."""
    n = arch.n_layers
    heads = arch.heads_per_layer or (arch.n_heads,) * n
    kv_heads = arch.kv_heads_per_layer or heads
    widths = arch.d_mlp_per_layer or (arch.d_mlp,) * n
    if not all(heads) or not all(kv_heads):
        return None, None  # attention-free layers: what stands in for attention is not in the metadata
    uniform = dataclasses.replace(
        arch,
        n_heads=heads[0],
        n_kv_heads=kv_heads[0],
        heads_per_layer=None,
        kv_heads_per_layer=None,
        d_mlp_per_layer=None,
    )
    try:
        one = config_from_arch(uniform).replace(n_layers=1)
        layers = [
            param_counts(one.replace(n_heads=h, n_kv_heads=kv, **({"d_mlp": m} if m else {})))
            for h, kv, m in zip(heads, kv_heads, widths)
        ]
        with_one, with_two = param_counts(one)[1], param_counts(one.replace(n_layers=2))[1]
    except (ModelIncompatibleError, ValueError, TypeError):
        return None, None
    outside = 2 * with_one - with_two  # embeddings, final norm, unembedding: a one-layer model less its layer
    return sum(a for a, _ in layers), outside + sum(t - outside for _, t in layers)


def card_from_hf_config(hf: dict, *, name: str, context: int | None = None, dtype: str = "fp32") -> dict:
    """The card of an HF config dict (read by :func:`~headscope.probes.models.arch.arch_from_hf_config`)."""
    if dtype not in BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(BYTES)}")
    card = card_from_arch(arch_from_hf_config(hf, name), name=name, context=context, dtype=dtype)
    card["not_loadable"] = hf.get(NOT_LOADABLE)
    return card


#: contexts of the KV-cache table (those below the model's maximum, then the maximum)
TABLE_CONTEXTS = (1024, 4096, 32768, 131072)


def kv_cache_bytes(arch: ArchSpec, context: int, bytes_per_value: int) -> int:
    """KV-cache bytes at ``context`` tokens: a global layer holds every token, a sliding layer
    at most its window; × 2 (K and V) × the layer's KV heads × d_head × bytes per value."""
    if arch.sliding_window is None and arch.kv_heads_per_layer is None:  # arithmetic: any number of layers
        return 2 * arch.n_layers * context * arch.n_kv_heads * arch.d_head * bytes_per_value
    windows = arch.sliding_window or (None,) * arch.n_layers
    kv_heads = arch.kv_heads_per_layer or (arch.n_kv_heads,) * arch.n_layers
    tokens = sum((context if w is None else min(w, context)) * kv for w, kv in zip(windows, kv_heads))
    return 2 * tokens * arch.d_head * bytes_per_value


def _kind(heads: int, kv_heads: int) -> str:
    """A layer's attention: MHA, MQA, ``GQA/<group size>`` or ``none``."""
    if not heads or not kv_heads:
        return "none"
    if kv_heads == heads:
        return "MHA"
    return "MQA" if kv_heads == 1 else f"GQA/{heads // kv_heads}"


def card_from_arch(arch: ArchSpec, *, name: str, context: int | None = None, dtype: str = "fp32") -> dict:
    """The card's dict. Where a GGUF file's layers differ (``arch.per_layer``), ``heads``,
    ``kv_heads``, ``group_size``, ``heads_x_d_head`` and ``attention`` are None and
    ``heads_per_layer``, ``kv_heads_per_layer`` and ``attention_per_layer`` hold each layer's;
    totals and the KV cache add the layers up."""
    if dtype not in BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(BYTES)}")
    n_layers, d_model, n_heads, n_kv, d_head = arch.n_layers, arch.d_model, arch.n_heads, arch.n_kv_heads, arch.d_head
    ctx = context or arch.max_positions or 2048
    if ctx <= 0:
        raise ValueError(f"--context must be positive; got {ctx}")
    per_layer = arch.heads_per_layer is not None or arch.kv_heads_per_layer is not None
    if per_layer:
        heads = arch.heads_per_layer or (n_heads,) * n_layers
        kv_heads = arch.kv_heads_per_layer or heads
        total_heads, total_kv = sum(heads), sum(kv_heads)
    else:
        total_heads, total_kv = n_layers * n_heads, n_layers * n_kv
    per_token = 2 * total_kv * d_head * BYTES[dtype]
    attn_params, total_params = _count_params(arch)
    windows = arch.sliding_window or ()
    sliding = [w for w in windows if w is not None]
    distinct = sorted(set(sliding))
    max_ctx = arch.max_positions or ctx
    table = sorted({c for c in TABLE_CONTEXTS if c < max_ctx} | {max_ctx, ctx})
    return {
        "name": name,
        "model_type": arch.model_type,
        "layers": n_layers,
        "d_model": d_model,
        "heads": None if per_layer else n_heads,
        "d_head": d_head,
        "kv_heads": None if per_layer else n_kv,
        "attention": None if per_layer else arch.attention_kind,
        "group_size": None if per_layer else arch.group_size,
        "heads_x_d_head": None if per_layer else n_heads * d_head,
        "heads_x_d_head_equals_d_model": all(h * d_head == d_model for h in heads)
        if per_layer
        else n_heads * d_head == d_model,
        "heads_per_layer": list(heads) if per_layer else None,
        "kv_heads_per_layer": list(kv_heads) if per_layer else None,
        "attention_per_layer": [_kind(h, kv) for h, kv in zip(heads, kv_heads)] if per_layer else None,
        "total_heads": total_heads,
        "attention_params": attn_params,
        "total_params": total_params,
        "attention_share": (attn_params / total_params) if attn_params and total_params else None,
        "context": ctx,
        "dtype": dtype,
        "kv_cache_bytes_per_token": per_token,
        "kv_cache_bytes_at_context": kv_cache_bytes(arch, ctx, BYTES[dtype]),
        "kv_cache_vs_mha": total_kv / total_heads,
        "encoder": arch.encoder,
        # what the attention is beyond heads and KV heads
        "sliding_layers": len(sliding),
        "global_layers": n_layers - len(sliding),
        "sliding_window": (distinct[0] if len(distinct) == 1 else distinct) if distinct else None,
        "sliding_layer_indices": [i for i, w in enumerate(windows) if w is not None],
        "kv_cache_bytes_at_context_without_sliding": per_token * ctx,
        "max_context": arch.max_positions,
        "kv_cache_16bit_bytes_by_context": {str(c): kv_cache_bytes(arch, c, 2) for c in table},
        "qk_norm": arch.qk_norm,
        "attn_logit_softcapping": arch.attn_softcap,
        "final_logit_softcapping": arch.final_softcap,
        "query_pre_attn_scalar": arch.query_pre_attn_scalar,
        "rope_theta": arch.rope_theta,
        "rope_type": arch.rope_type,
        "rope_factor": arch.rope_factor,
        "rope_local_theta": arch.rope_local_theta,
        "rope_local_type": arch.rope_local_type,
    }


def model_card(model: str | ModelSource, *, context: int | None = None, dtype: str = "fp32") -> dict:
    source = resolve(model)
    return card_from_hf_config(source_hf_config(source), name=source.name, context=context, dtype=dtype)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render_card(c: dict) -> str:
    """Plain-text rendering of :func:`model_card`'s dict."""
    kind = c["attention"]
    if kind is None:
        pass  # per layer: _per_layer_lines
    elif kind == "GQA":
        kind = f"GQA, {c['kv_heads']} KV heads shared by groups of {c['group_size']} query heads"
    elif kind == "MQA":
        kind = f"MQA, one KV head shared by all {c['heads']} query heads"
    else:
        kind = "MHA, one KV head per query head"
    eq = (
        ""
        if c["heads"] is None
        else f"{c['heads']} heads × {c['d_head']} = {c['heads_x_d_head']} = d_model"
        if c["heads_x_d_head_equals_d_model"]
        else f"{c['heads']} heads × {c['d_head']} = {c['heads_x_d_head']} ≠ d_model {c['d_model']}: "
        "the attention works in a space of a different width than the residual stream"
    )
    lines = [
        f"model           {c['name']} ({c['model_type']}{', encoder' if c['encoder'] else ', decoder'})",
        f"layers          {c['layers']}",
        f"d_model         {c['d_model']}",
    ]
    if c.get("heads_per_layer") is not None:
        lines += _per_layer_lines(c)
    else:
        lines += [
            f"heads           {c['heads']} per layer, {c['total_heads']} in all; d_head {c['d_head']}",
            f"                {eq}",
            f"KV heads        {c['kv_heads']}",
            f"attention       {kind}",
        ]
    lines += _attention_extras(c)
    if c.get("purpose"):  # what it is for, decided when it loaded (with_purpose)
        p = c["purpose"]
        lines.append(f"purpose         {'language model' if p['kind'] == 'lm' else 'embedding model'}: {p['reason']}")
        if c.get("embedding"):
            lines.append(f"embedding       {c['embedding']}")
    if c.get("not_loadable"):
        lines.append(f"not loadable    {c['not_loadable']}")
    if c["total_params"]:
        lines.append(
            f"parameters      {c['total_params'] / 1e6:.1f} M in all; attention {c['attention_params'] / 1e6:.1f} M "
            f"({100 * c['attention_share']:.1f}%)"
        )
    per_token = f"{_bytes(c['kv_cache_bytes_per_token'])} per token"
    if c["sliding_layers"]:
        per_token += " while every layer holds it"
    cache = (
        f"KV cache        {per_token} ({c['dtype']}); "
        f"{_bytes(c['kv_cache_bytes_at_context'])} at context {c['context']:,}"
    )
    if c["sliding_layers"] and c["kv_cache_bytes_at_context"] != c["kv_cache_bytes_at_context_without_sliding"]:
        cache += f" ({_bytes(c['kv_cache_bytes_at_context_without_sliding'])} if no layer slid)"
    if c["kv_cache_vs_mha"] != 1:
        cache += f" ({c['kv_cache_vs_mha']:.2f}× an MHA model of the same shape)"
    lines.append(cache)
    if c["encoder"]:
        lines.append("                (an encoder keeps no cache when it runs; the figure is what one would hold)")
    else:
        max_ctx = c["max_context"]
        cells = [
            f"{int(k):,}{' (max)' if int(k) == max_ctx else ''}: {_bytes(v)}"
            for k, v in c["kv_cache_16bit_bytes_by_context"].items()
        ]
        lines.append(f"KV cache 16-bit {'; '.join(cells)} (fp16/bf16)")
    return "\n".join(lines)


def _per_layer_lines(c: dict) -> list[str]:
    """The heads, KV heads and attention lines of a model whose layers differ: each layer's
    values (a run of equal ones as ``value ×count``) and their sum."""
    heads, kv_heads, d_head, d_model = c["heads_per_layer"], c["kv_heads_per_layer"], c["d_head"], c["d_model"]
    widths = layer_runs(h * d_head for h in heads)
    vs = "= d_model" if c["heads_x_d_head_equals_d_model"] else f"against d_model {d_model}"
    kinds = {"MHA": "MHA", "MQA": "MQA", "none": "no attention"}
    layers = "; ".join(
        f"{kinds.get(k, f'GQA, groups of {k[4:]}')} in {_layer_span(a, b)}"
        for k, a, b in _spans(c["attention_per_layer"])
    )
    return [
        f"heads           {_each(heads)}, {c['total_heads']} in all; d_head {d_head}",
        f"                heads × {d_head} = {widths} (per layer) {vs}",
        f"KV heads        {_each(kv_heads)}, {sum(kv_heads)} in all",
        f"attention       by layer: {layers}",
    ]


def _each(values) -> str:
    """``4, 8 (per layer)``, or ``2 in every layer``."""
    return f"{values[0]} in every layer" if len(set(values)) == 1 else f"{layer_runs(values)} (per layer)"


def _spans(values) -> list[tuple]:
    """``(value, first layer, last layer)`` of each run of equal values."""
    out: list[list] = []
    for i, v in enumerate(values):
        if out and out[-1][0] == v:
            out[-1][2] = i
        else:
            out.append([v, i, i])
    return [tuple(x) for x in out]


def _layer_span(a: int, b: int) -> str:
    return f"layer {a}" if a == b else f"layers {a}–{b}"


def _attention_extras(c: dict) -> list[str]:
    """Lines for sliding-window layers, QK-norm, soft-capping and the query scale, when there are any."""
    out = []
    n_slide, n_global = c["sliding_layers"], c["global_layers"]
    if n_slide:
        w = c["sliding_window"]
        window = f"the last {w:,} tokens" if isinstance(w, int) else f"windows of {', '.join(f'{x:,}' for x in w)}"
        if n_global:
            out.append(
                f"sliding window  {n_slide} of {c['layers']} layers attend to {window} only; "
                f"{n_global} global layer{'s see' if n_global > 1 else ' sees'} the whole context"
            )
        else:
            out.append(f"sliding window  all {n_slide} layers attend to {window} only")
        out.append("                (a sliding layer caches at most its window: the KV cache stops growing there)")
    if c["qk_norm"]:
        out.append("QK-norm         queries and keys are RMS-normalised per head before the dot product")
    caps = []
    if c["attn_logit_softcapping"]:
        caps.append(f"attention logits capped at ±{c['attn_logit_softcapping']:g} (cap·tanh(x/cap))")
    if c["final_logit_softcapping"]:
        caps.append(f"final logits at ±{c['final_logit_softcapping']:g}")
    if caps:
        out.append(f"soft-capping    {'; '.join(caps)}")
    q = c["query_pre_attn_scalar"]
    if q and q != c["d_head"]:
        out.append(f"query scale     1/√{q:g} (query_pre_attn_scalar), not 1/√d_head = 1/√{c['d_head']}")
    if c.get("rope_type") not in (None, "default"):
        where = " on the global layers" if c["sliding_layers"] and c.get("rope_local_theta") else ""
        plain = c.get("rope_local_type") in (None, "default")
        local = (
            f"; sliding layers θ {c['rope_local_theta']:g}, {'unscaled' if plain else c['rope_local_type']}"
            if where
            else ""
        )
        factor = f" ×{c['rope_factor']:g}" if c.get("rope_factor") else ""
        out.append(f"RoPE            θ {c['rope_theta']:g}, {c['rope_type']} scaling{factor}{where}{local}")
    return out


def with_purpose(card: dict, model) -> tuple[dict, str]:
    """``card`` with what the loaded ``model`` is for (``purpose``:
    :func:`~headscope.probes.models.purpose.purpose_of`; ``embedding``: an embedding model's
    pipeline in words) and its :func:`render_card` text."""
    from headscope.probes.embedding import pipeline_of
    from headscope.probes.models.purpose import purpose_of

    purpose = purpose_of(model)
    card = {
        **card,
        "purpose": purpose.record(),
        "embedding": pipeline_of(model).describe() if purpose.kind == "embedding" else None,
    }
    return card, render_card(card)
