"""The in-house backend: headscope's own :class:`~headscope.probes.models.inhouse.transformer.Transformer`
(the families of :mod:`headscope.probes.models.config`) with a tokenizer — every hook point,
per-head gates, a forward that stops and resumes at a layer, physical pruning."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager

import torch

from headscope.probes.errors import CheckpointError
from headscope.probes.models.arch import ArchSpec, arch_from_hf_config
from headscope.probes.models.backends.protocol import (
    BackendCommon,
    HeadFn,
    ModelSpec,
    batch_to,
    check_layers,
    check_quantities,
    module_device,
)
from headscope.probes.models.checkpoints import (
    ModelSource,
    check_tokenizer_vocab,
    check_weight_memory,
    hf_dir,
    hf_to_inhouse_names,
    load_state_into,
    load_tokenizer,
    read_hf_config,
    read_state_dict,
)
from headscope.probes.models.config import ModelConfig, config_from_arch
from headscope.probes.models.inhouse.hooks import HookPoint, hooks
from headscope.probes.models.inhouse.transformer import Transformer
from headscope.probes.tokens import TokenBatch

__all__ = ["InHouseModel", "inhouse_config"]


def inhouse_config(arch: ArchSpec, name: str, where) -> ModelConfig:
    """The in-house :class:`ModelConfig` of a checkpoint's :class:`ArchSpec`; ``CheckpointError``
    naming ``where`` for sizes ``ModelConfig`` refuses (``arch_from_hf_config`` checked the common ones)."""
    try:
        return config_from_arch(arch, name=name)
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None


class InHouseModel(BackendCommon):
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
    def network(self) -> Transformer:
        """The in-house :class:`Transformer` that runs."""
        return self.module

    @property
    def hook_points(self) -> Mapping[str, HookPoint]:
        """Every named activation: ``blocks.{l}.attn.hook_z``, ``blocks.{l}.hook_resid_mid`` …"""
        return self.module.hook_points

    @property
    def gates(self) -> list[torch.nn.Parameter]:
        """Per-layer head gates ``[head]`` (:attr:`Transformer.gates`)."""
        return self.module.gates

    def gates_set(self, mask: torch.Tensor, *, requires_grad: bool = False, ablation: torch.Tensor | None = None):
        """For the ``with`` block the gates hold ``mask [layer, head]`` (and the ablation values
        ``ablation [layer, head, d_head]``), restored on exit (:meth:`Transformer.gates_set`)."""
        return self.module.gates_set(mask, requires_grad=requires_grad, ablation=ablation)

    def to(self, device) -> InHouseModel:
        self.module.to(device)
        return self

    #: ``forward`` takes ``stop_at_layer`` / ``start_at_layer`` + ``resid`` (a prefix of
    #: layers shared by many ablated runs is computed once)
    resumable = True

    @property
    def unembedding(self) -> torch.nn.Module | None:
        """The decoder's unembedding module, whose input rows a caller may select
        (:func:`~headscope.probes.models.backends.protocol.unembed_at`); None for an encoder."""
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
        qs = check_quantities(quantities)
        ls = check_layers(layers, self.spec.n_layers)
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
