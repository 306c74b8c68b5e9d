"""Ray sharding of streaming reducers: the merged result equals one process's result."""

from __future__ import annotations

import functools
import importlib.util
import sys

import pytest
import torch

from headscope.data import path
from headscope.probes.capture import StreamReport, stream
from headscope.reports.tools.experiments.distributed import (
    AttentionMassReducer,
    ReducerSet,
    merge_reports,
    shard_bounds,
    stream_distributed,
)

HAS_RAY = importlib.util.find_spec("ray") is not None


# Streams of different batch composition (a split, Ray shards) pad items to different lengths, and float32 kernels
# (AVX-512 GEMM/softmax blocking) round differently for different shapes: MiniLM's patterns then differ by up to
# ~1e-6 (README: paths agree to 1e-5) and the row means here by 7e-8 to 1e-7 (0 with AVX2 kernels). A row mean of
# float32-derived values is good to a few float32 ulps of its size whatever the number of rows averaged, so the
# bound is 16 ulps of the largest mean (entropy, ~2.4 nats): 4.6e-6. The same captures split differently must merge
# to float64 rounding (sums of ~200 row values below 4: < 1e-12).
F32_ULPS = 16 * torch.finfo(torch.float32).eps


def _f32_tol(ref):
    return F32_ULPS * float(ref["value"].abs().max())


class _Keep:
    """A reducer that keeps the captures, to feed the same ones to other reducers."""

    def __init__(self):
        self.caps = []

    def update(self, cap):
        self.caps.append(cap)


def _corpus(n=30):
    lines = [l for l in path("text/sentences.txt").read_text(encoding="utf-8").splitlines() if l.strip()][:n]
    lines.insert(17, "   ")  # an empty item in the second shard: its skip must carry its corpus-wide index
    return lines


def test_shard_bounds_cover_the_corpus_without_overlap():
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_bounds(2, 5) == [(0, 1), (1, 2)]
    with pytest.raises(ValueError, match="n_shards"):
        shard_bounds(3, 0)


def test_merge_reports_sums_counts_and_sorts_skips():
    from collections import Counter

    a = StreamReport(
        n_items=5,
        n_used=4,
        skipped=Counter(empty=1),
        skipped_items=[(3, "empty")],
        n_batches=2,
        real_tokens=40,
        padded_tokens=4,
    )
    b = StreamReport(
        n_items=3,
        n_used=2,
        skipped=Counter(empty=1),
        skipped_items=[(1, "empty")],
        n_batches=1,
        real_tokens=20,
        padded_tokens=0,
    )
    m = merge_reports([a, b])
    assert (m.n_items, m.n_used, m.n_batches, m.real_tokens, m.padded_tokens) == (8, 6, 3, 60, 4)
    assert m.skipped == Counter(empty=2) and m.skipped_items == [(1, "empty"), (3, "empty")]
    assert m.padding_ratio == pytest.approx(4 / 60)


def test_merge_of_split_reducers_equals_whole(minilm):
    """Without Ray: reducers over two halves, merged, equal the reducer over the whole."""
    items = _corpus(12)
    whole, kept = AttentionMassReducer(), _Keep()
    stream(minilm, items, [whole, kept], batch_size=4)
    ref = whole.result()
    # the same captures split in two: merging is exact up to float64 rounding
    a, b = AttentionMassReducer(), AttentionMassReducer()
    for i, cap in enumerate(kept.caps):
        (a if i < 2 else b).update(cap)
    same = a.merge(b).result()
    assert (same["value"] - ref["value"]).abs().max() < 1e-12
    # two streams over the halves: other batches, other padding, float32 rounding (see F32_ULPS)
    a, b = AttentionMassReducer(), AttentionMassReducer()
    stream(minilm, items[:5], [a], batch_size=4)
    stream(minilm, items[5:], [b], batch_size=4)
    merged = a.merge(b).result()
    assert merged["n"].iloc[0] == ref["n"].iloc[0] == whole.rows
    assert (merged["value"] - ref["value"]).abs().max() <= _f32_tol(ref)
    # MiniLM's heads differ: some put much more of their mass on [CLS] than others
    mass = ref[ref.metric == "first_token_mass"]["value"]
    assert mass.max() - mass.min() > 0.3


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'headscope\[ray\]'"):
        stream_distributed("minilm-l6", ["a b c"], AttentionMassReducer)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'headscope[ray]')")
def test_ray_merge_equals_single_process(minilm):
    import ray

    from headscope.analyses.roles.positional import PositionalReducer

    items = _corpus()
    single_mass = AttentionMassReducer()
    single_pos = PositionalReducer(causal=False)
    rep1 = stream(minilm, items, [single_mass, single_pos], batch_size=8)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    try:
        factory = functools.partial(
            ReducerSet, mass=AttentionMassReducer, pos=functools.partial(PositionalReducer, causal=False)
        )
        both, rep = stream_distributed("minilm-l6", items, factory, n_shards=3, batch_size=8)
    finally:
        ray.shutdown()
    merged, pos = both["mass"], both["pos"]

    a, b = merged.result(), single_mass.result()
    assert len(a) == 2 * 6 * 12
    assert (a["value"] - b["value"]).abs().max() <= _f32_tol(b)  # other batch composition (see F32_ULPS)
    assert (a["n"] == b["n"]).all()
    assert rep.n_items == rep1.n_items == len(items) and rep.n_used == rep1.n_used == len(items) - 1
    assert rep.skipped_items == rep1.skipped_items == [(17, "empty")]
    assert rep.real_tokens == rep1.real_tokens

    vals_d, _, layers_d = pos.result()
    vals_s, _, layers_s = single_pos.result()
    assert tuple(layers_d) == tuple(layers_s)
    for bucket in vals_s:
        assert vals_d[bucket].shape == vals_s[bucket].shape
        assert torch.allclose(vals_d[bucket].double(), vals_s[bucket].double(), atol=1e-6, equal_nan=True)
