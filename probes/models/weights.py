"""A model's weights: their size by arithmetic, and the memory they need checked before anything is allocated."""

from __future__ import annotations

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
