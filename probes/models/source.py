"""Where checkpoints come from and where headscope caches what it derives from them."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def allow_download() -> bool:
    """Whether a hub id may be fetched over the network (``--allow-download``, which sets
    ``HEADSCOPE_ALLOW_DOWNLOAD=1``). Off by default: a name that is neither shipped nor a
    local path is refused without any network access."""
    return os.environ.get("HEADSCOPE_ALLOW_DOWNLOAD") == "1"


def cache_dir() -> Path:
    root = os.environ.get("HEADSCOPE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "headscope"
    )
    return Path(root)


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
