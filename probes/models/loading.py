"""Loaded models behind one interface, whatever the backend.

* :class:`InHouseModel` — headscope's own :class:`~headscope.probes.models.transformer.Transformer`
  (BERT and Llama families): every hook point, per-head gates, physical pruning.
* :class:`BridgeModel` — any HF checkpoint through transformer-lens 4.x
  ``TransformerBridge``, for architectures the in-house stack does not cover.
* :class:`HFReference` — plain HF transformers (eager attention), the reference the
  in-house stack is checked against, and the baseline of ``headscope bench``.

``model.run(batch, quantities, layers)`` returns ``{(quantity, layer): tensor}`` in the
shapes of :mod:`headscope.probes.models.attention` plus ``("output", None)``.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass

import torch

from headscope.probes.errors import CheckpointError, HeadscopeError, ModelIncompatibleError
from headscope.probes.models.checkpoints import (
    ModelSource,
    check_safetensors,
    check_tokenizer_vocab,
    check_weight_memory,
    hf_dir,
    hf_to_inhouse_names,
    load_state_into,
    load_tokenizer,
    quiet_transformers,
    read_hf_config,
    read_state_dict,
    resolve,
    trust_remote_code,
    weight_files,
)
from headscope.probes.models.config import ModelConfig, config_from_hf
from headscope.probes.models.hooks import hooks
from headscope.probes.models.transformer import Transformer
from headscope.probes.tokens import TokenBatch, encode

log = logging.getLogger(__name__)

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


def _check_quantities(quantities) -> tuple[str, ...]:
    qs = tuple(quantities)
    bad = [q for q in qs if q not in QUANTITIES]
    if bad:
        raise ValueError(f"unknown quantity {bad[0]!r}; valid quantities: {', '.join(QUANTITIES)}")
    return qs


def _check_layers(layers, n_layers: int) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(n_layers))
    ls = tuple(int(l) for l in layers)
    bad = [l for l in ls if not 0 <= l < n_layers]
    if bad:
        raise ValueError(f"layer {bad[0]} out of range; the model has layers 0..{n_layers - 1}")
    return ls


def inhouse_config(hf_cfg: dict, name: str, where) -> ModelConfig:
    """The in-house :class:`ModelConfig` of an HF config dict; ``CheckpointError`` naming
    ``where`` for sizes ``ModelConfig`` refuses (``read_hf_config`` checked the common ones)."""
    try:
        return config_from_hf(hf_cfg, name=name)
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None


class InHouseModel:
    """headscope's own transformer with a tokenizer."""

    backend = "inhouse"

    def __init__(
        self, module: Transformer, tokenizer=None, *, name: str | None = None, source: ModelSource | None = None
    ):
        self.module = module.eval()
        self.tokenizer = tokenizer
        self.source = source
        cfg = module.cfg
        self.cfg = cfg
        self.spec = ModelSpec(
            name=name or cfg.name,
            family=cfg.family,
            n_layers=cfg.n_layers,
            n_heads=cfg.n_heads,
            n_kv_heads=cfg.n_kv_heads,
            d_head=cfg.d_head,
            d_model=cfg.d_model,
            causal=cfg.causal,
            max_positions=cfg.max_positions,
            backend=self.backend,
        )

    @classmethod
    def from_source(cls, source: ModelSource, dtype: torch.dtype = torch.float32) -> InHouseModel:
        hf_cfg = read_hf_config(source)
        directory = hf_dir(source)
        where = source.path if source.kind == "config" else directory / "config.json"
        cfg = inhouse_config(hf_cfg, source.name, where)
        check_weight_memory(hf_cfg, where)
        tokenizer = load_tokenizer(directory)
        check_tokenizer_vocab(tokenizer, cfg.vocab_size, directory)
        return cls.from_hf_state(
            cfg, read_state_dict(directory), tokenizer, name=source.name, where=directory, dtype=dtype, source=source
        )

    @classmethod
    def from_hf_state(
        cls, cfg: ModelConfig, state: dict, tokenizer, *, name: str, where, dtype=torch.float32, source=None
    ) -> InHouseModel:
        """The in-house stack with an HF ``state`` dict (HF tensor names) loaded; ``where``
        names the weights in errors."""
        module = Transformer(cfg)
        load_state_into(module, hf_to_inhouse_names(cfg, state), str(where))
        return cls(module.to(dtype), tokenizer, name=name, source=source)

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def encode(self, texts=None, words=None) -> TokenBatch:
        return encode(self.tokenizer, texts, words, max_positions=self.spec.max_positions, vocab_size=self.vocab_size)

    def run(self, batch: TokenBatch, quantities=("pattern",), layers=None, *, grad: bool = False) -> dict:
        qs = _check_quantities(quantities)
        ls = _check_layers(layers, self.spec.n_layers)
        out: dict = {}
        pairs = []
        for layer in ls:
            for q in qs:
                hp_name = f"blocks.{layer}.hook_resid_post" if q == "resid_post" else f"blocks.{layer}.attn.hook_{q}"
                hp = self.module.hook_points[hp_name]

                def keep(t, name, _key=(q, layer)):
                    out[_key] = t if grad else t.detach()

                pairs.append((hp, keep))
        stop = max(ls) + 1 if qs and "output" not in qs and not grad else None
        ctx = torch.enable_grad() if grad else torch.inference_mode()
        with ctx, hooks(pairs):
            result = self.module(
                batch.input_ids,
                batch.attention_mask,
                stop_at_layer=stop if stop and stop < self.spec.n_layers else None,
            )
        if stop is None or stop >= self.spec.n_layers:
            out[("output", None)] = result
        return out


class HFReference:
    """Plain HF transformers model, eager attention (``output_attentions`` works)."""

    backend = "hf"

    def __init__(self, hf_model, tokenizer, spec: ModelSpec):
        self.hf = hf_model.eval()
        self.tokenizer = tokenizer
        self.spec = spec

    @classmethod
    def from_source(cls, source: ModelSource, *, attn_implementation: str = "eager", for_bridge: bool = False):
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

        directory = hf_dir(source)
        hf_cfg = read_hf_config(source)
        check_weight_memory(hf_cfg, directory / "config.json")
        tokenizer = load_tokenizer(directory)
        if isinstance(hf_cfg.get("vocab_size"), int):
            check_tokenizer_vocab(tokenizer, hf_cfg["vocab_size"], directory)
        files = weight_files(directory)
        for f in files:
            if f.suffix == ".safetensors":
                check_safetensors(f)
        where = files[0] if len(files) == 1 else directory
        mtype = hf_cfg["model_type"]
        if mtype == "bert":
            klass = AutoModelForMaskedLM if for_bridge else AutoModel
        else:
            klass = AutoModelForCausalLM
        torch.manual_seed(0)  # heads missing from the checkpoint (BERT MLM head) initialise the same every time
        try:
            with quiet_transformers():
                config = AutoConfig.from_pretrained(str(directory), trust_remote_code=trust_remote_code())
                config._attn_implementation = attn_implementation
                model, info = klass.from_pretrained(
                    str(directory),
                    config=config,
                    dtype=torch.float32,
                    trust_remote_code=trust_remote_code(),
                    output_loading_info=True,
                    ignore_mismatched_sizes=True,
                )
        except (HeadscopeError, ImportError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - unreadable weights: corrupt, truncated, refused pickle
            detail = str(e).strip().splitlines()[0].split(". ")[0][:160] if str(e).strip() else ""
            raise CheckpointError(
                f"{where}: refused or unreadable ({type(e).__name__}: {detail}); only intact safetensors or "
                "weights-only torch files are loaded"
            ) from None
        _check_loading_info(model, info, where, strict_head=klass is AutoModelForCausalLM)
        spec = _spec_from_hf(hf_cfg, source.name, "hf")
        ref = cls(model, tokenizer, spec)
        ref.vocab_size = model.config.vocab_size
        return ref

    vocab_size: int | None = None

    def encode(self, texts=None, words=None) -> TokenBatch:
        return encode(self.tokenizer, texts, words, max_positions=self.spec.max_positions, vocab_size=self.vocab_size)

    def run(self, batch: TokenBatch, quantities=("pattern",), layers=None) -> dict:
        qs = _check_quantities(quantities)
        if set(qs) - {"pattern"}:
            raise ValueError("the plain HF reference gives patterns only; use the inhouse or bridge backend")
        ls = _check_layers(layers, self.spec.n_layers)
        with torch.inference_mode():
            res = self.hf(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions="pattern" in qs
            )
        out = {("pattern", l): res.attentions[l] for l in ls} if "pattern" in qs else {}
        out[("output", None)] = res.logits if hasattr(res, "logits") else res.last_hidden_state
        return out


_IGNORED_SUFFIXES = ("position_ids", "rotary_emb.inv_freq", "attn.masked_bias", "attn.bias")


def _check_loading_info(model, info: dict, where, *, strict_head: bool) -> None:
    """Refuse an HF model whose checkpoint lacks tensors of the base model (e.g. a config
    with more layers than the weights), holds tensors the base model would have used
    (fewer layers), or holds a tensor of another shape. A task head absent from the
    checkpoint (BERT's MLM head, seeded) is allowed unless ``strict_head`` (a causal LM:
    its logits would be random)."""
    prefix = model.base_model_prefix
    base = model.base_model
    in_base = (lambda k: True) if base is model else (lambda k: k.startswith(prefix + "."))
    missing = sorted(
        k for k in info.get("missing_keys", ()) if (strict_head or in_base(k)) and not k.endswith(_IGNORED_SUFFIXES)
    )
    base_children = {n for n, _ in base.named_children()}
    unexpected = sorted(
        k
        for k in info.get("unexpected_keys", ())
        if k.removeprefix(prefix + ".").split(".")[0] in base_children and not k.endswith(_IGNORED_SUFFIXES)
    )
    mismatched = sorted(info.get("mismatched_keys", ()), key=lambda m: str(m[0]))
    layers = getattr(model.config, "num_hidden_layers", None)
    hint = f"; does config.json (num_hidden_layers={layers}) describe these weights?"
    if missing:
        raise CheckpointError(f"{where}: tensor {missing[0]!r} missing from checkpoint ({len(missing)} missing){hint}")
    if unexpected:
        raise CheckpointError(
            f"{where}: unexpected tensor {unexpected[0]!r} in checkpoint ({len(unexpected)} extra){hint}"
        )
    if mismatched:
        key, got, want = mismatched[0][0], mismatched[0][1], mismatched[0][2]
        raise CheckpointError(
            f"{where}: tensor {key!r} has shape {tuple(got)}; the config implies {tuple(want)} "
            f"({len(mismatched)} mismatched)"
        )


def _spec_from_hf(hf_cfg: dict, name: str, backend: str) -> ModelSpec:
    n_heads = hf_cfg.get("num_attention_heads") or hf_cfg.get("n_head")
    d_model = hf_cfg.get("hidden_size") or hf_cfg.get("n_embd") or hf_cfg.get("d_model")
    n_layers = hf_cfg.get("num_hidden_layers") or hf_cfg.get("n_layer")
    if not (n_heads and d_model and n_layers):
        raise ModelIncompatibleError(f"config of {name!r} lacks heads/layers/hidden size fields")
    decoder = hf_cfg.get("model_type") not in ("bert", "roberta", "distilbert", "electra", "deberta", "deberta-v2")
    return ModelSpec(
        name=name,
        family=hf_cfg.get("model_type", "?"),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=(hf_cfg.get("num_key_value_heads") if decoder else None) or n_heads,  # encoders: MHA
        d_head=hf_cfg.get("head_dim") or d_model // n_heads,
        d_model=d_model,
        causal=decoder,
        max_positions=hf_cfg.get("max_position_embeddings") or hf_cfg.get("n_positions") or 2048,
        backend=backend,
    )


class BridgeModel:
    """transformer-lens 4.x ``TransformerBridge`` over an HF model, same ``run`` API."""

    backend = "bridge"
    _NAMES = {
        "pattern": "attn.hook_pattern",
        "scores": "attn.hook_attn_scores",
        "q": "attn.hook_q",
        "k": "attn.hook_k",
        "v": "attn.hook_v",
        "z": "attn.hook_z",
        "out": "hook_attn_out",
        "resid_post": "hook_resid_post",
    }

    def __init__(self, bridge, tokenizer, spec: ModelSpec):
        self.bridge = bridge
        self.tokenizer = tokenizer
        self.spec = spec

    @classmethod
    def from_source(cls, source: ModelSource) -> BridgeModel:
        ref = HFReference.from_source(source, for_bridge=True)
        hf_cfg = read_hf_config(source)
        hub_name = hf_cfg.get("_name_or_path") or source.name
        return cls.wrap_hf(
            ref.hf,
            ref.tokenizer,
            _spec_from_hf(hf_cfg, source.name, "bridge"),
            hub_name=hub_name,
            vocab_size=ref.vocab_size,
        )

    @classmethod
    def wrap_hf(cls, hf_model, tokenizer, spec: ModelSpec, *, hub_name: str, vocab_size=None, hint: str = ""):
        """Boot a ``TransformerBridge`` over ``hf_model`` (wrapped in place by transformer-lens);
        ``ModelIncompatibleError`` naming ``spec.name`` (and ``hint``) when it cannot."""
        from transformer_lens.model_bridge import TransformerBridge

        try:
            with quiet_transformers():
                bridge = TransformerBridge.boot_transformers(hub_name, hf_model=hf_model, tokenizer=tokenizer)
        except Exception as e:
            raise ModelIncompatibleError(
                f"transformer-lens could not wrap {spec.name!r} ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
                f"{hint}"
            ) from None
        m = cls(bridge, tokenizer, spec)
        m.vocab_size = vocab_size
        return m

    vocab_size: int | None = None

    def encode(self, texts=None, words=None) -> TokenBatch:
        return encode(self.tokenizer, texts, words, max_positions=self.spec.max_positions, vocab_size=self.vocab_size)

    def run(self, batch: TokenBatch, quantities=("pattern",), layers=None) -> dict:
        qs = _check_quantities(quantities)
        ls = _check_layers(layers, self.spec.n_layers)
        unsupported = [q for q in qs if q not in self._NAMES]
        if unsupported:
            raise ValueError(f"quantity {unsupported[0]!r} is not exposed by the bridge backend; use --backend inhouse")
        out: dict = {}
        fwd_hooks = []
        for layer in ls:
            for q in qs:

                def keep(t, hook, _key=(q, layer)):
                    t = t.detach()
                    if _key[0] in ("q", "k", "v", "z") and t.dim() == 4:
                        t = t.transpose(1, 2)  # TL: [batch, pos, head, d_head] -> ours
                    out[_key] = t

                fwd_hooks.append((f"blocks.{layer}.{self._NAMES[q]}", keep))
        with torch.inference_mode():
            res = self.bridge.run_with_hooks(batch.input_ids, attention_mask=batch.attention_mask, fwd_hooks=fwd_hooks)
        out[("output", None)] = res
        return out


BACKENDS = {"inhouse": InHouseModel, "bridge": BridgeModel, "hf": HFReference}


def load_model(model="minilm-l6", backend: str | None = None, *, dtype: str = "float32", tokenizer=None):
    """Load ``model`` with ``backend`` (``"inhouse"``, ``"bridge"`` or ``"hf"``; ``None``:
    ``"inhouse"``, or the backend of a bridge or loaded model passed in).

    ``model`` is a shipped name, a directory, a ``.gguf`` or ``config.json`` file, or a hub
    id — or an object a notebook already holds:

    * an HF ``transformers.PreTrainedModel`` (pass ``tokenizer=``): ``"hf"`` wraps it as
      :class:`HFReference` and ``"bridge"`` boots a ``TransformerBridge`` on it — both need
      it loaded with ``attn_implementation="eager"``, and the bridge replaces the model's
      modules in place (a warning says so; pass a copy to keep it plain); ``"inhouse"``
      copies its weights into headscope's transformer (BERT and Llama families);
    * a transformer-lens ``TransformerBridge`` (``tokenizer`` defaults to its own) →
      :class:`BridgeModel`;
    * an :class:`InHouseModel`, :class:`HFReference` or :class:`BridgeModel` → returned as is.

    Raises ``ValueError`` for an unknown backend or dtype, a backend other than a loaded
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
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    dtypes = {"float32": torch.float32, "fp32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(dtypes)}")
    if not isinstance(model, (str, os.PathLike)):
        return _from_object(model, backend, dtypes[dtype], tokenizer)
    if tokenizer is not None:
        raise ValueError(f"tokenizer= goes with a model object; {str(model)!r} is loaded with its own tokenizer files")
    source = resolve(model)
    if backend in (None, "inhouse"):
        return InHouseModel.from_source(source, dtype=dtypes[dtype])
    return BACKENDS[backend].from_source(source)


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
    if _is_bridge(obj):
        if backend not in (None, "bridge"):
            raise ValueError(f"a TransformerBridge loads with backend='bridge'; got backend={backend!r}")
        return _wrap_bridge(obj, tokenizer if tokenizer is not None else getattr(obj, "tokenizer", None))
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
    backend = backend or "inhouse"
    hf_cfg = config.to_dict()
    vocab = hf_cfg.get("vocab_size")
    if isinstance(vocab, int):
        check_tokenizer_vocab(tokenizer, vocab, name)
    if backend == "inhouse":
        cfg = inhouse_config(hf_cfg, name, name)
        state = {k: v.detach() for k, v in obj.state_dict().items()}
        return InHouseModel.from_hf_state(cfg, state, tokenizer, name=name, where=name, dtype=dtype)
    impl = getattr(config, "_attn_implementation", None)
    if impl != "eager":
        raise ValueError(
            f"{name!r} uses attn_implementation={impl!r}; attention patterns need eager attention: load it with "
            'from_pretrained(..., attn_implementation="eager")'
        )
    if backend == "hf":
        ref = HFReference(obj, tokenizer, _spec_from_hf(hf_cfg, name, "hf"))
        ref.vocab_size = vocab if isinstance(vocab, int) else None
        return ref
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
        _spec_from_hf(hf_cfg, name, "bridge"),
        hub_name=name,
        vocab_size=vocab if isinstance(vocab, int) else None,
        hint=hint,
    )


def _is_bridge(obj) -> bool:
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:  # pragma: no cover - transformer-lens is a dependency
        return False
    return isinstance(obj, TransformerBridge)


def _wrap_bridge(bridge, tokenizer) -> BridgeModel:
    """A :class:`BridgeModel` over a user's ``TransformerBridge``, spec from its ``cfg``."""
    cfg = bridge.cfg
    name = getattr(cfg, "model_name", None) or type(bridge).__name__
    if tokenizer is None:
        raise ValueError(f"the TransformerBridge {name!r} has no tokenizer: pass tokenizer=...")
    original = getattr(bridge, "original_model", None)
    if original is not None and hasattr(original, "config"):  # family named as the string path names it
        spec = _spec_from_hf(original.config.to_dict(), name, "bridge")
    else:
        n_heads = cfg.n_heads
        spec = ModelSpec(
            name=name,
            family=getattr(cfg, "original_architecture", None) or getattr(cfg, "architecture", None) or "?",
            n_layers=cfg.n_layers,
            n_heads=n_heads,
            n_kv_heads=getattr(cfg, "n_key_value_heads", None) or n_heads,
            d_head=cfg.d_head,
            d_model=cfg.d_model,
            causal=getattr(cfg, "attention_dir", "causal") == "causal",
            max_positions=getattr(cfg, "n_ctx", None) or 2048,
            backend="bridge",
        )
    m = BridgeModel(bridge, tokenizer, spec)
    m.vocab_size = getattr(cfg, "d_vocab", None)
    return m
