"""Swapping a finished folder in for the old one, and tidying what a killed run left.

:func:`swap_in` puts a staged folder at ``out`` in one atomic exchange (Linux
``renameat2(RENAME_EXCHANGE)``, :func:`exchange`), or with two renames where the file
system has none; :func:`recover` repairs what a run killed at any point left beside
``out``. Both touch only what :func:`~headscope.probes.outputs.markers.why_not_ours`
proves is headscope's.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
from pathlib import Path

from headscope.probes.outputs.kinds import KINDS, is_atomic_leftover
from headscope.probes.outputs.markers import MARKER, read_marker, remove_marker, why_not_ours, write_marker

log = logging.getLogger(__name__)

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()


def exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two existing paths; False where the system cannot."""
    if _RENAMEAT2 is None or os.environ.get("HEADSCOPE_NO_EXCHANGE") == "1":
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _discard(previous: Path, out: Path, kind: str | None) -> None:
    """Delete the folder that was at ``out`` before the swap, if headscope provably wrote it
    (it was checked when the run started; a file put into it since is kept, with a warning)."""
    if kind is None:
        shutil.rmtree(previous, ignore_errors=True)
        return
    why = why_not_ours(previous, out.name, os.getpid())
    if why is None:
        shutil.rmtree(previous, ignore_errors=True)
        return
    remove_marker(previous)
    log.warning(f"kept what was in {out} before this run at {previous}: {why} (it was put there during the run)")


def swap_in(tmp: Path, out: Path, kind: str | None = None) -> None:
    """Put the finished folder ``tmp`` at ``out``. An existing ``out`` is exchanged with
    ``tmp`` in one step and then deleted; where the system has no exchange, it is moved
    to ``<out>.old-<pid>`` first (restored by :func:`recover` if the run dies there).

    With ``kind`` (an output folder), ``out`` first gets this run's staging marker, so a
    run killed at any point leaves only folders :func:`recover` can prove are headscope's;
    and the previous folder is deleted only when it still holds nothing but what that
    kind writes (:func:`_discard`)."""
    if not out.exists():
        os.rename(tmp, out)
        return
    if kind is not None:
        try:
            write_marker(out, out, kind)
        except OSError:  # a folder we may not write into: swapped unmarked (kept, not deleted, if a kill leaves it)
            pass
    try:
        swapped = exchange(tmp, out)
    except BaseException:
        remove_marker(out)
        raise
    if swapped:
        _discard(tmp, out, kind)  # now the previous folder
        return
    old = out.with_name(f"{out.name}.old-{os.getpid()}")
    try:
        if old.exists() or old.is_symlink():  # left by an earlier process with this pid
            why = why_not_ours(old, out.name, os.getpid()) if kind is not None else None
            if why is not None:
                raise ValueError(f"{old} is in the way of the swap and is not headscope's: {why}; move it away")
            shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    except BaseException:
        remove_marker(out)
        raise
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        remove_marker(out)
        raise
    _discard(old, out, kind)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:  # not a pid this system can have
        return False
    return True


_STALE = re.compile(r"(?P<what>old|tmp)-(?P<pid>[0-9]{1,10})")


def recover(out: Path, kind: str | None = None) -> list[str]:
    """Tidy what a killed run left beside (and, for ``prune``, inside) ``out``; returns
    what was done, one line each (also logged as warnings).

    Only what headscope provably wrote is touched: a folder ``<out>.tmp-<pid>`` or
    ``<out>.old-<pid>`` whose process is gone must carry that run's staging marker or be an
    earlier headscope output, and hold nothing else (:func:`why_not_ours`); anything
    else with such a name is left as it is (one line says so). Then ``<out>.tmp-<pid>``
    (never complete, or the previous folder after an exchange) is deleted;
    ``<out>.old-<pid>`` with no ``out`` (killed between the two renames where there is no
    exchange) is moved back, else deleted; the marker a killed run left in ``out`` is
    removed; in a pruning folder, the ``.<name>.xxxxxxxx.tmp`` files of killed atomic
    writes are deleted."""
    out = Path(out)
    done = []
    prefix = out.name + "."
    try:
        names = [p.name for p in out.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        names = []
    stale = []
    for name in names:
        m = _STALE.fullmatch(name[len(prefix) :])
        if m:
            stale.append((m["what"] != "old", name, m["what"], int(m["pid"])))
    for _, name, what, pid in sorted(stale):  # every old-<pid> first: one may be the output to restore
        path = out.with_name(name)
        if pid == os.getpid() or pid_alive(pid):
            continue
        why = why_not_ours(path, out.name, pid)
        if why is not None:
            done.append(f"left {name} alone: it is named like a folder headscope stages, but {why}")
        elif what == "old" and not out.exists() and not out.is_symlink():  # what was at out before that run
            os.replace(path, out)
            remove_marker(out)
            done.append(f"restored the previous output {out} from {name} (a run was killed while swapping)")
        else:
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {name}, left by a killed run")
    mark = read_marker(out) if out.is_dir() and not out.is_symlink() else None
    if mark is not None and mark["pid"] != os.getpid() and not pid_alive(mark["pid"]):
        (out / MARKER).unlink(missing_ok=True)
        done.append(f"removed {out.name}/{MARKER}, left by a run killed while swapping")
    if kind is not None and out.is_dir():
        spec = KINDS[kind]
        for entry in sorted(out.iterdir()):
            if entry.is_file() and is_atomic_leftover(entry.name, spec, spec.entries):
                entry.unlink(missing_ok=True)
                done.append(f"removed {out.name}/{entry.name}, left by a killed write")
    for line in done:
        log.warning(line)
    return done
