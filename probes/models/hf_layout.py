"""Where the heads are in a transformers model: per layer, the block, the attention output
projection (its input is every head's ``z``, concatenated) and the Q/K/V projections.

HF families name these modules differently (each :class:`~headscope.probes.models.families.Family`
says its own: ``self_attn.o_proj`` in Llama, Mistral, Qwen, Gemma, Phi-3, OLMo;
``attention.output.dense`` in BERT and RoBERTa; ``attn.c_proj`` in GPT-2; ``attention.out_lin``
in DistilBERT; …) but every one of them concatenates the heads
``[batch, pos, head × d_head]`` before that projection, so a forward pre-hook there sees
(and may replace) each head's output — what :class:`~headscope.probes.models.loading.HFReference`
builds ablation, gradient importance and patching on. :func:`find_layout` finds the modules
by name and checks their sizes against the model's :class:`~headscope.probes.models.backend.ModelSpec`;
a model it cannot map raises :class:`~headscope.probes.errors.ModelIncompatibleError`
naming the bridge backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.families import FAMILIES

#: attention output projections of architectures that are no family of :data:`FAMILIES` (Phi,
#: Falcon, GPT-NeoX, OPT, GPT-Neo, ModernBERT, …), by the end of the module name
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
    projections where the family keeps them separate (``None`` where it fuses them)."""

    blocks: tuple[nn.Module, ...]
    attn_out: tuple[nn.Module, ...]
    q: tuple[nn.Module, ...] | None
    k: tuple[nn.Module, ...] | None
    v: tuple[nn.Module, ...] | None


def _per_layer(model: nn.Module, suffixes, n_layers: int) -> tuple[nn.Module, ...] | None:
    """The modules whose names end with one of ``suffixes``, one per layer in layer order,
    or None when the model does not have exactly one per layer."""
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
    if sorted(found) != list(range(n_layers)):
        return None
    return tuple(found[l] for l in range(n_layers))


def _blocks(model: nn.Module, n_layers: int) -> tuple[nn.Module, ...] | None:
    lists = [m for _, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n_layers]
    return tuple(lists[0]) if len(lists) == 1 else None


def _in_features(mod: nn.Module) -> int | None:
    if isinstance(mod, nn.Linear):
        return mod.in_features
    w = getattr(mod, "weight", None)  # GPT-2's Conv1D holds weight [in, out]
    if w is not None and type(mod).__name__ == "Conv1D":
        return int(w.shape[0])
    return None


def find_layout(model: nn.Module, spec) -> HFLayout:
    """The :class:`HFLayout` of an HF ``model`` with ``spec`` (its layer and head counts);
    ``ModelIncompatibleError`` when no module of a known name takes ``head × d_head``
    inputs in every layer."""
    n = spec.n_layers
    attn_out = _per_layer(model, ATTN_OUT, n)
    blocks = _blocks(model, n)
    width = spec.n_heads * spec.d_head
    if attn_out is None or blocks is None or any(_in_features(m) not in (width, None) for m in attn_out):
        raise ModelIncompatibleError(
            f"{spec.name!r} ({spec.family}): cannot find the attention output projection of each of its {n} layers "
            f"(a module named *{'/*'.join(ATTN_OUT[:3])}/… taking {spec.n_heads} heads × {spec.d_head}); "
            "use --backend bridge"
        )
    qkv = {q: _per_layer(model, names, n) for q, names in QKV.items()}
    return HFLayout(blocks=blocks, attn_out=attn_out, **qkv)
