"""Device hygiene, checked on a machine without a GPU.

Every tensor a role reducer creates must live on the device of the data it works on. On
CPU a stray ``torch.zeros(shape)`` (no ``device=``) is invisible, so these tests run each
reducer's ``update`` under ``torch.device("meta")``: a factory call without a device then
makes a meta tensor, which fails as soon as it meets the CPU data or is read back. The
guarded run must give the same tables as the plain one.
"""

from __future__ import annotations

import dataclasses
import functools

import pandas as pd
import pytest
import torch

from headscope.analyses.roles import pipeline as roles_pipeline
from headscope.analyses.roles.config import RolesConfig
from headscope.probes.models.loading import load_model
from tests.tiny_models import tiny_hf_model

TEXTS = [
    "The cat sat on the mat, and the dog slept.",
    "Grouped-query attention lets several query heads share one key-value head.",
    "A small model reads a short sentence.",
    "Where did the old man put the red book yesterday?",
] * 3


def _guarded(factory):
    """A reducer factory whose reducers run ``update`` with meta as the default device."""

    @functools.wraps(factory)
    def make(ctx):
        red = factory(ctx)
        plain = red.update

        def update(cap):
            with torch.device("meta"):
                plain(cap)

        red.update = update
        return red

    return make


@pytest.fixture(scope="module", params=["llama", "bert"])
def tiny(request):
    hf, tok = tiny_hf_model(request.param)
    return load_model(hf, "inhouse", tokenizer=tok)


def _roles(model):
    return roles_pipeline.head_roles(model, text=TEXTS, cfg=RolesConfig(seed=0, n_boot=50, n_perm=50))


def test_role_reducers_create_no_tensor_off_the_data_device(tiny, monkeypatch):
    plain = _roles(tiny)
    for name, role in list(roles_pipeline.REGISTRY.items()):
        monkeypatch.setitem(roles_pipeline.REGISTRY, name, dataclasses.replace(role, reducer=_guarded(role.reducer)))
    guarded = _roles(tiny)
    pd.testing.assert_frame_equal(guarded.frame, plain.frame)
    pd.testing.assert_frame_equal(guarded.stats, plain.stats)
    # every group ran (syntactic and coreference items aligned: none skipped as unaligned)
    assert {"positional:previous", "syntactic", "coreference:number", "induction", "rare-word"} <= set(plain.frame.role)
    assert not guarded.skipped.get("syntactic", {}).get("unaligned")


def test_the_guard_catches_a_stray_host_tensor():
    data = torch.ones(2, 3)
    with torch.device("meta"), pytest.raises(RuntimeError, match="meta"):
        float((data * torch.zeros(2, 3)).sum())  # a factory call without device=
