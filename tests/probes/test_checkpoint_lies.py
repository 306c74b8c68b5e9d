"""Checkpoints whose metadata, tensor shapes or tensor types lie (issues #23 and #29): each is
refused in one line naming the tensor or key and what was expected (exit 2), never an internal
error, a silent cast or a model other than the one the file holds; what is honest (per-layer
head counts that are all equal, fp16 weights, Phi-3's legacy ``su`` RoPE) still loads.

GGUF files are tiny random Llama models written as llama.cpp writes them (:mod:`gguf_writer`),
then made to lie through its ``metadata=`` and ``edit=`` hooks; safetensors folders are tiny
Llama checkpoints saved by transformers (:func:`test_checkpoint_inputs._build`). Figures
asserted: a file that loads computes the source model's logits (≤ 1e-4); the card of a
file with per-layer heads adds its layers up exactly (tensor elements counted in the file).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import tracemalloc
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from cli_checks import cli_error
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from gguf_writer import write_tiny_gguf  # noqa: E402
from test_checkpoint_inputs import _build  # noqa: E402

from headscope.probes.errors import CheckpointError, HeadscopeError, ModelIncompatibleError  # noqa: E402
from headscope.probes.models.arch import check_hf_config  # noqa: E402
from headscope.probes.models.card import model_card, render_card  # noqa: E402
from headscope.probes.models.loading import load_model  # noqa: E402
from headscope.reports.cli.app import main  # noqa: E402

Q4_0 = gguf.GGMLQuantizationType.Q4_0
D_HEAD = 16  # the tiny Llama: d_model 64, 4 heads sharing 2 KV heads of 16 dims, 2 layers, 329 tokens
IDS = torch.randint(5, 300, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every dequantised folder goes to the test's own HEADSCOPE_CACHE."""
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _edit(name: str, change):
    """An ``edit=`` for :func:`write_tiny_gguf` that changes one tensor."""
    return lambda n, a: change(a) if n == name else a


def _logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits


def _same_model(path: Path, src) -> float:
    """The largest logit difference between what headscope loads from ``path`` and ``src``."""
    model = load_model(str(path))
    return (model.forward(IDS, torch.ones_like(IDS)) - _logits(src)).abs().max().item()


# ----------------------------------------------------------------------------- tensor shapes that lie


@pytest.mark.parametrize(
    ("tensor", "change", "expected"),
    [
        ("token_embd.weight", lambda a: a[:0], "has shape [64, 0]; the metadata implies [64, 329]"),
        ("blk.0.attn_q.weight", lambda a: a[:48], "has shape [64, 48]; the metadata implies [64, 64]"),
        ("blk.1.attn_output.weight", lambda a: a[:, :32], "has shape [32, 64]; the metadata implies [64, 64]"),
        ("blk.1.ffn_down.weight", lambda a: a[:32], "has shape [128, 32]; the metadata implies [128, 64]"),
    ],
)
def test_a_tensor_whose_shape_lies_is_named(tmp_path, capsys, tensor, change, expected):
    """Was: ``headscope: internal error: RuntimeError: You set `ignore_mismatched_sizes` to False``."""
    path, _ = write_tiny_gguf(tmp_path / "lie.gguf", "llama", edit=_edit(tensor, change))
    for argv in (["capture", path, "--backend", "hf"], ["capture", path], ["card", path]):
        line = cli_error(capsys, *argv)
        assert f"{path}: tensor {tensor!r} {expected}" in line, line
    assert not (tmp_path / "cache").exists()  # refused before anything is dequantised


def test_a_tensor_transformers_would_fill_with_random_values_is_refused(tmp_path, capsys):
    """A tensor missing from its layer: transformers initialised it at random and said nothing."""
    path, _ = write_tiny_gguf(
        tmp_path / "gap.gguf", "llama", edit=lambda n, a: None if n == "blk.1.attn_k.weight" else a
    )
    line = cli_error(capsys, "capture", path, "--backend", "hf")
    assert "1 weight(s) the file does not hold, e.g. 'model.layers.1.self_attn.k_proj.weight'" in line, line


def test_layers_past_or_short_of_block_count_are_named(tmp_path, capsys):
    """block_count 3 over 2 layers of tensors loaded, its third layer random; block_count 1 dropped one."""
    path, _ = write_tiny_gguf(tmp_path / "three.gguf", "llama", metadata={"block_count": 3})
    line = cli_error(capsys, "capture", path)
    assert "llama.block_count is 3, but the file holds no tensor of layer 2 (blk.2.*" in line, line
    path, _ = write_tiny_gguf(tmp_path / "one.gguf", "llama", metadata={"block_count": 1})
    line = cli_error(capsys, "card", path)
    assert "belongs to layer 1, but llama.block_count is 1 (layers 0–0)" in line, line


# ----------------------------------------------------------------------------- tensor types that lie


@pytest.mark.parametrize("tensor", ["blk.0.attn_q.weight", "output.weight"])  # one inside, the last one
def test_a_tensor_whose_type_lies_is_named(tmp_path, capsys, tensor):
    """Q4_0 declared over F32 bytes: was read as Q4_0 garbage (NaNs, or a model that ran)."""
    path, _ = write_tiny_gguf(tmp_path / "q4.gguf", "llama", edit=_edit(tensor, lambda a: (a, Q4_0)))
    rows = 64 if tensor.startswith("blk") else 329
    for argv in (["capture", path], ["card", path]):
        line = cli_error(capsys, *argv)
        assert f"tensor {tensor!r}" in line and f"is declared Q4_0 [64, {rows}] ({rows * 2 * 18:,} bytes)" in line, line
        assert f"{rows * 64 * 4:,} bytes" in line and "declared type or shape does not match its data" in line, line


def _move_offset(path: Path, index: int, to) -> str:
    """Rewrite the data offset of tensor ``index`` in the file's tensor table; its name."""
    reader = gguf.GGUFReader(str(path), "r+")
    tensor = reader.tensors[index]
    offset = tensor.field.parts[-1]
    offset[0] = to(int(offset[0]))
    reader.data.flush()
    return tensor.name


def test_a_data_offset_that_moves_is_named(tmp_path, capsys):
    """A tensor whose data offset points elsewhere than where the one before it ends (inside the
    file), or past the end of the file."""
    path, _ = write_tiny_gguf(tmp_path / "moved.gguf", "llama")
    first = gguf.GGUFReader(str(path)).tensors[0].name
    second = _move_offset(path, 1, lambda o: o + 64)
    line = cli_error(capsys, "card", path)
    assert f"tensor {first!r} is declared F32" in line and f"bytes before {second!r} starts" in line, line
    path, _ = write_tiny_gguf(tmp_path / "away.gguf", "llama")
    _move_offset(path, 1, lambda o: 10**12)
    assert f"{path}: truncated or corrupt GGUF file" in cli_error(capsys, "card", path)


def test_the_shipped_smollm2_file_passes_the_layout_check():
    """The Q4_1 file headscope ships: every tensor where its type and shape put it."""
    from headscope.probes.models.checkpoints import SHIPPED, _package_path
    from headscope.probes.models.gguf import check_gguf

    assert "smollm2-135m" in SHIPPED
    reader = check_gguf(_package_path("smollm2-135m"))
    assert len(reader.tensors) == 272


# ----------------------------------------------------------------------------- per-layer head counts


def _per_layer_gguf(path, heads, kv_heads):
    """A Llama whose layer i has ``heads[i]`` query and ``kv_heads[i]`` KV heads, its tensors the
    width those imply (the source's 4/2 heads repeated): the metadata and tensors agree."""

    def widen(name, a):
        if not name.startswith("blk."):
            return a
        i = int(name.split(".")[1])
        q, kv = heads[i] // 4, kv_heads[i] // 2
        if name.endswith("attn_q.weight"):
            return np.concatenate([a] * q)
        if name.endswith(("attn_k.weight", "attn_v.weight")):
            return np.concatenate([a] * kv)
        if name.endswith("attn_output.weight"):
            return np.concatenate([a] * q, axis=1)
        return a

    return write_tiny_gguf(
        path,
        "llama",
        metadata={"attention.head_count": list(heads), "attention.head_count_kv": list(kv_heads)},
        edit=widen,
    )[0]


def test_equal_per_layer_head_counts_load_as_one_number(tmp_path, capsys):
    """head_count = [4, 4], head_count_kv = [2, 2] (llama.cpp allows arrays): was
    ``StrictDataclassFieldValidationError``; now the model the file holds."""
    path, src = write_tiny_gguf(
        tmp_path / "arrays.gguf",
        "llama",
        metadata={"attention.head_count": [4, 4], "attention.head_count_kv": [2, 2], "feed_forward_length": [128, 128]},
    )
    assert _same_model(path, src) <= 1e-4
    hf = load_model(str(path), "hf")
    assert (hf.spec.n_heads, hf.spec.n_kv_heads) == (4, 2)
    assert (hf.forward(IDS, torch.ones_like(IDS)) - _logits(src)).abs().max().item() <= 1e-4
    assert main(["card", str(path)]) == 0
    assert "heads           4 per layer, 8 in all; d_head 16" in capsys.readouterr().out


def test_differing_per_layer_head_counts_are_refused_for_loading_by_name(tmp_path, capsys):
    """Was: an internal error (transformers' config refused the array)."""
    path = _per_layer_gguf(tmp_path / "48.gguf", [4, 8], [2, 2])
    for argv in (["capture", path], ["capture", path, "--backend", "hf"], ["capture", path, "--backend", "bridge"]):
        line = cli_error(capsys, *argv)
        assert "per-layer sizes (llama.attention.head_count = 4, 8): no backend here builds layers" in line, line
    with pytest.raises(ModelIncompatibleError, match="head_count = 4, 8"):
        load_model(str(path), "inhouse")


@pytest.mark.parametrize(("heads", "kv_heads"), [([4, 8], [2, 2]), ([4, 8], [2, 4]), ([8, 4], [8, 2])])
def test_the_card_adds_per_layer_heads_up(tmp_path, heads, kv_heads):
    """Was "8 per layer, 16 in all" for [4, 8], its KV cache the widest layer's × 2."""
    path = _per_layer_gguf(tmp_path / "pl.gguf", heads, kv_heads)
    card = model_card(str(path))
    text = render_card(card)
    assert f"heads           {heads[0]}, {heads[1]} (per layer), {sum(heads)} in all; d_head 16" in text, text
    kv = f"{kv_heads[0]} in every layer" if kv_heads[0] == kv_heads[1] else f"{kv_heads[0]}, {kv_heads[1]} (per layer)"
    assert f"KV heads        {kv}, {sum(kv_heads)} in all" in text, text
    assert "not loadable    the metadata gives per-layer sizes" in text
    assert (card["heads"], card["kv_heads"], card["heads_per_layer"]) == (None, None, heads)
    assert card["total_heads"] == sum(heads)
    assert card["kv_cache_bytes_per_token"] == 2 * sum(kv_heads) * D_HEAD * 4  # fp32
    assert card["kv_cache_bytes_at_context"] == 2 * sum(kv_heads) * D_HEAD * 4 * 512
    assert card["kv_cache_vs_mha"] == sum(kv_heads) / sum(heads)
    reader = gguf.GGUFReader(str(path))  # every parameter is a tensor of the file
    assert card["total_params"] == sum(int(t.n_elements) for t in reader.tensors)
    attn = ("attn_q", "attn_k", "attn_v", "attn_output")
    assert card["attention_params"] == sum(int(t.n_elements) for t in reader.tensors if t.name.split(".")[-2] in attn)


def test_the_card_of_per_layer_heads_with_an_attention_free_layer(tmp_path, capsys):
    """Layer 1 without heads (as Nemotron-51B's skipped attention): said so, cached as nothing."""
    from test_gguf_card import BASE, write_gguf

    p = write_gguf(
        tmp_path / "free.gguf",
        "llama",
        **dict(BASE, block_count=3),
        attention__head_count=[4, 0, 8],
        attention__head_count_kv=[4, 0, 2],
        rope__dimension_count=16,
    )
    assert main(["card", p]) == 0
    out = capsys.readouterr().out
    assert "heads           4, 0, 8 (per layer), 12 in all; d_head 16" in out, out
    assert "attention       by layer: MHA in layer 0; no attention in layer 1; GQA, groups of 4 in layer 2" in out
    assert "KV cache        768 B per token (fp32)" in out  # 2 × (4 + 0 + 2) × 16 × 4


# ----------------------------------------------------------------------------- absurd counts


ABSURD = [
    ({"attention.head_count": 0}, "llama.attention.head_count must be a positive integer; got 0"),
    ({"attention.head_count": (-4, "int32")}, "llama.attention.head_count must be a positive integer; got -4"),
    ({"attention.head_count": (2**32 - 4, "uint32")}, "head_count=4,294,967,292 (-4 as a signed 32-bit integer"),
    ({"attention.head_count": (10**12, "uint64")}, "head_count=1,000,000,000,000 is more than llama.embedding_length"),
    ({"attention.head_count": 3, "attention.head_count_kv": 1}, "head_count=3 does not divide llama.embedding_length"),
    ({"attention.head_count_kv": 3}, "llama.attention.head_count_kv=3 does not divide llama.attention.head_count=4"),
    (
        {"attention.head_count": [4, 4, 4]},
        "llama.attention.head_count gives 3 per-layer entries; llama.block_count is 2",
    ),
    ({"block_count": 0}, "llama.block_count must be a positive integer; got 0"),
    (
        {"block_count": (10**9, "uint64")},
        "llama.block_count=1,000,000,000 is past 512, the most layers llama.cpp loads",
    ),
    ({"context_length": 0}, "llama.context_length must be a positive integer; got 0"),
    ({"context_length": (2**63, "uint64")}, "llama.context_length=9,223,372,036,854,775,808 is past 2**63"),
    ({"context_length": "long"}, "llama.context_length must be a positive integer; got 'long'"),
    ({"embedding_length": [64, 64]}, "llama.embedding_length must be one integer; got an array of 2"),
]


@pytest.mark.parametrize(("metadata", "expected"), ABSURD, ids=[str(m) for m, _ in ABSURD])
def test_absurd_counts_are_one_line_naming_the_key(tmp_path, capsys, metadata, expected):
    path, _ = write_tiny_gguf(tmp_path / "absurd.gguf", "llama", metadata=metadata)
    assert main(["card", "minilm-l6"]) == 0  # imports done before memory is traced
    capsys.readouterr()
    tracemalloc.start()
    try:
        lines = [cli_error(capsys, *argv) for argv in (["card", path], ["capture", path, "--backend", "hf"])]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for line in lines:
        assert line.startswith(f"headscope: error: {path}: GGUF metadata ") and expected in line, line
    assert peak < 64 * 2**20  # nothing sized by the absurd count


# ----------------------------------------------------------------------------- safetensors weights


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("st") / "llama", "llama")


def _with_weight(src: Path, dst: Path, dtype: torch.dtype) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    state[name] = (state[name] * 100).to(dtype)
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.bool])
def test_an_integer_weight_is_refused_not_cast(llama_dir, tmp_path, capsys, dtype):
    """transformers (and torch's copy) cast int8 -3 to the weight -3.0 without a word; so did headscope."""
    folder = _with_weight(llama_dir, tmp_path / "m", dtype)
    name = str(dtype).removeprefix("torch.")
    for backend in ("inhouse", "hf", "bridge"):
        line = cli_error(capsys, "capture", folder, "--backend", backend)
        assert (
            f"{folder / 'model.safetensors'}: weight 'model.layers.0.self_attn.q_proj.weight' is stored as {name}"
            in line
        )
        assert "quantised checkpoints (int8, GPTQ, AWQ, bitsandbytes) are not supported" in line, line


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_floating_weights_of_any_width_still_load(llama_dir, tmp_path, dtype):
    folder = _with_weight(llama_dir, tmp_path / "m", dtype)
    from safetensors.torch import load_file

    stored = load_file(folder / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    for backend in ("inhouse", "hf"):
        model = load_model(str(folder), backend)
        w = (
            model.module.blocks[0].attn.q_proj.weight
            if backend == "inhouse"
            else model.hf.model.layers[0].self_attn.q_proj.weight
        )
        assert torch.equal(w, stored.float())


def test_a_quantised_checkpoint_is_named_as_such():
    with pytest.raises(CheckpointError, match="it is a quantised checkpoint .*bitsandbytes/GPTQ/AWQ"):
        from headscope.probes.models.checkpoints import check_weight_dtypes

        check_weight_dtypes({"l.0.q_proj.weight": "I8", "l.0.q_proj.SCB": "F32", "embed.position_ids": "I64"}, "m")


# ----------------------------------------------------------------------------- RoPE type in config.json


def test_a_bad_rope_type_blames_config_json(llama_dir, tmp_path, capsys):
    """Was blamed on model.safetensors (``KeyError: 'bogus'``), or sent to --backend hf by the in-house check."""
    folder = tmp_path / "rope"
    shutil.copytree(llama_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "bogus", "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    expected = (
        f"headscope: error: {folder / 'config.json'}: rope_parameters.rope_type is 'bogus', not a RoPE type "
        "transformers implements (valid: default, dynamic, linear, llama3, longrope"
    )
    for argv in (["capture", folder], *(["capture", folder, "--backend", b] for b in ("inhouse", "hf", "bridge"))):
        assert cli_error(capsys, *argv).startswith(expected)
    assert cli_error(capsys, "card", folder).startswith(expected)


def test_legacy_rope_spellings_transformers_renames_pass():
    """Phi-3's ``su`` (now ``longrope``) and Qwen2-VL's ``mrope``: their config classes rename them."""
    phi3 = {
        "model_type": "phi3",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "type": "su",
            "short_factor": [1.0] * 8,
            "long_factor": [1.0] * 8,
            "original_max_position_embeddings": 4096,
        },
    }
    check_hf_config(phi3, "phi3/config.json")
    qwen2_vl = {"model_type": "qwen2_vl", "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
    check_hf_config(qwen2_vl, "q/config.json")
    with pytest.raises(
        CheckpointError, match=r"phi3/config.json: rope_scaling.type is 'sux', and transformers' Phi3Config"
    ):
        check_hf_config({**phi3, "rope_scaling": {"type": "sux"}}, "phi3/config.json")


# ----------------------------------------------------------------------------- property test


TENSORS = ["token_embd.weight", "output_norm.weight"] + [
    f"blk.{i}.{t}.weight"
    for i in (0, 1)
    for t in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
]
# values for each key (None: the honest one); a pair is (value, GGUF type)
METADATA = {
    "attention.head_count": [None, 0, 3, 8, 64, 65, (-4, "int32"), (2**32 - 4, "uint32"), (10**12, "uint64"),
                             [4, 4], [4, 8], [4], [4, 4, 4], [0, 4]],
    "attention.head_count_kv": [None, 0, 1, 3, 4, [2, 2], [2, 4], [1, 2]],
    "block_count": [None, 0, 1, 3, 513, (10**9, "uint64")],
    "context_length": [None, 0, 16, (10**12, "uint64"), (2**64 - 1, "uint64")],
    "embedding_length": [None, 0, 48, 65],
    "feed_forward_length": [None, 64, [128, 128], [128, 64]],
    "vocab_size": [None, 0, 100],
    "attention.key_length": [None, 8, 16],
}  # fmt: skip
LIES = {
    "rows": lambda a: a[: max(len(a) - 16, 0)],
    "cols": lambda a: a[:, :-16] if a.ndim == 2 else a[:-16],
    "type": lambda a: (a, Q4_0),
    "drop": lambda a: None,
}


@st.composite
def gguf_lies(draw):
    """A metadata edit (up to three keys) and a tensor lie (or none)."""
    keys = draw(st.lists(st.sampled_from(sorted(METADATA)), max_size=3, unique=True))
    metadata = {k: v for k in keys if (v := draw(st.sampled_from(METADATA[k]))) is not None}
    lie = draw(st.one_of(st.none(), st.sampled_from(sorted(LIES))))
    tensor = draw(st.sampled_from(TENSORS)) if lie else None
    return metadata, lie, tensor


@pytest.fixture(scope="module")
def source():
    """The tiny Llama every file of the property test is written from."""
    from gguf_writer import tiny_hf_model

    return tiny_hf_model("llama")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(gguf_lies())
def test_a_lying_gguf_loads_as_its_source_or_is_one_line(capsys, source, case):
    """Every outcome is the model the file was written from or one line naming the file (what
    the CLI prints with exit 2); the card likewise: never an internal error, never another model."""
    metadata, lie, tensor = case
    with tempfile.TemporaryDirectory() as root, mock.patch.dict(os.environ, {"HEADSCOPE_CACHE": f"{root}/cache"}):
        edit = _edit(tensor, LIES[lie]) if lie else None
        path, src = write_tiny_gguf(Path(root) / "lie.gguf", "llama", metadata=metadata, edit=edit, source=source)
        rc = main(["card", str(path)])
        err = capsys.readouterr().err
        assert rc in (0, 2), err
        if rc == 2:
            assert err.count("\n") == 1 and err.startswith(f"headscope: error: {path}"), err
        try:
            diff = _same_model(path, src)
        except (HeadscopeError, ValueError, TypeError) as e:  # the CLI's exit 2
            assert "\n" not in str(e).strip() and str(path) in str(e), str(e)
            event(f"refused: {type(e).__name__}")
        else:
            assert diff <= 1e-4, (metadata, lie, tensor)
            event("loaded: the source model")
    capsys.readouterr()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_an_fp8_weight_is_refused_not_cast(llama_dir, tmp_path, capsys, dtype):
    """An FP8 checkpoint keeps per-block scales beside its weights; a cast to float32 (what
    transformers does without a quantisation config) drops them, so every figure would come
    from weights off by those scales."""
    folder = _with_weight(llama_dir, tmp_path / "m", dtype)
    name = str(dtype).removeprefix("torch.")
    for backend in ("inhouse", "hf", "bridge"):
        line = cli_error(capsys, "capture", folder, "--backend", backend)
        assert f"weight 'model.layers.0.self_attn.q_proj.weight' is stored as {name}" in line, line
        assert "FP8-quantised checkpoint" in line, line


def test_a_config_with_absurdly_many_layers_is_refused_at_once(tmp_path, capsys):
    """A Gemma 2 config with a sliding window builds one window entry per layer: with 10**8
    layers the card hung before anything refused it."""
    import json
    import time

    cfg = {
        "model_type": "gemma2",
        "num_hidden_layers": 10**8,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 100,
        "sliding_window": 8,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    start = time.monotonic()
    line = cli_error(capsys, "card", tmp_path / "config.json")
    assert time.monotonic() - start < 60  # a bound for a hang, not a speed target
    assert "num_hidden_layers=100,000,000 layers with a sliding window is past 4,096" in line, line
