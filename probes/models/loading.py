"""Loaded models behind one interface, whatever the backend: the registry :data:`BACKENDS` and
:func:`load_model`.

* :class:`~headscope.probes.models.backends.inhouse.InHouseModel` — headscope's own
  :class:`~headscope.probes.models.inhouse.transformer.Transformer` (BERT and Llama families): every
  hook point, per-head gates, physical pruning.
* :class:`~headscope.probes.models.backends.bridge.BridgeModel` — any HF checkpoint through
  transformer-lens 4.x ``TransformerBridge``, for architectures the in-house stack does not cover.
* :class:`~headscope.probes.models.backends.hf.HFReference` — plain HF transformers (eager
  attention), the reference the in-house stack is checked against, and the baseline of
  ``headscope bench``.

All three satisfy :class:`~headscope.probes.models.backends.protocol.Backend`:
``model.run(batch, quantities, layers)`` returns ``{(quantity, layer): tensor}`` in the
shapes of :mod:`headscope.probes.models.inhouse.attention` plus ``("output", None)``; ``encode`` is
shared (:class:`~headscope.probes.models.backends.protocol.BackendCommon`). The spec of a
checkpoint comes from :func:`~headscope.probes.models.arch.arch_from_hf_config`, its one reader.
"""

from __future__ import annotations

import logging
import os
import warnings

import torch

from headscope.probes.errors import HeadscopeError, ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.backends.bridge import BridgeModel, is_bridge, wrap_bridge
from headscope.probes.models.backends.hf import HFReference, check_device_map
from headscope.probes.models.backends.inhouse import InHouseModel, inhouse_config
from headscope.probes.models.backends.protocol import Backend, ModelSpec, spec_from_arch
from headscope.probes.models.checkpoints import ModelSource, check_tokenizer_vocab, read_hf_config, resolve
from headscope.probes.models.config import config_from_arch

__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "DTYPES",
    "Backend",
    "BridgeModel",
    "HFReference",
    "HeadscopeError",
    "InHouseModel",
    "ModelSpec",
    "choose_backend",
    "hf_config_of",
    "load_model",
    "resolve",
]

log = logging.getLogger(__name__)

#: every backend by name: what ``--backend`` accepts (besides ``auto``) and the backend contract test runs over
BACKENDS = {"inhouse": InHouseModel, "bridge": BridgeModel, "hf": HFReference}

#: ``dtype=`` of :func:`load_model` (and the CLI's ``--dtype``) -> torch dtype
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def load_model(
    model="minilm-l6",
    backend: str | None = "auto",
    *,
    dtype: str = "float32",
    device: str | torch.device | None = None,
    device_map: str | None = None,
    max_memory: dict | None = None,
    tokenizer=None,
    trust_remote_code: bool = False,
) -> Backend:
    """Load ``model`` with ``backend``: ``"inhouse"``, ``"hf"``, ``"bridge"``, or ``"auto"``
    (default; ``None`` is the same): the first of in-house, hf and the bridge that loads and
    passes its load-time probe (:func:`_attempt`); a loaded model or bridge passed in keeps its
    own. Why a backend was chosen, and each one rejected with its reason, are kept on the model
    (``model.backend_choice``, ``model.backend_rejected``) for run.json; only an explicit backend
    fails on its own load error.

    ``trust_remote_code`` lets code shipped with a checkpoint (its tokenizer or model
    classes) run; off by default (the CLI's ``--trust-remote-code``), kept on the model
    (``model.trust_remote_code``) for run.json.

    ``model`` is a shipped name, a directory, a ``.gguf`` or ``config.json`` file, or a hub
    id (or the :class:`~headscope.probes.models.checkpoints.ModelSource` they resolve to) — or
    an object a notebook already holds:

    * an HF ``transformers.PreTrainedModel`` (pass ``tokenizer=``): ``"hf"`` wraps it as
      :class:`HFReference` and ``"bridge"`` boots a ``TransformerBridge`` on it — both need
      it loaded with ``attn_implementation="eager"``, and the bridge replaces the model's
      modules in place (a warning says so; pass a copy to keep it plain); ``"inhouse"``
      copies its weights into headscope's transformer (BERT and Llama families);
    * a transformer-lens ``TransformerBridge`` (``tokenizer`` defaults to its own) →
      :class:`BridgeModel`;
    * an :class:`InHouseModel`, :class:`HFReference` or :class:`BridgeModel` → returned as is.

    ``dtype``: ``fp32`` (default), ``bf16`` or ``fp16`` weights and activations, softmax
    and norms in fp32 as HF does — the in-house and hf backends (the bridge runs in fp32).
    ``device``: where the network is placed (``None``: where it loads, the CPU; the
    CLI's ``--device`` goes through :func:`~headscope.reports.cli.argtypes.resolve_device`);
    every backend's ``run`` and ``forward`` move their inputs there. ``device_map="auto"``
    (the hf backend only) spreads a checkpoint over every visible GPU through accelerate;
    inputs then go to the embedding's device (``model.input_device``); ``max_memory``
    (``{gpu index: bytes}``) bounds what each GPU holds, as the placement plan computed it
    (``headscope.probes.models.placement.place``, which ``report --dry-run --device-map auto`` prints).

    Raises ``ValueError`` for an unknown backend, dtype or device map, a backend other than a loaded
    model's own, a missing tokenizer, or a non-eager HF model; ``TypeError`` for another
    kind of object; :class:`~headscope.probes.errors.ModelIncompatibleError` for a family
    the backend does not cover; :class:`~headscope.probes.errors.HeadscopeError` for an
    unknown name.

    >>> load_model("no-such-model")  # doctest: +ELLIPSIS, +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    headscope.probes.errors.HeadscopeError: unknown model 'no-such-model': ...
    >>> load_model(3.14)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: load_model takes a model name or path, ...; got float
    """
    backend, torch_dtype = _check_options(backend, dtype, device, device_map, max_memory)
    if not isinstance(model, (str, os.PathLike, ModelSource)):
        return _place(_from_object(model, backend, torch_dtype, tokenizer), device)
    if tokenizer is not None:
        raise ValueError(f"tokenizer= goes with a model object; {str(model)!r} is loaded with its own tokenizer files")
    source = resolve(model)
    if backend is None and device_map is None:
        return _place(_with_purpose(_load_auto(source, torch_dtype, trust_remote_code), source), device)
    backend = backend or "hf"  # a device map needs the hf backend
    if backend == "bridge" and torch_dtype != torch.float32:
        raise ValueError(f"dtype {dtype!r}: the bridge backend runs in float32; use --backend inhouse or hf")
    if backend == "inhouse":
        loaded = InHouseModel.from_source(source, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    elif backend == "hf":
        spread = {"device_map": device_map, "max_memory": max_memory}
        loaded = HFReference.from_source(source, dtype=torch_dtype, trust_remote_code=trust_remote_code, **spread)
    else:
        loaded = BACKENDS[backend].from_source(source, trust_remote_code=trust_remote_code)
    loaded.backend_choice = f"{backend} (asked for)"
    return _place(_with_purpose(loaded, source), device)


def _with_purpose(model: Backend, source: ModelSource) -> Backend:
    """``model`` with its source and what it is for (``model.purpose``,
    :func:`~headscope.probes.models.purpose.purpose_from_source`), decided here, once."""
    from headscope.probes.models.purpose import purpose_from_source

    if getattr(model, "source", None) is None:
        model.source = source
    arch = arch_from_hf_config(read_hf_config(source), str(source.path))
    model.purpose = purpose_from_source(arch, source, causal=model.spec.causal)
    return model


def _check_options(
    backend: str | None, dtype: str, device, device_map, max_memory=None
) -> tuple[str | None, torch.dtype]:
    """``(backend, torch dtype)`` of :func:`load_model`'s options (``"auto"``: None), or the
    ``ValueError`` / ``ImportError`` it raises for an unknown or conflicting one."""
    if backend == "auto":
        backend = None
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends: auto, {', '.join(BACKENDS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    if device_map is not None:
        if backend not in (None, "hf"):
            raise ValueError(f"device_map={device_map!r} needs the hf backend; got backend={backend!r}")
        check_device_map(device_map)
        if device is not None:
            raise ValueError("give device or device_map, not both (device_map places every layer itself)")
    elif max_memory is not None:
        raise ValueError("max_memory goes with device_map='auto' (it bounds what each device holds)")
    return backend, DTYPES[dtype]


def _place(model: Backend, device) -> Backend:
    """``model`` moved to ``device`` (None: left where it is)."""
    if device is None:
        return model
    device = torch.device(device)
    if model.device != device:
        model.to(device)
    return model


def choose_backend(source: ModelSource) -> tuple[str, str]:
    """``(backend, why)`` from the config alone, the first guess of ``--backend auto``:
    ``"inhouse"`` when the in-house stack covers the family and its options, else ``"hf"``.
    :func:`load_model` then probes each backend in turn (:data:`AUTO_ORDER`)."""
    hf_cfg = read_hf_config(source)
    try:
        config_from_arch(arch_from_hf_config(hf_cfg, str(source.path)))
    except ModelIncompatibleError as e:
        return "hf", f"not in-house: {str(e).split(';')[0]}"
    return "inhouse", f"model_type {hf_cfg.get('model_type')!r} is covered in-house"


#: the backends ``--backend auto`` tries, in this order; the first that loads and passes its probe is kept
AUTO_ORDER = ("inhouse", "hf", "bridge")
#: the probe input of the in-house backend's load-time check (patterns against HF eager's)
PROBE_TEXT = "The cat sat on the mat. It was warm, so it slept."
#: largest |in-house - HF eager| pattern difference the probe accepts, by dtype. Half types round
#: differently in each stack and the rounding grows with depth (MiniLM, 6 layers: 1.6e-2 in bf16,
#: 2.9e-3 in fp16), so they get room for a deep model; a wrong model differs by far more
PROBE_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 0.1, torch.float16: 0.05}


class _Rejected(Exception):
    """A backend ``--backend auto`` moves past: ``reason`` (one line); ``error``: the load error, if
    any; ``hooks_only``: it loaded and only its head hooks are missing (hf)."""

    def __init__(self, reason: str, error: Exception | None = None, *, hooks_only: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.error = error
        self.hooks_only = hooks_only


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _load_auto(source: ModelSource, dtype: torch.dtype, trust_remote_code: bool) -> Backend:
    """Try :data:`AUTO_ORDER` and keep the first backend that loads and passes its probe
    (:func:`_attempt`); keep each one rejected, with its reason, on the model
    (``model.backend_rejected``: run.json records them, the CLI prints them). An hf model whose head hooks cannot be
    reached is freed and taken back only where the bridge fails too (a command that needs the
    hooks then says so). Where none loads, the first load error is raised (one line, as an explicit
    backend's; the rejections are its notes)."""
    rejected: list[dict] = []
    errors: list[Exception] = []
    hooks_missing = None  # the reason hf's head hooks were not found, when it loaded otherwise
    model = None
    for name in AUTO_ORDER:
        try:
            model = _attempt(name, source, dtype, trust_remote_code)
            break
        except _Rejected as r:
            rejected.append({"backend": name, "reason": r.reason})
            if r.error is not None:
                errors.append(r.error)
            if r.hooks_only:
                hooks_missing = r.reason
    if model is None and hooks_missing is not None:  # patterns and hidden states still work on hf
        model = HFReference.from_source(source, dtype=dtype, trust_remote_code=trust_remote_code)
    if model is None:  # one line, the first load error's; the other rejections go with it as notes
        for r in rejected:
            log.info("backend auto: rejected %s (%s)", r["backend"], r["reason"])
        if not errors:
            raise ValueError(f"{'; '.join(r['reason'] for r in rejected)}; no backend left (drop --dtype)")
        for r in rejected:
            errors[0].add_note(f"backend auto: rejected {r['backend']} ({r['reason']})")
        raise errors[0]
    rejected = [r for r in rejected if r["backend"] != model.backend]
    if model.backend == "inhouse":
        why = choose_backend(source)[1]
    else:
        why = "; ".join(
            f"not in-house: {r['reason']}" if r["backend"] == "inhouse" else f"not {r['backend']}: {r['reason']}"
            for r in rejected
        )
        if model.backend == "hf" and hooks_missing is not None:
            why = f"{why}; kept without head hooks: {hooks_missing}"
    model.backend_choice = f"auto: {model.backend} ({why})"
    model.backend_rejected = rejected
    log.info("backend %s", model.backend_choice)
    return model


def _attempt(name: str, source: ModelSource, dtype: torch.dtype, trust_remote_code: bool) -> Backend:
    """Backend ``name`` loaded from ``source`` and probed, or :class:`_Rejected` saying why not:
    in-house where it covers the family and its patterns on :data:`PROBE_TEXT` equal HF eager's
    (:func:`_probe_patterns`); hf where its head hooks are reached (``check_head_hooks``; its
    resume check runs too); the bridge in float32."""
    if name == "inhouse":
        backend, why = choose_backend(source)
        if backend != "inhouse":
            raise _Rejected(why.removeprefix("not in-house: "))
    if name == "bridge" and dtype != torch.float32:
        raise _Rejected("the bridge backend runs in float32 (drop --dtype)")
    try:
        if name == "inhouse":
            model = InHouseModel.from_source(source, dtype=dtype, trust_remote_code=trust_remote_code)
        elif name == "hf":
            model = HFReference.from_source(source, dtype=dtype, trust_remote_code=trust_remote_code)
        else:
            model = BridgeModel.from_source(source, trust_remote_code=trust_remote_code)
    except HeadscopeError as e:
        raise _Rejected(_first_line(e), e.with_traceback(None)) from None
    if name == "inhouse":
        problem = _probe_patterns(model, source, dtype, trust_remote_code)
        if problem is not None:
            del model
            raise _Rejected(problem)
    if name == "hf":
        try:
            model.check_head_hooks()
        except ModelIncompatibleError as e:
            del model
            raise _Rejected(f"head hooks unreachable: {_first_line(e)}", hooks_only=True) from None
        model.resumable  # noqa: B018 - the resume check, once, at load time
    if name == "bridge":
        try:
            model.check_head_hooks()
        except ModelIncompatibleError as e:
            del model
            raise _Rejected(f"head hooks unreachable: {_first_line(e)}", e) from None
    return model


def _probe_patterns(model: InHouseModel, source: ModelSource, dtype: torch.dtype, trust_remote_code: bool):
    """None when ``model``'s patterns on :data:`PROBE_TEXT` equal HF eager's on the same
    checkpoint within :data:`PROBE_TOLERANCE`, else why not (one line). The HF model is loaded
    for the probe only and freed after; where transformers cannot load the checkpoint there is
    nothing to compare with and the in-house model is kept (logged)."""
    try:
        ref = HFReference.from_source(source, dtype=dtype, trust_remote_code=trust_remote_code)
    except HeadscopeError as e:
        log.info("%s: no HF eager model to probe the in-house patterns against (%s)", source.name, _first_line(e))
        return None
    try:
        batch = model.encode([PROBE_TEXT])
        ours = model.run(batch, ("pattern",))
        theirs = ref.run(batch, ("pattern",))
    except Exception as e:  # noqa: BLE001 - a probe that cannot run rejects the backend, saying why
        return f"pattern probe failed ({type(e).__name__}: {_first_line(e)[:160]})"
    finally:
        del ref
    tol = PROBE_TOLERANCE.get(dtype, 1e-5)
    for layer in range(model.spec.n_layers):
        a, b = ours["pattern", layer].float(), theirs["pattern", layer].float()
        diff = float((a - b).abs().max()) if a.shape == b.shape else float("inf")
        if not diff <= tol:
            return f"patterns differ from HF eager's in layer {layer} by {diff:.2e} (> {tol:g}) on a probe input"
    return None


_ACCEPTED = (
    "a model name or path, a transformers PreTrainedModel (with tokenizer=), a transformer-lens "
    "TransformerBridge, or a loaded InHouseModel/HFReference/BridgeModel"
)


def _from_object(obj, backend: str | None, dtype: torch.dtype, tokenizer):
    """Wrap a model object a user already holds; see :func:`load_model`."""
    if isinstance(obj, tuple(BACKENDS.values())):
        if backend not in (None, obj.backend):
            raise ValueError(
                f"model is an already-loaded {type(obj).__name__} (backend {obj.backend!r}); got backend="
                f"{backend!r}; pass backend={obj.backend!r} or load the checkpoint again with {backend!r}"
            )
        return obj
    if is_bridge(obj):
        if backend not in (None, "bridge"):
            raise ValueError(f"a TransformerBridge loads with backend='bridge'; got backend={backend!r}")
        return wrap_bridge(obj, tokenizer if tokenizer is not None else getattr(obj, "tokenizer", None))
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        PreTrainedModel = ()
    if not isinstance(obj, PreTrainedModel):
        raise TypeError(f"load_model takes {_ACCEPTED}; got {type(obj).__name__}")
    config = obj.config
    name = getattr(config, "_name_or_path", None) or type(obj).__name__
    if tokenizer is None:
        raise ValueError(f"an HF model object needs its tokenizer: pass tokenizer=... with {name!r}")
    arch = arch_from_hf_config(config.to_dict(), name)
    if backend is None:  # auto: in-house where it covers the family
        try:
            config_from_arch(arch, name)
            backend = "inhouse"
        except ModelIncompatibleError:
            backend = "hf"
    vocab = arch.vocab_size
    if vocab is not None:
        check_tokenizer_vocab(tokenizer, vocab, name)
    if backend == "inhouse":
        cfg = inhouse_config(arch, name, name)
        state = {k: v.detach() for k, v in obj.state_dict().items()}
        loaded = InHouseModel.from_hf_state(cfg, state, tokenizer, name=name, where=name, dtype=dtype)
        loaded.hf_config = config.to_dict()  # for the card: the object has no files
        return loaded
    impl = getattr(config, "_attn_implementation", None)
    if impl != "eager":
        raise ValueError(
            f"{name!r} uses attn_implementation={impl!r}; attention patterns need eager attention: load it with "
            'from_pretrained(..., attn_implementation="eager")'
        )
    if backend == "hf":
        return HFReference(obj, tokenizer, spec_from_arch(arch, name, "hf"), vocab_size=vocab)
    warnings.warn(
        f"the bridge wraps {name!r}'s modules in place: the HF model now runs through transformer-lens "
        "(output_attentions stops working); pass copy.deepcopy(model) to keep a plain one",
        stacklevel=3,
    )
    hint = (
        "; transformer-lens wraps a model with its head (AutoModelForMaskedLM, AutoModelForCausalLM), "
        f"not a bare {type(obj).__name__}"
        if obj.base_model is obj
        else ""
    )
    return BridgeModel.wrap_hf(
        obj,
        tokenizer,
        spec_from_arch(arch, name, "bridge"),
        hub_name=name,
        vocab_size=vocab,
        hint=hint,
    )


def hf_config_of(model: Backend) -> dict | None:
    """The HF configuration (dict) behind a loaded model, for its card: its checkpoint's
    ``config.json``, or the config of the HF object it was built from; None when unknown
    (an in-house model built from a :class:`ModelConfig` alone)."""
    if getattr(model, "hf_config", None) is not None:
        return model.hf_config
    if isinstance(model, HFReference):
        return model.hf.config.to_dict()
    if isinstance(model, BridgeModel):
        original = getattr(model.bridge, "original_model", None)
        return original.config.to_dict() if original is not None and hasattr(original, "config") else None
    source = getattr(model, "source", None)
    return read_hf_config(source) if source is not None else None
