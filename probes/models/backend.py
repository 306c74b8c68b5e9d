"""Moved to :mod:`headscope.probes.models.backends.protocol`; this name is kept while callers move."""

from headscope.probes.models.backends.protocol import *  # noqa: F403
from headscope.probes.models.backends.protocol import (  # noqa: F401
    Backend,
    BackendCommon,
    HeadFn,
    ModelSpec,
    apply_to_heads,
    batch_to,
    module_device,
    placement,
    rows_unembedded,
    spec_from_arch,
    unembed_at,
    weight_dtype,
)
