"""Compiled models cached under the user cache directory, so tests and runs compile each once.

``$HEADSCOPE_CACHE`` (else ``$XDG_CACHE_HOME/headscope``, else ``~/.cache/headscope``) ``/tracr/``
holds one ``<label>-<key>.pt`` per :class:`~headscope.probes.models.compiled.programs.ProgramSetting`:
the export of :func:`~headscope.probes.models.compiled.tracr.compile_export` (tensors and plain
values, read back with ``weights_only=True``). The key hashes the setting, the seed and
:data:`FORMAT` (tracr is pinned by the extra; its version is recorded in the export). A writer holds an exclusive ``flock`` on ``<file>.lock`` while it compiles, and
renames a finished temporary file into place: concurrent runs (pytest workers) compile once and
never read half a file. A cached export loads without jax.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import tempfile
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import torch

from headscope.probes.models.compiled.programs import ProgramSetting

log = logging.getLogger(__name__)

#: the export's layout version: a change of what compile_export writes bumps it
FORMAT = 1


def cache_dir() -> Path:
    """The folder compiled models are cached in (module docstring)."""
    root = os.environ.get("HEADSCOPE_CACHE")
    if root:
        return Path(root) / "tracr"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "headscope" / "tracr"


def _tracr_version() -> str:
    try:
        return metadata.version("tracr-pypi")
    except metadata.PackageNotFoundError:
        return "absent"


def cache_path(setting: ProgramSetting, seed: int = 0) -> Path:
    """Where the export of ``setting`` is cached."""
    text = json.dumps(
        [setting.program, [str(v) for v in setting.vocab], setting.max_seq_len, setting.causal, seed, FORMAT],
        sort_keys=True,
    )
    key = hashlib.sha256(text.encode()).hexdigest()[:12]
    return cache_dir() / f"{setting.label}-{key}.pt"


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path) -> dict | None:
    try:
        return torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        if path.exists():
            log.warning("cached compiled model %s is unreadable (%s); compiling again", path, e)
        return None


def cached_export(setting: ProgramSetting, *, seed: int = 0, use_cache: bool = True) -> dict:
    """The export of ``setting``: read from the cache, or compiled (needs the ``tracr`` extra) and
    written there (module docstring). ``use_cache=False`` compiles and writes nothing."""
    from headscope.probes.models.compiled.tracr import compile_export

    if not use_cache:
        return compile_export(setting, seed=seed)
    path = cache_path(setting, seed)
    found = _read(path) if path.exists() else None
    if found is not None:
        return found
    with _locked(path):
        found = _read(path) if path.exists() else None  # another process may have written it meanwhile
        if found is not None:
            return found
        export = compile_export(setting, seed=seed)
        export["tracr_version"] = _tracr_version()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(export, f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return export
