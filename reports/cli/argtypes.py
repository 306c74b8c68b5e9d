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
from typing import TYPE_CHECKING

from headscope.analyses.roles.config import MAX_SEED  # one bound for the CLI and the configs

if TYPE_CHECKING:
    import torch

__all__ = [
    "BACKENDS",
    "DTYPES",
    "MAX_SEED",
    "add_backend",
    "add_device",
    "add_dtype",
    "fraction",
    "int_at_least",
    "load_from_args",
    "positive_int",
    "resolve_device",
    "seed",
    "unit_interval",
]

#: ``--backend`` of every command that loads a model
BACKENDS = ("auto", "inhouse", "hf", "bridge")

#: ``--dtype`` of every command that loads a model (weights and activations; softmax and norms stay fp32)
DTYPES = ("fp32", "bf16", "fp16")


def add_backend(parser) -> None:
    """The one ``--backend`` flag (default ``auto``: in-house where it covers the family, else
    HF, else the transformer-lens bridge; the choice is printed and recorded in run.json)."""
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="auto (default): in-house where it covers the family, else hf, else bridge",
    )


def add_device(parser, *, device_map: bool = False) -> None:
    """The one ``--device`` flag (default ``auto``: ``cuda`` when CUDA is available, else
    ``cpu``; checked by :func:`resolve_device` when the command runs). ``device_map``
    adds ``--device-map auto`` (the HF backend spreads a checkpoint over every GPU
    through accelerate)."""
    parser.add_argument(
        "--device",
        default="auto",
        metavar="DEVICE",
        help="auto (default: cuda when available, else cpu), cpu, cuda or cuda:N",
    )
    if device_map:
        parser.add_argument(
            "--device-map",
            choices=("auto",),
            default=None,
            help="auto: the hf backend spreads a checkpoint too large for one GPU over all of them (needs accelerate)",
        )


def add_dtype(parser, default: str = "fp32") -> None:
    """The one ``--dtype`` flag: fp32 (default), bf16 or fp16 weights and activations
    (softmax and norms in fp32, as HF does)."""
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=default,
        help="weights and activations: fp32 (default), bf16 or fp16 (softmax and norms stay fp32); "
        "compare with an fp32 run by headscope diff",
    )


def load_from_args(args, device):
    """The model a command's arguments name: ``args.model`` on ``args.backend`` in ``args.dtype``
    on ``device`` (or spread by ``args.device_map`` where the command has it)."""
    from headscope.probes.models.loading import load_model

    return load_model(
        args.model,
        args.backend,
        dtype=args.dtype,
        device=device,
        device_map=getattr(args, "device_map", None),
        trust_remote_code=args.trust_remote_code,
    )


def resolve_device(text) -> torch.device:
    """``--device`` as a ``torch.device``: ``auto`` is ``cuda`` when CUDA is available, else
    ``cpu``; ``cpu``, ``cuda`` and ``cuda:N`` are checked against this machine. A
    ``ValueError`` of one line for anything else (the CLI prints it, exit 2).

    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_device("tpu")
    Traceback (most recent call last):
    ...
    ValueError: --device must be auto, cpu, cuda or cuda:N; got 'tpu'
    """
    import torch

    raw = str(text).strip().lower()
    if raw == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, _, index = raw.partition(":")
    if not ((raw == "cpu") or (kind == "cuda" and (not _ or index.isdigit()))):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N; got {str(text)[:40]!r}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"--device {raw}: CUDA is not available on this machine (torch {torch.__version__}); "
                "use --device cpu or auto"
            )
        n = torch.cuda.device_count()
        if index and int(index) >= n:
            raise ValueError(f"--device {raw}: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}")
    return torch.device(raw)


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
