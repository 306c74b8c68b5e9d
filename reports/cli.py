"""The ``headscope`` command line.

Each subcommand lives in its own module (``headscope.reports.cmd_*``) exposing
``register(subparsers)``; this file only assembles them and turns errors into one line
on stderr with exit code 2 (``--debug`` shows the traceback).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

COMMAND_MODULES = [
    "headscope.reports.cmd_card",
    "headscope.reports.cmd_capture",
    "headscope.reports.cmd_roles",
    "headscope.reports.cmd_prune",
    "headscope.reports.cmd_report",
    "headscope.reports.cmd_diff",
    "headscope.reports.cmd_bench",
    "headscope.reports.cmd_doctor",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue  # command not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from headscope.probes.allocator import tune_allocator

    tune_allocator()  # large pattern tensors reuse heap blocks instead of fresh mmaps (see the module)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.trust_remote_code:
        os.environ["HEADSCOPE_TRUST_REMOTE_CODE"] = "1"
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
        if isinstance(e, (HeadscopeError, ValueError, TypeError, FileNotFoundError, IsADirectoryError, PermissionError, KeyError)):
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if isinstance(e, KeyError):
                msg = msg.strip("'\"")
            print(f"headscope: error: {msg}", file=sys.stderr)
            return 2
        print(f"headscope: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
