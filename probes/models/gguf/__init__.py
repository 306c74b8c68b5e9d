"""All GGUF handling: a file's metadata read as an HF config (:mod:`.metadata`), its header and
tensor table checked (:mod:`.tensors`), and its float32 copy cached as an HF directory (:mod:`.cache`).

Nothing here imports :mod:`~headscope.probes.models.checkpoints`: checkpoints (the loader) calls
in, never the other way.
"""

from headscope.probes.models.gguf.cache import (
    METADATA_OVER_READER,
    SETTLED_FILE,
    SETTLED_VERSION,
    gguf_as_hf_dir,
    gguf_meta_config,
    per_layer_arrays_as_numbers,
    settle_cached_config,
)
from headscope.probes.models.gguf.metadata import (
    EQUAL_PER_LAYER,
    GGUF_ARCHITECTURES,
    GGUF_MAX_LAYERS,
    NOT_LOADABLE,
    arch_from_gguf,
    gguf_hf_config,
)
from headscope.probes.models.gguf.tensors import check_gguf, check_gguf_layout, check_gguf_tensors

__all__ = [
    "EQUAL_PER_LAYER",
    "GGUF_ARCHITECTURES",
    "GGUF_MAX_LAYERS",
    "METADATA_OVER_READER",
    "NOT_LOADABLE",
    "SETTLED_FILE",
    "SETTLED_VERSION",
    "arch_from_gguf",
    "check_gguf",
    "check_gguf_layout",
    "check_gguf_tensors",
    "gguf_as_hf_dir",
    "gguf_hf_config",
    "gguf_meta_config",
    "per_layer_arrays_as_numbers",
    "settle_cached_config",
]
