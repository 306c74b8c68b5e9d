"""The in-house stack reproduces HF transformers (eager attention, fp32) for every family it
covers (every in-house family of :data:`~headscope.probes.models.families.FAMILIES`, with its
config in ``tests/tiny_models.py`` ``PARITY``): a tiny random model built from transformers' own config class, with the family's
interesting options switched on (sliding windows shorter than the input, soft-capping,
biases, QK-norm, MQA with a d_head independent of d_model, …), is loaded through
``config_from_arch`` + ``hf_to_inhouse_names`` + ``load_state_into`` and compared on one
right-padded batch of random ids (lengths 20, 13, 7): patterns of every layer ≤ 1e-5,
logits / last hidden states ≤ 1e-4, on real positions only. Nothing is downloaded."""

from __future__ import annotations

import pytest
import torch

from headscope.probes.capture import capture
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.config import INHOUSE_MODEL_TYPES, config_from_arch, config_from_hf, param_counts
from headscope.probes.models.loading import InHouseModel
from headscope.probes.tokens import TokenBatch
from tests.tiny_models import PARITY, PARITY_PAD, PARITY_VOCAB, parity_hf_model, tiny_hf_model, tiny_model_dir

VOCAB, PAD = PARITY_VOCAB, PARITY_PAD  # PAD: every family's pad id here (RoBERTa's positions start after it)
LENGTHS = (20, 13, 7)
#: every in-house family (a new one is picked up here and fails until tests/tiny_models.py PARITY has its
#: config), then the variants ("model_type:what") of PARITY
CASES = [*INHOUSE_MODEL_TYPES, *(case for case in PARITY if ":" in case)]
# the measured differences: see the table at the end of the file


def _hf_model(case: str):
    if case not in PARITY:
        pytest.fail(f"in-house family {case!r} has no parity config: add it to tests/tiny_models.py PARITY")
    return parity_hf_model(case)


def _batch() -> TokenBatch:
    gen = torch.Generator().manual_seed(1)
    n = max(LENGTHS)
    ids = torch.full((len(LENGTHS), n), PAD)
    mask = torch.zeros(len(LENGTHS), n, dtype=torch.long)
    for i, length in enumerate(LENGTHS):
        ids[i, :length] = torch.randint(4, VOCAB, (length,), generator=gen)  # never a special id
        mask[i, :length] = 1
    empty = [[] for _ in LENGTHS]
    return TokenBatch(
        input_ids=ids,
        attention_mask=mask,
        texts=[""] * len(LENGTHS),
        words=empty,
        tokens=empty,
        offsets=empty,
        word_ids=empty,
        special=empty,
        lengths=list(LENGTHS),
    )


def _inhouse(hf, family: str) -> InHouseModel:
    cfg = config_from_arch(arch_from_hf_config(hf.config.to_dict(), family))
    return InHouseModel.from_hf_state(cfg, hf.state_dict(), None, name=family, where=family)


def _diffs(family: str) -> tuple[float, float, float]:
    """Max |in-house - HF| of the patterns, of the output computed with them (explicit
    softmax), and of the output of a plain forward (fused kernel unless soft-capped)."""
    hf, encoder = _hf_model(family)
    ours = _inhouse(hf, family)
    batch = _batch()
    real = batch.attention_mask.bool()
    with torch.no_grad():
        ref = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    got = ours.run(batch, ["pattern"])
    assert len(ref.attentions) == ours.spec.n_layers
    pattern = 0.0
    for layer, expected in enumerate(ref.attentions):
        d = (got["pattern", layer] - expected).abs().amax(dim=(1, 3))  # [batch, query_pos]
        pattern = max(pattern, d[real].max().item())
    out = ref.last_hidden_state if encoder else ref.logits
    output = (got["output", None] - out)[real].abs().max().item()
    with torch.no_grad():  # no pattern asked for: the fused kernel (unless soft-capped), same figures
        fused = ours.module(batch.input_ids, batch.attention_mask)
    return pattern, output, (fused - out)[real].abs().max().item()


@pytest.mark.parametrize("family", CASES)
def test_inhouse_matches_hf_eager(family):
    pattern, output, fused = _diffs(family)
    print(f"{family}: pattern {pattern:.1e} output {output:.1e} fused {fused:.1e}")
    assert pattern <= 1e-5, pattern
    assert output <= 1e-4 and fused <= 1e-4, (output, fused)


@pytest.mark.parametrize("family", CASES)
def test_gates_and_param_counts(family):
    hf, _ = _hf_model(family)
    ours = _inhouse(hf, family)
    batch = _batch()
    module = ours.module
    model_type = family.split(":")[0]
    assert ours.spec.family == model_type and model_type in INHOUSE_MODEL_TYPES
    params = [(n, p.numel()) for n, p in module.named_parameters() if not n.endswith(".gate")]
    assert param_counts(ours.cfg) == (sum(k for n, k in params if ".attn." in n), sum(k for _, k in params))
    hf_params = sum(p.numel() for n, p in hf.named_parameters() if not n.startswith("pooler."))  # tied: once
    assert param_counts(ours.cfg)[1] == hf_params

    def run():
        with torch.no_grad():
            return module(batch.input_ids, batch.attention_mask)

    base = run()
    for gate in module.gates:
        gate.fill_(1.0)
    assert torch.equal(run(), base)  # all ones: bit-identical
    with torch.no_grad():
        module.gates[-1][1] = 0.0
    try:
        assert (run() - base)[batch.attention_mask.bool()].abs().max().item() > 1e-4
    finally:
        with torch.no_grad():
            module.gates[-1].fill_(1.0)


@pytest.mark.parametrize("family", ["qwen2", "gemma2", "gpt2", "roberta"])
def test_physical_pruning_equals_gating(family, tmp_path):
    from headscope.probes.models.inhouse.physical import gates_off, load_pruned, prune_heads, save_pruned

    hf, _ = _hf_model(family)
    ours = _inhouse(hf, family)
    batch = _batch()
    real = batch.attention_mask.bool()
    drop = {0: [1, 2], ours.cfg.n_layers - 1: [0]}
    with torch.no_grad(), gates_off(ours, drop):
        soft = ours.module(batch.input_ids, batch.attention_mask)
    hard = prune_heads(ours, drop)
    back = load_pruned(save_pruned(hard, tmp_path / "pruned"))
    with torch.no_grad():
        assert (hard.module(batch.input_ids, batch.attention_mask) - soft)[real].abs().max().item() <= 1e-5
        assert torch.equal(
            back.module(batch.input_ids, batch.attention_mask), hard.module(batch.input_ids, batch.attention_mask)
        )
    assert back.cfg == hard.cfg


def test_scores_hook_sees_scaled_soft_capped_scores_before_the_mask():
    from headscope.probes.models.inhouse.hooks import hooks

    hf, _ = _hf_model("gemma2")
    module = _inhouse(hf, "gemma2").module
    batch = _batch()
    seen = {}
    attn = module.blocks[0].attn
    with (
        torch.no_grad(),
        hooks(
            [
                (attn.hook_scores, lambda t, _n: seen.setdefault("scores", t)),
                (attn.hook_pattern, lambda t, _n: seen.setdefault("pattern", t)),
            ]
        ),
    ):
        module(batch.input_ids, batch.attention_mask)
    cap = module.cfg.attn_softcap
    assert seen["scores"].abs().max().item() <= cap and seen["scores"].abs().max().item() > cap / 2
    assert torch.isfinite(seen["scores"]).all()  # no mask in it
    row = seen["scores"][0, 0, 19, 19 - 7 :]  # the last query's window (8 keys)
    assert torch.allclose(seen["pattern"][0, 0, 19, 19 - 7 :], torch.softmax(row, -1), atol=1e-6)
    assert seen["pattern"][0, 0, 19, : 19 - 7].abs().max().item() == 0.0  # outside the window


def test_sliding_window_convention():
    """Query i sees key j when 0 <= i - j < window (transformers' sliding_window_overlay)."""
    from headscope.probes.models.inhouse.attention import additive_mask

    mask = additive_mask(torch.ones(1, 6, dtype=torch.long), causal=True, window=3)[0, 0] == 0
    expected = torch.tensor([[0 <= i - j < 3 for j in range(6)] for i in range(6)])
    assert torch.equal(mask, expected)


def test_roberta_positions_skip_padding():
    hf, _ = _hf_model("roberta")
    module = _inhouse(hf, "roberta").module
    ids = torch.tensor([[5, 6, 7], [5, PAD, PAD]])
    assert module.positions(ids).tolist() == [[PAD + 1, PAD + 2, PAD + 3], [PAD + 1, PAD, PAD]]


def test_gemma3_local_rope_base_from_an_older_config_json():
    raw = dict(
        model_type="gemma3_text",
        num_hidden_layers=6,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=128,
        vocab_size=100,
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
        rope_scaling=None,
        sliding_window=8,
        sliding_window_pattern=6,
        query_pre_attn_scalar=32,
    )
    cfg = config_from_hf(raw)
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert [cfg.layer_rope_theta(i) for i in range(6)] == [10_000.0] * 5 + [1_000_000.0]
    assert cfg.sliding_window == (8,) * 5 + (None,) and cfg.query_scale == 32**-0.5


def test_uncovered_options_name_the_hf_backend():
    from transformers import AutoConfig

    def refused(model_type, **kw):
        with pytest.raises(ModelIncompatibleError, match="--backend hf") as e:
            config_from_hf(AutoConfig.for_model(model_type, **kw).to_dict())
        return str(e.value)

    small = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=100,
    )
    assert "model_type 'opt'" in refused("opt", hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    assert "rope_type='dynamic'" in refused("mistral", **small, rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    assert "partial_rotary_factor" in refused("phi3", **small, partial_rotary_factor=0.5, pad_token_id=0)
    local_linear = {  # the sliding layers scaled: not a Gemma 3 release, not computed in-house
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e4},
    }
    assert "rope_type='linear' on the sliding layers" in refused("gemma3_text", **small, rope_parameters=local_linear)
    with pytest.raises(ModelIncompatibleError):  # the multimodal Gemma 3: only its text model is covered
        config_from_hf(AutoConfig.for_model("gemma3").to_dict())
    gpt2 = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=100)
    assert "scale_attn_by_inverse_layer_idx=True" in refused("gpt2", **gpt2, scale_attn_by_inverse_layer_idx=True)
    assert "scale_attn_weights=False" in refused("gpt2", **gpt2, scale_attn_weights=False)
    assert "mlp_bias=True" in refused("llama", **small, mlp_bias=True)
    config_from_hf(AutoConfig.for_model("gpt2", **gpt2, reorder_and_upcast_attn=True).to_dict())  # fp32: same math


def test_auto_runs_an_option_the_in_house_stack_lacks_through_hf(tmp_path):
    """GPT-2 with ``scale_attn_by_inverse_layer_idx``: auto picks hf, whose patterns are HF eager's."""
    from headscope.probes.models.loading import choose_backend, load_model, resolve

    d = tiny_model_dir(tmp_path, "gpt2", scale_attn_by_inverse_layer_idx=True)
    backend, why = choose_backend(resolve(str(d)))
    assert backend == "hf" and "scale_attn_by_inverse_layer_idx=True" in why
    model = load_model(str(d))
    assert model.backend == "hf"
    ref, tok = tiny_hf_model("gpt2", scale_attn_by_inverse_layer_idx=True)
    texts = ["the cat sat on the mat", "a dog"]
    cap = capture(model, texts, quantities=["pattern"])
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        want = ref(**enc, output_attentions=True).attentions
    for layer in range(2):
        n = int(enc["attention_mask"][0].sum())
        got = cap["pattern", layer][0, :, :n, :n]
        assert (got - want[layer][0, :, :n, :n]).abs().max() <= 1e-6
    plain = tiny_hf_model("gpt2")[0]  # the option matters: without it layer 1 differs
    with torch.no_grad():
        other = plain(**enc, output_attentions=True).attentions
    assert (other[1][0] - want[1][0]).abs().max() > 1e-3


# Measured max |in-house - HF eager| over real positions, CPU fp32, torch 2.13, transformers 5.24
# (output: with the patterns computed, explicit softmax; fused: a plain forward, SDPA kernel):
#   family        pattern    output     fused
#   bert          9.5e-07    2.6e-06    1.8e-06   (as RoBERTa: HF adds token types before positions; we after)
#   llama         0          0          5.2e-06
#   mistral       0          0          4.1e-06
#   qwen2         0          0          3.8e-06
#   qwen3         0          0          4.5e-06
#   gemma2        0          0          0         (soft-capped: never fused)
#   gemma3_text   0          0          2.3e-06
#   phi3          0          0          4.5e-06
#   gpt2          0          0          3.3e-06
#   roberta       6.9e-07    1.8e-06    2.3e-06   (HF adds token types before positions; we after, as for BERT)
#   distilbert    0          0          3.6e-06


@pytest.mark.parametrize("family", ["llama:llama3-rope", "gemma3_text:linear-rope"])
def test_scaled_rope_is_computed_not_dropped(family):
    """The scaled variants match HF (test above) because the scaling is computed: the same
    weights with plain RoPE give other logits; the config survives its JSON form (a pruned
    model's folder)."""
    from headscope.probes.models.config import ModelConfig

    hf, _ = _hf_model(family)
    ours = _inhouse(hf, family)
    assert ours.cfg.rope_scaling["rope_type"] == {"llama": "llama3", "gemma3_text": "linear"}[family.split(":")[0]]
    assert ModelConfig.from_dict(ours.cfg.to_dict()) == ours.cfg
    plain = InHouseModel.from_hf_state(
        ours.cfg.replace(rope_scaling=None), hf.state_dict(), None, name=family, where=family
    )
    batch = _batch()
    real = batch.attention_mask.bool()
    with torch.no_grad():
        ref = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        scaled = ours.module(batch.input_ids, batch.attention_mask)
        unscaled = plain.module(batch.input_ids, batch.attention_mask)
    assert (scaled - ref)[real].abs().max().item() <= 1e-4
    assert (unscaled - ref)[real].abs().max().item() > 1e-2


def test_rope_scalings_not_computed_in_house_go_to_hf():
    from headscope.probes.models.arch import arch_from_hf_config

    kwargs, _ = PARITY["llama"]
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10_000.0}
    with pytest.raises(ModelIncompatibleError, match=r"rope_type='yarn' .*only 'default', linear, llama3"):
        config_from_arch(arch_from_hf_config(dict(kwargs, model_type="llama", rope_parameters=yarn)))
