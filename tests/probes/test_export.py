"""Exports for bertviz and CircuitsVis: padding cut off, values exact, JSON round-trips."""

from __future__ import annotations

import json

import pytest
import torch

from headscope.probes.capture import capture
from headscope.probes.export import to_bertviz, to_circuitsvis, write_patterns_json
from headscope.reports.cli.app import main

TEXTS = ["The cat didn't climb on the table because it was too tired.", "Heads can be pruned."]


@pytest.fixture(scope="module")
def cap(minilm):
    return capture(minilm, TEXTS, quantities=["pattern"])


def test_padding_is_cut_and_values_are_exact(cap):
    lengths = cap.tokens.lengths
    assert lengths[0] > lengths[1]  # item 1 is padded in the batch
    for item, n in enumerate(lengths):
        attention, tokens = to_bertviz(cap, item)
        assert tokens == cap.tokens.tokens[item] and len(tokens) == n
        assert len(attention) == len(cap.layers) == 6
        for layer, a in zip(cap.layers, attention):
            assert a.shape == (1, 12, n, n)
            assert torch.equal(a[0], cap["pattern", layer][item, :, :n, :n])
            torch.testing.assert_close(a.sum(-1), torch.ones(1, 12, n), atol=1e-5, rtol=0)
        cv = to_circuitsvis(cap, 3, item)
        assert cv["tokens"] == tokens
        got = torch.tensor(cv["attention"])  # [head, dest, src]
        assert got.shape == (12, n, n)
        assert torch.equal(got, cap["pattern", 3][item, :, :n, :n])
        json.dumps(cv)  # serialisable as it is


def test_export_does_not_alias_the_capture(cap):
    attention, _ = to_bertviz(cap, 1)
    attention[0].zero_()
    assert cap["pattern", 0][1].sum() > 0


def test_json_round_trips(cap, tmp_path):
    path = write_patterns_json(cap, tmp_path / "p.json", item=1)
    got = json.loads(path.read_text())
    n = cap.tokens.lengths[1]
    assert got["model"] == "minilm-l6" and got["text"] == TEXTS[1]
    assert got["tokens"] == cap.tokens.tokens[1] and got["layers"] == list(range(6))
    assert got["kv_groups"] == {str(k): v for k, v in cap.kv_groups.items()}
    a = torch.tensor(got["attention"])  # [layer, head, dest, src]
    assert a.shape == (6, 12, n, n)
    assert torch.equal(a, cap.stack("pattern")[:, 1, :, :n, :n])


def test_errors(cap, minilm):
    with pytest.raises(ValueError, match=r"item must be an integer in 0\.\.1.*got 2"):
        to_bertviz(cap, 2)
    with pytest.raises(ValueError, match="item must be"):
        to_circuitsvis(cap, 0, item=-1)
    with pytest.raises(ValueError, match=r"layer 6 has no captured pattern; captured layers are \[0, 1, 2, 3, 4, 5\]"):
        to_circuitsvis(cap, 6)
    no_pattern = capture(minilm, TEXTS[:1], quantities=["q"], layers=[0])
    with pytest.raises(ValueError, match="no attention patterns"):
        to_bertviz(no_pattern)
    with pytest.raises(ValueError, match="no attention patterns"):
        to_circuitsvis(no_pattern, 0)


def test_cli_export(tmp_path, capsys, minilm):
    out = tmp_path / "patterns.json"
    rc = main(
        ["capture", "minilm-l6", "Heads can be pruned.", "--quantities", "q", "--layers", "0,5", "--export", str(out)]
    )
    assert rc == 0
    got = json.loads(out.read_text())
    ref = capture(minilm, ["Heads can be pruned."], quantities=["pattern"], layers=[0, 5])
    assert got["layers"] == [0, 5] and got["tokens"] == ref.tokens.tokens[0]  # WordPiece tokens read as they are
    torch.testing.assert_close(torch.tensor(got["attention"]), ref.stack("pattern")[:, 0], rtol=0, atol=1e-6)
    assert str(out) in capsys.readouterr().out

    rc = main(["capture", "minilm-l6", "--export", str(tmp_path / "missing" / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1
