"""What every loaded model offers, whatever runs it: :class:`Backend`.

:class:`~headscope.probes.models.loading.InHouseModel`,
:class:`~headscope.probes.models.loading.HFReference` and
:class:`~headscope.probes.models.loading.BridgeModel` satisfy it (``isinstance(m, Backend)``
holds); analyses ask a model what it is through it (``model.backend``, ``model.has_gates``)
rather than by probing for attributes. :class:`ModelSpec` is what analyses need to know of
a model's shape; :func:`spec_from_arch` makes one from a checkpoint's
:class:`~headscope.probes.models.arch.ArchSpec`.

>>> spec = ModelSpec(name="m", family="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_model=32,
...     causal=True, max_positions=64, backend="inhouse")
>>> spec.group_size, spec.kv_groups()
(2, {0: [0, 1], 1: [2, 3]})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from headscope.probes.models.arch import ArchSpec
from headscope.probes.tokens import TokenBatch, encode


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What analyses need to know about a model, whatever its backend."""

    name: str
    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    causal: bool
    max_positions: int
    backend: str

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    def kv_groups(self) -> dict[int, list[int]]:
        """``{kv_head: [query heads that read it]}``."""
        return {g: list(range(g * self.group_size, (g + 1) * self.group_size)) for g in range(self.n_kv_heads)}


def spec_from_arch(arch: ArchSpec, name: str, backend: str) -> ModelSpec:
    """The :class:`ModelSpec` of a checkpoint read by :func:`~headscope.probes.models.arch.arch_from_hf_config`
    (``family`` is the config's ``model_type``; a context the config does not give is 2048)."""
    return ModelSpec(
        name=name,
        family=arch.model_type,
        n_layers=arch.n_layers,
        n_heads=arch.n_heads,
        n_kv_heads=arch.n_kv_heads,
        d_head=arch.d_head,
        d_model=arch.d_model,
        causal=arch.causal,
        max_positions=arch.max_positions or 2048,
        backend=backend,
    )


@runtime_checkable
class Backend(Protocol):
    """A loaded model, whatever runs it.

    * ``backend``: ``"inhouse"``, ``"hf"`` or ``"bridge"``; ``spec``: its :class:`ModelSpec`;
    * ``tokenizer``, ``vocab_size`` (embedding rows; None when unknown), ``device``;
    * ``trust_remote_code``: whether code shipped with the checkpoint was allowed to run
      when it loaded (recorded in run.json);
    * ``has_gates``: whether ``gates`` holds per-layer head gates ``[head]`` (the in-house
      backend only; ablation and pruning need them);
    * ``encode(texts=None, words=None) -> TokenBatch`` (one implementation for all:
      :class:`EncodesTexts`);
    * ``run(batch, quantities, layers) -> {(quantity, layer): tensor, ("output", None): ...}``;
    * ``to(device)`` moves the network (in place) and returns the model.
    """

    backend: str
    spec: ModelSpec
    tokenizer: Any
    vocab_size: int | None
    trust_remote_code: bool
    has_gates: bool

    @property
    def device(self) -> torch.device: ...

    def encode(self, texts=None, words=None) -> TokenBatch: ...

    def run(self, batch: TokenBatch, quantities=("pattern",), layers=None) -> dict: ...

    def to(self, device) -> Backend: ...


class EncodesTexts:
    """The one ``encode`` of every backend: the model's tokenizer, its context
    (``spec.max_positions``) and its vocabulary (``vocab_size``, ids past it refused)."""

    tokenizer: Any
    spec: ModelSpec
    vocab_size: int | None = None

    def encode(self, texts=None, words=None) -> TokenBatch:
        return encode(self.tokenizer, texts, words, max_positions=self.spec.max_positions, vocab_size=self.vocab_size)


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (CPU for a module without any)."""
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
