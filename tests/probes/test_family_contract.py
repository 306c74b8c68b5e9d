"""The contract every registered model family meets, run over
:data:`~headscope.probes.models.families.FAMILIES` (as scikit-learn's common checks run over
``all_estimators()``), so a new family cannot be forgotten:

* it has a tiny model in ``tests/tiny_models.py`` (an in-house one also a parity config, which
  ``tests/probes/test_families.py`` compares with HF eager);
* the backend it declares is the one that takes it: an in-house family builds a
  :class:`~headscope.probes.models.config.ModelConfig` of its own type, an hf-only one is
  refused in-house with the way out;
* its name map covers every tensor of the HF state dict: each is dropped by a declared pattern
  (``Family.hf_drop``) or becomes in-house tensors, and together they are exactly the model's;
* the HF backend finds its heads in the modules it declares (``Family.attn_out``, ``Family.qkv``).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.checkpoints import hf_to_inhouse_names
from headscope.probes.models.config import config_from_arch
from headscope.probes.models.families import FAMILIES, INHOUSE_MODEL_TYPES
from tests import tiny_models
from tests.tiny_models import PARITY, parity_hf_model, tiny_hf_model


def test_every_family_has_a_tiny_model_and_every_tiny_model_a_family():
    assert sorted(tiny_models.FAMILIES) == sorted(FAMILIES)
    assert {t for t in FAMILIES if FAMILIES[t].encoder} == set(tiny_models.ENCODERS)


def test_every_in_house_family_has_a_parity_config():
    cases = {case.split(":")[0] for case in PARITY}
    assert set(INHOUSE_MODEL_TYPES) <= cases, (
        f"no parity config in tests/tiny_models.py PARITY for {set(INHOUSE_MODEL_TYPES) - cases}"
    )
    assert cases <= set(INHOUSE_MODEL_TYPES), (
        f"parity configs of families not built in-house: {cases - set(INHOUSE_MODEL_TYPES)}"
    )


@pytest.mark.parametrize("model_type", INHOUSE_MODEL_TYPES)
def test_name_map_covers_every_hf_tensor(model_type):
    from headscope.probes.models.inhouse.transformer import Transformer

    family = FAMILIES[model_type]
    hf, _ = parity_hf_model(model_type)
    cfg = config_from_arch(arch_from_hf_config(hf.config.to_dict(), model_type))
    own = {k for k in Transformer(cfg).state_dict() if not k.endswith(".gate")}
    state = hf.state_dict()
    if cfg.tie_embeddings and "unembed.weight" not in hf_to_inhouse_names(cfg, state):
        own.discard("unembed.weight")
    mapped: set[str] = set()
    for name, tensor in state.items():
        pieces = hf_to_inhouse_names(cfg, {name: tensor})
        stripped = name
        for old, new in family.hf_prefixes:
            stripped = new + stripped[len(old) :] if stripped.startswith(old) else stripped
        dropped = any(fnmatchcase(stripped, p) for p in family.hf_drop)
        assert bool(pieces) != dropped, f"{model_type}: {name!r} is {'dropped' if dropped else 'lost'}"
        assert set(pieces) <= own, f"{model_type}: {name!r} -> {sorted(set(pieces) - own)}, no in-house tensor"
        assert not mapped & set(pieces), f"{model_type}: {name!r} -> {sorted(mapped & set(pieces))} twice"
        mapped |= set(pieces)
    assert mapped == own, f"{model_type}: in-house tensors no HF tensor fills: {sorted(own - mapped)}"


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_backend_and_hf_layout_are_as_declared(model_type):
    from headscope.probes.models.backends.protocol import spec_from_arch
    from headscope.probes.models.hf_layout import find_layout

    family = FAMILIES[model_type]
    hf, _ = tiny_hf_model(model_type)
    arch = arch_from_hf_config(hf.config.to_dict(), model_type)
    assert arch.encoder == family.encoder
    if family.inhouse:
        cfg = config_from_arch(arch)
        assert (cfg.family, cfg.encoder) == (model_type, family.encoder)
    else:
        with pytest.raises(ModelIncompatibleError, match=rf"model_type '{model_type}' .*--backend hf"):
            config_from_arch(arch)
    names = {id(m): n for n, m in hf.named_modules()}
    layout = find_layout(hf, spec_from_arch(arch, model_type, "hf"))
    assert all(names[id(m)].endswith(family.attn_out) for m in layout.attn_out), model_type
    for i, which in enumerate((layout.q, layout.k, layout.v)):
        if family.qkv is None:
            assert which is None, model_type
        else:
            assert which is not None and all(names[id(m)].endswith(family.qkv[i]) for m in which), model_type
