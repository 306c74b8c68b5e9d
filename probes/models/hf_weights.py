"""Per-head weights of a transformers model (the hf backend), as the same
:class:`~headscope.probes.models.inhouse.head_weights.ModelWeights` the in-house model gives.

The projections are found in the module tree, from the attention output projection the hf backend
already found for capture (:class:`~headscope.probes.models.hf_layout.HFLayout`): its parent is
the attention module, and inside it the query, key and value projections are either

- separate linear maps (Llama, Mistral, Qwen2, BERT, MPNet, DistilBERT, …), by the last piece of
  their name (:data:`Q_NAMES`, :data:`K_NAMES`, :data:`V_NAMES`), or
- one fused map from ``d_model`` to ``(heads + 2 × kv_heads) × d_head`` (GPT-2's ``Conv1D``
  ``c_attn``, stored ``[in, out]`` and read transposed; Falcon and BLOOM's ``query_key_value``;
  Phi-3's ``qkv_proj``), whose rows are laid out one of the ways of :data:`FUSED_LAYOUTS`.

Which fused layout a model uses is not guessed: :func:`hf_weights` takes the first whose matrices
pass :func:`~headscope.probes.models.hf_weights_check.check_weights` (pattern × V × W_O equals the
heads' output the forward computes; the pattern recomputed from W_Q, W_K equals the model's).

Convention and shapes are :mod:`~headscope.probes.models.inhouse.head_weights`'s; K and V stay per
KV head (``kv_index[h] = h // (heads / kv_heads)``, transformers' ``repeat_kv``). The norms are not
folded: the matrices act on the projection's input, the output of the norm before it
(:attr:`HFModelWeights.norm` names it). :attr:`HFModelWeights.positions` and
:attr:`HFModelWeights.scale` say the position scheme and the scale the check confirmed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.head_check import input_embeddings
from headscope.probes.models.hf_layout import linear_shape
from headscope.probes.models.hf_weights_extras import extras_of, frozen_lines, linear_weights, positions_in_words
from headscope.probes.models.inhouse.head_weights import LayerWeights, ModelWeights

__all__ = ["FUSED_LAYOUTS", "HFModelWeights", "HFSource", "LayerProjections", "find_projections", "hf_weights"]

#: last pieces of the module names of separate projections
Q_NAMES = ("q_proj", "q", "query", "q_lin", "wq", "query_proj", "Wq", "q_gate_proj")
K_NAMES = ("k_proj", "k", "key", "k_lin", "wk", "key_proj", "Wk")
V_NAMES = ("v_proj", "v", "value", "v_lin", "wv", "value_proj", "Wv")
#: row layouts of a fused QKV map: ``q|k|v`` (GPT-2, Phi-3, GPT-BigCode, Falcon with multi-query),
#: ``head,(q,k,v)`` (BLOOM, GPT-NeoX, Falcon's classic layout), ``group,(q…,k,v)`` (Falcon's new
#: decoder architecture: each KV group's queries, then its key and value), ``mp,(q,v,k)`` (CodeGen: the rows in
#: ``mp_num`` blocks, each its share of the heads' queries, values, then keys)
FUSED_LAYOUTS = ("q|k|v", "head,(q,k,v)", "group,(q…,k,v)", "mp,(q,v,k)")


@dataclass(frozen=True)
class LayerProjections:
    """One layer's projection modules: ``q``/``k``/``v`` (the same module where fused), ``o``, the
    attention module holding them (``attn``), their paths, and the fused layout (None: separate)."""

    attn: nn.Module
    q: nn.Module
    k: nn.Module
    v: nn.Module
    o: nn.Module
    paths: dict
    fused: str | None = None
    n_kv: int = 0
    #: what sits between the projections and the output projection (:func:`~.hf_weights_extras.extras_of`)
    extras: dict = dataclasses.field(default_factory=dict)


def _ancestors(block: nn.Module, target: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules holding ``target`` inside ``block``, nearest first (the block last, path "")."""
    for rel, m in block.named_modules():
        if m is target:
            parts = rel.split(".")[:-1]
            paths = [".".join(parts[:i]) for i in range(len(parts), -1, -1)]
            return [(p, block.get_submodule(p) if p else block) for p in paths]
    raise ModelIncompatibleError("the attention output projection is not inside its layer's block")


def _owner(holder: nn.Module, rel: str) -> nn.Module:
    """The module directly holding ``holder``'s sub-module ``rel`` (the attention whose forward runs it)."""
    parent = rel.rpartition(".")[0]
    return holder.get_submodule(parent) if parent else holder


def _attention_of(block: nn.Module, o: nn.Module, spec) -> tuple[str, nn.Module]:
    """The nearest module holding ``o`` and the query projection (BERT's ``attention``: ``self.query`` beside
    ``output.dense``), else the block's one module holding a query, beside ``o`` (SqueezeBERT); the nearest
    holding ``o`` where none holds a query by name (a fused map)."""
    chain = _ancestors(block, o)
    for where, attn in chain:
        if where and _named(attn, Q_NAMES, spec.d_model):
            return where, attn
    q = [rel.rpartition(".")[0] for rel, _ in _named(block, Q_NAMES, spec.d_model)]  # SqueezeBERT's `attention`
    return (q[0], block.get_submodule(q[0])) if len(q) == 1 and q[0] else chain[0]  # beside `post_attention`


def _named(attn: nn.Module, names, want_in: int) -> list[tuple[str, nn.Module]]:
    return [
        (rel, m)
        for rel, m in attn.named_modules()
        if rel and rel.split(".")[-1] in names and (linear_shape(m) or (0,))[0] == want_in
    ]


def find_projections(
    block: nn.Module, o: nn.Module, spec, *, layout: str | None = None, prefix: str = ""
) -> LayerProjections:
    """The :class:`LayerProjections` of one layer (``block``, its output projection ``o``);
    ``layout``: the fused layout to read a fused map with (default the first); ``prefix``: the block's
    module path (the paths named start with it). Raises :class:`ModelIncompatibleError` naming the
    attention module whose projections are not understood."""
    where, attn = _attention_of(block, o, spec)
    where = ".".join(p for p in (prefix, where) if p)
    d, h, dm = spec.d_head, spec.n_heads, spec.d_model
    q, k, v = (_named(attn, names, dm) for names in (Q_NAMES, K_NAMES, V_NAMES))
    if len(q) == len(k) == len(v) == 1:
        (qp, qm), (kp, km), (vp, vm) = q[0], k[0], v[0]
        extras = extras_of(attn, dm, h, d)
        if linear_shape(qm)[1] == 2 * h * d and "gate" not in extras:  # Qwen3-Next: per head [query | gate]
            extras["gate"] = {"module": "the query projection's rows", "width": h * d, "in_q": True}
        if (
            linear_shape(qm)[1] != h * d * (2 if extras.get("gate", {}).get("in_q") else 1)
            or linear_shape(km)[1] % d
            or linear_shape(km)[1] != linear_shape(vm)[1]
        ):
            raise ModelIncompatibleError(
                f"{where}: projections {qp}/{kp}/{vp} give {linear_shape(qm)[1]}/{linear_shape(km)[1]}/"
                f"{linear_shape(vm)[1]} features, not {h} heads × {d} and a whole number of KV heads"
            )
        n_kv = linear_shape(km)[1] // d
        if h % n_kv:
            raise ModelIncompatibleError(f"{where}: {n_kv} KV heads do not divide {h} query heads")
        paths = {n: ".".join(x for x in (where, r) if x) for n, r in (("q", qp), ("k", kp), ("v", vp))}
        return LayerProjections(attn, qm, km, vm, o, paths, None, n_kv, extras)
    kv_counts = tuple(dict.fromkeys((spec.n_kv_heads, *(c for c in range(h, 0, -1) if h % c == 0))))
    for where_f, holder in _ancestors(block, o)[:-1]:  # noqa: B007 - the nearest holding o and a fused map, below the
        fused = [  # block (DeBERTa's in_proj sits in attention.self, beside attention.output.dense)
            (rel, m, n_kv)
            for rel, m in holder.named_modules()
            for n_kv in kv_counts
            if rel and linear_shape(m) == (dm, (h + 2 * n_kv) * d)
        ]
        if fused:
            break
    else:
        fused = []
    if fused:
        where, attn = ".".join(x for x in (prefix, where_f) if x), holder
        attn = _owner(holder, fused[0][0])
    if len(fused) != 1:
        found = ", ".join(f"{rel} {linear_shape(m)}" for rel, m in attn.named_modules() if linear_shape(m)) or "none"
        raise ModelIncompatibleError(
            f"{where}: projections not understood (no single q/k/v by name, nor one fused map of "
            f"d_model {dm} -> (heads + 2 × kv_heads) × {d}; linear maps there: {found})"
        )
    rel, m, n_kv = fused[0]
    path = ".".join(p for p in (where, rel) if p)
    chosen = layout or FUSED_LAYOUTS[0]
    if chosen in ("head,(q,k,v)", "mp,(q,v,k)") and n_kv != h:
        raise ModelIncompatibleError(f"{path}: layout {chosen} needs as many KV heads as heads; got {n_kv} of {h}")
    if chosen == "mp,(q,v,k)" and not isinstance(getattr(attn, "mp_num", None), int):
        raise ModelIncompatibleError(f"{path}: layout {chosen} needs the attention's mp_num (CodeGen's); none")
    return LayerProjections(attn, m, m, m, o, {"qkv": path}, chosen, n_kv, extras_of(attn, dm, h, d))


def _split_fused(w: torch.Tensor, layout: str, h: int, n_kv: int, d: int, mp: int | None = None):
    """``(q [h·d, …], k [n_kv·d, …], v [n_kv·d, …])`` rows of a fused map's weight ``[out, in]`` or bias ``[out]``."""
    rest = w.shape[1:]
    if layout == "mp,(q,v,k)":
        t = w.reshape(mp, 3, h * d // mp, *rest)
        return t[:, 0].reshape(h * d, *rest), t[:, 2].reshape(h * d, *rest), t[:, 1].reshape(h * d, *rest)
    if layout == "q|k|v":
        return w[: h * d], w[h * d : (h + n_kv) * d], w[(h + n_kv) * d :]
    if layout == "head,(q,k,v)":
        t = w.reshape(h, 3, d, *rest)
        return (t[:, i].reshape(h * d, *rest) for i in range(3))
    if layout == "group,(q…,k,v)":
        t = w.reshape(n_kv, h // n_kv + 2, d, *rest)
        return t[:, :-2].reshape(h * d, *rest), t[:, -2].reshape(n_kv * d, *rest), t[:, -1].reshape(n_kv * d, *rest)
    raise ValueError(f"layout must be one of {FUSED_LAYOUTS}; got {layout!r}")


def projection_tensors(p: LayerProjections, spec) -> dict[str, torch.Tensor | None]:
    """``{"q_proj.weight": [heads·d_head, d_model], "q_proj.bias": …, k, v, "o_proj.weight":
    [d_model, heads·d_head], "o_proj.bias"}`` of one layer (``nn.Linear`` layout; a bias None where absent)."""
    out: dict[str, torch.Tensor | None] = {}
    if p.fused is None:
        for name, mod in (("q", p.q), ("k", p.k), ("v", p.v)):
            out[f"{name}_proj.weight"], out[f"{name}_proj.bias"] = linear_weights(mod)
        gate = p.extras.get("gate")
        if gate and gate["in_q"]:  # rows per head: [query d_head | gate d_head]
            h, d = spec.n_heads, spec.d_head
            w, b = out["q_proj.weight"].view(h, 2, d, -1), out["q_proj.bias"]
            out["q_proj.weight"], out["gate.weight"] = (w[:, i].reshape(h * d, -1).contiguous() for i in (0, 1))
            if b is not None:
                out["q_proj.bias"], out["gate.bias"] = (b.view(h, 2, d)[:, i].reshape(-1).contiguous() for i in (0, 1))
    else:
        w, b = linear_weights(p.q)
        mp = getattr(p.attn, "mp_num", None)
        parts = _split_fused(w, p.fused, spec.n_heads, p.n_kv, spec.d_head, mp)
        biases = _split_fused(b, p.fused, spec.n_heads, p.n_kv, spec.d_head, mp) if b is not None else (None,) * 3
        extra = {n: getattr(p.attn, f"{n}_bias", None) for n in "qkv"}  # DeBERTa adds q_bias, v_bias after in_proj
        biases = tuple(
            bt
            if not isinstance(extra[n], torch.Tensor)
            else extra[n].detach().float().cpu().reshape(-1) + (0 if bt is None else bt)
            for n, bt in zip("qkv", biases, strict=True)
        )
        for name, wt, bt in zip("qkv", parts, biases, strict=True):
            out[f"{name}_proj.weight"] = wt.contiguous()
            out[f"{name}_proj.bias"] = None if bt is None else bt.contiguous()
    gate = p.extras.get("gate")
    if gate and not gate["in_q"]:
        out["gate.weight"], out["gate.bias"] = linear_weights(getattr(p.attn, gate["module"]))
        extra = getattr(p.attn, "gate_bias", None)  # Beam: one learned bias per head, added to its gate
        if isinstance(extra, torch.Tensor):
            per = extra.detach().float().cpu().repeat_interleave(gate["width"] // extra.numel())
            out["gate.bias"] = per if out["gate.bias"] is None else out["gate.bias"] + per
    if "v_scale" in p.extras:  # a constant on V: folded into W_V and b_V (exact)
        out["v_proj.weight"] = out["v_proj.weight"] * p.extras["v_scale"]
        if out["v_proj.bias"] is not None:
            out["v_proj.bias"] = out["v_proj.bias"] * p.extras["v_scale"]
    out["o_proj.weight"], out["o_proj.bias"] = linear_weights(p.o)
    if "heads_part" in p.extras:  # W_O: the heads' columns; the other mixer's are its own term
        out["other_mixer.weight"] = out["o_proj.weight"][:, p.extras["heads_part"] :].contiguous()
        out["o_proj.weight"] = out["o_proj.weight"][:, : p.extras["heads_part"]].contiguous()
    return out


@dataclass(frozen=True, kw_only=True)
class _Shape:
    """What :class:`ModelWeights` reads of a config, for a transformers model (norms never folded)."""

    name: str
    family: str
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    vocab_size: int
    positional: str
    encoder: bool
    tie_embeddings: bool
    pad_token_id: int = 0
    pad_aware_positions: bool = False
    post_norm: bool = False
    sandwich_norm: bool = False
    embed_scale: float | None = None
    norm: str = "layernorm"
    rms_offset: bool = False


class HFSource:
    """A :class:`~headscope.probes.models.inhouse.head_weights.TensorSource` over a transformers model's
    modules, by in-house name (``blocks.3.attn.q_proj.weight``): each layer's projections split
    from the modules :func:`find_projections` finds, the embeddings from the model's own."""

    def __init__(self, model, projections: list[LayerProjections], pos_embed: nn.Module | None):
        self.spec = model.spec
        self.projections = projections
        self._cache: dict[int, dict] = {}
        emb = input_embeddings(model.hf)
        if not isinstance(getattr(emb, "weight", None), torch.Tensor) or emb.weight.dim() != 2:
            raise ModelIncompatibleError(f"{type(emb).__name__}: no token embedding matrix [vocab, d_model] to read")
        self._t = {"embed.weight": emb.weight}
        try:
            out = model._output_embedding() if hasattr(model, "_output_embedding") else None
        except AttributeError:  # FSMT's encoder has no get_output_embeddings
            out = None
        if out is not None and getattr(out, "weight", None) is not None and out.weight is not emb.weight:
            self._t["unembed.weight"] = out.weight
        if pos_embed is not None:
            self._t["pos_embed.weight"] = pos_embed.weight
        self._map = _embedding_map(model.hf, int(emb.weight.shape[1]), self.spec.d_model)
        paths = projections[0].paths
        self.description = "transformers model (in memory): " + ", ".join(f"{k} {v}" for k, v in paths.items())

    def _layer(self, layer: int) -> dict:
        if layer not in self._cache:
            self._cache = {layer: projection_tensors(self.projections[layer], self.spec)}  # one layer held
        return self._cache[layer]

    def _split(self, name: str) -> tuple[int, str] | None:
        parts = name.split(".")
        if len(parts) == 5 and parts[0] == "blocks" and parts[2] == "attn":
            return int(parts[1]), ".".join(parts[3:])
        return None

    def has(self, name: str) -> bool:
        at = self._split(name)
        return self._layer(at[0]).get(at[1]) is not None if at else name in self._t

    def tensor(self, name: str) -> torch.Tensor:
        at = self._split(name)
        if at is not None:
            t = self._layer(at[0]).get(at[1])
            if t is None:
                raise KeyError(name)
            return t.clone()
        return self._mapped(name, self._t[name].detach().float().cpu()).clone()

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self._mapped(name, self._t[name].detach()[start:stop].float().cpu())

    def _mapped(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """Embedding rows ``[n, E]`` into the residual stream ``[n, d_model]`` (ALBERT, ELECTRA: E < d_model)."""
        if self._map is None or name not in ("embed.weight", "pos_embed.weight"):
            return t
        return t @ self._map.T

    def layout(self, layer: int) -> tuple[tuple[int, ...], list[int]]:
        h, n_kv = self.spec.n_heads, self.projections[layer].n_kv
        return tuple(range(h)), [i // (h // n_kv) for i in range(h)]


def _embedding_map(hf, width: int, d_model: int) -> torch.Tensor | None:
    """``[d_model, E]``: the one linear map from embeddings of width ``E`` to the residual stream where they
    differ (ALBERT's ``embedding_hidden_mapping_in``, ELECTRA's ``embeddings_project``; its bias, a constant
    of every token, is left out of W_E); None where ``E == d_model``. ``ModelIncompatibleError`` where none
    or several such maps exist."""
    if width == d_model:
        return None
    maps = [(n, m) for n, m in hf.named_modules() if linear_shape(m) == (width, d_model)]
    if len(maps) != 1:
        raise ModelIncompatibleError(
            f"embeddings of width {width} reach d_model {d_model} through {len(maps)} linear maps "
            f"({', '.join(n for n, _ in maps) or 'none'}); W_E not read"
        )
    return linear_weights(maps[0][1])[0]


class HFModelWeights(ModelWeights):
    """:class:`ModelWeights` of a transformers model, its layers with biases (``b_Q [head, d_head]``,
    ``b_K``/``b_V [kv_head, d_head]``, ``b_O [d_model]``; None where absent). ``norm``: the module
    before the projections (not folded); ``positions``: the position scheme; ``scale``: the
    attention scale; ``check``: the check's record (:func:`hf_weights`)."""

    def __init__(self, shape: _Shape, source: HFSource, *, norm: str, positions: str, scales: tuple[float, ...]):
        super().__init__(shape, source, fold_norms=False, name=shape.name)
        self.norm = norm
        self.positions = positions
        self.scales = scales  # the candidates the check chooses among
        self.scale: float | None = scales[0] if len(scales) == 1 else None
        self.check: dict = {}
        #: what the matrices hold frozen at the forward's own values (one line each; empty: nothing,
        #: the matrices alone give each head's output): per-position norm scales, output gates
        self.frozen: list[str] = []

    @property
    def folding(self) -> str:
        return f"not folded: the matrices act on the projections' input, {self.norm}"

    @folding.setter
    def folding(self, value: str) -> None:  # ModelWeights.__init__ sets its own; the norm found decides
        pass

    def reading(self) -> dict[str, str]:
        """:meth:`ModelWeights.reading`, with the position scheme, the attention scale and what is frozen."""
        frozen = "; ".join(self.frozen) or "nothing: the matrices alone give each head's output"
        return {**super().reading(), "positions": self.positions, "scale": f"{self.scale:.6g}", "frozen": frozen}

    def layer(self, layer: int) -> LayerWeights:
        lw = super().layer(layer)
        d, src, p = self.d_head, self._src, f"blocks.{layer}.attn."

        def bias(name: str, n: int):
            return src.tensor(p + name).view(n, d) if src.has(p + name) else None

        n, n_kv = len(lw.heads), lw.W_K.shape[0]
        b_o = src.tensor(p + "o_proj.bias") if src.has(p + "o_proj.bias") else None
        return dataclasses.replace(
            lw, b_Q=bias("q_proj.bias", n), b_K=bias("k_proj.bias", n_kv), b_V=bias("v_proj.bias", n_kv), b_O=b_o
        )


#: module names of learned absolute position embeddings
POS_EMBED_NAMES = ("position_embeddings", "wpe", "embed_positions")


def _pos_embed(hf) -> tuple[nn.Module | None, int | None]:
    """``(learned position embedding, padding index its positions start after or None)``."""
    for name, m in hf.named_modules():
        if isinstance(m, nn.Embedding) and name.split(".")[-1] in POS_EMBED_NAMES:
            parent = hf.get_submodule(name.rpartition(".")[0]) if "." in name else hf
            pad = getattr(parent, "padding_idx", None)
            return m, pad if isinstance(pad, int) else None
    return None, None


def attention_scales(attn: nn.Module, hf_config, d_head: int) -> tuple[float, ...]:
    """The scales the attention module may multiply ``q · k`` by, the check choosing: its own
    ``scaling`` (``scale``, ``inv_norm_factor``, ``1 / norm_factor``) alone where it has one, else
    ``query_pre_attn_scalar ** -0.5`` of the config, ``d_head ** -0.5`` and 1 (T5 and GPT-Neo do not scale)."""
    for name in ("scaling", "scale", "inv_norm_factor"):
        v = getattr(attn, name, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            # its square where the module scales both q and k by it (OpenAI's privacy filter: d_head ** -0.25 each)
            return (float(v), float(v) ** 2) if float(v) != 1.0 else (1.0,)
    nf = getattr(attn, "norm_factor", None)
    if isinstance(nf, (int, float)) and nf:
        return (1.0 / float(nf),)
    qs = getattr(hf_config, "query_pre_attn_scalar", None)
    return tuple(dict.fromkeys(([float(qs) ** -0.5] if qs else []) + [d_head**-0.5, 1.0]))


def _build(model, projections, pos, pad) -> HFModelWeights:
    spec, hf = model.spec, model.hf
    source = HFSource(model, projections, pos)
    shape = _Shape(
        name=spec.name,
        family=spec.family,
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        d_model=spec.d_model,
        d_head=spec.d_head,
        vocab_size=int(source._t["embed.weight"].shape[0]),  # its shape, not a copy of the whole table
        positional="learned" if pos is not None else "none",
        encoder=not spec.causal,
        tie_embeddings="unembed.weight" not in source._t,
        pad_token_id=pad if pad is not None else 0,
        pad_aware_positions=pad is not None,
    )
    scales = attention_scales(projections[0].attn, getattr(hf, "config", None), spec.d_head)
    return HFModelWeights(shape, source, norm="not found", positions=shape.positional, scales=scales)


#: attention whose per-head weights have no meaning as x W matrices, by a config key it is known by
NO_PER_HEAD = {
    "kv_lora_rank": (
        "MLA (multi-head latent attention) whose latent projections are not kv_a_proj_with_mqa, kv_a_layernorm "
        "and kv_b_proj by name: the per-head maps through the shared latent are not read"
    ),
}
#: embeddings with no per-token W_E, by a config key the family is known by
NO_W_E = {
    "trigram_input": "MobileBERT: each position's input is one linear map of the concatenated embeddings of the "
    "token and its two neighbours (trigram input), so no per-token W_E reaches the residual stream",
    "num_hash_functions": "CANINE: characters are embedded by hashing each codepoint into several bucket tables "
    "(concatenated), then downsampled by a strided convolution over positions before the deep stack: no "
    "per-token W_E reaches the heads' residual stream",
}


def _embedding_width(hf) -> int | None:
    return int(w.shape[1]) if isinstance(w := getattr(input_embeddings(hf), "weight", None), torch.Tensor) else None


def structural_refusal(block: nn.Module, o: nn.Module, spec, prefix: str = "") -> str | None:
    """Why a layer's attention has no per-position per-head weights, read from its modules (one line), or
    None: a short convolution over positions on its keys or values (Inkling, Zaya), a value read partly from
    the previous position (Zaya), projections reading the residual stream concatenated with another input
    (Zamba's shared block: ``[hidden, original embeddings]``)."""
    chain = _ancestors(block, o)
    for where, attn in chain[:-1] or chain:  # noqa: B007 - the nearest holder of a conv below the block (Inkling 2's o_proj is
        convs = [  # a module of its own inside self_attn, its convolutions inside k_proj / v_proj)
            rel
            for rel, m in attn.named_modules()
            if rel
            and (
                (isinstance(m, nn.Conv1d) and m.kernel_size[0] > 1)
                or ("ShortConvolution" in type(m).__name__ and "ShortConvolution" not in type(attn).__name__)
            )
        ]
        if convs:
            break
    where = ".".join(p for p in (prefix, where) if p)
    if convs:
        delayed = (
            " and a value half read from the previous position (v_proj_delayed)"
            if hasattr(attn, "v_proj_delayed")
            else ""
        )
        return (
            f"{where}: queries, keys or values pass through a short causal convolution over positions "
            f"({', '.join(convs[:3])}){delayed}: a position's q/k/v mixes several positions' projections, so no "
            "per-position W_Q/W_K/W_V exists"
        )
    wide = [
        rel
        for rel, m in attn.named_modules()
        if rel.split(".")[-1] in Q_NAMES + K_NAMES + V_NAMES and (linear_shape(m) or (0,))[0] == 2 * spec.d_model
    ]
    if wide:
        return (
            f"{where}: the projections ({', '.join(wide[:3])}) read {2 * spec.d_model} features, the residual stream "
            "concatenated with the original embeddings (a shared attention block): W_Q/W_K/W_V act on that pair, "
            "not on the residual stream alone"
        )
    return None


#: why the check may fail, by a config key the family is known by (appended to the check's reason)
HINTS = {
    "pos_att_type": "DeBERTa's disentangled attention adds content-to-position and position-to-content "
    "terms (relative position embeddings read through W_Q, W_K) that these matrices alone do not give",
    "relative_attention_num_buckets": "T5-style attention: unscaled scores plus a learned relative position "
    "bias computed inside the first layer",
    "rotary_dim": "rotary applied inside the attention module (GPT-J/CodeGen: interleaved pairs), not "
    "handed to it as (cos, sin)",
}


def _config_reason(hf_config, table: dict) -> str | None:
    for key, why in table.items():
        if getattr(hf_config, key, None) not in (None, False, 0, [], ""):
            return why
    return None


def _mla(model, layout) -> HFModelWeights | None:
    """The checked weights of an MLA model (:mod:`~headscope.probes.models.hf_weights_mla`), None where
    its attention is not MLA."""
    from headscope.probes.models.hf_weights_mla import is_mla, mla_weights

    attns = [_ancestors(b, o)[0][1] for b, o in zip(layout.blocks, layout.attn_out, strict=True)]
    if not all(is_mla(a) for a in attns):
        return None
    names = {id(m): name for name, m in model.hf.named_modules()}
    projections = [
        LayerProjections(a, a.kv_b_proj, a.kv_b_proj, a.kv_b_proj, o, {"mla": names.get(id(a), "")})
        for a, o in zip(attns, layout.attn_out, strict=True)
    ]
    pos, pad = _pos_embed(model.hf)
    base = _build(model, projections, pos, pad)
    return mla_weights(model, attns, HFModelWeights, base.cfg, base.source)


def hf_weights(model) -> HFModelWeights:
    """The checked :class:`HFModelWeights` of an hf-backend model: projections found from the
    module tree (:func:`find_projections`; a fused map read with each of :data:`FUSED_LAYOUTS`
    until one passes), then checked by
    :func:`~headscope.probes.models.hf_weights_check.check_weights` (its record is the weights'
    ``check``). Raises :class:`ModelIncompatibleError` naming the module not understood or the
    check that failed."""
    layout = model.layout
    spec = model.spec
    config = getattr(model.hf, "config", None)
    mla = _mla(model, layout)
    if mla is not None:
        return mla
    no_meaning = _config_reason(config, NO_PER_HEAD)
    if no_meaning is not None:
        raise ModelIncompatibleError(no_meaning)
    pos, pad = _pos_embed(model.hf)
    names = {id(m): name for name, m in model.hf.named_modules()}
    prefixes = [names.get(id(b), "") for b in layout.blocks]
    try:
        return _checked(model, layout, spec, config, pos, pad, prefixes)
    except ModelIncompatibleError:
        for b, o, pre in zip(layout.blocks, layout.attn_out, prefixes, strict=True):
            why = structural_refusal(b, o, spec, pre)  # the check failed or the projections were not found:
            if why is not None:  # the reason in the module tree, where there is one
                raise ModelIncompatibleError(why) from None
        raise


def _checked(model, layout, spec, config, pos, pad, prefixes) -> HFModelWeights:
    """:func:`hf_weights` past the refusals by design: the projections found and checked."""
    from headscope.probes.models.hf_weights_check import check_weights

    if "lsh" in (getattr(config, "attn_layers", None) or []):
        raise ModelIncompatibleError(
            "Reformer: its LSH layers share one query_key projection and attend within buckets of positions hashed "
            "by angle (chunked, each query never scored against itself): no dense pattern from W_Q, W_K"
        )
    why = _config_reason(config, NO_W_E) if _embedding_width(model.hf) != spec.d_model else None
    if why is not None:
        raise ModelIncompatibleError(why)
    first = find_projections(layout.blocks[0], layout.attn_out[0], spec, prefix=prefixes[0])
    tried = []
    for chosen in FUSED_LAYOUTS if first.fused else (None,):
        try:
            projections = [
                find_projections(b, o, spec, layout=chosen, prefix=p)
                for b, o, p in zip(layout.blocks, layout.attn_out, prefixes, strict=True)
            ]
        except ModelIncompatibleError as e:  # a layout this map cannot hold: the next
            tried.append(f"{chosen}: {e}")
            continue
        if layout.heads is not None:  # ConvBERT: the output projection also reads another mixer's features
            projections = [dataclasses.replace(p, extras={**p.extras, "heads_part": layout.heads}) for p in projections]
        weights = _build(model, projections, pos, pad)
        record = check_weights(model, weights, projections, blocks=layout.blocks)
        if record["passed"]:
            weights.positional, weights.positions = positions_in_words(pos is not None, record["scores"])
            weights.norm = record.get("norm", weights.norm)
            weights.scale = record["scores"]["scale"]
            weights.check = {**record, "layout": chosen or "separate", **projections[0].paths}
            weights.frozen = frozen_lines(
                projections[0].extras, record["scores"], spec.n_heads, projections[0].paths.get("q", "q_proj")
            )
            return weights
        tried.append(f"{chosen or 'separate projections'}: {record['reason']}")
    where = ", ".join(f"{k} {v}" for k, v in first.paths.items())
    hint = _config_reason(config, HINTS)
    raise ModelIncompatibleError(
        f"per-head weights of {where} fail the check" + (f" (likely: {hint})" if hint else "") + f": {'; '.join(tried)}"
    )
