"""Types for the command line's numeric flags: each checks one rule and names the value.

argparse calls them on the raw string; a bad value exits 2 with
``headscope <command>: error: argument --top: must be an integer >= 1; got '0'``
(after the usage line), before anything is read or loaded.

Every count has an upper bound too (``MAX_*`` below), so an absurd value is refused in
one line instead of running for hours or allocating what no machine holds; list-valued
flags (``--layers 0,2``, ``--receiver 1.1``) are parsed here as well.

>>> positive_int("3"), seed("0"), fraction("0.5"), unit_interval("0")
(3, 0, 0.5, 0.0)
>>> try:
...     positive_int("0")
... except argparse.ArgumentTypeError as err:
...     print(err)
must be an integer >= 1; got '0'
>>> try:
...     batch_size("1000000000000000000")
... except argparse.ArgumentTypeError as err:
...     print(err)
must be an integer <= 65536 (items or rows per forward pass); got '1000000000000000000'
>>> layer_list("0,2,5"), head("1.3")
((0, 2, 5), (1, 3))
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
    "MAX_BATCH",
    "MAX_CONTEXT",
    "MAX_LISTED",
    "MAX_REPEATS",
    "MAX_SEED",
    "MAX_SEEDS",
    "MAX_SENTENCES",
    "MAX_SEQ_LEN",
    "add_backend",
    "add_device",
    "add_dtype",
    "add_ray",
    "batch_size",
    "cap_note",
    "fraction",
    "head",
    "int_at_least",
    "int_in",
    "layer_list",
    "listed",
    "load_from_args",
    "print_rejected",
    "ray_config",
    "ray_in_driver",
    "ray_pool",
    "positive_int",
    "resolve_device",
    "seed",
    "unit_interval",
]

#: items (or rows) per forward pass: ``--batch-size``, ``--max-rows``, ``bench --batch``
MAX_BATCH = 1 << 16
#: tokens of context (``card --context``): past any model's
MAX_CONTEXT = 1 << 32
#: heads listed or compared (``--top``, ``--top-k``, ``--top-heads``): more than any model has
MAX_LISTED = 1 << 16
#: random-order seeds of a pruning study (``prune --seeds``; each is a whole pruning curve)
MAX_SEEDS = 1000
#: sentences of a bench corpus (``bench --sentences``, ``--memory-sizes``)
MAX_SENTENCES = 1_000_000
#: timed rounds per bench path (``bench --repeats``)
MAX_REPEATS = 1000
#: tokens of a generated sequence (``patch --seq-len``): past any model's context; the
#: model's own context is checked when it loads
MAX_SEQ_LEN = 1 << 20

#: ``--backend`` of every command that loads a model
BACKENDS = ("auto", "inhouse", "hf", "bridge")

#: ``--dtype`` of every command that loads a model (weights and activations; softmax and norms stay fp32)
DTYPES = ("fp32", "bf16", "fp16")


def add_backend(parser) -> None:
    """The one ``--backend`` flag (default ``auto``: the first of in-house, HF and the
    transformer-lens bridge that loads the checkpoint and passes its load-time probe; the
    choice and every rejected backend are printed and recorded in run.json)."""
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="auto (default): the first of inhouse, hf, bridge that loads the model and passes "
        "its load-time probe (in-house: patterns equal HF eager's)",
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


#: ``--workers``: past this, a count is refused before Ray starts (the cluster's CPUs bound it further)
MAX_RAY_WORKERS = 4096


def add_ray(parser) -> None:
    """``--ray``, ``--workers N``, ``--ray-address ADDR`` and ``--worker-threads N`` of every command
    that runs report stages: the stages that shard run on Ray workers
    (:mod:`~headscope.reports.stages.sharded`); :func:`ray_config` reads them. Without ``--ray``
    nothing imports Ray."""
    parser.add_argument(
        "--ray",
        action="store_true",
        help="run the stages that shard (docs: guide/ray) on Ray workers and merge them exactly "
        "(needs pip install 'headscope[ray]')",
    )
    parser.add_argument(
        "--workers",
        type=int_in(1, MAX_RAY_WORKERS, "Ray workers"),
        default=None,
        metavar="N",
        help="Ray workers, each loading the model once (default: one per CPU of the cluster; with --ray)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="join an existing Ray cluster (HOST:PORT, ray://HOST:PORT or auto; default: start a local one; with --ray)",
    )
    parser.add_argument(
        "--worker-threads",
        type=int_in(1, MAX_RAY_WORKERS, "torch threads per Ray worker"),
        default=None,
        metavar="N",
        help="torch threads (and Ray CPUs) of each worker (default: the cluster's CPUs // --workers); gradient "
        "sums depend on it: compare with a run on as many threads (with --ray)",
    )


def ray_config(args):
    """The :class:`~headscope.reports.stages.sharded.RayConfig` of ``--ray`` (None without it;
    ``--workers`` or ``--ray-address`` without ``--ray`` refused in one line)."""
    if not args.ray:
        flags = (
            ("--workers", args.workers),
            ("--ray-address", args.ray_address),
            ("--worker-threads", getattr(args, "worker_threads", None)),
        )
        given = [f for f, v in flags if v is not None]
        if given:
            raise ValueError(
                f"{' and '.join(given)} {'go' if len(given) > 1 else 'goes'} with --ray; add --ray or leave them out"
            )
        return None
    from headscope.reports.stages.sharded import RayConfig

    return RayConfig(workers=args.workers, address=args.ray_address, threads=getattr(args, "worker_threads", None))


def ray_pool(args):
    """A context manager holding the command's Ray workers under ``--ray``
    (:func:`~headscope.reports.stages.command_shards.command_pool`: connected on entry, before the
    model loads, closed on exit), yielding None without it; the workers load ``args.model`` on
    the command's ``--backend``, ``--dtype``, ``--device`` and ``--trust-remote-code``."""
    from headscope.reports.stages.command_shards import command_pool

    load = {
        "backend": getattr(args, "backend", "auto"),  # a command without --backend: the first that loads it
        "dtype": getattr(args, "dtype", "fp32"),
        "trust_remote_code": getattr(args, "trust_remote_code", False),
        "device": resolve_device(args.device).type if getattr(args, "device", None) else None,
    }
    return command_pool(ray_config(args), args.model, **load)


def ray_in_driver(args, command: str, why: str):
    """The :func:`ray_config` of a command whose work has no stage split: with ``--ray`` the flags
    are checked as a sharded command checks them (Ray installed, else one line naming the extra;
    ``--ray-address`` reachable; ``--workers`` within this machine's cores when no address is
    given), no worker is started, and one line on stderr says the work runs in the driver
    (``why``: what has no split). Returns the config (None without ``--ray``)."""
    ray = ray_config(args)
    if ray is None:
        return None
    import sys

    from headscope.reports.stages.sharded import preflight

    preflight(ray)
    print(f"note: {command} --ray: {why}; it runs in the driver, without Ray workers", file=sys.stderr)
    return ray


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

    model = load_model(
        args.model,
        args.backend,
        dtype=args.dtype,
        device=device,
        device_map=getattr(args, "device_map", None),
        trust_remote_code=args.trust_remote_code,
    )
    if not (getattr(args, "quiet", False) or getattr(args, "json", False)):
        print_rejected(model)
    return model


def print_rejected(model) -> None:
    """Each backend ``--backend auto`` rejected, with its reason (``model.backend_rejected``), one
    line each on stderr (the library prints nothing; run.json records them)."""
    import sys

    for r in getattr(model, "backend_rejected", ()):
        print(f"backend auto: rejected {r['backend']} ({r['reason']})", file=sys.stderr)


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
    parse.low, parse.high = low, None  # read by the tests that go through every count flag
    return parse


positive_int = int_at_least(1)


def int_in(low: int, high: int, what: str):
    """A type accepting integers in ``[low, high]``; ``what`` says what the count counts
    (named in the message for a value past ``high``)."""

    def parse(text: str) -> int:
        value = _int(text, f"an integer >= {low}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}; got {text[:40]!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be an integer <= {high} ({what}); got {text[:40]!r}")
        return value

    parse.__name__ = f"int_in_{low}_{high}"
    parse.low, parse.high = low, high
    return parse


batch_size = int_in(1, MAX_BATCH, "items or rows per forward pass")
listed = int_in(1, MAX_LISTED, "heads listed")


def cap_note(flag: str, asked: int, holds: int, what: str) -> str:
    """The one-line note of a count capped at what the data holds.

    >>> cap_note("--n-items", 3000, 2304, "task agreement")
    '--n-items 3000: task agreement holds 2304 items; using all 2304'
    """
    return f"{flag} {asked}: {what} holds {holds} item{'s' if holds != 1 else ''}; using all {holds}"


def layer_list(text: str) -> tuple[int, ...]:
    """``--layers``: comma-separated layer indices (integers >= 0), e.g. ``0,2,5``; the
    model's range is checked when it loads."""
    rule = "comma-separated layer indices (integers >= 0, e.g. 0,2,5)"
    parts = [x.strip() for x in str(text).split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError(f"must be {rule}; got {text[:40]!r}")
    out = []
    for x in parts:
        if not x.isascii() or not x.isdigit() or len(x) > 9:  # '', '-1', '1.5', 'a', a number past any model
            what = "an empty item" if not x else repr(x[:20])
            raise argparse.ArgumentTypeError(f"must be {rule}; got {text[:40]!r} ({what} is not a layer index)")
        out.append(int(x))
    return tuple(dict.fromkeys(out))


def head(text: str) -> tuple[int, int]:
    """``--receiver`` / ``--sender``: one head as ``LAYER.HEAD`` (two integers >= 0, e.g.
    ``1.1``); the model's range is checked when it loads."""
    parts = str(text).strip().split(".")
    if len(parts) != 2 or not all(x.isascii() and x.isdigit() and len(x) <= 9 for x in parts):
        raise argparse.ArgumentTypeError(f"must be LAYER.HEAD (two integers >= 0, e.g. 1.1); got {text[:40]!r}")
    return int(parts[0]), int(parts[1])


def seed(text: str) -> int:
    """A seed: an integer in ``[0, 2**32 - 1]``."""
    rule = "an integer in [0, 2**32 - 1]"
    value = _int(text, rule)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be {rule}; got {text[:40]!r}")
    return value


seed.low, seed.high = 0, MAX_SEED


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
