"""The bridge backend: any HF checkpoint through transformer-lens 4.x ``TransformerBridge``, for
architectures the in-house stack does not cover and whose heads the hf backend cannot find."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.backends.hf import HFReference
from headscope.probes.models.backends.protocol import (
    BackendCommon,
    HeadFn,
    ModelSpec,
    batch_to,
    check_layers,
    check_quantities,
    module_device,
    spec_from_arch,
)
from headscope.probes.models.backends.resume import ResumableForward
from headscope.probes.models.checkpoints import ModelSource, quiet_transformers, read_hf_config
from headscope.probes.tokens import TokenBatch

__all__ = ["BridgeModel", "is_bridge", "wrap_bridge"]


class BridgeModel(ResumableForward, BackendCommon):
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

    def check_head_hooks(self) -> None:
        """The patterns and head hooks need ``blocks.{layer}.attn.hook_pattern`` and ``hook_z``:
        :class:`ModelIncompatibleError` where transformer-lens's adapter of this architecture has none
        (it runs the attention as one opaque module: DeepSeek-V4, JetMoE, HRM), tried on a few tokens."""
        names = [f"blocks.{l}.{self._NAMES[q]}" for l in range(self.spec.n_layers) for q in ("pattern", "z")]
        ids = (torch.arange(1, 5) % max(2, self.vocab_size or 2))[None].to(self.device)
        try:
            with torch.inference_mode():
                self.bridge.run_with_hooks(ids, fwd_hooks=[(name, lambda t, hook: None) for name in names])
        except (KeyError, NotImplementedError) as e:
            from headscope.probes.models.unsupported import explained

            detail = str(e).strip("'\"")
            raise explained(
                self.spec, f"transformer-lens's bridge of it has no per-head attention hooks ({detail})"
            ) from None

    @property
    def device(self) -> torch.device:
        return module_device(self.bridge)

    @property
    def network(self) -> torch.nn.Module:
        """The ``TransformerBridge`` that runs."""
        return self.bridge

    def to(self, device) -> BridgeModel:
        import contextlib
        import sys

        with contextlib.redirect_stdout(sys.stderr):  # the bridge's .to() prints "Moving model to device"
            self.bridge.to(device)
        return self

    # resuming (:class:`~headscope.probes.models.backends.resume.ResumableForward`): the bridge's blocks
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
        qs = check_quantities(quantities)
        ls = check_layers(layers, self.spec.n_layers)
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


def is_bridge(obj) -> bool:
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:  # pragma: no cover - transformer-lens is a dependency
        return False
    return isinstance(obj, TransformerBridge)


def wrap_bridge(bridge, tokenizer) -> BridgeModel:
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
