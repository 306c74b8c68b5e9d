"""The bench's configuration: what to run, on what, how many times."""

from __future__ import annotations

from dataclasses import dataclass

from headscope.reports.tools.bench.machine import check_device
from headscope.reports.tools.bench.registry import unknown_path

__all__ = ["BenchConfig"]


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """``model``: shipped name or path; ``n_sentences`` and ``batch_size`` shape the batches;
    ``dtype``: ``"fp32"`` or ``"bf16"`` for the model paths; ``repeats``: timed rounds (the
    fastest is reported, the median kept); ``paths``: names of
    :data:`~headscope.reports.tools.bench.registry.PATHS` (None: all); ``corpus``: see
    :func:`~headscope.probes.corpora.bench_sentences.corpus_sentences`; ``device``: torch
    device string; ``peak_size`` and ``peak_seconds``: the matmul loop that measures the
    peak; ``prune_items``: items of the ``quick_pruning`` paths' metric (None: the quick
    stage's 24). Raises ``ValueError`` for a value out of range or an unknown path.

    >>> BenchConfig(paths=["hf_sdpa"]).paths
    ('hf_sdpa',)
    """

    model: str = "minilm-l6"
    n_sentences: int = 512
    batch_size: int = 64
    dtype: str = "fp32"
    repeats: int = 3
    paths: tuple[str, ...] | None = None
    corpus: str = "generated"
    seed: int = 0
    device: str = "cpu"
    peak_seconds: float = 1.0
    peak_size: int = 2048
    prune_items: int | None = None

    def __post_init__(self):
        if self.prune_items is not None and (
            isinstance(self.prune_items, bool) or not isinstance(self.prune_items, int) or self.prune_items < 2
        ):
            raise ValueError(
                f"The 'prune_items' parameter of BenchConfig must be None or an int >= 2; got {self.prune_items!r}."
            )
        for k in ("n_sentences", "batch_size", "repeats", "peak_size"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"The {k!r} parameter of BenchConfig must be a positive int; got {v!r}.")
        if self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"The 'dtype' parameter of BenchConfig must be 'fp32' or 'bf16'; got {self.dtype!r}.")
        if self.paths is not None:
            object.__setattr__(self, "paths", tuple(self.paths))
            message = unknown_path(self.paths)
            if message:
                raise ValueError(message)
        check_device(self.device)
