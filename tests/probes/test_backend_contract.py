"""The Backend contract, checked on every registered backend (:data:`~headscope.probes.models.loading.BACKENDS`)
as scikit-learn's common checks run on every estimator: each member of
:class:`~headscope.probes.models.backends.protocol.Backend` exists and does what the protocol says,
on a tiny random BERT encoder and a tiny Llama decoder with grouped-query attention (4 query heads
reading 2 KV heads), both from :mod:`tests.tiny_models`.

A new backend registered in ``BACKENDS`` is picked up here without another line.
"""

from __future__ import annotations

import pytest
import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.backends.protocol import (
    QUANTITIES,
    Backend,
    check_head_hooks,
    placement,
    rows_unembedded,
)
from headscope.probes.models.loading import BACKENDS, load_model
from tests.tiny_models import tiny_model_dir

FAMILIES = ("bert", "llama")  # an encoder; a GQA decoder (num_key_value_heads=2 of 4)
CASES = [(b, f) for b in BACKENDS for f in FAMILIES]
TEXTS = ["The cat sat on the mat because it was tired.", "Heads can be pruned.", "Why?"]

#: what ``run`` cannot capture on a backend (inside HF's attention function, or not hooked by the bridge);
#: asking for it is a ValueError that names the in-house backend
NOT_CAPTURED = {"inhouse": (), "hf": ("scores", "q_rot", "k_rot"), "bridge": ("q_rot", "k_rot")}

#: members the protocol grew for analyses (issue #24): they must stay in it
GROWN = {"network", "hook_points", "point_hooks", "gates_set", "check_head_hooks", "unembed_at", "head_hooks"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    loaded: dict = {}

    def get(backend: str, family: str):
        if (backend, family) not in loaded:
            loaded[backend, family] = load_model(str(tiny_model_dir(root, family)), backend)
        return loaded[backend, family]

    return get


@pytest.fixture(params=CASES, ids=[f"{b}-{f}" for b, f in CASES])
def model(request, models):
    return models(*request.param)


def _members() -> set[str]:
    names = {n for n in vars(Backend) if not n.startswith("_")} | set(Backend.__annotations__)
    return names - {"mro"}


def _plain(model, batch) -> torch.Tensor:
    with torch.inference_mode():
        return model.forward(batch.input_ids, batch.attention_mask)


def _zero_head(h: int):
    def fn(z):  # z [batch, head, pos, d_head]
        keep = torch.ones(z.shape[1], dtype=z.dtype, device=z.device)
        keep[h] = 0
        return z * keep[None, :, None, None]

    return fn


def test_the_registry_names_each_backend_by_its_own_name():
    assert set(BACKENDS) == {"inhouse", "hf", "bridge"}
    assert all(cls.backend == name for name, cls in BACKENDS.items())


def test_every_protocol_member_exists(model):
    members = _members()
    assert GROWN <= members
    assert isinstance(model, Backend) and isinstance(model, BACKENDS[model.backend])
    missing = [n for n in sorted(members) if not hasattr(model, n)]
    assert missing == []
    assert model.spec.backend == model.backend
    assert isinstance(model.network, torch.nn.Module) and sum(p.numel() for p in model.network.parameters()) > 0
    assert placement(model) == {"device": "cpu", "dtype": "fp32"}


def test_forward_shapes(model):
    spec = model.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads) == (2, 4, 4 if spec.family == "bert" else 2)
    batch = model.encode(TEXTS)
    out = _plain(model, batch)
    width = model.vocab_size if spec.causal else spec.d_model
    assert tuple(out.shape) == (*batch.input_ids.shape, width)
    assert not batch.attention_mask.bool().all()  # padded: the shapes hold for a ragged batch


def test_head_hooks_reach_each_head_and_are_removed(model):
    spec = model.spec
    batch = model.encode(TEXTS)
    base = _plain(model, batch)
    seen = []

    def identity(z):
        seen.append(tuple(z.shape))
        return z

    with model.head_hooks({l: identity for l in range(spec.n_layers)}), torch.inference_mode():
        same = model.forward(batch.input_ids, batch.attention_mask)
    pos = batch.input_ids.shape[1]
    assert seen == [(len(TEXTS), spec.n_heads, pos, spec.d_head)] * spec.n_layers
    assert torch.equal(same, base)
    for l in range(spec.n_layers):
        for h in range(spec.n_heads):
            with model.head_hooks({l: _zero_head(h)}), torch.inference_mode():
                ablated = model.forward(batch.input_ids, batch.attention_mask)
            assert (ablated - base).abs().max().item() > 1e-6, (l, h)
    with pytest.raises(RuntimeError, match="inside"), model.head_hooks({0: _zero_head(0)}):
        raise RuntimeError("inside")
    assert torch.equal(_plain(model, batch), base)  # nothing left behind, even after an exception


def test_run_returns_the_quantities_asked(model):
    spec = model.spec
    batch = model.encode(TEXTS)
    b, pos = batch.input_ids.shape
    asked = [q for q in QUANTITIES if q not in NOT_CAPTURED[model.backend]]
    got = model.run(batch, asked)
    if spec.family == "bert":  # no RoPE: nothing is rotated, so no rotated q/k to give
        asked = [q for q in asked if q not in ("q_rot", "k_rot")]
    assert set(got) == {(q, l) for q in asked for l in range(spec.n_layers)} | {("output", None)}
    shapes = {
        "pattern": (b, spec.n_heads, pos, pos),
        "scores": (b, spec.n_heads, pos, pos),
        "q": (b, spec.n_heads, pos, spec.d_head),
        "q_rot": (b, spec.n_heads, pos, spec.d_head),
        "k": (b, spec.n_kv_heads, pos, spec.d_head),
        "k_rot": (b, spec.n_kv_heads, pos, spec.d_head),
        "v": (b, spec.n_kv_heads, pos, spec.d_head),
        "z": (b, spec.n_heads, pos, spec.d_head),
        "out": (b, pos, spec.d_model),
        "resid_post": (b, pos, spec.d_model),
    }
    assert {k: tuple(v.shape) for k, v in got.items() if k[0] != "output"} == {
        (q, l): shapes[q] for q in asked for l in range(spec.n_layers)
    }
    real = batch.attention_mask.bool()
    sums = got[("pattern", 1)].sum(-1)  # [batch, head, query_pos]: a distribution over keys per real query
    assert torch.allclose(sums.permute(0, 2, 1)[real], torch.ones(()), atol=1e-5)
    if model.backend == "bridge" and not spec.causal:  # the bridge's own output: its MLM head's logits
        assert tuple(got[("output", None)].shape) == (b, pos, model.vocab_size)
    else:
        assert torch.allclose(got[("output", None)], _plain(model, batch), atol=1e-5)
    kept = {}
    with model.head_hooks({1: lambda z: kept.setdefault("z", z.clone())}), torch.inference_mode():
        model.forward(batch.input_ids, batch.attention_mask)
    assert torch.allclose(got[("z", 1)], kept["z"], atol=1e-5)  # run's z is what the head hooks see
    only = model.run(batch, ["z"], layers=[1])
    assert ("z", 1) in only and ("z", 0) not in only
    for q in (*NOT_CAPTURED[model.backend], "nope"):
        with pytest.raises(ValueError, match=q):
            model.run(batch, [q])


def test_named_hook_points(model):
    batch = model.encode(TEXTS)
    points = model.hook_points
    if model.backend != "inhouse":
        assert dict(points) == {}
        with pytest.raises(ModelIncompatibleError, match="--backend inhouse"), model.point_hooks({"x": print}):
            pass
        return
    spec = model.spec
    wanted = {f"blocks.{l}.attn.hook_z" for l in range(spec.n_layers)}
    wanted |= {f"blocks.{l}.hook_resid_post" for l in range(spec.n_layers)}
    assert wanted <= set(points)
    seen = {}
    with model.point_hooks({n: lambda t, name: seen.__setitem__(name, t.detach().clone()) for n in points}):
        _plain(model, batch)
    assert wanted <= set(seen)
    run = model.run(batch, ["z", "resid_post"])
    assert torch.allclose(seen["blocks.1.attn.hook_z"], run[("z", 1)], atol=1e-6)  # patterns kept: unfused
    assert torch.allclose(seen["blocks.0.hook_resid_post"], run[("resid_post", 0)], atol=1e-5)
    with model.point_hooks({"blocks.0.attn.hook_z": lambda t, name: torch.zeros_like(t)}), torch.inference_mode():
        by_name = model.forward(batch.input_ids, batch.attention_mask)
    with model.head_hooks({0: lambda z: z * 0}), torch.inference_mode():
        by_layer = model.forward(batch.input_ids, batch.attention_mask)
    assert torch.equal(by_name, by_layer)
    assert not any(p.active for p in points.values())
    with pytest.raises(ModelIncompatibleError, match="no hook point 'blocks.9.attn.hook_z'"):
        with model.point_hooks({"blocks.9.attn.hook_z": print}):
            pass


def test_gates_change_the_output_exactly_like_a_zeroed_head(model):
    spec = model.spec
    mask = torch.ones(spec.n_layers, spec.n_heads)  # [layer, head]
    mask[1, 2] = 0.0
    if not model.has_gates:
        with pytest.raises(ModelIncompatibleError, match="no built-in head gates"), model.gates_set(mask):
            pass
        return
    batch = model.encode(TEXTS)
    base = _plain(model, batch)
    assert [tuple(g.shape) for g in model.gates] == [(spec.n_heads,)] * spec.n_layers
    with model.gates_set(mask) as gates:
        assert [g.tolist() for g in gates] == mask.tolist()
        gated = _plain(model, batch)
    with model.head_hooks({1: _zero_head(2)}):
        zeroed = _plain(model, batch)
    assert torch.equal(gated, zeroed) and not torch.equal(gated, base)
    assert all(bool((g == 1).all()) and not g.requires_grad for g in model.gates)  # restored on exit
    with model.gates_set(torch.ones_like(mask), requires_grad=True) as gates, torch.enable_grad():
        out = model.forward(batch.input_ids, batch.attention_mask)
        grads = torch.autograd.grad(out.float().pow(2).mean(), gates)
    assert all(g.abs().sum().item() > 0 for g in grads)
    assert torch.equal(_plain(model, batch), base)


def test_unembed_at_reads_the_chosen_rows_only(model):
    batch = model.encode(TEXTS)
    keep = batch.attention_mask.bool().clone()  # [batch, pos]
    keep[:, 0] = False
    if not model.spec.causal:
        assert not rows_unembedded(model)
        with pytest.raises(ModelIncompatibleError, match="unembedding"), model.unembed_at(keep):
            pass
        return
    assert rows_unembedded(model)
    full = _plain(model, batch)
    with model.unembed_at(keep):
        rows = _plain(model, batch)
    assert tuple(rows.shape) == (int(keep.sum()), full.shape[-1])
    assert (rows - full[keep]).abs().max().item() <= 1e-5
    assert torch.equal(_plain(model, batch), full)  # the hook is gone


def test_to_device_moves_in_place(model):
    batch = model.encode(TEXTS)
    base = _plain(model, batch)
    assert model.to("cpu") is model and model.device == torch.device("cpu")
    if torch.cuda.is_available():
        try:
            assert model.to("cuda") is model and model.device.type == "cuda"
            assert placement(model)["device"].startswith("cuda")
            assert torch.allclose(_plain(model, batch).cpu(), base, atol=1e-4)  # the ids follow the model
        finally:
            model.to("cpu")
    assert torch.equal(_plain(model, batch), base)


def test_the_head_hook_check(model):
    check_head_hooks(model)  # every loaded backend reaches its heads
    with pytest.raises(ModelIncompatibleError, match="got object"):
        check_head_hooks(object())


def test_the_head_hook_check_refuses_heads_it_cannot_find(models):
    """The hf backend finds each layer's attention output projection by name and size; a spec
    whose heads do not fit the modules is refused by the check, before any study runs."""
    import dataclasses

    from headscope.probes.models.backends.hf import HFReference

    ref = models("hf", "llama")
    wrong = HFReference(ref.hf, ref.tokenizer, dataclasses.replace(ref.spec, n_heads=3), vocab_size=ref.vocab_size)
    with pytest.raises(ModelIncompatibleError):
        check_head_hooks(wrong)
