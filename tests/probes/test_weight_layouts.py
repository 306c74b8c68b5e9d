"""Every weight layout transformers accepts loads in-house with HF eager's logits (issue #25, part 3).

Each layout is written for real on disk from a tiny random model of :mod:`tiny_models` (tied weights
under either name, shards with an index, base-model vs head prefixes, sentence-transformers folders,
bf16/fp16 storage, a weights-only ``pytorch_model.bin``); the in-house model's logits (or an encoder's
final hidden states) are compared with transformers loading the same folder. Each broken layout is
refused in one line naming the file and the tensor.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import tiny_models
import torch
from safetensors.torch import load_file, save_file, save_model
from tiny_models import tiny_hf_model

from headscope.probes.errors import CheckpointError
from headscope.probes.models.checkpoints import resolve
from headscope.probes.models.loading import load_model

TOL = 1e-5


def _ids(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (2, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return ids, mask


def _hf_out(folder: Path, encoder: bool, ids, mask, dtype=torch.float32) -> torch.Tensor:
    from transformers import AutoModel, AutoModelForCausalLM

    cls = AutoModel if encoder else AutoModelForCausalLM
    hf = cls.from_pretrained(folder, attn_implementation="eager", dtype=dtype).eval()
    with torch.inference_mode():
        out = hf(input_ids=ids, attention_mask=mask)
    return (out.last_hidden_state if encoder else out.logits).float()


def _inhouse_out(folder, ids, mask, dtype: str = "float32") -> torch.Tensor:
    model = load_model(str(folder), backend="inhouse", dtype=dtype)
    with torch.inference_mode():
        return model.forward(ids, mask).float()


def _assert_same(folder: Path, encoder: bool, *, reference: torch.Tensor | None = None) -> None:
    """In-house == HF eager on ``folder`` (≤ TOL on the unpadded positions), and HF == ``reference`` (the
    model the folder was written from: the layout really holds its weights)."""
    vocab = len(tiny_models.tokenizer(encoder))
    ids, mask = _ids(vocab)
    hf = _hf_out(folder, encoder, ids, mask)
    ours = _inhouse_out(folder, ids, mask)
    keep = mask.bool()
    assert (ours[keep] - hf[keep]).abs().max().item() <= TOL
    if reference is not None:
        assert (hf[keep] - reference[keep]).abs().max().item() <= TOL


def _reference(model, encoder: bool) -> torch.Tensor:
    ids, mask = _ids(len(tiny_models.tokenizer(encoder)))
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask)
    return (out.last_hidden_state if encoder else out.logits).float()


def _write(model, tok, folder: Path, state: dict | None = None) -> Path:
    """``model`` saved (config, tokenizer, safetensors); ``state``: the weights file replaced by it."""
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    if state is not None:
        (folder / "model.safetensors").unlink()
        save_file({k: v.detach().clone().contiguous() for k, v in state.items()}, folder / "model.safetensors")
    return folder


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ----------------------------------------------------------------------------- 1. tied weights under either name

TIED = {"gemma3_text": {}, "llama": {"tie_word_embeddings": True}}


@pytest.mark.parametrize("model_type", sorted(TIED))
@pytest.mark.parametrize("layout", ["embed_tokens", "lm_head", "both", "save_model"])
def test_tied_weights_under_either_name(tmp_path, model_type, layout):
    model, tok = tiny_hf_model(model_type, **TIED[model_type])
    assert model.config.tie_word_embeddings
    state = {k: v for k, v in model.state_dict().items()}
    emb = state["model.embed_tokens.weight"]
    if layout == "embed_tokens":
        state.pop("lm_head.weight", None)
    elif layout == "lm_head":
        state.pop("model.embed_tokens.weight")
        state["lm_head.weight"] = emb
    elif layout == "both":
        state["lm_head.weight"] = emb
    folder = _write(model, tok, tmp_path / layout, None if layout == "save_model" else state)
    if layout == "save_model":  # what the user's report did: safetensors keeps the tied tensor once
        save_model(model, str(folder / "model.safetensors"))
    stored = set(load_file(folder / "model.safetensors"))
    assert ("lm_head.weight" in stored) == (layout in ("lm_head", "both", "save_model"))
    assert ("model.embed_tokens.weight" in stored) == (layout in ("embed_tokens", "both"))
    _assert_same(folder, False, reference=_reference(model, False))


@pytest.mark.parametrize("drop", ["lm_head.weight", "model.embed_tokens.weight"])
def test_untied_needs_both_tensors(tmp_path, drop):
    model, tok = tiny_hf_model("llama")
    assert not model.config.tie_word_embeddings
    both = _write(model, tok, tmp_path / "both")
    _assert_same(both, False, reference=_reference(model, False))
    state = {k: v for k, v in model.state_dict().items() if k != drop}
    folder = _write(model, tok, tmp_path / "one", state)
    with pytest.raises(CheckpointError) as e:
        load_model(str(folder), backend="inhouse")
    msg = _one_line(e)
    assert msg.startswith(str(folder)) and f"missing from checkpoint (1 missing) (HF name {drop!r})" in msg
    assert "tie_word_embeddings false" in msg


# ----------------------------------------------------------------------------- 2. sharded safetensors


def _sharded(tmp_path: Path) -> tuple[Path, object]:
    model, tok = tiny_hf_model("llama")
    folder = tmp_path / "sharded"
    model.save_pretrained(folder, max_shard_size="40KB")
    tok.save_pretrained(folder)
    assert not (folder / "model.safetensors").exists() and len(list(folder.glob("model-*.safetensors"))) > 2
    return folder, model


def test_sharded_safetensors_with_index(tmp_path):
    folder, model = _sharded(tmp_path)
    _assert_same(folder, False, reference=_reference(model, False))


def test_index_naming_a_missing_shard(tmp_path):
    folder, _ = _sharded(tmp_path)
    index = folder / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    tensor = "model.layers.1.mlp.down_proj.weight"
    (folder / weight_map[tensor]).unlink()
    with pytest.raises(CheckpointError) as e:
        load_model(str(folder), backend="inhouse")
    msg = _one_line(e)
    assert msg.startswith(f"{index}: shard {weight_map[tensor]!r} (holding tensor ") and "is missing" in msg


def test_index_placing_a_tensor_in_the_wrong_shard(tmp_path):
    folder, _ = _sharded(tmp_path)
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    tensor = "model.layers.1.mlp.down_proj.weight"
    other = next(s for s in sorted(set(data["weight_map"].values())) if s != data["weight_map"][tensor])
    data["weight_map"][tensor] = other
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as e:
        load_model(str(folder), backend="inhouse")
    assert _one_line(e).startswith(f"{folder / other}: tensor {tensor!r}, which model.safetensors.index.json places")


# ----------------------------------------------------------------------------- 3. base-model prefixes

#: model_type -> (its head class, the attribute holding its base model, the prefix the head saves)
PREFIXES = {
    "llama": ("AutoModelForCausalLM", "model", "model."),
    "gpt2": ("AutoModelForCausalLM", "transformer", "transformer."),
    "bert": ("AutoModelForMaskedLM", "bert", "bert."),
    "roberta": ("AutoModelForMaskedLM", "roberta", "roberta."),
    "distilbert": ("AutoModelForMaskedLM", "distilbert", "distilbert."),
}


def _head_and_base(model_type: str, **overrides):
    import transformers

    model, tok = tiny_hf_model(model_type, **overrides)
    head_cls, attr, _ = PREFIXES[model_type]
    if head_cls == "AutoModelForCausalLM":
        return model, getattr(model, attr), tok
    head = getattr(transformers, head_cls).from_config(model.config, attn_implementation="eager").eval()
    missing, _ = getattr(head, attr).load_state_dict(model.state_dict(), strict=False)  # (no pooler on the head)
    assert not missing
    return head, model, tok


@pytest.mark.parametrize("model_type", sorted(PREFIXES))
@pytest.mark.parametrize("saved", ["head", "base"])
def test_base_model_prefixes(tmp_path, model_type, saved):
    encoder = model_type not in ("llama", "gpt2")
    tie = {"tie_word_embeddings": True} if model_type == "llama" else {}  # a base checkpoint has no lm_head
    head, base, tok = _head_and_base(model_type, **tie)
    folder = _write(head if saved == "head" else base, tok, tmp_path / saved)
    names = set(load_file(folder / "model.safetensors"))
    prefix = PREFIXES[model_type][2]
    assert any(n.startswith(prefix) for n in names) == (saved == "head")
    _assert_same(folder, encoder, reference=_reference(base if encoder else head, encoder))


def test_untied_base_decoder_names_its_missing_head(tmp_path):
    _, base, tok = _head_and_base("llama")
    folder = _write(base, tok, tmp_path / "base")
    with pytest.raises(CheckpointError) as e:
        load_model(str(folder), backend="inhouse")
    assert "HF name 'lm_head.weight'" in _one_line(e)


# ----------------------------------------------------------------------------- 4. sentence-transformers folders

ST_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def _sentence_transformers(root: Path, inner: str, pooling: str) -> tuple[Path, object]:
    model, tok = tiny_hf_model("bert")
    _write(model, tok, root / inner if inner else root)
    modules = [dict(m, path=inner) if m["idx"] == 0 else m for m in ST_MODULES]
    (root / "modules.json").write_text(json.dumps(modules, indent=2))
    (root / "config_sentence_transformers.json").write_text(json.dumps({"__version__": {"sentence_transformers": "3"}}))
    (root / "1_Pooling").mkdir()
    flags = {f"pooling_mode_{m}": m == pooling for m in ("cls_token", "mean_tokens", "max_tokens")}
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **flags}))
    (root / "2_Normalize").mkdir()
    return root, model


@pytest.mark.parametrize(("inner", "pooling"), [("", "mean_tokens"), ("0_Transformer", "cls_token")])
def test_sentence_transformers_folder(tmp_path, inner, pooling):
    root, model = _sentence_transformers(tmp_path / "st", inner, pooling)
    assert (root / "config.json").exists() == (not inner)
    source = resolve(str(root))
    assert source.path == (root / inner if inner else root) and source.name == "st"
    assert source.pooling == pooling.removesuffix("_token").removesuffix("_tokens") and source.normalize
    _assert_same(source.path, True, reference=_reference(model, True))
    ids, mask = _ids(len(tiny_models.tokenizer(True)))
    assert torch.equal(_inhouse_out(root, ids, mask), _inhouse_out(source.path, ids, mask))  # the root loads alike


def test_shipped_minilm_is_a_sentence_transformers_folder():
    source = resolve("minilm-l6")
    assert (source.pooling, source.normalize) == ("mean", True)


def test_modules_json_naming_an_absent_transformer(tmp_path):
    root, _ = _sentence_transformers(tmp_path / "st", "0_Transformer", "mean_tokens")
    shutil.rmtree(root / "0_Transformer")
    with pytest.raises(CheckpointError) as e:
        resolve(str(root))
    assert _one_line(e).startswith(f"{root / 'modules.json'}: module 0 (Transformer) has no config.json")


# ----------------------------------------------------------------------------- 5. bf16 / fp16 storage


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
def test_half_precision_weights(tmp_path, stored):
    model, tok = tiny_hf_model("llama")
    folder = _write(model.to(stored), tok, tmp_path / str(stored))
    assert {v.dtype for v in load_file(folder / "model.safetensors").values()} == {stored}
    _assert_same(folder, False)  # both cast the stored halves to float32
    emb = load_file(folder / "model.safetensors")["model.embed_tokens.weight"]
    bf16 = load_model(str(folder), backend="inhouse", dtype="bf16")
    assert bf16.network.embed.weight.dtype == torch.bfloat16
    assert torch.equal(bf16.network.embed.weight, emb.to(torch.bfloat16))


# ----------------------------------------------------------------------------- 6. pytorch_model.bin, weights only


def test_pytorch_model_bin(tmp_path):
    model, tok = tiny_hf_model("llama")
    folder = _write(model, tok, tmp_path / "bin")
    (folder / "model.safetensors").unlink()
    torch.save(dict(model.state_dict()), folder / "pytorch_model.bin")
    _assert_same(folder, False, reference=_reference(model, False))


def test_pickle_needing_more_than_weights_is_refused(tmp_path):
    model, tok = tiny_hf_model("llama")
    folder = _write(model, tok, tmp_path / "pickle")
    (folder / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "extra": argparse.Namespace(x=1)}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as e:
        load_model(str(folder), backend="inhouse")
    msg = _one_line(e)
    assert msg.startswith(f"{folder / 'pytorch_model.bin'}: refused or unreadable (") and "weights-only" in msg


def test_pooling_config_read_or_refused(tmp_path):
    root, _ = _sentence_transformers(tmp_path / "st", "", "mean_tokens")
    (root / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": tru}')
    with pytest.raises(CheckpointError) as e:
        resolve(str(root))
    assert _one_line(e).startswith(f"{root / '1_Pooling' / 'config.json'}:1:")
    shutil.rmtree(root / "1_Pooling")  # a copy without it (as a user may copy the transformer's files): unknown
    assert resolve(str(root)).pooling is None
