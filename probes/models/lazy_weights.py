"""Head weights read lazily from a checkpoint on disk, one tensor at a time, without building the
model: the weights-only analyses (:mod:`headscope.analyses.circuits.weights`) then run on checkpoints
larger than the machine's memory.

* safetensors (``model.safetensors`` or shards with ``model.safetensors.index.json``): each read
  opens the tensor's shard memory-mapped for that read only (``safe_open``), so no shard stays
  mapped; rows of the embedding are read as a slice (``get_slice``), never the whole table.
* GGUF: the file is memory-mapped (gguf's ``GGUFReader``); one tensor is dequantised at a time
  (``gguf.dequantize``) and reshaped as transformers' GGUF loader does (its per-architecture
  ``TensorProcessor``: Llama's q/k rows un-permuted, Gemma's ``1 + w`` norms), its GGUF name
  mapped to the HF name by transformers' own map (built on a meta-device model: no memory).

HF names become in-house names through the loader's own renaming
(:func:`~headscope.probes.models.checkpoints.hf_to_inhouse_names`, on meta tensors), and the
checkpoint's tensor table is checked against the in-house model its config describes (built on
the meta device) by the loader's own check (:func:`~headscope.probes.models.checkpoints.load_state_into`):
the same missing / extra / mis-shaped refusals, before any tensor is read. Only the attention
projections, the norms before them, the final norm and the (un)embedding are ever read.

>>> from pathlib import Path; import tempfile
>>> from tests.tiny_models import tiny_model_dir
>>> w = lazy_weights(str(tiny_model_dir(Path(tempfile.mkdtemp()), "llama")))
>>> w.reader.split(":")[0], tuple(w.layer(0).W_Q.shape)
('safetensors, read lazily', (4, 64, 16))
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch

from headscope.probes.errors import CheckpointError, ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.checkpoints import (
    ModelSource,
    hf_dir,
    hf_to_inhouse_names,
    load_state_into,
    read_hf_config,
    resolve,
)
from headscope.probes.models.config import ModelConfig, config_from_arch
from headscope.probes.models.inhouse.head_weights import ModelWeights, layer_heads
from headscope.probes.models.weights import _weight_map, check_safetensors, check_weight_dtypes

__all__ = ["LAZY_GGUF_PROCESSORS", "FileSource", "lazy_weights", "reads_lazily"]

#: transformers' GGUF tensor processors whose reshapes act on one whole tensor by its name and
#: leave the embedding rows as stored (so a block of rows can be dequantised alone)
LAZY_GGUF_PROCESSORS = ("TensorProcessor", "LlamaTensorProcessor", "Gemma2TensorProcessor", "NemotronTensorProcessor")


class _Safetensors:
    """The tensors of an HF folder's safetensors file(s), by HF name; every read maps its shard
    for that read only."""

    def __init__(self, directory: Path):
        from safetensors import safe_open

        single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
        if single.is_file():
            shards = {single: None}
        elif index.is_file():
            weight_map = _weight_map(index)
            shards = {
                directory / s: sorted(t for t, f in weight_map.items() if f == s) for s in set(weight_map.values())
            }
        else:
            raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json to read lazily")
        self.where = index if index.is_file() and not single.is_file() else single
        self.file: dict[str, Path] = {}
        self.shape: dict[str, tuple[int, ...]] = {}
        dtypes: dict[str, str] = {}
        for shard, listed in sorted(shards.items()):
            check_safetensors(shard)
            with safe_open(str(shard), framework="pt") as f:
                names = list(f.keys())
                for name in names:
                    sl = f.get_slice(name)
                    self.file[name], self.shape[name] = shard, tuple(sl.get_shape())
                    dtypes[name] = sl.get_dtype()
            absent = sorted(set(listed or ()) - set(names))
            if absent:
                raise CheckpointError(
                    f"{shard}: tensor {absent[0]!r}, which {index.name} places in this shard, is not in it "
                    f"({len(absent)} absent)"
                )
        check_weight_dtypes(dtypes, self.where)
        self.description = f"safetensors, read lazily: {self.where}"

    def read(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self.file[name]), framework="pt") as f:
            return f.get_tensor(name)

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self.file[name]), framework="pt") as f:
            return f.get_slice(name)[start:stop]


@contextlib.contextmanager
def _one_name_map():
    """While transformers maps GGUF names to HF names, build gguf's name table once: its map
    walks every submodule and builds the same ``get_tensor_name_map(arch, n_layers)`` for each
    (397 times for SmolLM2, most of a minute)."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


class _GGUF:
    """The tensors of a GGUF file, by HF name, dequantised one at a time."""

    def __init__(self, path: Path, hf: dict):
        import transformers.modeling_gguf_pytorch_utils as tg
        from transformers import AutoConfig, AutoModelForCausalLM

        from headscope.probes.models.gguf.tensors import check_gguf
        from headscope.probes.models.quiet import quiet_transformers

        self.where = path
        self._reader = check_gguf(path)  # parsed once: lazy_weights keeps the reader gguf_meta_config checked
        arch = str(bytes(self._reader.fields["general.architecture"].parts[-1]), "utf-8")
        cls = tg.TENSOR_PROCESSORS.get(arch, tg.TensorProcessor)
        if cls.__name__ not in LAZY_GGUF_PROCESSORS:
            raise ModelIncompatibleError(
                f"{path}: GGUF architecture {arch!r} is reshaped on load by transformers' {cls.__name__}, which the "
                f"lazy reader does not follow (it reads {', '.join(LAZY_GGUF_PROCESSORS)}); load the model instead"
            )
        cfg = {k: v for k, v in hf.items() if not k.startswith("_") and k not in ("model_type", "architectures")}
        cfg = {k: v for k, v in cfg.items() if k.isidentifier()}
        self._processor = cls(config=hf)
        with quiet_transformers(), torch.device("meta"), _one_name_map():
            hf_cfg = AutoConfig.for_model(hf["model_type"], **cfg)
            meta = AutoModelForCausalLM.from_config(hf_cfg)
            to_hf = tg.get_gguf_hf_weights_map(meta, self._processor)
        shapes = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
        self._tensor = {}
        for t in self._reader.tensors:
            name = to_hf.get(t.name)
            if name is not None:
                self._tensor[name] = t
        self.shape = {name: shapes.get(name, ()) for name in self._tensor}
        self.description = f"GGUF, dequantised one tensor at a time: {path}"

    def _process(self, weights, gguf_name: str) -> torch.Tensor:
        import numpy as np

        out = self._processor.process(weights=weights, name=gguf_name, parsed_parameters={"config": {}, "tensors": {}})
        return torch.from_numpy(np.copy(out.weights))

    def read(self, name: str) -> torch.Tensor:
        from gguf import dequantize

        t = self._tensor[name]
        return self._process(dequantize(t.data, t.tensor_type), t.name)

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        from gguf import dequantize

        t = self._tensor[name]  # data rows are the HF tensor's rows (ne0, the row length, is last here)
        return self._process(dequantize(t.data[start:stop], t.tensor_type), t.name)


class FileSource:
    """A :class:`~headscope.probes.models.inhouse.head_weights.TensorSource` over a checkpoint's
    files: in-house names mapped to the stored (HF) tensors, each read when asked, as float32.
    ``bytes_read`` counts the float32 bytes handed out (the stored tensors are read no more)."""

    def __init__(self, cfg: ModelConfig, files):
        self.cfg, self._files = cfg, files
        self.description = files.description
        self.bytes_read = 0
        meta_state, self._from = _name_map(cfg, files.shape)
        _check_table(cfg, meta_state, files.where)
        if cfg.tie_embeddings and not cfg.encoder and "embed.weight" not in self._from:
            self._from["embed.weight"] = self._from.pop("unembed.weight")  # stored under the head's name alone

    def has(self, name: str) -> bool:
        return name in self._from

    def layout(self, layer: int):
        return layer_heads(self.cfg, layer)

    def _inhouse(self, name: str, t: torch.Tensor) -> torch.Tensor:
        t = t.float()
        self.bytes_read += t.numel() * 4
        return t

    def tensor(self, name: str) -> torch.Tensor:
        hf_name, fused_as = self._from[name]
        t = self._files.read(hf_name)
        if fused_as is not None:  # one part of a fused tensor, split (and transposed) as the loader does
            t = hf_to_inhouse_names(self.cfg, {fused_as: t})[name]
        return self._inhouse(name, t)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        hf_name, fused_as = self._from[name]
        if fused_as is not None:
            return self.tensor(name)[start:stop].clone()
        return self._inhouse(name, self._files.read_rows(hf_name, start, stop))


def _name_map(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]]):
    """``(in-house meta state, {in-house name: (HF name, key to split it under or None)})``: the
    loader's renaming of the whole table (on meta tensors); a part of a fused tensor is traced to
    its HF tensor by renaming that one alone (under the base-model prefix the whole table got)."""
    from headscope.probes.models.families import FAMILIES

    state = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    whole = hf_to_inhouse_names(cfg, state)
    origin = {id(t): k for k, t in state.items()}
    base = FAMILIES[cfg.family].hf_base
    rebased = bool(base) and not any(k.startswith(base) for k in state)
    found: dict[str, tuple[str, str | None]] = {n: (origin[id(t)], None) for n, t in whole.items() if id(t) in origin}
    for k in sorted(set(state) - {hf for hf, _ in found.values()}):
        key = base + k if rebased and not k.startswith("lm_head.") else k
        for n in hf_to_inhouse_names(cfg, {key: state[k]}):
            if n in whole and n not in found:
                found[n] = (k, key)
    return whole, found


def _check_table(cfg: ModelConfig, meta_state: dict[str, torch.Tensor], where) -> None:
    """Refuse a tensor table that is not the in-house model's (missing, extra or mis-shaped
    tensor), with the loader's own messages, on meta tensors (nothing is allocated)."""
    from headscope.probes.models.inhouse.transformer import Transformer

    with torch.device("meta"):
        model = Transformer(cfg)
    load_state_into(model, meta_state, str(where))


def reads_lazily(source: ModelSource) -> bool:
    """Whether ``source``'s weights can be read lazily: a GGUF file, or an HF folder with
    safetensors (a ``pytorch_model.bin`` is a pickle: it is loaded whole)."""
    if source.kind == "gguf":
        return True
    if source.kind != "hf-dir" or source.path is None:
        return False
    return (source.path / "model.safetensors").is_file() or (source.path / "model.safetensors.index.json").is_file()


def _config(source: ModelSource) -> tuple[ModelConfig, dict]:
    """``(in-house config, HF config dict)`` of ``source``, checked as the loader checks them."""
    if source.kind == "gguf":
        from headscope.probes.models.gguf import gguf_meta_config

        hf, where = gguf_meta_config(source.path), source.path
    else:
        hf, where = read_hf_config(source), hf_dir(source) / "config.json"
    try:
        return config_from_arch(arch_from_hf_config(hf, str(where)), name=source.name), hf
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None


def lazy_weights(model, *, fold_norms: bool = True) -> ModelWeights:
    """A :class:`~headscope.probes.models.inhouse.head_weights.ModelWeights` reading ``model``
    (a name, path or :class:`ModelSource`: a safetensors folder, sharded or not, or a GGUF file)
    one tensor at a time. Its config is checked as the loader checks it, but not against the
    machine's memory: nothing is held beyond what the caller keeps. ``CheckpointError`` for a
    broken checkpoint or a source with no safetensors/GGUF weights, ``ModelIncompatibleError``
    for a GGUF architecture the lazy reader does not follow."""
    source = resolve(model)
    if not reads_lazily(source):
        raise CheckpointError(
            f"{source.path}: no safetensors or GGUF weights to read lazily (a pytorch_model.bin is loaded whole)"
        )
    if source.kind == "gguf":
        from headscope.probes.models.gguf.tensors import kept_gguf_readers

        with kept_gguf_readers():  # the metadata parsed once for the config and the tensors
            cfg, hf = _config(source)
            files = _GGUF(source.path, hf)
    else:
        cfg, _ = _config(source)
        files = _Safetensors(hf_dir(source))
    return ModelWeights(cfg, FileSource(cfg, files), fold_norms=fold_norms, name=source.name)
