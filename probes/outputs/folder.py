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
   (:func:`recover`).

A folder headscope stages (``<out>.tmp-<pid>``) carries a marker file,
``.headscope-staging`` (JSON: ``headscope``, ``kind``, ``out``, ``pid``), and ``out`` gets one
just before it is swapped out; :func:`recover` deletes or moves back only what carries
that marker, or what is an earlier output of the same kind with nothing else in it. A
folder of the user's that merely has such a name is left as it is (one warning line).

``--out`` may be an empty folder (``mktemp -d``, ``TemporaryDirectory()``, ``.``): it is
claimed like a missing one. A ``--out`` that is a symbolic link is followed: the folder it
points to is checked, locked and replaced under the same rules, and the link is left as
it is. An empty ``--out`` and a mount point (which cannot be swapped) are refused.

Files are created with the usual permissions (``0666 & ~umask``; folders ``0777 &
~umask``), not the ``0600`` of a bare temporary file.

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
import ctypes
import errno
import fcntl
import fnmatch
import json
import logging
import os
import re
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: written into every manifest: ``{"output": {"kind": ..., "format": OUTPUT_FORMAT}}``
#: 2: role tables gained p_raw, test, interval, family, meets_threshold; roles folders coref_pairs
OUTPUT_FORMAT = 2


@dataclass(frozen=True)
class OutputKind:
    """What one kind of output folder holds.

    ``manifests``: files that identify the kind (the first one found is read);
    ``legacy_keys``: keys a manifest written before ``output`` was recorded must hold;
    ``entries``: glob patterns of the top-level names the kind writes; ``subfolders``:
    folder name -> glob patterns of the names inside it."""

    name: str
    manifests: tuple[str, ...]
    legacy_keys: tuple[frozenset, ...]
    entries: tuple[str, ...]
    subfolders: tuple[tuple[str, tuple[str, ...]], ...] = ()


_FRAME = ("*.csv", "*.parquet")
KINDS: dict[str, OutputKind] = {
    "report": OutputKind(
        "report",
        ("run.json",),
        (frozenset({"tables", "card", "model"}),),
        ("run.json", "report.html", "report.md", "tables", "figures"),
        (("tables", _FRAME), ("figures", ("*.png",))),
    ),
    "roles": OutputKind(
        "roles",
        ("run.json",),
        (frozenset({"roles", "config", "n_items", "model"}),),
        (
            "run.json",
            "skipped.json",
            "examples.json",
            *(
                f"{stem}.{ext}"
                for stem in ("roles", "head_stats", "clusters", "roles_by_head", "coref_pairs")
                for ext in ("csv", "parquet")
            ),
        ),
    ),
    "prune": OutputKind(
        "prune",
        ("state.json", "run.json"),
        (frozenset({"version", "config", "curves", "done"}), frozenset({"config", "model", "summary"})),
        (
            "state.json",
            "run.json",
            *(
                f"{stem}.{ext}"
                for stem in (
                    "baseline",
                    "ablation",
                    "all_but_one",
                    "importance",
                    "roles",
                    "curves",
                    "curve_summary",
                    "prunable",
                )
                for ext in ("csv", "parquet")
            ),
        ),
    ),
    "patch": OutputKind(
        "patch",
        ("run.json",),
        (),
        ("run.json", "patch.csv", "patch.parquet", "figures"),
        (("figures", ("*.png",)),),
    ),
    "diff": OutputKind(
        "diff",
        ("diff.json",),
        (frozenset({"run_a", "run_b", "tables"}),),
        ("diff.json", "tables", "figures"),
        (("tables", _FRAME), ("figures", ("*.png",))),
    ),
}

# a temporary file left by a killed atomic write: ".<name>.<8 random chars>.tmp[<suffix>]"
_ATOMIC_TMP = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]{8}\.tmp(\.[A-Za-z0-9]+)?$")

#: the marker of a folder headscope is staging or swapping out (see the module docstring)
MARKER = ".headscope-staging"


def out_argument(text: str) -> str:
    """``type=`` of every command's ``--out``: an empty value names no folder (it used to
    mean the default place, or ``.``), so it is refused before anything runs.

    >>> out_argument("runs/roles")
    'runs/roles'
    """
    if text == "":
        raise argparse.ArgumentTypeError("must name a folder; got '' (leave --out off for the command's default)")
    return text


def umask() -> int:
    """The process umask, read without changing it where /proc allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    return 0o666 & ~umask()


def folder_mode() -> int:
    return 0o777 & ~umask()


def _is_atomic_leftover(name: str, kind: OutputKind, patterns: tuple[str, ...]) -> bool:
    m = _ATOMIC_TMP.match(name)
    return bool(m) and any(fnmatch.fnmatchcase(m.group("name"), p) for p in patterns)


def _foreign_entries(out: Path, kind: OutputKind) -> list[str]:
    """Entries of ``out`` that ``kind`` does not write (``sub/name`` inside subfolders)."""
    subs = dict(kind.subfolders)
    foreign = []
    for entry in sorted(out.iterdir(), key=lambda p: p.name):
        name = entry.name
        if name == MARKER and _marker(out) is not None:
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
                        or _is_atomic_leftover(inner.name, kind, subs[name])
                    )
                )
                if not ok:
                    foreign.append(f"{name}/{inner.name}")
        elif entry.is_file() and (
            name in kind.entries and name not in subs or _is_atomic_leftover(name, kind, kind.entries)
        ):
            continue
        else:
            foreign.append(name + ("/" if entry.is_dir() else ""))
    return foreign


def output_kind_of(out: Path) -> str | None:
    """The kind of headscope output ``out`` holds according to its manifest, or None."""
    for kind in KINDS.values():
        for manifest in kind.manifests:
            path = out / manifest
            if not path.is_file():
                continue
            try:
                meta = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(meta, dict):
                continue
            declared = meta.get("output")
            if isinstance(declared, dict) and declared.get("kind") in KINDS:
                return declared["kind"]
            if any(keys <= meta.keys() for keys in kind.legacy_keys):
                return kind.name
    return None


def _few(names: list[str], k: int = 5) -> str:
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


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
        entries = [e for e in out.iterdir() if e.name != MARKER or _marker(out) is None]
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
    foreign = _foreign_entries(out, spec)
    if foreign:
        raise ValueError(
            f"--out {label} holds an earlier {kind} output but also {_few(foreign)}, which headscope does not write; "
            "move them away or pass another --out (nothing was touched)"
        )
    return out


# ---------------------------------------------------------------- markers: what headscope provably wrote


def _marker(folder: Path) -> dict | None:
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


def _mark(folder: Path, out: Path, kind: str) -> None:
    """Write the staging marker of this process into ``folder`` (which stages or is ``out``)."""
    data = json.dumps({"headscope": "staging", "kind": kind, "out": out.name, "pid": os.getpid()}, sort_keys=True)
    fd = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, file_mode())
    try:
        os.write(fd, data.encode("utf-8") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def _unmark(folder: Path) -> None:
    if _marker(folder) is not None:
        (folder / MARKER).unlink(missing_ok=True)


def _why_not_ours(folder: Path, out_name: str, pid: int) -> str | None:
    """None when headscope provably wrote ``folder`` (``<out>.tmp-<pid>`` / ``<out>.old-<pid>``):
    it carries the marker of run ``pid`` into ``out_name``, or its manifest says it is an
    earlier headscope output; and it holds nothing that kind does not write. Else why not."""
    if folder.is_symlink() or not folder.is_dir():
        return "it is not a folder (a link or a file)"
    mark = _marker(folder)
    if mark is not None and mark["out"] == out_name and mark["pid"] == pid:
        found = mark["kind"]
    else:
        found = output_kind_of(folder)
        if found is None:
            try:
                names = sorted(e.name + ("/" if e.is_dir() else "") for e in folder.iterdir())
            except OSError:
                names = []
            held = f" (it holds {_few(names)})" if names else " (it is empty)"
            return f"it carries neither headscope's {MARKER} marker nor the manifest of a headscope output{held}"
    try:
        foreign = _foreign_entries(folder, KINDS[found])
    except OSError as e:
        return f"it cannot be read ({e.strerror})"
    if foreign:
        return f"it holds {_few(foreign)}, which headscope does not write"
    return None


# ---------------------------------------------------------------- swapping folders in

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
    why = _why_not_ours(previous, out.name, os.getpid())
    if why is None:
        shutil.rmtree(previous, ignore_errors=True)
        return
    _unmark(previous)
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
            _mark(out, out, kind)
        except OSError:  # a folder we may not write into: swapped unmarked (kept, not deleted, if a kill leaves it)
            pass
    try:
        swapped = exchange(tmp, out)
    except BaseException:
        _unmark(out)
        raise
    if swapped:
        _discard(tmp, out, kind)  # now the previous folder
        return
    old = out.with_name(f"{out.name}.old-{os.getpid()}")
    try:
        if old.exists() or old.is_symlink():  # left by an earlier process with this pid
            why = _why_not_ours(old, out.name, os.getpid()) if kind is not None else None
            if why is not None:
                raise ValueError(f"{old} is in the way of the swap and is not headscope's: {why}; move it away")
            shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    except BaseException:
        _unmark(out)
        raise
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        _unmark(out)
        raise
    _discard(old, out, kind)


def _pid_alive(pid: int) -> bool:
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
    earlier headscope output, and hold nothing else (:func:`_why_not_ours`); anything
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
        if pid == os.getpid() or _pid_alive(pid):
            continue
        why = _why_not_ours(path, out.name, pid)
        if why is not None:
            done.append(f"left {name} alone: it is named like a folder headscope stages, but {why}")
        elif what == "old" and not out.exists() and not out.is_symlink():  # what was at out before that run
            os.replace(path, out)
            _unmark(out)
            done.append(f"restored the previous output {out} from {name} (a run was killed while swapping)")
        else:
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {name}, left by a killed run")
    mark = _marker(out) if out.is_dir() and not out.is_symlink() else None
    if mark is not None and mark["pid"] != os.getpid() and not _pid_alive(mark["pid"]):
        (out / MARKER).unlink(missing_ok=True)
        done.append(f"removed {out.name}/{MARKER}, left by a run killed while swapping")
    if kind is not None and out.is_dir():
        spec = KINDS[kind]
        for entry in sorted(out.iterdir()):
            if entry.is_file() and _is_atomic_leftover(entry.name, spec, spec.entries):
                entry.unlink(missing_ok=True)
                done.append(f"removed {out.name}/{entry.name}, left by a killed write")
    for line in done:
        log.warning(line)
    return done


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
            why = _why_not_ours(tmp, self.out.name, os.getpid())
            if why is not None:
                raise ValueError(f"{tmp} is in the way (headscope stages --out there) and is not headscope's: {why}")
            shutil.rmtree(tmp)
        check_output(self.out, self.kind)  # unchanged since the claim, unless someone wrote into it meanwhile
        tmp.mkdir(mode=folder_mode())
        try:
            _mark(tmp, self.out, self.kind)
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


def manifest_header(kind: str) -> dict:
    """The ``output`` entry of a manifest: ``{"output": {"kind": kind, "format": OUTPUT_FORMAT}}``."""
    return {"output": {"kind": kind, "format": OUTPUT_FORMAT}}
