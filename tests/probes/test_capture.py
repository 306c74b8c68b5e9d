"""The capture API: one call, token metadata, K/V un-expanded, streaming with buckets."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from headscope.probes.capture import Capture, buckets, capture, stream
from headscope.probes.errors import MemoryBudgetError


def test_capture_shapes_and_metadata(smollm, sentences):
    cap = capture(smollm, sentences, quantities=["pattern", "q", "k", "v", "q_rot", "k_rot", "z"], layers=[0, 29])
    b, n = cap.tokens.shape
    assert cap["pattern", 29].shape == (b, 9, n, n)
    assert cap["q", 0].shape == (b, 9, n, 64)
    assert cap["k", 0].shape == (b, 3, n, 64)  # un-expanded
    assert cap["z", 29].shape == (b, 9, n, 64)
    assert cap.kv_groups == {0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8]}
    assert not torch.allclose(cap["q", 0], cap["q_rot", 0])  # pre- vs post-RoPE
    # position 0 is not rotated: q_rot == q there
    assert torch.allclose(cap["q", 0][:, :, 0], cap["q_rot", 0][:, :, 0], atol=1e-6)
    with pytest.raises(KeyError, match="not captured"):
        cap["pattern", 5]


def test_capture_pattern_reproduces_from_q_and_k(minilm, sentences):
    """Our own q/k hooks and the pattern hook are consistent: softmax(q k^T / sqrt(d)) + mask."""
    cap = capture(minilm, sentences[:2], quantities=["pattern", "q", "k"], layers=[2])
    q, k = cap["q", 2], cap["k", 2]
    scores = q @ k.transpose(-1, -2) / 32**0.5
    scores = scores.masked_fill(~cap.key_mask[:, None, None, :], float("-inf"))
    assert (scores.softmax(-1) - cap["pattern", 2]).abs().max().item() < 1e-5


def test_word_ids_for_presplit_words(minilm):
    cap = capture(minilm, words=[["Heads", "attend", "."], ["Unbelievably", "so"]], layers=[0])
    assert cap.tokens.word_ids[0] == [None, 0, 1, 2, None]
    assert cap.tokens.word_ids[1][:3] == [None, 0, 0]  # "unbelievably" is several pieces
    assert cap.tokens.special[0] == [True, False, False, False, True]


def test_memory_guard_refuses_before_running(minilm, sentences):
    with pytest.raises(MemoryBudgetError, match="over the budget"):
        capture(minilm, sentences, memory_budget=1000)


def test_buckets_limit_padding():
    lengths = [30, 5, 29, 6, 31, 5, 7, 28]
    groups = buckets(lengths, max_batch=4)
    assert groups == [[1, 5, 3, 6], [7, 2, 0, 4]]
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    unsorted = sum(4 * max(lengths[i : i + 4]) for i in range(0, 8, 4))
    assert padded < unsorted


class FirstTokenMass:
    """Per-head attention mass on the first token, summed over real queries (mergeable)."""

    def __init__(self):
        self.total, self.count = None, 0

    def update(self, cap: Capture):
        p = cap.stack("pattern")[..., 0]  # [layer, batch, head, query_pos]
        m = cap.key_mask[None, :, None, :].float()
        s = (p * m).sum(dim=(1, 3))
        self.total = s if self.total is None else self.total + s
        self.count += int(cap.key_mask.sum())

    def merge(self, other):
        self.total, self.count = self.total + other.total, self.count + other.count
        return self

    def result(self):
        return self.total / self.count


def test_stream_equals_one_big_capture_and_counts_skips(minilm, sentences):
    items = sentences + ["", "word " * 600]  # one empty, one past the 512-token context
    red = FirstTokenMass()
    report = stream(minilm, items, [red], batch_size=2)
    assert report.n_items == 7 and report.n_used == 5
    assert dict(report.skipped) == {"empty": 1, "longer than context": 1}
    assert [i for i, _ in report.skipped_items] == [5, 6]
    big = FirstTokenMass()
    big.update(capture(minilm, sentences))
    assert torch.allclose(red.result(), big.result(), atol=1e-6)
    assert report.padding_ratio < 0.2


def test_stream_over_a_generator_in_small_windows_equals_the_list(minilm, sentences):
    items = ["", *sentences, "word " * 600, *sentences[:2]]
    whole, windowed = FirstTokenMass(), FirstTokenMass()
    seen = []
    rep_list = stream(minilm, items, [whole], batch_size=2)
    rep_gen = stream(
        minilm,
        (x for x in items),
        [windowed],
        batch_size=2,
        window=3,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert torch.allclose(whole.result(), windowed.result(), atol=1e-6)
    assert rep_gen.n_items == rep_list.n_items == 9 and rep_gen.n_used == rep_list.n_used == 7
    assert rep_gen.skipped_items == rep_list.skipped_items == [(0, "empty"), (6, "longer than context (602 > 512)")]
    assert rep_gen.n_batches == 4 and seen[-1] == (9, None)  # windows of 3 items hold 2, 3, 2 usable: 1 + 2 + 1 batches
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    with pytest.raises(ValueError, match="window must be >= 1; got 0"):
        stream(minilm, items, [], window=0)


def test_cli_capture_summary_runs():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "headscope.reports.cli",
            "capture",
            "smollm2-135m",
            "The cat sat.",
            "--layers",
            "0,29",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "KV groups: KV 0 <- heads [0, 1, 2]" in out.stdout
    assert "k          [1, 3, 4, 64]" in out.stdout


def _row_sums(cap, layer, causal):
    m = torch.ones(cap["pattern", layer].shape[-2:], dtype=torch.bool)
    return (cap["pattern", layer] * (m.tril() if causal else m)).sum(-1)


def test_cached_results_are_keyed_by_function_and_arguments(minilm, sentences):
    """Two reducers asking for the same (function, layer, causal) share one tensor; a different
    argument is a different entry, never the other's result."""
    cap = capture(minilm, sentences[:2], layers=[0, 1])
    a = cap.cached(_row_sums, 0, True)
    assert cap.cached(_row_sums, 0, True) is a
    b = cap.cached(_row_sums, 0, False)
    assert torch.allclose(b, torch.ones_like(b), atol=1e-5) and not torch.allclose(a, b)  # MiniLM looks both ways
    assert not hasattr(cap, "derived")
