"""What every loaded model offers, whatever runs it: :class:`Backend`.

:class:`~headscope.probes.models.backends.inhouse.InHouseModel`,
:class:`~headscope.probes.models.backends.hf.HFReference` and
:class:`~headscope.probes.models.backends.bridge.BridgeModel` satisfy it (``isinstance(m, Backend)``
holds); analyses ask a model what it is and drive it through it (``model.backend``,
``model.has_gates``, ``model.head_hooks``, ``model.gates_set``, ``model.hook_points``,
:func:`unembed_at`, :func:`check_head_hooks`) rather than by reaching into its modules.
:class:`ModelSpec` is what analyses need to know of a model's shape; :func:`spec_from_arch`
makes one from a checkpoint's :class:`~headscope.probes.models.spec.ArchSpec`.

>>> spec = ModelSpec(name="m", family="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_model=32,
...     causal=True, max_positions=64, backend="inhouse")
>>> spec.group_size, spec.kv_groups()
(2, {0: [0, 1], 1: [2, 3]})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.arch import ArchSpec
from headscope.probes.models.inhouse.hooks import HookFn, HookPoint, hooks
from headscope.probes.tokens import TokenBatch, encode

#: a per-layer head hook: ``z [batch, head, pos, d_head] -> z`` (same shape)
HeadFn = Callable[[torch.Tensor], torch.Tensor]

#: what ``run`` captures: names of :mod:`headscope.probes.models.inhouse.attention`'s hook points
QUANTITIES = ("pattern", "scores", "q", "k", "v", "q_rot", "k_rot", "z", "out", "resid_post")


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
    * ``network``: the torch module that runs (the in-house ``Transformer``, the HF model, the
      ``TransformerBridge``), for what reads its parameters as a whole (placement, FLOP counts);
    * ``trust_remote_code``: whether code shipped with the checkpoint was allowed to run
      when it loaded (recorded in run.json);
    * ``forward(input_ids, attention_mask, grad=False) -> output``: logits of a decoder, last
      hidden states ``[batch, pos, d_model]`` of an encoder, in the model's own graph
      (gradients flow when ``grad``);
    * ``head_hooks({layer: fn})``: a context in which every forward passes each listed
      layer's per-head output ``z [batch, head, pos, d_head]`` (before the output
      projection) through ``fn(z) -> z`` — the one hook ablation, gradient importance,
      pruning curves and patching are built on (:func:`apply_to_heads` for a module hook);
      ``check_head_hooks()`` raises :class:`~headscope.probes.errors.ModelIncompatibleError`
      where they cannot reach the heads (:func:`check_head_hooks`);
    * ``has_gates``: whether the model holds built-in per-layer head gates (``gates``: one
      ``[head]`` per layer; the in-house backend only: physical pruning and MHA→GQA conversion
      need them); ``gates_set(mask, requires_grad=, ablation=)``: a context in which they hold
      ``mask [layer, head]`` (``ModelIncompatibleError`` without gates);
    * ``hook_points``: ``{name: HookPoint}``, every named activation (in-house:
      ``blocks.{l}.attn.hook_z`` …; empty for hf and bridge, which expose theirs through
      ``run`` and ``head_hooks``); ``point_hooks({name: fn})``: a context with
      ``fn(tensor, name)`` on those points (:func:`~headscope.probes.models.inhouse.hooks.hooks`);
    * ``unembed_at(keep)``: a context in which a decoder's ``forward`` returns the logits at
      ``keep [batch, pos]`` only (:func:`unembed_at`; where :func:`rows_unembedded`: the
      model's ``unembedding`` is known, None otherwise — an attribute the protocol leaves out
      of ``isinstance``, since the hf backend checks it with a forward);
    * ``encode(texts=None, words=None) -> TokenBatch`` (one implementation for all:
      :class:`BackendCommon`);
    * ``run(batch, quantities, layers) -> {(quantity, layer): tensor, ("output", None): ...}``:
      the batch goes to ``input_device`` (the embedding's device), the tensors come back on
      the device they were computed on (no copy to the host);
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

    @property
    def network(self) -> torch.nn.Module: ...

    @property
    def hook_points(self) -> Mapping[str, HookPoint]: ...

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, grad: bool = False) -> torch.Tensor: ...

    def head_hooks(self, fns: dict[int, HeadFn]) -> AbstractContextManager: ...

    def check_head_hooks(self) -> None: ...

    def gates_set(
        self, mask: torch.Tensor, *, requires_grad: bool = False, ablation: torch.Tensor | None = None
    ) -> AbstractContextManager: ...

    def point_hooks(self, fns: dict[str, HookFn]) -> AbstractContextManager: ...

    def unembed_at(self, keep: torch.Tensor) -> AbstractContextManager: ...

    def final_states(self) -> AbstractContextManager: ...

    def unembed_rows(self, h: torch.Tensor) -> torch.Tensor: ...

    def encode(self, texts=None, words=None) -> TokenBatch: ...

    def run(self, batch: TokenBatch, quantities=("pattern",), layers=None) -> dict: ...

    def to(self, device) -> Backend: ...


class BackendCommon:
    """What every backend shares: ``encode`` (the model's tokenizer, its context
    ``spec.max_positions`` and its vocabulary ``vocab_size``, ids past it refused), the
    input device, and the defaults of a backend without gates or named hook points."""

    backend: str
    tokenizer: Any
    spec: ModelSpec
    vocab_size: int | None = None
    has_gates = False

    def encode(self, texts=None, words=None) -> TokenBatch:
        return encode(self.tokenizer, texts, words, max_positions=self.spec.max_positions, vocab_size=self.vocab_size)

    @property
    def input_device(self) -> torch.device:
        """Where token ids go (the embedding's device; ``device`` unless a model is spread)."""
        return self.device  # type: ignore[attr-defined]

    @property
    def hook_points(self) -> Mapping[str, HookPoint]:
        """No named hook points (the in-house backend has them)."""
        return {}

    @contextmanager
    def point_hooks(self, fns: dict[str, HookFn]):
        """``fn(tensor, name)`` on each named hook point (:attr:`hook_points`) for the ``with``
        block; ``ModelIncompatibleError`` for a name the model does not have."""
        points = self.hook_points
        missing = [n for n in fns if n not in points]
        if missing:
            raise ModelIncompatibleError(
                f"{self.spec.name}: no hook point {missing[0]!r} on the {self.backend} backend"
                + ("; named hook points need --backend inhouse" if not points else "")
            )
        with hooks([(points[n], fn) for n, fn in fns.items()]):
            yield

    def check_head_hooks(self) -> None:
        """The head hooks reach every head (nothing to find on this backend)."""

    def unembed_at(self, keep: torch.Tensor) -> AbstractContextManager:
        """:func:`unembed_at` on this model; ``ModelIncompatibleError`` where it has no
        unembedding whose rows may be chosen (an encoder; a model whose check on load refused it)."""
        self._refuse_unless_rows_unembedded()
        return unembed_at(self, keep)

    def final_states(self) -> AbstractContextManager:
        """:func:`final_states` on this model (the same refusal as :meth:`unembed_at`)."""
        self._refuse_unless_rows_unembedded()
        return final_states(self)

    def _refuse_unless_rows_unembedded(self) -> None:
        if not rows_unembedded(self):
            raise ModelIncompatibleError(
                f"{self.spec.name}: no unembedding whose input rows may be chosen on the {self.backend} backend"
            )

    def unembed_rows(self, h: torch.Tensor) -> torch.Tensor:
        """Logits ``[rows, vocab]`` (float32) of final hidden states ``h [rows, d_model]``, as
        the forward makes them (the in-house network's final soft cap applied)."""
        from headscope.probes.models.inhouse.transformer import soft_capped

        cap = getattr(getattr(self.network, "cfg", None), "final_softcap", None)
        return soft_capped(self.unembedding(h), cap).float()

    def gates_set(self, mask: torch.Tensor, *, requires_grad: bool = False, ablation: torch.Tensor | None = None):
        """Built-in gates: the in-house backend only; analyses gate any backend through
        ``head_hooks`` (:func:`~headscope.analyses.pruning.gates.head_gates`)."""
        raise ModelIncompatibleError(
            f"{self.spec.name}: the {self.backend} backend has no built-in head gates; use --backend inhouse"
        )


def check_head_hooks(model) -> None:
    """Pruning studies and patching drive a model through its head hooks
    (:meth:`Backend.head_hooks`): any loaded backend whose per-head outputs can be reached (the
    HF backend checks that it finds each layer's attention output projection). Raises
    :class:`~headscope.probes.errors.ModelIncompatibleError` otherwise."""
    if not isinstance(model, Backend):
        raise ModelIncompatibleError(
            f"pruning studies need a loaded model (load_model(...)); got {type(model).__name__}"
        )
    model.check_head_hooks()


def check_quantities(quantities) -> tuple[str, ...]:
    """``quantities`` as a tuple; ``ValueError`` naming the valid ones for another name."""
    qs = tuple(quantities)
    bad = [q for q in qs if q not in QUANTITIES]
    if bad:
        raise ValueError(f"unknown quantity {bad[0]!r}; valid quantities: {', '.join(QUANTITIES)}")
    return qs


def check_layers(layers, n_layers: int) -> tuple[int, ...]:
    """``layers`` as a tuple (None: every layer); ``ValueError`` for one out of range."""
    if layers is None:
        return tuple(range(n_layers))
    ls = tuple(int(l) for l in layers)
    bad = [l for l in ls if not 0 <= l < n_layers]
    if bad:
        raise ValueError(f"layer {bad[0]} out of range; the model has layers 0..{n_layers - 1}")
    return ls


def batch_to(batch: TokenBatch, device: torch.device | str) -> TokenBatch:
    """``batch`` with its ``input_ids`` and ``attention_mask`` on ``device`` (the same object
    when they are there already; the per-item lists stay on the host).

    >>> from headscope.probes.tokens import TokenBatch
    >>> b = TokenBatch(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long), [""], [[]], [[]], [[]], [[]], [[]])
    >>> batch_to(b, "cpu") is b
    True
    """
    device = torch.device(device)
    ids = batch.input_ids
    if ids.device == device or (device.index is None and ids.device.type == device.type):
        return batch
    return dataclasses.replace(batch, input_ids=ids.to(device), attention_mask=batch.attention_mask.to(device))


_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def _network(model) -> torch.nn.Module | None:
    """The torch module behind a loaded model (``network``; a bare holder's ``module``, ``hf`` or ``bridge``)."""
    net = getattr(model, "network", None)
    if net is not None:
        return net
    return next((getattr(model, a) for a in ("module", "hf", "bridge") if getattr(model, a, None) is not None), None)


def placement(model) -> dict:
    """Where a loaded model runs, for run.json: ``{"device": "cuda:0", "dtype": "bf16"}``
    (``device`` lists every device of a model spread by a device map, e.g. ``"cuda:0,cuda:1"``).

    >>> placement(type("M", (), {"module": torch.nn.Linear(2, 2)})())
    {'device': 'cpu', 'dtype': 'fp32'}
    """
    net = _network(model)
    if net is None:
        return {"device": str(getattr(model, "device", "cpu")), "dtype": None}
    params = [p for p in net.parameters() if p.is_floating_point()]
    devices = sorted({str(p.device) for p in params}) or ["cpu"]
    dtype = params[0].dtype if params else None
    return {"device": ",".join(devices), "dtype": _DTYPE_NAMES.get(dtype, str(dtype))}


def weight_dtype(model) -> torch.dtype | None:
    """The dtype of a loaded model's (first floating-point) weights; None when unknown.

    >>> weight_dtype(type("M", (), {"module": torch.nn.Linear(2, 2).to(torch.bfloat16)})())
    torch.bfloat16
    """
    net = _network(model)
    p = None if net is None else next((p for p in net.parameters() if p.is_floating_point()), None)
    return None if p is None else p.dtype


def rows_unembedded(model) -> bool:
    """Whether the model's unembedding can read some rows only (:func:`unembed_at`): the
    in-house decoder, and an HF or bridge causal LM where checked on load (``model.unembedding``)."""
    return getattr(model, "unembedding", None) is not None


@contextmanager
def unembed_at(model, keep: torch.Tensor):
    """A decoder whose ``unembedding`` module is known (:func:`rows_unembedded`): inside the
    ``with`` block the unembedding reads the final hidden states at ``keep [batch, pos]``
    (True) only, so ``forward`` returns logits ``[n_kept, vocab]`` (rows in row-major order
    of ``keep``): the logits nobody reads are never computed. Each kept row's arithmetic is
    the full forward's. The hook is removed on exit, whatever happens."""
    handle = model.unembedding.register_forward_pre_hook(lambda mod, args: (args[0][keep.to(args[0].device)],))
    try:
        yield
    finally:
        handle.remove()


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (CPU for a module without any)."""
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def apply_to_heads(fn: HeadFn, x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``fn`` on the heads of ``x [batch, pos, head × d_head]`` (the input of an attention
    output projection, heads concatenated as every HF attention module does): split to
    ``z [batch, head, pos, d_head]``, ``fn``, concatenate back.

    >>> x = torch.arange(12.0).view(1, 2, 6)             # 2 positions, 3 heads of 2
    >>> apply_to_heads(lambda z: z * torch.tensor([1.0, 0.0, 1.0])[None, :, None, None], x, 3).tolist()
    [[[0.0, 1.0, 0.0, 0.0, 4.0, 5.0], [6.0, 7.0, 0.0, 0.0, 10.0, 11.0]]]
    """
    batch, pos, width = x.shape
    z = x.view(batch, pos, n_heads, width // n_heads).transpose(1, 2)
    out = fn(z)
    if out.shape != z.shape:
        raise ValueError(f"a head hook must return z of shape {tuple(z.shape)}; got {tuple(out.shape)}")
    return out.transpose(1, 2).reshape(batch, pos, width)


@contextmanager
def final_states(model):
    """Inside the ``with`` block a forward keeps its final hidden states ``[batch, pos, d_model]``
    in the yielded list and the unembedding reads no row (its logits ``[batch, 0, vocab]``):
    logits are then made where wanted, a block of rows at a time (:meth:`BackendCommon.unembed_rows`)."""
    kept: list[torch.Tensor] = []

    def grab(module, args):
        kept.append(args[0])
        return (args[0][:, :0],)

    handle = model.unembedding.register_forward_pre_hook(grab)
    try:
        yield kept
    finally:
        handle.remove()
