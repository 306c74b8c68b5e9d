"""Train-time pruning experiment: the synthetic task, importance, determinism, learning."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from headscope.probes.corpora.synthetic_task import AGREEMENT, INDUCTION, SyntheticTask
from headscope.reports.tools.experiments.train_time import (
    CONDITIONS,
    TRAIN_TIME_COLUMNS,
    TrainTimeConfig,
    condition_summary,
    head_importance,
    heads_to_drop,
    make_model,
    train_time_experiment,
)

QUICK = TrainTimeConfig(quick=True, num_threads=1)


@pytest.fixture(scope="module")
def quick_frame():
    return train_time_experiment(QUICK)


def test_task_targets_are_what_the_rules_say():
    task = SyntheticTask()
    b = task.sample(200, torch.Generator().manual_seed(3))
    ids, tgt, kind = b.input_ids, b.targets, b.kind
    for i in range(200):
        row = ids[i].tolist()
        for t in range(task.seq_len):
            if kind[i, t] == INDUCTION:  # the token after the previous occurrence of the current one
                prev = [j for j in range(t) if row[j] == row[t]]
                assert len(prev) == 1 and tgt[i, t] == row[prev[0] + 1] == row[t + 1]
            elif kind[i, t] == AGREEMENT:
                assert row[t] == task.mark_token and tgt[i, t] == task.agree_token + (row[0] - task.class_token)
            else:
                assert tgt[i, t] == -100
    assert int(kind.eq(AGREEMENT).sum()) == 400
    assert 3 * 200 <= int(kind.eq(INDUCTION).sum()) <= 6 * 200
    again = task.sample(200, torch.Generator().manual_seed(3))
    assert torch.equal(again.input_ids, ids)


def test_config_validation():
    with pytest.raises(ValueError, match="keep must list head counts in 1..7"):
        TrainTimeConfig(keep=(8,))
    with pytest.raises(ValueError, match="importance must be one of"):
        TrainTimeConfig(importance="random")
    with pytest.raises(ValueError, match="'steps' parameter"):
        TrainTimeConfig(steps=0)
    with pytest.raises(ValueError, match="seq_len must hold"):
        SyntheticTask(seq_len=12)


def test_importance_finds_planted_heads():
    """A head whose output weights are zero is unimportant by both measures."""
    task = SyntheticTask()
    cfg = TrainTimeConfig()
    model = make_model(cfg, task, 4, seed=0)
    with torch.no_grad():
        model.init_weights(std=0.3, seed=0)
        for block in model.blocks:
            block.attn.o_proj.weight[:, 8:16] = 0.0  # head 1 of every layer writes nothing
    batch = task.sample(64, torch.Generator().manual_seed(0))
    for method in ("ablation", "gradient"):
        scores = head_importance(model, batch, method)
        assert scores[:, 1].abs().max().item() < 1e-6
        assert scores[:, [0, 2, 3]].abs().min().item() > 1e-5
        assert all(bool((g == 1).all()) and not g.requires_grad for g in model.gates)
    assert heads_to_drop(scores, 3) == {0: [1], 1: [1]}


def test_quick_run_learns_and_is_deterministic(quick_frame):
    df = quick_frame
    assert df.columns.tolist() == TRAIN_TIME_COLUMNS
    assert set(df["condition"]) == set(CONDITIONS)
    v = {(r.condition, r.metric): r.value for r in df.itertuples()}
    # chance: agreement 1/4 (four classes), induction 1/24 (content tokens)
    assert v["full", "agreement_accuracy"] >= 0.9  # measured 1.0 after 100 steps
    assert v["full", "induction_accuracy"] >= 0.08  # measured 0.124 after 100 steps: learning has begun
    assert v["full", "accuracy"] >= 0.3  # measured 0.397
    assert v["full", "loss"] < 2.5  # measured 2.09; uniform over the 33-token vocabulary is 3.50
    # pruning 7 of 8 heads per layer without fine-tuning hurts (measured 0.236 vs 0.397)
    assert v["pruned", "accuracy"] < v["full", "accuracy"] - 0.1
    assert df.attrs["finding"].startswith("accuracy (mean±sd over 1 seeds): full H=8")
    again = train_time_experiment(QUICK)
    pd.testing.assert_frame_equal(again, df)
    assert torch.get_num_threads() >= 1


def test_summarize_spreads():
    df = pd.DataFrame(
        {
            "condition": ["scratch"] * 3 + ["pruned_ft"] * 3 + ["full"] * 3 + ["pruned"] * 3,
            "k": [1] * 3 + [1] * 3 + [8] * 3 + [1] * 3,
            "seed": [0, 1, 2] * 4,
            "metric": ["accuracy"] * 12,
            "value": [0.5, 0.6, 0.7, 0.9, 0.95, 1.0, 1.0, 1.0, 1.0, 0.3, 0.4, 0.5],
            "n": [10] * 12,
            "train_steps": [400] * 12,
        }
    )
    s = condition_summary(df).set_index(["condition", "k"])
    assert s.loc[("scratch", 1), "mean"] == pytest.approx(0.6) and s.loc[("scratch", 1), "std"] == pytest.approx(0.1)
    from headscope.reports.tools.experiments.train_time import finding

    line = finding(df)
    assert "k=1: scratch 0.600±0.100, pruned 0.400±0.100, pruned+FT 0.950±0.050" in line
    assert "prune-then-finetune beats scratch: +0.350, pruned+FT higher in 3/3 seeds" in line
