"""What headscope provably wrote: the staging marker and the check that a folder is ours.

A folder headscope stages (``<out>.tmp-<pid>``) carries the marker file :data:`MARKER`
(JSON: ``headscope``, ``kind``, ``out``, ``pid``); ``out`` gets one just before it is
swapped out. :func:`why_not_ours` says why a folder is not provably headscope's (None when
it is): only such a folder is ever deleted or moved.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
from pathlib import Path

from headscope.probes.outputs.kinds import KINDS, OutputKind, few, is_atomic_leftover, output_kind_of
from headscope.probes.outputs.modes import file_mode

#: the marker of a folder headscope is staging or swapping out (see the module docstring)
MARKER = ".headscope-staging"


def foreign_entries(out: Path, kind: OutputKind) -> list[str]:
    """Entries of ``out`` that ``kind`` does not write (``sub/name`` inside subfolders)."""
    subs = dict(kind.subfolders)
    foreign = []
    for entry in sorted(out.iterdir(), key=lambda p: p.name):
        name = entry.name
        if name == MARKER and read_marker(out) is not None:
            continue
        if entry.is_symlink():
            foreign.append(name)
        elif name in subs and entry.is_dir():
            for inner in sorted(entry.iterdir(), key=lambda p: p.name):
                ok = (
                    inner.is_file()
                    and not inner.is_symlink()
                    and (
                        any(fnmatch.fnmatchcase(inner.name, p) for p in subs[name])
                        or is_atomic_leftover(inner.name, kind, subs[name])
                    )
                )
                if not ok:
                    foreign.append(f"{name}/{inner.name}")
        elif entry.is_file() and (
            name in kind.entries and name not in subs or is_atomic_leftover(name, kind, kind.entries)
        ):
            continue
        else:
            foreign.append(name + ("/" if entry.is_dir() else ""))
    return foreign


def read_marker(folder: Path) -> dict | None:
    """The staging marker in ``folder`` (``{"headscope": "staging", "kind", "out", "pid"}``), or None."""
    path = folder / MARKER
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
            return None
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        isinstance(meta, dict)
        and meta.get("headscope") == "staging"
        and meta.get("kind") in KINDS
        and isinstance(meta.get("out"), str)
        and isinstance(meta.get("pid"), int)
        and not isinstance(meta.get("pid"), bool)
    ):
        return meta
    return None


def write_marker(folder: Path, out: Path, kind: str) -> None:
    """Write the staging marker of this process into ``folder`` (which stages or is ``out``)."""
    data = json.dumps({"headscope": "staging", "kind": kind, "out": out.name, "pid": os.getpid()}, sort_keys=True)
    fd = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, file_mode())
    try:
        os.write(fd, data.encode("utf-8") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_marker(folder: Path) -> None:
    if read_marker(folder) is not None:
        (folder / MARKER).unlink(missing_ok=True)


def why_not_ours(folder: Path, out_name: str, pid: int) -> str | None:
    """None when headscope provably wrote ``folder`` (``<out>.tmp-<pid>`` / ``<out>.old-<pid>``):
    it carries the marker of run ``pid`` into ``out_name``, or its manifest says it is an
    earlier headscope output; and it holds nothing that kind does not write. Else why not."""
    if folder.is_symlink() or not folder.is_dir():
        return "it is not a folder (a link or a file)"
    mark = read_marker(folder)
    if mark is not None and mark["out"] == out_name and mark["pid"] == pid:
        found = mark["kind"]
    else:
        found = output_kind_of(folder)
        if found is None:
            try:
                names = sorted(e.name + ("/" if e.is_dir() else "") for e in folder.iterdir())
            except OSError:
                names = []
            held = f" (it holds {few(names)})" if names else " (it is empty)"
            return f"it carries neither headscope's {MARKER} marker nor the manifest of a headscope output{held}"
    try:
        foreign = foreign_entries(folder, KINDS[found])
    except OSError as e:
        return f"it cannot be read ({e.strerror})"
    if foreign:
        return f"it holds {few(foreign)}, which headscope does not write"
    return None
