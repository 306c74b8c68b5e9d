"""Atomic output: write to a temporary name in the same folder, then rename.

A crash never leaves a half-written file that looks complete: readers see the old
file or the new one. Files get the usual permissions (``0666 & ~umask``), not the
``0600`` of a bare temporary file, so a report can be shared as it is.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> with atomic_write(d / "a.txt") as f:
...     _ = f.write("hello")
>>> (d / "a.txt").read_text(), sorted(p.name for p in d.iterdir())
('hello', ['a.txt'])
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from headscope.probes.outputs.modes import file_mode


@contextmanager
def atomic_write(path, mode: str = "w", encoding: str | None = "utf-8"):
    """Open a temporary file beside ``path``; on success fsync and rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_path(path):
    """Context manager yielding a temporary path to hand to a library writer
    (``df.to_parquet(tmp)``, ``fig.savefig(tmp)``), renamed over ``path`` on success."""
    return _AtomicPath(Path(path))


class _AtomicPath:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp" + self.path.suffix, dir=self.path.parent)
        os.close(fd)
        self.tmp = Path(tmp)
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            os.chmod(self.tmp, file_mode())
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)
        return False


def write_json(obj, path) -> None:
    with atomic_write(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")


def write_frame(df, stem) -> tuple[Path, Path]:
    """Write ``df`` as ``stem.csv`` and ``stem.parquet``, each atomically. CSV floats are
    written with ``%.10g`` so identical runs give byte-identical files."""
    stem = Path(stem)
    csv, pq = stem.with_suffix(".csv"), stem.with_suffix(".parquet")
    with atomic_write(csv) as f:
        df.to_csv(f, index=False, float_format="%.10g", lineterminator="\n")
    with atomic_path(pq) as tmp:
        df.to_parquet(tmp, index=False)
    return csv, pq
