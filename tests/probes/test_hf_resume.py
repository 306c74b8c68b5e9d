"""The hf and bridge backends resume a forward from a layer, as the in-house one does: the studies run
each ablated replica from the first layer its mask touches (the unablated prefix once), and
read the logits at the positions their metric reads only. Checked on load, per model: a
family whose layer loop does not allow it runs whole, as before.

Figures asserted, on a tiny random model of every family the reports cover (13; 11 that
transformer-lens wraps on the bridge), in a right-padded batch: stopped at block ``l`` and resumed there, the output equals the full forward's
(≤ 1e-6; 0.0 measured) for every ``l``; a decoder's logits at chosen rows equal the full
forward's at those rows (≤ 1e-5)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.backends.protocol import rows_unembedded, unembed_at
from headscope.probes.models.loading import load_model
from tests.tiny_models import ENCODERS, FAMILIES, tiny_model_dir


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("hf-resume")


def _hf(root, family, backend="hf"):
    return load_model(str(tiny_model_dir(root, family, num_hidden_layers=3)), backend)


# every family on hf; on the bridge those transformer-lens 4 wraps (not RoBERTa nor DistilBERT)
RUNS = [(f, "hf") for f in FAMILIES] + [(f, "bridge") for f in FAMILIES if f not in ("roberta", "distilbert")]


@pytest.mark.parametrize(("family", "backend"), RUNS)
def test_resumed_forward_is_the_full_forward(root, family, backend, sentences):
    model = _hf(root, family, backend)
    assert model.resumable
    batch = model.encode(sentences[:3])
    ids, am = batch.input_ids, batch.attention_mask
    assert not am.bool().all()  # really padded
    with torch.inference_mode():
        full = model.forward(ids, am)
        for layer in (1, 2):
            x = model.forward(ids, am, stop_at_layer=layer)
            assert x.shape == (*ids.shape, model.spec.d_model)
            again = model.forward(ids, am, start_at_layer=layer, resid=x)
            assert (again - full).abs().max().item() <= 1e-6, layer
        # the model is left as it was: the blocks skipped while resuming compute again
        assert torch.equal(model.forward(ids, am), full)
        assert ("pattern", 0) in model.run(batch, ["pattern"], layers=[0])
        if family in ENCODERS:
            assert not rows_unembedded(model)
            return
        assert rows_unembedded(model)
        keep = am.bool().clone()
        keep[:, 0] = False
        with unembed_at(model, keep):
            rows = model.forward(ids, am)
    assert rows.shape == (int(keep.sum()), full.shape[-1])
    assert (rows - full[keep]).abs().max().item() <= 1e-5


def test_resume_needs_the_stream_it_resumes(root):
    model = _hf(root, "llama")
    ids, d = torch.ones(2, 5, dtype=torch.long), model.spec.d_model
    with pytest.raises(
        ValueError, match=rf"start_at_layer=1 needs resid \[batch=2, pos=5, d_model\]; got \(1, 5, {d}\)"
    ):
        model.forward(ids, torch.ones_like(ids), start_at_layer=1, resid=torch.zeros(1, 5, d))


def test_a_model_whose_loop_does_not_resume_runs_whole(root):
    """The check on load sees the resumed forward differ (here: the layout's blocks handed
    over in the wrong order) and the model is run whole; asking for a resume says why."""
    model = _hf(root, "llama")
    model._layout = dataclasses.replace(model.layout, blocks=tuple(reversed(model.layout.blocks)))
    assert not model.resumable and not rows_unembedded(model)
    ids = torch.ones(1, 5, dtype=torch.long)
    with pytest.raises(ModelIncompatibleError, match="cannot be resumed from a layer"):
        model.forward(ids, torch.ones_like(ids), stop_at_layer=1)
    assert model.forward(ids, torch.ones_like(ids)).shape[:2] == (1, 5)
