"""The ``headscope`` command line: :mod:`.app` assembles one module per command."""

from headscope.reports.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
