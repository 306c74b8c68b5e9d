"""transformers kept quiet while headscope drives it: library code prints nothing itself."""

from __future__ import annotations

import contextlib
import logging

log = logging.getLogger(__name__)


@contextlib.contextmanager
def quiet_transformers():
    """transformers' warnings (load reports) and progress bars ("Loading weights") off for the
    block, unless headscope logs progress (``-v``); library code prints nothing itself."""
    import transformers
    from transformers.utils import logging as hf_logging

    verbosity = transformers.logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    quiet = not log.isEnabledFor(logging.INFO)
    if quiet:
        hf_logging.disable_progress_bar()
    gguf_utils = bar = None
    if quiet:  # the GGUF reader's own bar ("Converting and de-quantizing GGUF tensors") is a plain tqdm
        with contextlib.suppress(ImportError):
            import transformers.modeling_gguf_pytorch_utils as gguf_utils

            bar, gguf_utils.tqdm = gguf_utils.tqdm, _no_bar
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if bar is not None:
            gguf_utils.tqdm = bar


def _no_bar(iterable, *args, **kwargs):
    return iterable
