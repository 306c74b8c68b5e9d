"""One writer per cache entry: an exclusive ``flock`` beside it while it is made, and a finished
temporary copy renamed into place, so processes that need the same entry at once (Ray workers,
pytest workers, two runs) make it once and never read half of it.

>>> with cache_lock(Path(tempfile.mkdtemp()) / "gguf" / "abc"):  # doctest: +SKIP
...     ...  # check again, then write a temporary copy and rename it into place
"""

from __future__ import annotations

import fcntl
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["cache_lock", "drop_leftovers"]


@contextmanager
def cache_lock(entry: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<entry>.lock`` (its folder made if missing) for the ``with``
    body: a second process asking for the same entry waits here, then finds it made. The lock
    is the kernel's (``flock``): a process that dies lets go of it."""
    entry = Path(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_name(entry.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def drop_leftovers(entry: Path) -> int:
    """Remove the temporary copies of ``entry`` (``<entry>.tmp*``) a killed writer left; call it
    holding :func:`cache_lock` (no other writer is at work then). Returns how many were removed."""
    entry = Path(entry)
    n = 0
    for tmp in entry.parent.glob(entry.name + ".tmp*"):
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        log.info("removed %s, a temporary copy an interrupted writer left", tmp)
        n += 1
    return n
