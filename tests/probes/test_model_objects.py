"""``load_model`` on objects a notebook already holds: HF models, bridges, loaded models."""

from __future__ import annotations

import pytest
import torch

from headscope.probes.capture import capture
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models import checkpoints
from headscope.probes.models.backends.bridge import BridgeModel
from headscope.probes.models.backends.hf import HFReference
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.loading import load_model

TEXTS = ["The cat sat on the mat.", "Heads attend to the previous token, often."]


def _patterns(model) -> list[torch.Tensor]:
    cap = capture(model, TEXTS, quantities=["pattern"])
    return [cap["pattern", layer] for layer in cap.layers]


def _max_diff(a, b) -> float:
    pa, pb = _patterns(a), _patterns(b)
    assert len(pa) == len(pb)
    return max((x - y).abs().max().item() for x, y in zip(pa, pb, strict=True))


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert msg and "\n" not in msg
    return msg


@pytest.fixture(scope="module")
def minilm_object():
    from transformers import AutoModel, AutoTokenizer

    directory = checkpoints.hf_dir(checkpoints.resolve("minilm-l6"))
    with checkpoints.quiet_transformers():
        model = AutoModel.from_pretrained(str(directory), attn_implementation="eager")
    return model, AutoTokenizer.from_pretrained(str(directory))


def _tiny_llama(vocab_size: int, attn_implementation: str = "eager", **changes):
    """A tiny random Llama decoder: 4 query heads sharing 2 KV heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn_implementation,
        **changes,
    )
    return LlamaForCausalLM(cfg).eval()


def test_hf_object_matches_hf_by_name(minilm_object, minilm_hf):
    hf_model, tok = minilm_object
    m = load_model(hf_model, "hf", tokenizer=tok)
    assert isinstance(m, HFReference) and m.hf is hf_model
    assert m.spec.n_layers == 6 and m.spec.n_heads == 12 and not m.spec.causal
    assert _max_diff(m, minilm_hf) <= 1e-6


def test_inhouse_from_hf_object_matches_inhouse_by_name(minilm_object, minilm):
    hf_model, tok = minilm_object
    m = load_model(hf_model, tokenizer=tok)
    assert isinstance(m, InHouseModel)
    assert m.spec.family == "bert" and m.spec.n_kv_heads == 12
    assert _max_diff(m, minilm) <= 1e-5


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_llama_object_inhouse_agrees_with_hf(minilm_object, tied):
    tok = minilm_object[1]
    llama = _tiny_llama(len(tok), tie_word_embeddings=tied)
    inhouse = load_model(llama, "inhouse", tokenizer=tok)
    ref = load_model(llama, "hf", tokenizer=tok)
    assert inhouse.spec.causal and inhouse.spec.n_kv_heads == 2 and ref.spec.n_kv_heads == 2
    assert _max_diff(inhouse, ref) <= 1e-5
    assert capture(inhouse, TEXTS, quantities=["k"])["k", 1].shape[1] == 2  # K un-expanded


def test_tiny_llama_object_on_bridge(minilm_object):
    tok = minilm_object[1]
    ref = load_model(_tiny_llama(len(tok)), "hf", tokenizer=tok)
    with pytest.warns(UserWarning, match="in place"):  # TransformerBridge takes the model's modules over
        m = load_model(_tiny_llama(len(tok)), "bridge", tokenizer=tok)  # same seed: same weights
    assert isinstance(m, BridgeModel) and m.spec.family == "llama" and m.spec.n_kv_heads == 2
    assert _max_diff(m, ref) <= 1e-5


def test_inhouse_refuses_uncovered_family(minilm_object):
    from transformers import OPTConfig, OPTForCausalLM

    tok = minilm_object[1]
    opt = OPTForCausalLM(
        OPTConfig(
            num_hidden_layers=1,
            hidden_size=16,
            num_attention_heads=2,
            ffn_dim=32,
            word_embed_proj_dim=16,
            vocab_size=len(tok),
        )
    )
    with pytest.raises(ModelIncompatibleError, match="bridge") as e:
        load_model(opt, "inhouse", tokenizer=tok)
    _one_line(e)


def test_bridge_refuses_bare_base_model(minilm_object):
    from transformers import AutoModel

    directory = checkpoints.hf_dir(checkpoints.resolve("minilm-l6"))
    with checkpoints.quiet_transformers():
        bare = AutoModel.from_pretrained(str(directory), attn_implementation="eager")
    with pytest.warns(UserWarning), pytest.raises(ModelIncompatibleError, match="AutoModelForMaskedLM") as e:
        load_model(bare, "bridge", tokenizer=minilm_object[1])
    _one_line(e)


def test_bridge_object_matches_bridge_by_name(minilm_bridge):
    m = load_model(minilm_bridge.bridge)  # backend defaults to the object's own
    with pytest.raises(ValueError, match="backend='bridge'") as e:
        load_model(minilm_bridge.bridge, "inhouse")
    _one_line(e)
    assert isinstance(m, BridgeModel) and m.tokenizer is minilm_bridge.bridge.tokenizer
    assert m.spec.family == "bert" and m.spec.n_layers == 6 and m.spec.d_head == 32
    assert _max_diff(m, minilm_bridge) <= 1e-6


def test_loaded_model_returned_as_is(minilm):
    assert load_model(minilm) is minilm
    with pytest.raises(ValueError, match="backend='inhouse'") as e:
        load_model(minilm, "hf")
    _one_line(e)


def test_hf_object_without_tokenizer(minilm_object):
    with pytest.raises(ValueError, match="tokenizer=") as e:
        load_model(minilm_object[0], "hf")
    _one_line(e)


def test_non_eager_hf_object_refused(minilm_object):
    tok = minilm_object[1]
    sdpa = _tiny_llama(len(tok), attn_implementation="sdpa")
    for backend in ("hf", "bridge"):
        with pytest.raises(ValueError, match='attn_implementation="eager"') as e:
            load_model(sdpa, backend, tokenizer=tok)
        _one_line(e)
    assert sdpa.config._attn_implementation == "sdpa"  # the user's model is left alone
    load_model(sdpa, "inhouse", tokenizer=tok)  # weights only: any attention implementation


def test_other_objects_refused():
    for obj in (object(), torch.nn.Linear(2, 2), 3):
        with pytest.raises(TypeError, match="PreTrainedModel") as e:
            load_model(obj)
        _one_line(e)


def test_a_tokenizer_with_a_name_is_refused_not_ignored():
    with pytest.raises(ValueError, match="tokenizer= goes with a model object; 'minilm-l6' is loaded with its own"):
        load_model("minilm-l6", tokenizer=object())
