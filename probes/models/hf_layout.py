"""Where the heads are in a transformers model: per layer, the block, the attention output
projection (its input is every head's ``z``, concatenated) and the Q/K/V projections.

HF families name these modules differently (each :class:`~headscope.probes.models.families.Family`
says its own: ``self_attn.o_proj`` in Llama, Mistral, Qwen, Gemma, Phi-3, OLMo;
``attention.output.dense`` in BERT and RoBERTa; ``attn.c_proj`` in GPT-2; ``attention.out_lin``
in DistilBERT; …) but every one of them concatenates the heads
``[batch, pos, head × d_head]`` before that projection, so a forward pre-hook there sees
(and may replace) each head's output — what :class:`~headscope.probes.models.loading.HFReference`
builds ablation, gradient importance and patching on.

:func:`find_layout` finds that projection by structure: in each layer's block (the model's
``ModuleList`` of layers), the linear maps (``nn.Linear`` or GPT-2's ``Conv1D``) inside an
attention sub-module that take ``n_heads × d_head`` inputs to ``d_model`` outputs; a module of a
known name (:data:`ATTN_OUT`) is tried first. Each candidate is then checked on a probe input
(:mod:`~headscope.probes.models.head_check`): the attention pattern HF returns (eager) times V,
head by head, must reproduce what the candidate receives. The one found, and how, is the
layout's :meth:`HFLayout.record` (run.json's ``head_modules``). A model it cannot map raises
:class:`~headscope.probes.errors.ModelIncompatibleError` naming what was tried.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.families import FAMILIES
from headscope.probes.models.head_check import check_candidates, default_probe

#: attention output projections of architectures that are no family of :data:`FAMILIES` (Phi,
#: Falcon, GPT-NeoX, OPT, GPT-Neo, ModernBERT, MPNet, T5, …), by the end of the module name
_OTHER_ATTN_OUT = (
    "self_attn.dense",
    "self_attention.dense",
    "attention.dense",
    "self_attn.out_proj",
    "attn.out_proj",
    "attention.wo",
    "attn.Wo",
    "attention.o",
)
#: their separate query / key / value projections
_OTHER_QKV = (("attn.q_proj", "attn.k_proj", "attn.v_proj"), ("attention.q", "attention.k", "attention.v"))
#: a module name piece holding one of these (any case) names an attention sub-module
ATTENTION_WORDS = ("attn", "attention")


def _by_use(names) -> tuple[str, ...]:
    """``names`` without repeats, the most used first (ties: in their first order)."""
    names = list(names)
    return tuple(sorted(dict.fromkeys(names), key=lambda n: -names.count(n)))


#: attention output projections (input: heads concatenated), by the end of the module name: each
#: family's (``Family.attn_out``), the most shared first, then the others'
ATTN_OUT = _by_use(f.attn_out for f in FAMILIES.values()) + _OTHER_ATTN_OUT
#: separate query / key / value projections, by the end of the module name (``Family.qkv``, then the others')
QKV = {
    which: _by_use(qkv[i] for qkv in (*(f.qkv for f in FAMILIES.values() if f.qkv), *_OTHER_QKV))
    for i, which in enumerate("qkv")
}
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


@dataclass(frozen=True)
class HFLayout:
    """Per layer (index = layer): the block, the attention output projection, and the Q/K/V
    projections where the family keeps them separate (``None`` where it fuses them).
    ``attn_out_name``: the projection's module path with ``{layer}`` for the layer index;
    ``found_by``: ``"name"`` or ``"shape"``; ``check``: what confirmed it (``"pattern×V max err …"``
    or ``"shape only: <why>"``)."""

    blocks: tuple[nn.Module, ...]
    attn_out: tuple[nn.Module, ...]
    q: tuple[nn.Module, ...] | None
    k: tuple[nn.Module, ...] | None
    v: tuple[nn.Module, ...] | None
    attn_out_name: str = ""
    found_by: str = "name"
    check: str = ""
    #: a hybrid model (attention layers among recurrent or linear-attention ones): the block index of
    #: each layer analysed, and every block in order (what a resumed forward walks); None: every block
    layers: tuple[int, ...] | None = None
    all_blocks: tuple[nn.Module, ...] | None = None
    #: the layers are attention modules, several per block (LongCat-Flash): no block output per layer
    sublayers: bool = False
    #: the heads are the first ``heads`` features of the projection's input (ConvBERT); None: all of it
    heads: int | None = None
    #: the axes its input has turned from ``[batch, position, features]``: (0, 1) time-major (FSMT),
    #: (1, 2) channels first (SqueezeBERT's convolutions); None: not turned
    turn: tuple[int, int] | None = None

    def record(self) -> dict:
        """run.json's ``head_modules``: which module was found and how (a hybrid model: which of its
        blocks hold the attention layers analysed, and which hold none)."""
        out = {"attn_out": self.attn_out_name, "found_by": self.found_by, "check": self.check}
        if self.layers is not None:
            out["attention_blocks"] = list(self.layers)
            out["blocks_without_attention"] = [i for i in range(len(self.all_blocks)) if i not in self.layers]
        if self.sublayers:
            out["layers"] = "attention modules, several per block (each layer of the spec is one of them)"
        if self.turn is not None:
            held = "[position, batch, features]" if self.turn == (0, 1) else "[batch, features, position]"
            out["layout"] = f"its layers hold {held}: read as [batch, position, features]"
        if self.heads is not None:
            out["heads_part"] = f"the input's first {self.heads} features (the rest: another mixer's, not heads)"
        return out


@dataclass(frozen=True)
class Candidate:
    """A possible attention output projection: its path in each block (``rel``), the modules
    (one per layer), the full path pattern, and whether a known name matched it."""

    rel: str
    modules: tuple[nn.Module, ...]
    pattern: str
    by_name: bool
    #: the input's first ``heads`` features are the heads' (ConvBERT: its span-based convolution's follow);
    #: None: the whole input is
    heads: int | None = None
    #: the axes its input has turned from ``[batch, position, features]``: (0, 1) time-major (FSMT),
    #: (1, 2) channels first (SqueezeBERT's convolutions); None: not turned
    turn: tuple[int, int] | None = None


def _per_layer(model: nn.Module, suffixes, n_layers: int, layers=None) -> tuple[nn.Module, ...] | None:
    """The modules whose names end with one of ``suffixes``, one per layer in layer order,
    or None when the model does not have exactly one per layer (``layers``: the blocks that have
    one, where not every block has: a hybrid model)."""
    found: dict[int, nn.Module] = {}
    for name, mod in model.named_modules():
        if not name.endswith(suffixes):
            continue
        m = _LAYER_INDEX.search("." + name)
        if m is None:
            continue
        layer = int(m.group(1))
        if layer in found:
            return None  # two candidates in one layer: ambiguous
        found[layer] = mod
    want = list(range(n_layers)) if layers is None else list(layers)
    if sorted(found) != want:
        return None
    return tuple(found[l] for l in want)


def _block_list(model: nn.Module, n_layers: int) -> tuple[str, nn.ModuleList] | None:
    """``(name, ModuleList)`` of the model's layers: the one list of ``n_layers`` modules not
    nested in another such list (T5's per-block ``layer`` lists are); None when there is no one."""
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n_layers]
    outer = [(n, m) for n, m in lists if not any(n != o and n.startswith(o + ".") for o, _ in lists)]
    if len(outer) > 1:  # no block module (XLM, FlauBERT: parallel lists `attentions`, `ffns`, norms): the one
        outer = [(n, m) for n, m in outer if all(is_attention(b) for b in m)]  # list of attention modules
    return outer[0] if len(outer) == 1 else None


def is_attention(module: nn.Module) -> bool:
    """Whether a module's class says attention (XLM's ``MultiHeadAttention``, a layer of its
    ``attentions`` list: a model whose layers are parallel lists has its attention modules as blocks)."""
    return "attention" in type(module).__name__.lower()


def _blocks(model: nn.Module, n_layers: int) -> tuple[nn.Module, ...] | None:
    found = _block_list(model, n_layers)
    return tuple(found[1]) if found is not None else None


def linear_shape(mod: nn.Module) -> tuple[int, int] | None:
    """``(in, out)`` features of a linear map (``nn.Linear``, or GPT-2's ``Conv1D`` holding its
    weight ``[in, out]``); None for any other module."""
    if isinstance(mod, nn.Linear):
        return mod.in_features, mod.out_features
    sizes = getattr(mod, "in_features", None), getattr(mod, "out_features", None)
    if all(isinstance(v, int) for v in sizes) and isinstance(getattr(mod, "weight", None), torch.Tensor):
        return sizes  # a linear map of another class (I-BERT's QuantLinear, quantised layers)
    w = getattr(mod, "weight", None)
    if w is not None and type(mod).__name__ == "Conv1D" and w.dim() == 2:
        return int(w.shape[0]), int(w.shape[1])
    if isinstance(mod, nn.Conv1d) and mod.kernel_size == (1,) and mod.stride == (1,) and mod.padding == (0,):
        return mod.in_channels, mod.out_channels  # SqueezeBERT's, channels first (grouped: a block-diagonal map)
    return None


def _in_features(mod: nn.Module) -> int | None:
    shape = linear_shape(mod)
    return shape[0] if shape else None


def in_attention(rel: str, *, itself: bool = False) -> bool:
    """Whether the module path ``rel`` (inside a block) lies in an attention sub-module (or, with
    ``itself``, is one)."""
    pieces = rel.split(".") if itself else rel.split(".")[:-1]
    return any(w in piece.lower() for piece in pieces for w in ATTENTION_WORDS)


def attention_classes(blocks) -> set[str]:
    """The paths (inside a block) of the sub-modules whose class says attention (RecurrentGemma's
    ``temporal_block``, a ``RecurrentGemmaSdpaAttention``), whatever their name."""
    return {
        rel for block in blocks for rel, m in block.named_modules() if rel and "attention" in type(m).__name__.lower()
    }


def inside_attention(rel: str, classes: set[str], *, itself: bool = False) -> bool:
    """:func:`in_attention`, or ``rel`` lies in (or, with ``itself``, is) one of ``classes``
    (:func:`attention_classes`)."""
    if in_attention(rel, itself=itself):
        return True
    parts = rel.split(".")
    return any(".".join(parts[:i]) in classes for i in range(1, len(parts) + (1 if itself else 0)))


def _attention_linears(block: nn.Module, want: tuple[int, int], whole: bool = False) -> dict[str, nn.Module]:
    """The linear maps of ``block`` inside an attention sub-module of shape ``want`` (in, out) (``whole``:
    the block is an attention module, LongCat-Flash's sublayers: every map inside it)."""
    classes = attention_classes([block])
    whole = whole or is_attention(
        block
    )  # the block is an attention module (XLM's): every map inside is the attention's
    return {
        rel: m
        for rel, m in block.named_modules()
        if rel and linear_shape(m) == want and (whole or inside_attention(rel, classes))
    }


def _holds_linear(module: nn.Module) -> bool:
    return any(linear_shape(m) is not None for m in module.modules())


def attention_sublayers(model: nn.Module, n_blocks: int) -> tuple[str, tuple[nn.Module, ...]] | None:
    """``(path pattern, modules)`` where each of the model's ``n_blocks`` blocks holds its attention as a
    list of several attention modules run one after another (LongCat-Flash: ``self_attn``, two per layer,
    each with its own heads, residual and KV cache layer ``2 × layer + i``; HF returns a pattern for each):
    every one in order, the attention layers analysed; None where the blocks hold no such list."""
    found = _block_list(model, n_blocks)
    if found is None:
        return None
    lists = []
    for block in found[1]:
        subs = [
            (rel, m)
            for rel, m in block.named_children()
            if isinstance(m, nn.ModuleList) and in_attention(rel, itself=True) and all(map(_holds_linear, m))
        ]  # not a list of norms named after the attention (post_attention_layernorm)
        if len(subs) != 1 or len(subs[0][1]) < 2:
            return None
        lists.append(subs[0])
    rels, k = {rel for rel, _ in lists}, len(lists[0][1])
    if len(rels) != 1 or any(len(m) != k for _, m in lists):
        return None
    base = f"{found[0]}.{{layer // {k}}}.{lists[0][0]}.{{layer % {k}}}"
    return base, tuple(sub for _, m in lists for sub in m)


def _recorded_attention(model: nn.Module):
    """``is_recorded(module)``: whether transformers records the module's output as the model's
    ``attentions`` (the model classes' ``_can_record_outputs``: Bailing's ``BailingHybridAttention``,
    not its linear-attention layers'); None where no class says."""
    targets = []
    for m in model.modules():
        spec = (getattr(type(m), "_can_record_outputs", None) or {}).get("attentions")
        for t in spec if isinstance(spec, (list, tuple)) else [spec] if spec is not None else []:
            targets.append(t)
    classes = tuple(t if isinstance(t, type) else getattr(t, "target_class", None) for t in targets)
    classes = tuple(c for c in classes if isinstance(c, type))
    if not classes or len(classes) != len(targets):  # a recorder by layer or class name: not read here
        return None
    return lambda module: isinstance(module, classes)


def linear_layers(model: nn.Module, n_blocks: int) -> set[int]:
    """The blocks the config's ``layer_types`` (one kind per block) calls linear attention
    (MiniMax's ``"linear_attention"`` lightning layers, whose recorded "attentions" are their
    ``[head, d_head, d_head]`` KV state, no pattern); empty where it has no such list."""
    kinds = getattr(getattr(model, "config", None), "layer_types", None)
    if not isinstance(kinds, (list, tuple)) or len(kinds) != n_blocks:
        return set()
    return {i for i, kind in enumerate(kinds) if "linear" in str(kind)}


def attention_of_layers(attentions, layers, n_blocks: int):
    """The patterns of a hybrid model's attention ``layers`` (block indices) from HF's ``attentions``:
    those layers' entries where it gives one per block (MiniMax: its linear layers' too), else as given."""
    if layers is None or attentions is None or len(attentions) != n_blocks:
        return attentions
    return tuple(attentions[i] for i in layers)


#: attention modules (by class name) whose ``output_attentions`` entry is their masked, scaled scores before the
#: softmax, and the key of their output dict holding them: SqueezeBERT's ``forward`` returns ``attention_score``
#: and multiplies V by ``self.softmax(attention_score)`` (dropout only in training)
RETURNS_SCORES = {"SqueezeBertSelfAttention": "attention_score"}


def softmax_returned_scores(model: nn.Module) -> int:
    """Hook each attention module of ``model`` listed in :data:`RETURNS_SCORES` so that what it returns for
    ``output_attentions`` is the softmax of its scores over the keys, the pattern its forward multiplies V
    by (the same ``softmax(dim=-1)``, so equal bit for bit); the number of modules hooked."""

    def softmaxed(module, args, output):
        key = RETURNS_SCORES[type(module).__name__]
        if isinstance(output, dict) and torch.is_tensor(output.get(key)):
            return {**output, key: torch.softmax(output[key], dim=-1)}
        return output

    hooked = [m for m in model.modules() if type(m).__name__ in RETURNS_SCORES]
    for m in hooked:
        m.register_forward_hook(softmaxed)
    return len(hooked)


def unbanded(attentions, window):
    """HF's ``attentions`` with each sliding-window layer's ``[batch, head, query, window + 1]`` scores
    (Longformer, LED: key ``q - window/2 … q + window/2`` of query ``q``, the positions past the input
    masked to 0) laid out as its ``[batch, head, query, key]`` pattern, 0 outside the window;
    ``window``: the config's ``attention_window`` (one, or one per layer). As given where there is none
    or a layer's scores are not that shape (global tokens add their own columns first)."""
    if window is None or attentions is None or not isinstance(attentions, (tuple, list)):
        return attentions
    out = []
    for l, a in enumerate(attentions):
        w = window[l] if isinstance(window, (list, tuple)) else window
        if not (torch.is_tensor(a) and a.dim() == 4 and isinstance(w, int) and a.shape[-1] == w + 1 != a.shape[2]):
            out.append(a)
            continue
        pos, half = a.shape[2], w // 2
        offset = torch.arange(pos)[None, :] - torch.arange(pos)[:, None] + half  # [query, key] -> band column
        inside = (offset >= 0) & (offset <= w)
        rows = torch.arange(pos)[:, None].expand(pos, pos)[inside]
        full = a.new_zeros(*a.shape[:2], pos, pos)
        full[:, :, inside] = a[:, :, rows.to(a.device), offset[inside].to(a.device)]
        out.append(full)
    return tuple(out)


def attention_blocks(model: nn.Module, spec, n_blocks: int) -> tuple[int, ...] | None:
    """A hybrid model's attention layers (Mamba, gated-delta or other recurrent layers between them:
    Zamba2, Qwen3-Next, OLMo-Hybrid, Jamba, …): the indices of the blocks (of its one list of
    ``n_blocks``) holding a module whose output transformers records as the attentions, where only
    some do; else those holding a linear map from ``spec``'s heads × d_head to d_model inside an
    attention sub-module (one of a known name, :data:`ATTN_OUT`, first), where only some do and the
    others hold no module of an attention class (attention of another size is no recurrent layer:
    Gemma 4's 512-wide global heads). None where every block holds one, none does, or the list
    cannot be found (the layout then says why)."""
    found = _block_list(model, n_blocks)
    if found is None:
        return None
    recorded = _recorded_attention(model)
    if recorded:  # the blocks holding a module whose output transformers records as the attentions
        have = tuple(i for i, block in enumerate(found[1]) if any(recorded(m) for m in block.modules()))
        if len(have) == n_blocks:  # MiniMax records its lightning layers' KV state too: the config says which
            have = tuple(i for i in have if i not in linear_layers(model, n_blocks))
        if 0 < len(have) < n_blocks:
            return have
    want = (spec.n_heads * spec.d_head, spec.d_model)
    maps = [_attention_linears(block, want) for block in found[1]]
    named = tuple(i for i, m in enumerate(maps) if any(f"{found[0]}.{i}.{rel}".endswith(ATTN_OUT) for rel in m))
    have = tuple(i for i, m in enumerate(maps) if m)
    if 0 < len(named) < n_blocks:  # a known name first: a recurrent layer's square input map is no output projection
        have = named
    if not 0 < len(have) < n_blocks:
        return None
    others = [block for i, block in enumerate(found[1]) if i not in have]
    if any(attention_classes([block]) for block in others):  # attention of another size there (Gemma 4's global
        return None  # layers' 512-wide heads): not a hybrid, and its heads are not all of the spec's size
    return have


def candidates(model: nn.Module, spec, layers=None, n_blocks=None, sublayers=None) -> tuple[list[Candidate], str]:
    """The possible attention output projections of ``model`` (known names first), and the
    blocks' path pattern; ``ModelIncompatibleError`` where the layers' list cannot be found.
    ``layers``: the blocks analysed, of ``n_blocks`` (a hybrid model's attention layers; default every block);
    ``sublayers``: :func:`attention_sublayers`, the attention modules analysed as the layers."""
    if sublayers is not None:
        base, blocks = sublayers
        return _candidates_in(blocks, spec, base, None, whole=True), base
    n = n_blocks or spec.n_layers
    found = _block_list(model, n)
    if found is None:
        raise ModelIncompatibleError(
            f"{spec.name!r} ({spec.family}): cannot find its list of {n} layers (no single ModuleList of {n} "
            "blocks); use --backend bridge"
        )
    list_name, blocks = found
    if layers is not None:
        blocks = [blocks[i] for i in layers]
    base = f"{list_name}.{{layer}}" if list_name else "{layer}"
    return _candidates_in(blocks, spec, base, list_name), base


def _candidates_in(blocks, spec, base: str, list_name: str | None, *, whole: bool = False) -> list[Candidate]:
    """The linear maps of shape heads × d_head -> d_model at the same path in every one of ``blocks``
    (known names first: by the path under ``list_name``, None: no name is known there)."""
    want = (spec.n_heads * spec.d_head, spec.d_model)
    per_layer = [_attention_linears(block, want, whole) for block in blocks]
    common = [rel for rel in per_layer[0] if all(rel in p for p in per_layer)]
    named = lambda rel: list_name is not None and f"{list_name}.0.{rel}".endswith(ATTN_OUT)  # noqa: E731
    out = [Candidate(rel, tuple(p[rel] for p in per_layer), f"{base}.{rel}", named(rel)) for rel in common]
    if not out:  # the heads concatenated with another mixer's outputs of the same width (ConvBERT's convolution)
        wider = [_attention_linears(block, (2 * want[0], want[1]), whole) for block in blocks]
        common = [rel for rel in wider[0] if all(rel in p for p in wider) and named(rel)]
        out = [Candidate(rel, tuple(p[rel] for p in wider), f"{base}.{rel}", True, want[0]) for rel in common]
    return sorted(out, key=lambda c: not c.by_name)


def find_layout(model: nn.Module, spec, *, probe=None, layers=None, n_blocks=None, sublayers=None) -> HFLayout:
    """:func:`_find_layout`; where it refuses the model, what the family's attention does first, where known
    (:func:`~headscope.probes.models.unsupported.explained`)."""
    from headscope.probes.models.unsupported import explained

    try:
        return _find_layout(model, spec, probe=probe, layers=layers, n_blocks=n_blocks, sublayers=sublayers)
    except ModelIncompatibleError as e:
        raise explained(spec, str(e)) from None


def _find_layout(model: nn.Module, spec, *, probe=None, layers=None, n_blocks=None, sublayers=None) -> HFLayout:
    """The :class:`HFLayout` of an HF ``model`` with ``spec`` (its layer and head counts): each
    candidate of :func:`candidates` checked by :func:`~headscope.probes.models.head_check.check_candidates`
    on ``probe`` (``probe(model) -> attentions``; default: a few token ids through the model,
    ``output_attentions``); ``ModelIncompatibleError`` (one line, naming what was tried) when none
    passes. ``layers``: a hybrid model's attention layers among its ``n_blocks`` blocks
    (:func:`attention_blocks`), the only ones analysed (``spec.n_layers`` of them); ``sublayers``: the
    attention modules analysed as the layers, several per block (:func:`attention_sublayers`)."""
    n = spec.n_layers
    cands, base = candidates(model, spec, layers, n_blocks, sublayers)
    width = spec.n_heads * spec.d_head
    if not cands:
        raise ModelIncompatibleError(
            f"{spec.name!r} ({spec.family}): cannot find the attention output projection of each of its {n} layers "
            f"(no linear map inside {base}'s attention taking {spec.n_heads} heads × {spec.d_head} = {width} to "
            f"d_model {spec.d_model}; names tried: *{'/*'.join(ATTN_OUT[:3])}/…); use --backend bridge"
        )
    every = sublayers[1] if sublayers is not None else _blocks(model, n_blocks or n)
    blocks = every if layers is None else tuple(every[i] for i in layers)
    classes = attention_classes(blocks)
    whole = sublayers is not None or all(is_attention(b) for b in blocks)  # attention modules (XLM's, LongCat's)
    inside = lambda rel: whole or inside_attention(rel, classes, itself=True)  # noqa: E731
    if layers is not None:  # the attention layers' patterns alone (MiniMax returns one per block)
        given = probe or (lambda m: default_probe(m, spec))
        probe = lambda m: attention_of_layers(given(m), layers, n_blocks or n)  # noqa: E731
    window = getattr(getattr(model, "config", None), "attention_window", None)
    if window is not None:  # sliding-window scores laid out as [query, key] patterns (Longformer, LED)
        banded = probe or (lambda m: default_probe(m, spec))
        probe = lambda m: unbanded(banded(m), window)  # noqa: E731
    chosen, check = check_candidates(model, spec, cands, blocks, inside, probe)
    qkv = {q: _per_layer(model, names, n, layers) for q, names in QKV.items()}
    return HFLayout(
        layers=None if layers is None else tuple(layers),
        all_blocks=None if layers is None else every,
        blocks=blocks,
        attn_out=chosen.modules,
        **qkv,
        attn_out_name=chosen.pattern,
        found_by="name" if chosen.by_name else "shape",
        check=check,
        sublayers=sublayers is not None,
        heads=chosen.heads,
        turn=chosen.turn,
    )
