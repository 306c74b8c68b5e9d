"""A model's weights: their files found and read (safetensors, its shards, or a weights-only
``pytorch_model.bin``; nothing is unpickled), checked before use (a cut safetensors header,
integer or quantised dtypes), their size by arithmetic, and the memory they need checked before
anything is allocated."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from headscope.probes.errors import CheckpointError, HeadscopeError, ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.config import config_from_arch, param_counts


def available_memory_bytes() -> int | None:
    """Memory the system can give without swapping (``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - not installed or not supported here
        return None


def estimate_params(hf: dict) -> int | None:
    """Parameters of the model a config describes, by arithmetic: exact for the in-house
    families, ``vocab·d + positions·d + layers·(4·d² + 2·d·d_mlp)`` otherwise; None when
    the config lacks the sizes."""
    try:
        arch = arch_from_hf_config(hf)
    except HeadscopeError:
        return None
    try:
        return param_counts(config_from_arch(arch))[1]
    except (ModelIncompatibleError, ValueError, TypeError):
        pass
    d = arch.d_model
    d_mlp = arch.d_mlp or 4 * d
    vocab = arch.vocab_size or 0
    positions = arch.max_positions or 0
    return vocab * d + positions * d + arch.n_layers * (4 * d * d + 2 * d * d_mlp)


_SIZE_NAMES = (
    "num_hidden_layers",
    "n_layer",
    "hidden_size",
    "n_embd",
    "intermediate_size",
    "n_inner",
    "vocab_size",
    "max_position_embeddings",
    "n_positions",
)


def check_weight_memory(hf: dict, where, *, bytes_per_param: int = 4) -> None:
    """Refuse, before anything is allocated, a model whose weights alone would not fit in the
    memory available (a config with absurd sizes would otherwise die in the allocator)."""
    n = estimate_params(hf)
    avail = available_memory_bytes()
    if n is None or avail is None or n * bytes_per_param <= avail:
        return
    sizes = ", ".join(f"{k}={hf[k]}" for k in _SIZE_NAMES if isinstance(hf.get(k), int))
    raise CheckpointError(
        f"{where}: {sizes} need ~{n * bytes_per_param / 2**30:,.1f} GiB of weights ({n:,} parameters of "
        f"{bytes_per_param} bytes), more than the {avail / 2**30:,.1f} GiB available; check these sizes"
    )


# ----------------------------------------------------------------------------- weight files


def check_safetensors(path: Path) -> None:
    """Read a safetensors file's header (nothing else) and refuse one that is cut short or
    malformed, naming the file and what its header promised."""
    path = Path(path)
    size = path.stat().st_size

    def bad(detail: str):
        return CheckpointError(f"{path}: corrupt or truncated safetensors ({detail}); copy or download it again")

    if size < 8:
        raise bad(f"{size} bytes; expected at least the 8-byte header length")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > size - 8:
            raise bad(f"the header announces {n:,} bytes of JSON, the file holds {size - 8:,} after the length")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        dtypes = {k: str(v["dtype"]) for k, v in header.items() if k != "__metadata__"}
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise bad("the header is not the JSON table of tensors") from None
    if 8 + n + end > size:
        raise bad(f"{size:,} bytes; its header places tensor data up to byte {8 + n + end:,}")
    check_weight_dtypes(dtypes, path)


#: safetensors dtypes of integers and booleans (never a trained weight's) -> torch's names for them
INTEGER_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
}
#: 8-bit floats: a checkpoint stores its weights so only with per-block scale tensors beside them,
#: which a cast to float32 drops (safetensors' names and torch's)
FP8_DTYPES = {
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2fnuz": "float8_e5m2fnuz",
}
#: tensors that name a quantised checkpoint's parts (bitsandbytes, GPTQ, AWQ)
_QUANTISED_PARTS = (".SCB", ".weight_format", ".qweight", ".qzeros", ".g_idx")


def _is_parameter(name: str) -> bool:
    """Whether a checkpoint tensor is a trained weight or bias (not a buffer: position or
    token-type ids, GPT-2's causal mask ``attn.bias``/``attn.masked_bias``, a batch count)."""
    return name.endswith((".weight", ".bias")) and not name.endswith((".attn.bias", ".attn.masked_bias"))


def check_weight_dtypes(dtypes: dict[str, str], where) -> None:
    """Refuse a checkpoint whose weights (``{tensor name: dtype}``, safetensors' ``I8`` or
    torch's ``torch.int8``) include one stored as an integer or boolean: transformers and
    torch would cast it to float without a word (int8 ``-3`` becomes the weight ``-3.0``; a
    quantised weight loses its scales). Floating dtypes (float16, bfloat16, float32, float64)
    pass, and so do integer buffers (``position_ids``)."""
    torch_names = set(INTEGER_DTYPES.values())
    fp8_names = set(FP8_DTYPES.values())

    def integer(d: str) -> str | None:
        d = d.removeprefix("torch.")
        return INTEGER_DTYPES.get(d) or (d if d in torch_names else None)

    fp8 = sorted(
        k for k, d in dtypes.items() if _is_parameter(k) and (d in FP8_DTYPES or d.removeprefix("torch.") in fp8_names)
    )
    if fp8:
        d = dtypes[fp8[0]].removeprefix("torch.")
        raise CheckpointError(
            f"{where}: weight {fp8[0]!r} is stored as {FP8_DTYPES.get(d, d)} ({len(fp8)} 8-bit float weight(s)): an "
            "FP8-quantised checkpoint, whose per-block scales a cast to float32 would drop; headscope does not "
            "load it: load the bf16/fp16 release, or dequantise it first"
        )

    bad = sorted(k for k, d in dtypes.items() if _is_parameter(k) and integer(d))
    if not bad:
        return
    kind = (
        "it is a quantised checkpoint (its tensors include bitsandbytes/GPTQ/AWQ parts), which headscope does not load"
        if any(k.endswith(_QUANTISED_PARTS) for k in dtypes)
        else "quantised checkpoints (int8, GPTQ, AWQ, bitsandbytes) are not supported"
    )
    raise CheckpointError(
        f"{where}: weight {bad[0]!r} is stored as {integer(dtypes[bad[0]])} ({len(bad)} integer or boolean "
        f"weight(s)); weights must be floating point (float16, bfloat16, float32 or float64): {kind}; load the "
        "unquantised release, or dequantise it first"
    )


def weight_files(directory: Path) -> list[Path]:
    """The weight files of an HF directory (safetensors, its shards, or pytorch_model.bin)."""
    directory = Path(directory)
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return [directory / s for s in sorted(set(_weight_map(index).values()))]
    if (directory / "pytorch_model.bin").is_file():
        return [directory / "pytorch_model.bin"]
    bin_index = directory / "pytorch_model.bin.index.json"
    return [directory / s for s in sorted(set(_weight_map(bin_index).values()))] if bin_index.is_file() else []


def _weight_map(index: Path) -> dict[str, str]:
    """A shard index's ``weight_map`` (tensor -> shard file), every shard there; else a one-line refusal."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise CheckpointError(
            f"{index}: not a shard index (expected a 'weight_map' object of tensor -> file)"
        ) from None
    for tensor, shard in sorted(weight_map.items()):
        if not (index.parent / shard).is_file():
            missing = sorted({s for s in weight_map.values() if not (index.parent / s).is_file()})
            raise CheckpointError(
                f"{index}: shard {shard!r} (holding tensor {tensor!r}) is missing "
                f"({len(missing)} of {len(set(weight_map.values()))} shards missing)"
            )
    return weight_map


def _read_shards(index: Path, read) -> dict[str, torch.Tensor]:
    """The tensors of every shard ``index`` names (``read(path)`` reads one), each tensor checked to
    be in the shard the index names."""
    weight_map = _weight_map(index)
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        part = read(index.parent / shard)
        absent = sorted(t for t, s in weight_map.items() if s == shard and t not in part)
        if absent:
            raise CheckpointError(
                f"{index.parent / shard}: tensor {absent[0]!r}, which {index.name} places in this shard, is not "
                f"in it ({len(absent)} absent)"
            )
        state.update(part)
    return state


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated safetensors ({str(e).splitlines()[0][:160]})") from None
    check_weight_dtypes({k: str(v.dtype) for k, v in state.items()}, path)
    return state


def _read_torch_bin(path: Path) -> dict[str, torch.Tensor]:
    """A ``pytorch_model.bin`` read by ``torch.load(weights_only=True)`` only: a pickle that needs
    more (any class beyond tensors and containers) is refused."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"{path}: refused or unreadable ({type(e).__name__}: {str(e).strip().splitlines()[0][:160]}); "
            "only weights-only checkpoints are loaded"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors; got {type(state).__name__}")
    check_weight_dtypes({k: str(v.dtype) for k, v in state.items() if isinstance(v, torch.Tensor)}, path)
    return state


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """Tensors of an HF directory, in transformers' order of preference: ``model.safetensors``, its
    shards (``model.safetensors.index.json``), ``pytorch_model.bin`` or its shards — the torch files
    read weights-only. Stored bf16/fp16 tensors keep their dtype (the loader casts them)."""
    directory = Path(directory)
    st, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if st.exists():
        return _read_safetensors(st)
    if index.exists():
        return _read_shards(index, _read_safetensors)
    binf, bin_index = directory / "pytorch_model.bin", directory / "pytorch_model.bin.index.json"
    if binf.exists():
        return _read_torch_bin(binf)
    if bin_index.exists():
        return _read_shards(bin_index, _read_torch_bin)
    raise CheckpointError(f"{directory}: no model.safetensors, shard index or pytorch_model.bin")
