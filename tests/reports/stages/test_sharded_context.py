"""The contextualisation stage sharded by items on Ray workers: two MiniLM workers each run every
other batch of the sense set's sentences (cut as one process cuts them) and return each sentence's
states, word reps and head statistics; the driver runs the similarity, sense probes, permutations,
bootstrap and trends on all of them. Every table ``DataFrame.equals`` the single-process run (the
cluster and the workers are conftest.py's ``minilm_pool``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("ray")

from headscope.reports.stages.base import RunContext  # noqa: E402
from headscope.reports.stages.registry import STAGES  # noqa: E402


def test_context_sharded_by_items_equals_the_single_process_run(minilm_pool, minilm):
    ctx, stage = RunContext(name="minilm-l6", model=minilm), STAGES["context"]
    cfg = replace(stage.config(ctx), batch_size=8)  # the quick report's sense set, several batches a part
    whole = stage.run(ctx, cfg)
    sharded = minilm_pool.run(ctx, stage, cfg, stage.split(ctx, cfg, minilm_pool.workers))
    assert set(sharded.frames) == set(whole.frames) and len(whole.frames) >= 4
    for name, frame in whole.frames.items():
        assert sharded.frames[name].equals(frame), name
    assert sharded.summary == whole.summary
    assert whole.summary["n_sentences"] > 2 * 8 and whole.summary["n_attention_sentences"] == cfg.attention_sentences
