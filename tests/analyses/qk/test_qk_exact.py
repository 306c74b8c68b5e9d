"""The exact split of a head's scores (headscope.probes.qk_parts): the sum over every (query
component, key component) pair equals the model's own score to 1e-5 relative in float32, on
random-weight models of every in-house family (rotary, absolute and no positions; QK-norm with
frozen scales; soft-capping decomposed before the cap), on MiniLM and on SmolLM2; families whose
scores are not bilinear in the residual are refused in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.config import INHOUSE_MODEL_TYPES, ModelConfig, config_from_arch
from headscope.probes.models.inhouse.transformer import Transformer
from headscope.probes.qk_parts import head_parts, qk_refusal, residual_run
from tests.tiny_models import PARITY, PARITY_PAD, parity_hf_model

TOL = 1e-5
CASES = [*INHOUSE_MODEL_TYPES, *(case for case in PARITY if ":" in case)]


def _batch(vocab: int, n: int = 12):
    """Two rows, the second right-padded (its last 3 positions masked)."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(4, vocab, (2, n), generator=gen)
    mask = torch.ones_like(ids)
    ids[1, n - 3 :], mask[1, n - 3 :] = PARITY_PAD, 0
    return ids, mask


def _max_error(model) -> tuple[float, int]:
    cfg = model.network.cfg
    run = residual_run(model, *_batch(cfg.vocab_size))
    errors = [head_parts(run, l, h).relative_error() for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    return max(errors), len(errors)


@pytest.mark.parametrize("case", CASES)
def test_pairs_sum_to_the_score_on_every_family(case):
    hf, _ = parity_hf_model(case)
    family = case.split(":")[0]
    cfg = config_from_arch(arch_from_hf_config(hf.config.to_dict(), family))
    model = InHouseModel.from_hf_state(cfg, hf.state_dict(), None, name=case, where=case)
    err, n = _max_error(model)
    print(f"{case}: max relative error {err:.1e} over {n} heads")
    assert err <= TOL, (case, err)


def test_no_position_embeddings():
    net = Transformer(ModelConfig(family="llama", positional="none", n_layers=3, n_heads=4, n_kv_heads=2))
    net.init_weights(std=0.3, seed=1)
    model = InHouseModel(net, None, name="llama-nopos")
    err, _ = _max_error(model)
    assert err <= TOL, err
    run = residual_run(model, *_batch(128))
    assert "pos" not in head_parts(run, 2, 0).names


def test_minilm_post_norm_split_is_exact(minilm, sentences):
    b = minilm.encode(texts=sentences[:2])
    run = residual_run(minilm, b.input_ids, b.attention_mask)
    parts = [head_parts(run, l, h) for l in (0, 5) for h in range(12)]
    err = max(p.relative_error() for p in parts)
    print(f"minilm: max relative error {err:.1e}")
    assert err <= TOL
    assert parts[-1].names[:4] == ("embed", "pos", "type", "bias") and len(parts[-1].names) == 4 + 5 * 13


def test_smollm2_gqa_rotary_split_is_exact(smollm):
    b = smollm.encode(texts=["The cat sat on the mat because the cat was tired."])
    run = residual_run(smollm, b.input_ids, b.attention_mask, layers=[18])
    p = head_parts(run, 18, 6)
    print(f"smollm2 18.6: relative error {p.relative_error():.1e}")
    assert p.kv_head == 2 and p.relative_error() <= TOL
    assert len(p.names) == 2 + 18 * 10  # embed, bias, (9 heads + MLP) per earlier layer; no learned positions


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ({"kv_lora_rank": 512}, "MLA"),
        ({"pos_att_type": ["c2p", "p2c"]}, "DeBERTa"),
        ({"model_type": "bloom"}, "ALiBi"),
        ({"relative_attention_num_buckets": 32}, "T5"),
    ],
)
def test_families_without_an_exact_split_are_refused(config, reason):
    model = SimpleNamespace(backend="hf", hf_config=config, network=None)
    why = qk_refusal(model)
    assert reason in why and "\n" not in why
    with pytest.raises(ModelIncompatibleError, match=reason):
        residual_run(model, torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2))


def test_other_backends_are_refused_naming_the_fix():
    assert "--backend inhouse" in qk_refusal(SimpleNamespace(backend="hf", hf_config=None))
