"""The ``headscope`` command line.

Each subcommand lives in its own module (``headscope.reports.cli.<command>``) exposing
``register(subparsers)``; this file only assembles them and turns errors into one line
on stderr with exit code 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys

#: OSErrors that say something about the machine (disk full, read-only, too many files),
#: reported as one line with exit 2 like any other bad input
_ENVIRONMENT_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EMFILE,
        errno.ENFILE,
        errno.ENAMETOOLONG,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.EXDEV,
        errno.ENOTEMPTY,
        errno.EIO,
        errno.ELOOP,
    }
)

COMMAND_MODULES = [
    "headscope.reports.cli.card",
    "headscope.reports.cli.capture",
    "headscope.reports.cli.roles",
    "headscope.reports.cli.prune",
    "headscope.reports.cli.patch",
    "headscope.reports.cli.qk",
    "headscope.reports.cli.report",
    "headscope.reports.cli.diff",
    "headscope.reports.cli.weights",
    "headscope.reports.cli.kv",
    "headscope.reports.cli.circuit",
    "headscope.reports.cli.bench",
    "headscope.reports.cli.doctor",
    "headscope.reports.cli.sweep",
    "headscope.reports.cli.validate",
    "headscope.reports.cli.stages",  # a command per registered stage without one of its own
]


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``headscope roles: error: argument --top: ...``)
    instead of the usage block; ``--help`` still shows the usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="headscope",
        description="What each attention head of a transformer does, and what happens when heads are removed.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow code shipped with a checkpoint to run (off by default; recorded in run.json)",
    )
    parser.add_argument(
        "--allow-download",
        action="store_true",
        help="let a MODEL that is a hub id (org/name) be fetched over the network (off by default: only shipped "
        "models and local paths)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from headscope.probes.allocator import tune_allocator

    tune_allocator()  # large pattern tensors reuse heap blocks instead of fresh mmaps (see the module)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad flag (2, one line already printed): a code, not an exception
        return e.code if isinstance(e.code, int) else 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.allow_download:
        os.environ["HEADSCOPE_ALLOW_DOWNLOAD"] = "1"
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("headscope: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI boundary: one line, exit 2
        from headscope.probes.errors import HeadscopeError

        if args.debug:
            raise
        if isinstance(
            e, (HeadscopeError, ValueError, TypeError, FileNotFoundError, IsADirectoryError, PermissionError, KeyError)
        ):
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if isinstance(e, KeyError):
                msg = msg.strip("'\"")
            print(f"headscope: error: {msg}", file=sys.stderr)
            return 2
        if isinstance(e, OSError) and e.errno in _ENVIRONMENT_ERRNOS:  # the machine, not headscope: one line, exit 2
            where = f": {e.filename}" if e.filename else ""
            hint = (
                " (free some space; earlier outputs are left as they were)"
                if e.errno in (errno.ENOSPC, errno.EDQUOT)
                else ""
            )
            print(f"headscope: error: {os.strerror(e.errno).lower()}{where}{hint}", file=sys.stderr)
            return 2
        print(
            f"headscope: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
