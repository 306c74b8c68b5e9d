"""Types for the command line's numeric flags: each checks one rule and names the value.

argparse calls them on the raw string; a bad value exits 2 with
``headscope <command>: error: argument --top: must be an integer >= 1; got '0'``
(after the usage line), before anything is read or loaded.

>>> positive_int("3"), seed("0"), fraction("0.5"), unit_interval("0")
(3, 0, 0.5, 0.0)
>>> try:
...     positive_int("0")
... except argparse.ArgumentTypeError as err:
...     print(err)
must be an integer >= 1; got '0'
"""

from __future__ import annotations

import argparse
import math

from headscope.analyses.roles.config import MAX_SEED  # one bound for the CLI and the configs

__all__ = ["BACKENDS", "MAX_SEED", "add_backend", "fraction", "int_at_least", "positive_int", "seed", "unit_interval"]

#: ``--backend`` of every command that loads a model
BACKENDS = ("auto", "inhouse", "hf", "bridge")


def add_backend(parser) -> None:
    """The one ``--backend`` flag (default ``auto``: in-house where it covers the family, else
    HF, else the transformer-lens bridge; the choice is printed and recorded in run.json)."""
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="auto (default): in-house where it covers the family, else hf, else bridge",
    )


def _int(text: str, rule: str) -> int:
    try:
        return int(text)
    except ValueError:  # also a literal past Python's digit limit
        raise argparse.ArgumentTypeError(f"must be {rule}; got {text[:40]!r}") from None


def int_at_least(low: int):
    """A type accepting integers ``>= low``."""

    def parse(text: str) -> int:
        value = _int(text, f"an integer >= {low}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}; got {text[:40]!r}")
        return value

    parse.__name__ = f"int_at_least_{low}"
    return parse


positive_int = int_at_least(1)


def seed(text: str) -> int:
    """A seed: an integer in ``[0, 2**32 - 1]``."""
    rule = "an integer in [0, 2**32 - 1]"
    value = _int(text, rule)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be {rule}; got {text[:40]!r}")
    return value


def _float(text: str, rule: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {rule}; got {text[:40]!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be {rule}; got {text[:40]!r}")
    return value


def fraction(text: str) -> float:
    """A fraction in ``(0, 1]`` (e.g. a pruning step)."""
    rule = "a number in (0, 1]"
    value = _float(text, rule)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be {rule}; got {text[:40]!r}")
    return value


def unit_interval(text: str) -> float:
    """A number in ``[0, 1]`` (e.g. a margin over a baseline score)."""
    rule = "a number in [0, 1]"
    value = _float(text, rule)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be {rule}; got {text[:40]!r}")
    return value
