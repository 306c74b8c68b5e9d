"""Per-head weights of an HF folder whose family the in-house stack does not build (GPT-NeoX, OLMo 2,
MPNet, …), read one layer at a time from its safetensors files (sharded or not): the whole model is
never loaded.

The model's skeleton is built on the meta device (accelerate's ``init_empty_weights``: no memory)
to find its stack of blocks and where each parameter lives. For layer ``l`` a **one-layer model of
the same config** is built on the meta device and filled from the checkpoint (its block from the
checkpoint's block ``l``, the final norm as stored, and of the input embedding only the rows of the
check text's tokens, the rest zero pages never written (no memory); each tensor read by
``safe_open(file).get_tensor(name)``, the name matched with or without the checkpoint's
base-model prefix such as ``model.``); the existing per-head reader
(:func:`~headscope.probes.models.hf_weights.hf_weights`) then finds its projections from the module
tree and checks them on it, and the one-layer model is freed. One layer is held at a time.

**What the check covers here.** The check is :mod:`~headscope.probes.models.hf_weights_check`'s,
but *per module on embedding-level inputs*: layer ``l``'s attention is fed the real check text's
input embeddings (through the layer's own preceding norm, with the position ids / rotary
embeddings the model hands it), not the residual stream the full model would give it at depth
``l``. pattern × V × W_O, x·W_Q, x·W_K and the recomputed pattern must equal the module's own
to 1e-5 relative (float32). A layer that fails raises
:class:`~headscope.probes.errors.ModelIncompatibleError` when it is read.

A tensor a layer needs that the checkpoint lacks: :class:`~headscope.probes.errors.CheckpointError`,
one line naming the tensor and the file (the index, or the single ``model.safetensors``).
"""

from __future__ import annotations

import copy
import dataclasses
import gc

import torch

from headscope.probes.errors import CheckpointError, ModelIncompatibleError
from headscope.probes.models.hf_weights import HFModelWeights, _pos_embed, _Shape

__all__ = ["LazyHFSource", "hf_lazy_weights"]


def _blocks_path(model: torch.nn.Module, spec, n_layers: int) -> str:
    """The module path of the model's one stack of ``n_layers`` blocks (the hf layout's own search);
    :class:`ModelIncompatibleError` where there is none, or where the stack is not one attention layer
    per block (a hybrid stack with recurrent layers, several attention modules per block): those are
    read whole."""
    from headscope.probes.models.hf_layout import _block_list, attention_blocks, attention_sublayers

    found = _block_list(model, n_layers)
    if found is None:
        raise ModelIncompatibleError(f"no one stack of {n_layers} blocks found in {type(model).__name__}")
    if attention_blocks(model, spec, n_layers) is not None or attention_sublayers(model, n_layers) is not None:
        raise ModelIncompatibleError(
            f"{found[0]}: not one attention layer per block (a hybrid stack, or several attention modules a block); "
            "not read one layer at a time"
        )
    return found[0]


def _zero_pages(shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 tensor of zeros on an anonymous memory mapping: the kernel gives its pages on first
    write, so rows never written take no memory (the tensor keeps the mapping alive)."""
    import math
    import mmap

    n = max(1, math.prod(shape)) * 4
    return torch.frombuffer(mmap.mmap(-1, n), dtype=torch.float32, count=math.prod(shape)).view(shape)


def _one_layer_config(config, layer: int, n_layers: int):
    """``config`` of a one-layer model holding block ``layer`` (per-layer lists such as ``layer_types`` sliced)."""
    one = copy.deepcopy(config)
    for key, value in vars(config).items():
        if isinstance(value, (list, tuple)) and len(value) == n_layers and n_layers > 1 and key != "architectures":
            setattr(one, key, type(value)(value[layer : layer + 1]))
    one.num_hidden_layers = 1
    one._attn_implementation = "eager"
    return one


class _Checkpoint:
    """The checkpoint's tensor names resolved for a model's parameter names (its base-model prefix
    added or dropped), each read as float32."""

    def __init__(self, files, prefix: str):
        self.files, self.prefix = files, prefix

    def name(self, param: str) -> str | None:
        for cand in (param, self.prefix + param, param.removeprefix(self.prefix)):
            if cand in self.files.shape:
                return cand
        return None

    def read(self, param: str) -> torch.Tensor:
        name = self.name(param)
        if name is None:
            raise CheckpointError(
                f"{self.files.where}: tensor {param!r} (or {self.prefix + param!r}) is not in the checkpoint"
            )
        return self.files.read(name).float()


class LazyHFSource:
    """A :class:`~headscope.probes.models.inhouse.head_weights.TensorSource` over an HF folder: one
    layer's projections at a time from a checked one-layer model, the embeddings read from the files."""

    def __init__(self, directory, config, arch, tokenizer, name: str):
        from accelerate import init_empty_weights
        from transformers import AutoModel

        from headscope.probes.models.backends.protocol import spec_from_arch
        from headscope.probes.models.hf_weights_check import CHECK_TEXT
        from headscope.probes.models.lazy_weights import _Safetensors
        from headscope.probes.models.quiet import quiet_transformers
        from headscope.probes.tokens import encode

        self.files = _Safetensors(directory)
        self.config, self.arch, self.tokenizer, self.name = config, arch, tokenizer, name
        self.n_layers = int(config.num_hidden_layers)
        try:
            with quiet_transformers(), init_empty_weights(include_buffers=True):
                skeleton = AutoModel.from_config(copy.deepcopy(config), attn_implementation="eager")
        except Exception as e:  # noqa: BLE001 - transformers builds no model of this config: read whole instead
            raise ModelIncompatibleError(
                f"no skeleton of this config on the meta device ({type(e).__name__}: {str(e).strip()[:160]})"
            ) from None
        spec = spec_from_arch(arch, name, "hf")
        self.blocks = _blocks_path(skeleton, spec, self.n_layers)
        prefix = getattr(skeleton, "base_model_prefix", "") or ""
        self.ckpt = _Checkpoint(self.files, prefix + "." if prefix else "")
        emb = skeleton.get_input_embeddings()
        params = {id(p): n for n, p in skeleton.named_parameters()}
        self._names = {"embed.weight": params[id(emb.weight)]}
        pos, _ = _pos_embed(skeleton)
        if pos is not None:
            self._names["pos_embed.weight"] = params[id(pos.weight)]
        out = self.ckpt.name("lm_head.weight")  # a decoder's untied unembedding, stored beside the base model
        if out is not None and not getattr(config, "tie_word_embeddings", False):
            self._names["unembed.weight"] = "lm_head.weight"
        del skeleton
        batch = encode(tokenizer, [CHECK_TEXT], None, max_positions=spec.max_positions, vocab_size=arch.vocab_size)
        #: the token ids the check runs (the only embedding rows the one-layer models hold)
        self._check_ids = sorted({int(i) for i in batch.input_ids.flatten()})
        self.bytes_read = 0
        self.checks: dict[int, dict] = {}
        self._held: tuple[int, HFModelWeights] | None = None
        self.description = f"safetensors, one layer at a time (per-module check): {self.files.where}"

    def _param_to_checkpoint(self, param: str, layer: int) -> str:
        head = self.blocks + ".0."
        return self.blocks + f".{layer}." + param[len(head) :] if param.startswith(head) else param

    def one_layer(self, layer: int) -> HFModelWeights:
        """Layer ``layer``'s checked weights, from a one-layer model filled from the checkpoint (held until the next layer)."""
        if self._held is not None and self._held[0] == layer:
            return self._held[1]
        from accelerate import init_empty_weights
        from transformers import AutoModel

        from headscope.probes.models.arch import arch_from_hf_config
        from headscope.probes.models.backends.hf import HFReference
        from headscope.probes.models.backends.protocol import spec_from_arch
        from headscope.probes.models.hf_weights import hf_weights
        from headscope.probes.models.quiet import quiet_transformers

        self._held = None
        gc.collect()
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} of {self.n_layers}")
        cfg = _one_layer_config(self.config, layer, self.n_layers)
        try:
            with quiet_transformers(), init_empty_weights(include_buffers=False):
                model = AutoModel.from_config(cfg, attn_implementation="eager")
        except Exception as e:  # noqa: BLE001 - a config that builds no one-layer model: read whole instead
            raise ModelIncompatibleError(
                f"layer {layer}: no one-layer model of this config ({type(e).__name__}: {str(e).strip()[:160]})"
            ) from None
        state = {}
        embed = next(n for n, p in model.named_parameters() if p is model.get_input_embeddings().weight)
        for param, p in model.named_parameters():
            if param == embed:  # the check text's rows alone: the rest is never read (its pages never touched)
                state[param] = self._embedding_rows(tuple(p.shape))
                continue
            t = self.ckpt.read(self._param_to_checkpoint(param, layer))
            if tuple(t.shape) != tuple(p.shape):
                raise CheckpointError(
                    f"{self.files.where}: tensor {self.ckpt.name(self._param_to_checkpoint(param, layer))!r} has "
                    f"shape {tuple(t.shape)}, the config gives {tuple(p.shape)}"
                )
            state[param] = t
            self.bytes_read += t.numel() * 4
        model.load_state_dict(state, strict=False, assign=True)
        del state
        model.eval()
        arch = arch_from_hf_config(cfg.to_dict(), self.name)
        wrapped = HFReference(model, self.tokenizer, spec_from_arch(arch, self.name, "hf"), vocab_size=arch.vocab_size)
        try:
            w = hf_weights(wrapped)
        except (ModelIncompatibleError, CheckpointError) as e:
            raise type(e)(f"layer {layer}: {str(e).strip().splitlines()[0]}") from None
        except Exception as e:  # noqa: BLE001 - a module tree the reader cannot walk, as weights_provider says
            raise ModelIncompatibleError(
                f"layer {layer}: per-head weights could not be read ({type(e).__name__}: {str(e).strip()[:160]})"
            ) from None
        self.checks[layer] = w.check
        w.source._layer(0)  # the layer's split tensors, kept; the one-layer model's embeddings dropped
        w.source._t = {}
        self._held = (layer, w)
        return w

    def _embedding_rows(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The input embedding ``[vocab, E]`` holding only the rows of the check text's tokens (read
        from the file one row each); the other rows are zero pages of an anonymous mapping
        (:func:`_zero_pages`), never written, so they take no memory."""
        name = self.ckpt.name(self._names["embed.weight"])
        if name is None:
            self.ckpt.read(self._names["embed.weight"])  # the one-line refusal naming it
        table = _zero_pages(shape)
        for i in self._check_ids:
            table[i] = self.files.read_rows(name, i, i + 1)[0].float()
            self.bytes_read += table.shape[1] * 4
        return table

    def _split(self, name: str) -> tuple[int, str] | None:
        parts = name.split(".")
        if len(parts) == 5 and parts[0] == "blocks" and parts[2] == "attn":
            return int(parts[1]), ".".join(parts[3:])
        return None

    def has(self, name: str) -> bool:
        at = self._split(name)
        if at is None:
            return name in self._names
        return self.one_layer(at[0]).source._layer(0).get(at[1]) is not None

    def tensor(self, name: str) -> torch.Tensor:
        at = self._split(name)
        if at is not None:
            t = self.one_layer(at[0]).source._layer(0).get(at[1])
            if t is None:
                raise KeyError(name)
            return t.clone()
        t = self.ckpt.read(self._names[name])
        self.bytes_read += t.numel() * 4
        return t

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        param = self._names[name]
        t = self.files.read_rows(self.ckpt.name(param), start, stop).float()
        self.bytes_read += t.numel() * 4
        return t

    def layout(self, layer: int) -> tuple[tuple[int, ...], list[int]]:
        return self.one_layer(layer).source.layout(0)


def hf_lazy_weights(model) -> HFModelWeights:
    """The per-head weights of ``model`` (a path or :class:`~headscope.probes.models.checkpoints.ModelSource`:
    an HF folder with safetensors), read one layer at a time and checked per module on
    embedding-level inputs (see the module doc). :class:`CheckpointError` for a folder without
    safetensors or a missing tensor; :class:`ModelIncompatibleError` where a layer's projections
    are not understood or fail the check."""
    from transformers import AutoConfig

    from headscope.probes.models.arch import arch_from_hf_config
    from headscope.probes.models.checkpoints import hf_dir, read_hf_config, resolve
    from headscope.probes.models.quiet import quiet_transformers
    from headscope.probes.models.tokenizer import load_tokenizer

    source = resolve(model)
    directory = hf_dir(source)
    hf = read_hf_config(source)
    arch = arch_from_hf_config(hf, str(directory / "config.json"))
    with quiet_transformers():
        config = AutoConfig.from_pretrained(str(directory))
    src = LazyHFSource(directory, config, arch, load_tokenizer(directory), source.name)
    first = src.one_layer(0)
    shape = _Shape(**{**dataclasses.asdict(first.cfg), "name": source.name, "n_layers": src.n_layers})
    shape = dataclasses.replace(
        shape,
        vocab_size=int(src.files.shape[src.ckpt.name(src._names["embed.weight"])][0]),
        tie_embeddings="unembed.weight" not in src._names,
    )
    weights = _LazyHFModelWeights(shape, src, norm=first.norm, positions=first.positions, scales=(first.scale,))
    weights.positional, weights.frozen = first.positional, first.frozen
    return weights


#: what the lazy reader's check covers (run.json's ``check.scope``)
SCOPE = "per module on embedding-level inputs: each layer's attention alone, fed the check text's input embeddings"


class _LazyHFModelWeights(HFModelWeights):
    """:class:`HFModelWeights` whose layers come from :class:`LazyHFSource`; :attr:`check` is the
    record of every layer checked so far (the worst error of each part over them)."""

    @property
    def check(self) -> dict:
        checks = self._src.checks
        if not checks:
            return {}
        first = checks[min(checks)]
        errors: dict[str, float] = {}
        for record in checks.values():
            for part, e in record.get("errors", {}).items():
                errors[part] = max(errors.get(part, 0.0), e)
        return {
            **first,
            "errors": errors,
            "passed": all(r.get("passed") for r in checks.values()),
            "layers_checked": sorted(checks),
            "scope": SCOPE,
        }

    @check.setter
    def check(self, value: dict) -> None:  # HFModelWeights.__init__ sets an empty one; the layers read decide
        pass
