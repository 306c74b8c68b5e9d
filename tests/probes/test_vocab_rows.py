"""``ModelWeights.W_E_rows`` / ``W_U_columns`` (issue #38): the rows and columns a role reads,
equal to ``W_E[ids]`` / ``W_U[:, ids]``, read a block of rows at a time instead of copying the
whole vocabulary's matrices twice (the roles stage's ~300 MiB not counted on a 151,936-entry
vocabulary). Tiny random checkpoints, in-house and read lazily from the safetensors, with the
block made small so that the ids span several blocks."""

from __future__ import annotations

import pytest
import torch

from headscope.probes.models.inhouse import head_weights as hw
from headscope.probes.models.inhouse.head_weights import head_weights
from headscope.probes.models.lazy_weights import lazy_weights
from headscope.probes.models.loading import load_model
from tests.tiny_models import tiny_model_dir

#: ids out of order, repeated, at block edges, the first and the last
IDS = [5, 6, 7, 0, 13, 6, 599, 300, 14]


# llama: untied unembedding; gemma2: the embedding scale and (1 + w) final norm, tied
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_rows_and_columns_equal_the_whole_matrices_indexed(tmp_path, monkeypatch, family):
    monkeypatch.setattr(hw, "ROW_BLOCK", 7)
    folder = tiny_model_dir(tmp_path, family)
    for w in (head_weights(load_model(str(folder), backend="inhouse")), lazy_weights(str(folder))):
        assert w.vocab_size == 600
        assert torch.equal(w.W_E_rows(IDS), w.W_E[IDS])
        assert torch.equal(w.W_U_columns(IDS), w.W_U[:, IDS])
        assert w.W_U_columns([]).shape == (w.d_model, 0) and w.W_E_rows([]).shape == (0, w.d_model)
