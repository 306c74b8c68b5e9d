"""Output folders: claimed before the work starts, replaced whole, never mixed.

Every command that writes a folder (``report``, ``roles``, ``diff``: replaced whole;
``prune``: resumed in place) goes through :func:`claim_output`:

1. **checked first**, before any model loads: ``--out`` must not be a file or lie under
   one, and an existing folder is replaced only when it is *provably* an earlier
   headscope output of the same kind — its manifest (``run.json``, or ``diff.json``
   for a diff; ``state.json`` for a pruning study in progress) says so, and every entry
   in it is a name that kind writes. Anything else (a user's file, another kind of run)
   is refused with one line, and nothing is touched;
2. **locked** for the whole run (``flock`` on ``.<name>.lock`` beside the folder), so a
   second run into the same ``--out`` is refused at once instead of mixing its files
   with the first's; the lock dies with the process, so a killed run never blocks;
3. **written beside** the folder (``<out>.tmp-<pid>``) and **swapped in** with one
   atomic exchange (Linux ``renameat2(RENAME_EXCHANGE)``): readers see the old folder or
   the new one, never a missing or a half one. Where the file system has no exchange,
   two renames are used and a run killed between them is repaired by the next run
   (:func:`~headscope.probes.outputs.swap.recover`).

A folder headscope stages (``<out>.tmp-<pid>``) carries a marker file,
``.headscope-staging`` (JSON: ``headscope``, ``kind``, ``out``, ``pid``), and ``out`` gets one
just before it is swapped out; :func:`~headscope.probes.outputs.swap.recover` deletes or moves back only what carries
that marker, or what is an earlier output of the same kind with nothing else in it. A
folder of the user's that merely has such a name is left as it is (one warning line).

``--out`` may be an empty folder (``mktemp -d``, ``TemporaryDirectory()``, ``.``): it is
claimed like a missing one. A ``--out`` that is a symbolic link is followed: the folder it
points to is checked, locked and replaced under the same rules, and the link is left as
it is. An empty ``--out`` and a mount point (which cannot be swapped) are refused.

Files are created with the usual permissions (``0666 & ~umask``; folders ``0777 &
~umask``), not the ``0600`` of a bare temporary file.

The kinds of folder and their manifests live in :mod:`.kinds`, the staging marker in
:mod:`.markers`, the swap and the repair in :mod:`.swap`; this module checks, locks and
claims.

>>> import tempfile, pathlib
>>> out = pathlib.Path(tempfile.mkdtemp()) / "roles"
>>> with claim_output(out, "roles") as folder:
...     with folder.staging() as tmp:
...         _ = (tmp / "run.json").write_text('{"output": {"kind": "roles"}}')
>>> sorted(p.name for p in out.iterdir())
['run.json']
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from headscope.probes.outputs.kinds import KINDS, few, output_kind_of
from headscope.probes.outputs.markers import MARKER, foreign_entries, read_marker, why_not_ours, write_marker
from headscope.probes.outputs.modes import file_mode, folder_mode
from headscope.probes.outputs.swap import recover, swap_in


def out_argument(text: str) -> str:
    """``type=`` of every command's ``--out``: an empty value names no folder (it used to
    mean the default place, or ``.``), so it is refused before anything runs.

    >>> out_argument("runs/roles")
    'runs/roles'
    """
    if text == "":
        raise argparse.ArgumentTypeError("must name a folder; got '' (leave --out off for the command's default)")
    return text


def _resolve(out) -> tuple[Path, str]:
    """``(the folder to write, how a message names it)`` for ``--out``: a symbolic link's
    target (named ``"out (a symbolic link to /x/y)"``); ``.`` and ``..`` made absolute (a
    folder is staged beside itself, under its own name). Raises ``ValueError`` for an
    empty ``--out``, a link loop and the root folder."""
    if isinstance(out, str) and out == "":
        raise ValueError("--out is empty; name a folder (nothing was written)")
    out = Path(out)
    if out.is_symlink():
        try:
            target = out.resolve()
        except (RuntimeError, OSError):
            raise ValueError(
                f"--out {out} is a symbolic link that loops and never reaches a folder; pass another --out"
            ) from None
        label = f"{out} (a symbolic link to {target})"
    elif out.name in ("", ".", ".."):
        target, label = out.resolve(), str(out)
    else:
        return out, str(out)
    if not target.name:
        raise ValueError(f"--out {label} is the root folder; pass a folder inside it")
    return target, label


def check_output(out, kind: str) -> Path:
    """Raise ``ValueError`` (one line) unless ``kind`` may write ``out``; return the folder
    to write (``out``, or the folder a symbolic link ``out`` points to).

    Allowed: ``out`` does not exist (its parent must be a folder or creatable), is an
    empty folder, or is an earlier ``kind`` output with nothing else in it. Refused too:
    an empty ``out``, a mount point (it cannot be swapped for the new folder)."""
    spec = KINDS[kind]
    out, label = _resolve(out)
    for parent in [out, *out.parents]:
        if parent.exists() or parent.is_symlink():
            if parent != out and not parent.is_dir():
                raise ValueError(f"--out {label}: {parent} is a file, not a folder; pass another --out")
            break
    if not out.exists():
        return out
    if not out.is_dir():
        raise ValueError(f"--out {label} is a file, not a folder; pass another --out (nothing was written)")
    if os.path.ismount(out):
        raise ValueError(
            f"--out {label} is a mount point, which cannot be swapped for the new folder; "
            f"pass a folder inside it (e.g. --out {out / kind})"
        )
    try:
        entries = [e for e in out.iterdir() if e.name != MARKER or read_marker(out) is None]
    except PermissionError:
        raise ValueError(f"--out {label}: the folder cannot be read (permission denied); pass another --out") from None
    if not entries:  # empty (or holding only the marker of a run killed while swapping): claimed like a missing one
        return out
    found = output_kind_of(out)
    if found is None:
        raise ValueError(
            f"--out {label} exists and is not a headscope {kind} output (no {' or '.join(spec.manifests)} of one); "
            "pass another --out or empty it (only an earlier output of the same kind is replaced)"
        )
    if found != kind:
        raise ValueError(
            f"--out {label} holds a headscope {found} output; {kind} does not replace it; pass another --out"
        )
    foreign = foreign_entries(out, spec)
    if foreign:
        raise ValueError(
            f"--out {label} holds an earlier {kind} output but also {few(foreign)}, which headscope does not write; "
            "move them away or pass another --out (nothing was touched)"
        )
    return out


# ---------------------------------------------------------------- the claim

_HELD: dict[Path, OutputFolder] = {}


class OutputFolder:
    """A claimed output folder (see :func:`claim_output`); ``out`` is the folder written
    (a symbolic link's target)."""

    def __init__(self, out: Path, kind: str):
        self.out = out
        self.kind = kind
        self.recovered: list[str] = []

    @contextmanager
    def staging(self):
        """Yield an empty folder beside ``out`` (holding only the staging marker, which is
        removed before the swap); on success it replaces ``out`` whole."""
        tmp = self.out.with_name(f"{self.out.name}.tmp-{os.getpid()}")
        if tmp.exists() or tmp.is_symlink():  # an earlier process with this pid was killed: delete it only if ours
            why = why_not_ours(tmp, self.out.name, os.getpid())
            if why is not None:
                raise ValueError(f"{tmp} is in the way (headscope stages --out there) and is not headscope's: {why}")
            shutil.rmtree(tmp)
        check_output(self.out, self.kind)  # unchanged since the claim, unless someone wrote into it meanwhile
        tmp.mkdir(mode=folder_mode())
        try:
            write_marker(tmp, self.out, self.kind)
            yield tmp
            (tmp / MARKER).unlink()
            swap_in(tmp, self.out, self.kind)
        except BaseException:
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            raise


def _lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def _take_lock(out: Path):
    """An exclusive ``flock`` on ``.<name>.lock`` beside ``out``; ValueError if held."""
    path = _lock_path(out)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, file_mode())
        except (FileNotFoundError, NotADirectoryError):
            raise ValueError(f"--out {out}: its folder {out.parent} cannot be created") from None
        except PermissionError:
            raise ValueError(
                f"--out {out}: cannot write in {out.parent} (permission denied); pass another --out"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise ValueError(
                f"--out {out} is being written by another headscope run (pid {holder}); wait for it or pass another --out"
            ) from None
        try:  # the holder before us may have unlinked the file after we opened it: lock the one on disk
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            return fd, path
        os.close(fd)


def _release_lock(fd: int, path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)


@contextmanager
def claim_output(out, kind: str):
    """Check, lock and tidy ``out`` for a ``kind`` run; yield an :class:`OutputFolder`.

    Raises ``ValueError`` (one line, nothing touched) when ``out`` is a file or under
    one, holds anything but an earlier ``kind`` output, or is being written by another
    run. Claiming a folder this process already holds yields the same object. A
    symbolic link ``out`` is followed: its target is claimed (and the link kept)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}; got {kind!r}")
    key = _resolve(out)[0].absolute()
    if key in _HELD:
        yield _HELD[key]
        return
    out = check_output(out, kind)  # the folder to write: a symbolic link's target
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"--out {out}: a part of {out.parent} is a file, not a folder; pass another --out") from None
    except PermissionError:
        raise ValueError(f"--out {out}: cannot create {out.parent} (permission denied); pass another --out") from None
    fd, lock = _take_lock(out)
    try:
        folder = OutputFolder(out, kind)
        folder.recovered = recover(out, kind)
        check_output(out, kind)  # again: a restored folder must pass too
        _HELD[key] = folder
        try:
            yield folder
        finally:
            _HELD.pop(key, None)
    finally:
        _release_lock(fd, lock)
