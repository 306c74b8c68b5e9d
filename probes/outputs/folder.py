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

import ctypes
import errno
import fcntl
import fnmatch
import json
import logging
import os
import re
import shutil
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


def check_output(out, kind: str) -> Path:
    """Raise ``ValueError`` (one line) unless ``kind`` may write ``out``; return it as a Path.

    Allowed: ``out`` does not exist (its parent must be a folder or creatable), is an
    empty folder, or is an earlier ``kind`` output with nothing else in it."""
    spec = KINDS[kind]
    out = Path(out)
    for parent in [out, *out.parents]:
        if parent.exists() or parent.is_symlink():
            if parent != out and not parent.is_dir():
                raise ValueError(f"--out {out}: {parent} is a file, not a folder; pass another --out")
            break
    if not out.exists():
        return out
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; pass another --out (nothing was written)")
    try:
        entries = list(out.iterdir())
    except PermissionError:
        raise ValueError(f"--out {out}: the folder cannot be read (permission denied); pass another --out") from None
    if not entries:
        return out
    found = output_kind_of(out)
    if found is None:
        raise ValueError(
            f"--out {out} exists and is not a headscope {kind} output (no {' or '.join(spec.manifests)} of one); "
            "pass another --out or empty it (only an earlier output of the same kind is replaced)"
        )
    if found != kind:
        raise ValueError(
            f"--out {out} holds a headscope {found} output; {kind} does not replace it; pass another --out"
        )
    foreign = _foreign_entries(out, spec)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(
            f"--out {out} holds an earlier {kind} output but also {shown}, which headscope does not write; "
            "move them away or pass another --out (nothing was touched)"
        )
    return out


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


def swap_in(tmp: Path, out: Path) -> None:
    """Put the finished folder ``tmp`` at ``out``. An existing ``out`` is exchanged with
    ``tmp`` in one step and then deleted; where the system has no exchange, it is moved
    to ``<out>.old-<pid>`` first (restored by :func:`recover` if the run dies there)."""
    if not out.exists():
        os.rename(tmp, out)
        return
    if exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # now the previous folder
        return
    old = out.with_name(f"{out.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover(out: Path, kind: str | None = None) -> list[str]:
    """Tidy what a killed run left beside (and, for ``prune``, inside) ``out``; returns
    what was done, one line each (also logged as warnings).

    ``<out>.tmp-<pid>`` (never complete, or the previous folder after an exchange) is
    deleted once that process is gone; ``<out>.old-<pid>`` with no ``out`` (killed
    between the two renames where there is no exchange) is moved back; in a pruning
    folder, the ``.<name>.xxxxxxxx.tmp`` files of killed atomic writes are deleted."""
    done = []
    for stale in sorted(out.parent.glob(f"{out.name}.old-*")) + sorted(out.parent.glob(f"{out.name}.tmp-*")):
        what, _, pid = stale.name[len(out.name) + 1 :].partition("-")
        if not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        if what == "old" and not out.exists():  # what was at out before that run: put it back, whatever it holds
            os.replace(stale, out)
            done.append(f"restored the previous output {out} from {stale.name} (a run was killed while swapping)")
        else:
            shutil.rmtree(stale, ignore_errors=True)
            done.append(f"removed {stale.name}, left by a killed run")
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
    """A claimed output folder (see :func:`claim_output`)."""

    def __init__(self, out: Path, kind: str):
        self.out = out
        self.kind = kind
        self.recovered: list[str] = []

    @contextmanager
    def staging(self):
        """Yield an empty folder beside ``out``; on success it replaces ``out`` whole."""
        tmp = self.out.with_name(f"{self.out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        check_output(self.out, self.kind)  # unchanged since the claim, unless someone wrote into it meanwhile
        try:
            tmp.mkdir(mode=folder_mode())
            yield tmp
            swap_in(tmp, self.out)
        except BaseException:
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
    run. Claiming a folder this process already holds yields the same object."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}; got {kind!r}")
    out = Path(out)
    key = out.absolute()
    if key in _HELD:
        yield _HELD[key]
        return
    check_output(out, kind)
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
