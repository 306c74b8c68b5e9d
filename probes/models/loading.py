"""Loaded models behind one interface, whatever the backend.

* :class:`InHouseModel` — headscope's own :class:`~headscope.probes.models.transformer.Transformer`
  (BERT and Llama families): every hook point, per-head gates, physical pruning.
* :class:`BridgeModel` — any HF checkpoint through transformer-lens 4.x
  ``TransformerBridge``, for architectures the in-house stack does not cover.
* :class:`HFReference` — plain HF transformers (eager attention), the reference the
  in-house stack is checked against, and the baseline of ``headscope bench``.

All three satisfy :class:`~headscope.probes.models.backend.Backend`:
``model.run(batch, quantities, layers)`` returns ``{(quantity, layer): tensor}`` in the
shapes of :mod:`headscope.probes.models.attention` plus ``("output", None)``; ``encode`` is
shared (:class:`~headscope.probes.models.backend.EncodesTexts`). The spec of a checkpoint
comes from :func:`~headscope.probes.models.arch.arch_from_hf_config`, its one reader.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from contextlib import contextmanager

import torch

from headscope.probes.errors import CheckpointError, HeadscopeError, ModelIncompatibleError
from headscope.probes.models.arch import ArchSpec, arch_from_hf_config
from headscope.probes.models.backend import (
    Backend,
    EncodesTexts,
    HeadFn,
    ModelSpec,
    apply_to_heads,
    batch_to,
    module_device,
    spec_from_arch,
)
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
    weight_files,
)
from headscope.probes.models.config import ModelConfig, config_from_arch
from headscope.probes.models.hooks import hooks
from headscope.probes.models.resume import ResumableForward
from headscope.probes.models.transformer import Transformer
from headscope.probes.tokens import TokenBatch

__all__ = [
    "BACKENDS",
    "QUANTITIES",
    "Backend",
    "BridgeModel",
    "HFReference",
    "InHouseModel",
    "ModelSpec",
    "inhouse_config",
    "load_model",
]

log = logging.getLogger(__name__)

QUANTITIES = ("pattern", "scores", "q", "k", "v", "q_rot", "k_rot", "z", "out", "resid_post")


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


def inhouse_config(arch: ArchSpec, name: str, where) -> ModelConfig:
    """The in-house :class:`ModelConfig` of a checkpoint's :class:`ArchSpec`; ``CheckpointError``
    naming ``where`` for sizes ``ModelConfig`` refuses (``arch_from_hf_config`` checked the common ones)."""
    try:
        return config_from_arch(arch, name=name)
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None


class InHouseModel(EncodesTexts):
    """headscope's own transformer with a tokenizer; the one backend with head gates."""

    backend = "inhouse"
    has_gates = True
    backend_choice = "inhouse"
    hf_config: dict | None = None  # set when loaded from an HF object (a source has its config.json)

    def __init__(
        self,
        module: Transformer,
        tokenizer=None,
        *,
        name: str | None = None,
        source: ModelSource | None = None,
        trust_remote_code: bool = False,
    ):
        self.module = module.eval()
        self.tokenizer = tokenizer
        self.source = source
        self.trust_remote_code = trust_remote_code
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
    def from_source(
        cls, source: ModelSource, dtype: torch.dtype = torch.float32, *, trust_remote_code: bool = False
    ) -> InHouseModel:
        hf_cfg = read_hf_config(source)
        directory = hf_dir(source)
        where = source.path if source.kind == "config" else directory / "config.json"
        cfg = inhouse_config(arch_from_hf_config(hf_cfg, str(where)), source.name, where)
        check_weight_memory(hf_cfg, where)
        tokenizer = load_tokenizer(directory, trust_remote_code=trust_remote_code)
        check_tokenizer_vocab(tokenizer, cfg.vocab_size, directory)
        return cls.from_hf_state(
            cfg,
            read_state_dict(directory),
            tokenizer,
            name=source.name,
            where=directory,
            dtype=dtype,
            source=source,
            trust_remote_code=trust_remote_code,
        )

    @classmethod
    def from_hf_state(
        cls,
        cfg: ModelConfig,
        state: dict,
        tokenizer,
        *,
        name: str,
        where,
        dtype=torch.float32,
        source=None,
        trust_remote_code: bool = False,
    ) -> InHouseModel:
        """The in-house stack with an HF ``state`` dict (HF tensor names) loaded; ``where``
        names the weights in errors."""
        module = Transformer(cfg)
        load_state_into(module, hf_to_inhouse_names(cfg, state), str(where))
        return cls(module.to(dtype), tokenizer, name=name, source=source, trust_remote_code=trust_remote_code)

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def device(self) -> torch.device:
        return module_device(self.module)

    @property
    def gates(self) -> list[torch.nn.Parameter]:
        """Per-layer head gates ``[head]`` (:attr:`Transformer.gates`)."""
        return self.module.gates

    def to(self, device) -> InHouseModel:
        self.module.to(device)
        return self

    #: ``forward`` takes ``stop_at_layer`` / ``start_at_layer`` + ``resid`` (a prefix of
    #: layers shared by many ablated runs is computed once)
    resumable = True

    @property
    def unembedding(self) -> torch.nn.Module | None:
        """The decoder's unembedding module, whose input rows a caller may select
        (:func:`~headscope.probes.models.backend.unembed_at`); None for an encoder."""
        return None if self.module.cfg.encoder else self.module.unembed

    def forward(self, input_ids, attention_mask, **resume) -> torch.Tensor:
        """Logits (decoder) or last hidden states (encoder); ``resume``: see
        :meth:`Transformer.forward`. The grad mode is the caller's; the ids go to the model's device."""
        device = self.device
        return self.module(input_ids.to(device), attention_mask.to(device), **resume)

    @contextmanager
    def head_hooks(self, fns: dict[int, HeadFn]):
        """``fn(z)`` on ``blocks.{layer}.attn.hook_z`` for each listed layer."""
        pairs = [
            (self.module.hook_points[f"blocks.{l}.attn.hook_z"], lambda z, name, fn=fn: fn(z)) for l, fn in fns.items()
        ]
        with hooks(pairs):
            yield

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
        batch = batch_to(batch, self.device)
        with ctx, hooks(pairs):
            result = self.module(
                batch.input_ids,
                batch.attention_mask,
                stop_at_layer=stop if stop and stop < self.spec.n_layers else None,
            )
        if stop is None or stop >= self.spec.n_layers:
            out[("output", None)] = result
        return out


class HFReference(ResumableForward, EncodesTexts):
    """Plain HF transformers model (eager attention, so ``output_attentions`` works), the
    ``"hf"`` backend: patterns from ``output_attentions``, every other quantity and the head
    hooks from PyTorch hooks on the HF modules themselves (:mod:`~headscope.probes.models.hf_layout`
    finds them): ``z`` at the input of the attention output projection, ``out`` at its
    output, ``q``/``k``/``v`` at the projections' outputs (before RoPE and QK-norm),
    ``resid_post`` at each block's output. Any family whose modules it can map runs every
    analysis; it is also the reference the in-house stack is checked against."""

    backend = "hf"
    has_gates = False
    backend_choice = "hf"

    def __init__(
        self, hf_model, tokenizer, spec: ModelSpec, *, vocab_size: int | None = None, trust_remote_code: bool = False
    ):
        self.hf = hf_model.eval()
        self.tokenizer = tokenizer
        self.spec = spec
        self.vocab_size = vocab_size
        self.trust_remote_code = trust_remote_code
        self._layout = None

    @property
    def layout(self):
        """The model's :class:`~headscope.probes.models.hf_layout.HFLayout` (found on first use)."""
        if self._layout is None:
            from headscope.probes.models.hf_layout import find_layout

            self._layout = find_layout(self.hf, self.spec)
        return self._layout

    @classmethod
    def from_source(
        cls,
        source: ModelSource,
        *,
        attn_implementation: str = "eager",
        for_bridge: bool = False,
        trust_remote_code: bool = False,
        dtype: torch.dtype = torch.float32,
        device_map: str | None = None,
    ):
        """``dtype``: the weights' dtype (HF keeps softmax in fp32 and norms in the weights'
        dtype); ``device_map="auto"`` spreads the layers over every visible GPU through
        accelerate (:func:`check_device_map` says when it cannot)."""
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

        if device_map is not None:
            check_device_map(device_map)

        directory = hf_dir(source)
        hf_cfg = read_hf_config(source)
        arch = arch_from_hf_config(hf_cfg, str(directory / "config.json"))
        check_weight_memory(hf_cfg, directory / "config.json")
        tokenizer = load_tokenizer(directory, trust_remote_code=trust_remote_code)
        if arch.vocab_size is not None:
            check_tokenizer_vocab(tokenizer, arch.vocab_size, directory)
        files = weight_files(directory)
        for f in files:
            if f.suffix == ".safetensors":
                check_safetensors(f)
        where = files[0] if len(files) == 1 else directory
        if arch.encoder:
            klass = AutoModelForMaskedLM if for_bridge else AutoModel
        else:
            klass = AutoModelForCausalLM
        torch.manual_seed(0)  # heads missing from the checkpoint (BERT MLM head) initialise the same every time
        try:
            with quiet_transformers():
                config = AutoConfig.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
                config._attn_implementation = attn_implementation
                model, info = klass.from_pretrained(
                    str(directory),
                    config=config,
                    dtype=dtype,
                    trust_remote_code=trust_remote_code,
                    output_loading_info=True,
                    ignore_mismatched_sizes=True,
                    **({"device_map": device_map} if device_map is not None else {}),
                )
        except (HeadscopeError, ImportError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - unreadable weights: corrupt, truncated, refused pickle
            detail = str(e).strip().splitlines()[0].split(". ")[0][:160] if str(e).strip() else ""
            raise CheckpointError(
                f"{where}: refused or unreadable ({type(e).__name__}: {detail}); only intact safetensors or "
                "weights-only torch files are loaded"
            ) from None
        _check_positions_built(model, directory / "config.json")
        _check_loading_info(model, info, where, strict_head=klass is AutoModelForCausalLM)
        spec = spec_from_arch(arch, source.name, "hf")
        return cls(model, tokenizer, spec, vocab_size=model.config.vocab_size, trust_remote_code=trust_remote_code)

    @property
    def device(self) -> torch.device:
        return module_device(self.hf)

    @property
    def input_device(self) -> torch.device:
        """Where token ids go: the embedding's device (the first GPU of a ``device_map``)."""
        emb = self.hf.get_input_embeddings()
        return emb.weight.device if emb is not None else self.device

    def to(self, device) -> HFReference:
        self.hf.to(device)
        return self

    def _call(self, input_ids, attention_mask, **kw):
        """A causal LM's full model (logits); an encoder's base model (last hidden states,
        also when the object holds an MLM or classification head)."""
        if self.spec.causal:
            res = self.hf(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kw)
            return res, res.logits if "logits" in res else res.last_hidden_state
        res = self.hf.base_model(input_ids=input_ids, attention_mask=attention_mask, **kw)
        return res, res.last_hidden_state

    # resuming (:class:`~headscope.probes.models.resume.ResumableForward`): HF's own layer loop
    def _place(self, input_ids, attention_mask):
        device = self.input_device
        return input_ids.to(device), attention_mask.to(device)

    def _whole(self, ids, am) -> torch.Tensor:
        """Logits (a causal LM) or last hidden states (an encoder)."""
        return self._call(ids, am)[1]

    def _resume_blocks(self):
        return self.layout.blocks

    def _output_embedding(self):
        return self.hf.get_output_embeddings()

    @contextmanager
    def head_hooks(self, fns: dict[int, HeadFn]):
        """``fn(z)`` through a forward pre-hook on each listed layer's attention output projection."""
        n_heads = self.spec.n_heads
        handles = []

        def pre(module, args, fn):
            return (apply_to_heads(fn, args[0], n_heads), *args[1:])

        try:
            for l, fn in fns.items():
                handles.append(self.layout.attn_out[l].register_forward_pre_hook(lambda m, a, fn=fn: pre(m, a, fn)))
            yield
        finally:
            for h in handles:
                h.remove()

    def run(self, batch: TokenBatch, quantities=("pattern",), layers=None) -> dict:
        qs = _check_quantities(quantities)
        ls = _check_layers(layers, self.spec.n_layers)
        bad = [q for q in qs if q in ("scores", "q_rot", "k_rot")]
        if bad:
            raise ValueError(f"quantity {bad[0]!r} is inside HF's attention function; use --backend inhouse")
        out: dict = {}
        handles = []
        spec = self.spec

        def heads(t, n):  # [batch, pos, n × d_head] -> [batch, n, pos, d_head]
            return t.view(t.shape[0], t.shape[1], n, -1).transpose(1, 2)

        try:
            for l in ls:
                if "z" in qs:
                    handles.append(
                        self.layout.attn_out[l].register_forward_pre_hook(
                            lambda m, a, l=l: out.__setitem__(("z", l), heads(a[0].detach(), spec.n_heads))
                        )
                    )
                if "out" in qs:
                    handles.append(
                        self.layout.attn_out[l].register_forward_hook(
                            lambda m, a, o, l=l: out.__setitem__(("out", l), o.detach())
                        )
                    )
                if "resid_post" in qs:
                    handles.append(
                        self.layout.blocks[l].register_forward_hook(
                            lambda m, a, o, l=l: out.__setitem__(
                                ("resid_post", l), (o[0] if isinstance(o, tuple) else o).detach()
                            )
                        )
                    )
                for q in ("q", "k", "v"):
                    if q not in qs:
                        continue
                    mods = getattr(self.layout, q)
                    if mods is None:
                        raise ValueError(
                            f"{spec.name!r} fuses its Q/K/V projections; quantity {q!r} needs --backend inhouse or bridge"
                        )
                    n = spec.n_heads if q == "q" else spec.n_kv_heads
                    handles.append(
                        mods[l].register_forward_hook(
                            lambda m, a, o, l=l, q=q, n=n: out.__setitem__((q, l), heads(o.detach(), n))
                        )
                    )
            batch = batch_to(batch, self.input_device)
            with torch.inference_mode():
                res, output = self._call(batch.input_ids, batch.attention_mask, output_attentions="pattern" in qs)
        finally:
            for h in handles:
                h.remove()
        if "pattern" in qs:
            out.update({("pattern", l): res.attentions[l] for l in ls})
        out[("output", None)] = output
        if self.spread:  # a device map: every tensor to the inputs' device, where the reducers work
            device = self.input_device
            out = {k: v.to(device) for k, v in out.items()}
        return out

    @property
    def spread(self) -> bool:
        """Whether a device map spreads the model over several devices."""
        device_map = getattr(self.hf, "hf_device_map", None) or {}
        return len({str(d) for d in device_map.values()}) > 1


_IGNORED_SUFFIXES = ("position_ids", "rotary_emb.inv_freq", "attn.masked_bias", "attn.bias")


def _check_positions_built(model, config_path) -> None:
    """Refuse a config whose ``position_embedding_type`` the installed transformers' model
    class does not implement: transformers 5 dropped BERT-style ``relative_key`` /
    ``relative_key_query`` and builds absolute positions instead, silently, so every pattern
    and figure would belong to another model than the checkpoint's."""
    import inspect
    import sys

    import transformers

    kind = getattr(model.config, "position_embedding_type", None)
    if kind in (None, "absolute"):
        return
    module = sys.modules.get(type(model).__module__)
    try:
        implemented = module is not None and "position_embedding_type" in inspect.getsource(module)
    except (OSError, TypeError):  # no source to read (compiled, remote code): trust the class
        implemented = True
    if not implemented:
        raise ModelIncompatibleError(
            f"{config_path}: position_embedding_type={kind!r} is not implemented by transformers "
            f"{transformers.__version__}'s {model.config.model_type} (it builds absolute positions instead, "
            "which is another model than this checkpoint); no headscope backend computes it"
        )


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


class BridgeModel(ResumableForward, EncodesTexts):
    """transformer-lens 4.x ``TransformerBridge`` over an HF model, same ``run`` API."""

    backend = "bridge"
    has_gates = False
    backend_choice = "bridge"
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

    def __init__(
        self, bridge, tokenizer, spec: ModelSpec, *, vocab_size: int | None = None, trust_remote_code: bool = False
    ):
        self.bridge = bridge
        self.tokenizer = tokenizer
        self.spec = spec
        self.vocab_size = vocab_size
        self.trust_remote_code = trust_remote_code

    @classmethod
    def from_source(cls, source: ModelSource, *, trust_remote_code: bool = False) -> BridgeModel:
        ref = HFReference.from_source(source, for_bridge=True, trust_remote_code=trust_remote_code)
        hf_cfg = read_hf_config(source)
        hub_name = hf_cfg.get("_name_or_path") or source.name
        return cls.wrap_hf(
            ref.hf,
            ref.tokenizer,
            dataclasses.replace(ref.spec, backend="bridge"),
            hub_name=hub_name,
            vocab_size=ref.vocab_size,
            trust_remote_code=trust_remote_code,
        )

    @classmethod
    def wrap_hf(
        cls,
        hf_model,
        tokenizer,
        spec: ModelSpec,
        *,
        hub_name: str,
        vocab_size=None,
        hint: str = "",
        trust_remote_code: bool = False,
    ):
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
        return cls(bridge, tokenizer, spec, vocab_size=vocab_size, trust_remote_code=trust_remote_code)

    @property
    def device(self) -> torch.device:
        return module_device(self.bridge)

    def to(self, device) -> BridgeModel:
        import contextlib
        import sys

        with contextlib.redirect_stdout(sys.stderr):  # the bridge's .to() prints "Moving model to device"
            self.bridge.to(device)
        return self

    # resuming (:class:`~headscope.probes.models.resume.ResumableForward`): the bridge's blocks
    def _place(self, input_ids, attention_mask):
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _resume_blocks(self):
        return tuple(self.bridge.blocks)

    def _output_embedding(self):
        return getattr(self.bridge, "unembed", None)

    def _whole(self, input_ids, attention_mask) -> torch.Tensor:
        """Logits of a decoder; an encoder's last hidden states (the last block's
        ``hook_resid_post``, what HF's ``AutoModel`` returns), not its MLM logits."""
        if self.spec.causal:
            return self.bridge(input_ids, attention_mask=attention_mask)
        kept = {}

        def keep(t, hook):
            kept["h"] = t

        with self.bridge.hooks(fwd_hooks=[(f"blocks.{self.spec.n_layers - 1}.hook_resid_post", keep)]):
            self.bridge(input_ids, attention_mask=attention_mask, return_type=None)
        return kept["h"]

    @contextmanager
    def head_hooks(self, fns: dict[int, HeadFn]):
        """``fn(z)`` on ``blocks.{layer}.attn.hook_z`` (transformer-lens holds z as
        ``[batch, pos, head, d_head]``; ``fn`` sees ours)."""
        pairs = [
            (f"blocks.{l}.attn.hook_z", lambda t, hook, fn=fn: fn(t.transpose(1, 2)).transpose(1, 2))
            for l, fn in fns.items()
        ]
        with self.bridge.hooks(fwd_hooks=pairs):
            yield

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
        batch = batch_to(batch, self.device)
        with torch.inference_mode():
            res = self.bridge.run_with_hooks(batch.input_ids, attention_mask=batch.attention_mask, fwd_hooks=fwd_hooks)
        out[("output", None)] = res
        return out


BACKENDS = {"inhouse": InHouseModel, "bridge": BridgeModel, "hf": HFReference}


def load_model(
    model="minilm-l6",
    backend: str | None = "auto",
    *,
    dtype: str = "float32",
    device: str | torch.device | None = None,
    device_map: str | None = None,
    tokenizer=None,
    trust_remote_code: bool = False,
) -> Backend:
    """Load ``model`` with ``backend``: ``"inhouse"``, ``"hf"``, ``"bridge"``, or ``"auto"``
    (default; ``None`` is the same): in-house where it covers the family, else HF, else the
    bridge — :func:`choose_backend`; a loaded model or bridge passed in keeps its own. Why
    a backend was chosen is kept on the model (``model.backend_choice``) for run.json.

    ``trust_remote_code`` lets code shipped with a checkpoint (its tokenizer or model
    classes) run; off by default (the CLI's ``--trust-remote-code``), kept on the model
    (``model.trust_remote_code``) for run.json.

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

    ``dtype``: ``fp32`` (default), ``bf16`` or ``fp16`` weights and activations, softmax
    and norms in fp32 as HF does — the in-house and hf backends (the bridge runs in fp32).
    ``device``: where the network is placed (``None``: where it loads, the CPU; the
    CLI's ``--device`` goes through :func:`~headscope.reports.cli.argtypes.resolve_device`);
    every backend's ``run`` and ``forward`` move their inputs there. ``device_map="auto"``
    (the hf backend only) spreads a checkpoint over every visible GPU through accelerate;
    inputs then go to the embedding's device (``model.input_device``).

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
    if backend == "auto":
        backend = None
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends: auto, {', '.join(BACKENDS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype]
    if device_map is not None:
        if backend not in (None, "hf"):
            raise ValueError(f"device_map={device_map!r} needs the hf backend; got backend={backend!r}")
        check_device_map(device_map)
        if device is not None:
            raise ValueError("give device or device_map, not both (device_map places every layer itself)")
    if not isinstance(model, (str, os.PathLike)):
        return _place(_from_object(model, backend, torch_dtype, tokenizer), device)
    if tokenizer is not None:
        raise ValueError(f"tokenizer= goes with a model object; {str(model)!r} is loaded with its own tokenizer files")
    source = resolve(model)
    if backend is None:
        if device_map is not None:
            backend = "hf"
        else:
            return _place(_load_auto(source, torch_dtype, trust_remote_code), device)
    if backend == "bridge" and torch_dtype != torch.float32:
        raise ValueError(f"dtype {dtype!r}: the bridge backend runs in float32; use --backend inhouse or hf")
    if backend == "inhouse":
        loaded = InHouseModel.from_source(source, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    elif backend == "hf":
        loaded = HFReference.from_source(
            source, dtype=torch_dtype, device_map=device_map, trust_remote_code=trust_remote_code
        )
    else:
        loaded = BACKENDS[backend].from_source(source, trust_remote_code=trust_remote_code)
    loaded.backend_choice = f"{backend} (asked for)"
    return _place(loaded, device)


#: ``dtype=`` of :func:`load_model` (and the CLI's ``--dtype``) -> torch dtype
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def check_device_map(device_map) -> None:
    """``device_map`` must be ``"auto"`` and accelerate installed; a one-line ``ValueError``
    or ``ImportError`` naming the package otherwise (accelerate is not a dependency)."""
    if device_map != "auto":
        raise ValueError(f"device_map must be 'auto'; got {device_map!r}")
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise ImportError(
            "device_map='auto' needs the accelerate package, which is not installed: pip install accelerate"
        ) from None


def _place(model: Backend, device) -> Backend:
    """``model`` moved to ``device`` (None: left where it is)."""
    if device is None:
        return model
    device = torch.device(device)
    if model.device != device:
        model.to(device)
    return model


def choose_backend(source: ModelSource) -> tuple[str, str]:
    """``(backend, why)`` for ``--backend auto``, from the config alone: ``"inhouse"`` when
    the in-house stack covers the family and its options, else ``"hf"`` (which falls back to
    the bridge at load time when it cannot find the heads' modules)."""
    hf_cfg = read_hf_config(source)
    try:
        config_from_arch(arch_from_hf_config(hf_cfg, str(source.path)))
    except ModelIncompatibleError as e:
        return "hf", f"not in-house: {str(e).split(';')[0]}"
    return "inhouse", f"model_type {hf_cfg.get('model_type')!r} is covered in-house"


def _load_auto(source: ModelSource, dtype: torch.dtype, trust_remote_code: bool) -> Backend:
    backend, why = choose_backend(source)
    if backend == "inhouse":
        model = InHouseModel.from_source(source, dtype=dtype, trust_remote_code=trust_remote_code)
    else:
        model = HFReference.from_source(source, dtype=dtype, trust_remote_code=trust_remote_code)
        try:
            model.layout  # noqa: B018 - finds the heads' modules, or says why not
        except ModelIncompatibleError as e:
            if dtype != torch.float32:
                raise ValueError(f"{why}; the bridge backend runs in float32 (drop --dtype)") from None
            why = f"{why}; not hf: {str(e).split(';')[0]}"
            del model
            model = BridgeModel.from_source(source, trust_remote_code=trust_remote_code)
    model.backend_choice = f"auto: {model.backend} ({why})"
    log.info("backend %s", model.backend_choice)
    return model


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
        spec = spec_from_arch(arch_from_hf_config(original.config.to_dict(), name), name, "bridge")
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
    return BridgeModel(bridge, tokenizer, spec, vocab_size=getattr(cfg, "d_vocab", None))


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
