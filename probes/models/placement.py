"""Where ``device_map="auto"`` puts each layer of an hf checkpoint, computed on the meta device.

:func:`meta_model` builds the class :meth:`~headscope.probes.models.backends.hf.HFReference.from_source`
loads, from the config alone, on the meta device (no weight is read, nothing is allocated).
:func:`place` runs on it what ``from_pretrained(device_map="auto", max_memory=...)`` runs:
transformers' ``get_balanced_memory`` (each GPU but the last capped near an even share) and then
``infer_auto_device_map`` with the model's ``_no_split_modules``
(:mod:`transformers.integrations.accelerate`, the copy of accelerate's placement transformers 5
calls; accelerate's ``infer_auto_device_map`` gives the same map: tests/reports/test_device_plan.py).
The :class:`Placement` says which layers and how many bytes of weights each device holds.

:func:`parse_max_memory` reads ``--max-memory 0=8GiB,1=8GiB`` (sizes as accelerate reads them:
``GiB``/``MiB`` powers of 1024, ``GB``/``MB`` powers of 1000, or bytes); :func:`gpu_memory` is the
free memory of each CUDA device, as accelerate measures it.

>>> parse_max_memory("0=8GiB,1=512MiB")
{0: 8589934592, 1: 536870912}
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

__all__ = ["OFFLOAD", "Placement", "gpu_memory", "meta_model", "model_bytes", "parse_max_memory", "place"]

#: devices accelerate offloads to when the GPUs given are full (a plan that needs them does not fit)
OFFLOAD = ("cpu", "disk")

_RULE = "GPU=SIZE pairs, comma-separated, such as 0=8GiB,1=8GiB (SIZE in GiB, MiB, GB, MB or bytes)"


def parse_max_memory(text: str) -> dict[int, int]:
    """``--max-memory``: ``{gpu index: bytes}`` from ``"0=8GiB,1=8GiB"``; a one-line ``ValueError``
    naming the bad pair otherwise (an index given twice, a size of zero, a unit accelerate does not read)."""
    from accelerate.utils import convert_file_size_to_int

    out: dict[int, int] = {}
    for pair in str(text).split(","):
        key, eq, size = (x.strip() for x in pair.partition("="))
        bad = f"--max-memory must be {_RULE}; got {str(text)[:60]!r}"
        if not eq or not key.isascii() or not key.isdigit() or len(key) > 4:
            raise ValueError(f"{bad} ({pair.strip()[:20]!r} is not GPU=SIZE)")
        if int(key) in out:
            raise ValueError(f"{bad} (GPU {int(key)} given twice)")
        if not re.fullmatch(r"[0-9]*\.?[0-9]+\s*([KMG]i?B)?", size, re.IGNORECASE):
            raise ValueError(f"{bad} ({size[:20]!r} is not a size)")
        n = convert_file_size_to_int(size if size[-1:].isalpha() else int(float(size)))
        if n <= 0:
            raise ValueError(f"{bad} (GPU {int(key)} holds no bytes)")
        out[int(key)] = n
    return out


def gpu_memory() -> dict[int, int]:
    """``{cuda index: free bytes}`` of every visible CUDA device ({} without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {i: int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())}


def meta_model(source, *, dtype: str = "fp32", trust_remote_code: bool = False):
    """The model :meth:`~headscope.probes.models.backends.hf.HFReference.from_source` would load from
    ``source`` (a resolved :class:`~headscope.probes.models.checkpoints.ModelSource`), built from its
    config on the meta device in ``dtype``: its parameters have shapes and dtypes, no storage."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    from headscope.probes.models.arch import arch_from_hf_config
    from headscope.probes.models.backends.hf import model_class
    from headscope.probes.models.checkpoints import hf_dir, read_hf_config
    from headscope.probes.models.loading import DTYPES
    from headscope.probes.models.quiet import quiet_transformers

    directory = hf_dir(source)
    hf_cfg = read_hf_config(source)
    arch = arch_from_hf_config(hf_cfg, str(directory / "config.json"))
    klass, encoder_only, _ = model_class(hf_cfg, arch, directory)
    with quiet_transformers():
        config = AutoConfig.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
        config._attn_implementation = "eager"
        if encoder_only:
            config.is_encoder_decoder = False
        with init_empty_weights():
            return klass.from_config(config, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """A device map and what it puts where: ``device_map`` (module path -> device, as
    ``model.hf_device_map`` will read), ``max_memory`` (the bytes per device it was computed
    under), ``module_bytes`` (bytes of each entry of the map), ``layer_devices`` (layer ``i``'s
    device), ``input_device`` / ``output_device`` (the embedding's and the unembedding's; None
    when the model has none), ``total_bytes`` (every parameter and buffer)."""

    device_map: dict
    max_memory: dict
    module_bytes: dict
    layer_devices: tuple
    input_device: object = None
    output_device: object = None
    total_bytes: int = 0

    def weights(self) -> dict:
        """``{device: bytes of weights}`` over the devices of ``max_memory`` (0 where nothing goes)."""
        out = dict.fromkeys(self.max_memory, 0)
        for name, dev in self.device_map.items():
            out[dev] = out.get(dev, 0) + self.module_bytes[name]
        return out

    def layers(self) -> dict:
        """``{device: (layer indices)}`` over the devices of ``max_memory``."""
        out: dict = {d: () for d in self.max_memory}
        for i, dev in enumerate(self.layer_devices):
            out[dev] = (*out.get(dev, ()), i)
        return out

    def offloaded(self) -> list[str]:
        """The modules the map sends to the CPU or the disk (none in a plan that fits the GPUs)."""
        return [n for n, d in self.device_map.items() if d in OFFLOAD]


def model_bytes(model) -> int:
    """Bytes of ``model``'s parameters and buffers as the placement counts them (a tied weight once)."""
    from transformers.integrations.accelerate import compute_module_sizes

    return int(compute_module_sizes(model)[0].get("", 0))


def _device_of(name: str, device_map: dict):
    """The device of module ``name`` under ``device_map`` (its own entry or its closest parent's)."""
    parts = name.split(".")
    for k in range(len(parts), -1, -1):
        key = ".".join(parts[:k])
        if key in device_map:
            return device_map[key]
    return None


def place(model, max_memory: dict[int, int]) -> Placement:
    """What ``from_pretrained(device_map="auto", max_memory=max_memory)`` does with ``model`` (built
    by :func:`meta_model`): the balanced budgets, then the placement (see the module doc). A layer
    is a module of one of the model's ``_no_split_modules`` classes held in a list, in order."""
    from transformers.integrations.accelerate import compute_module_sizes, get_balanced_memory, infer_auto_device_map

    no_split = model._no_split_modules
    quiet = logging.getLogger("accelerate.utils.modeling")  # "Device 1 is not available": a plan for other GPUs
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        balanced = get_balanced_memory(model, max_memory=dict(max_memory), no_split_module_classes=no_split)
        device_map = dict(
            infer_auto_device_map(
                model,
                max_memory=balanced,
                no_split_module_classes=no_split,
                no_placement_params=getattr(model, "_no_placement_params", None),
            )
        )
    finally:
        quiet.setLevel(level)
    sizes, _ = compute_module_sizes(model, only_modules=False)
    kinds = set(no_split or ())  # a layer: an unsplit module of a list (BERT's embeddings are unsplit too, not a layer)
    layers = [n for n, m in model.named_modules() if type(m).__name__ in kinds and n.rpartition(".")[2].isdigit()]
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    names = {id(m): n for n, m in model.named_modules()}
    return Placement(
        device_map=device_map,
        max_memory=dict(max_memory),
        module_bytes={n: int(sizes.get(n, 0)) for n in device_map},
        layer_devices=tuple(_device_of(n, device_map) for n in layers),
        input_device=_device_of(names[id(emb)], device_map) if emb is not None else None,
        output_device=_device_of(names[id(head)], device_map) if head is not None else None,
        total_bytes=int(sizes.get("", 0)),
    )
