"""A sentence-transformers folder's embedding pipeline, read from its own files without importing
sentence-transformers: :func:`read_pipeline` -> :class:`SentencePipeline`.

The folder's ``modules.json`` lists its modules in order: the Transformer (whose last hidden
states are the token embeddings), then any of Pooling (``1_Pooling/config.json``), Dense
(``2_Dense/config.json`` and its ``linear`` weights) and Normalize. Prompts come from
``config_sentence_transformers.json`` (``prompts``, ``default_prompt_name``), the truncation
length from ``sentence_bert_config.json`` (``max_seq_length``). A folder without
``modules.json`` gets :data:`ASSUMED` (mean pooling, then Normalize; ``assumed`` is True).
The arithmetic that applies a pipeline is :mod:`headscope.probes.embedding`.

>>> ASSUMED.pooling, ASSUMED.normalize, ASSUMED.assumed
(('mean',), True, True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headscope.probes.errors import CheckpointError

#: sentence-transformers' pooling modes, in the order it concatenates several (its
#: ``Pooling.POOLING_MODES``); legacy ``pooling_mode_*`` flags map onto them
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
#: the module types applied here (``modules.json``'s ``type``, last dotted part)
MODULES = ("Transformer", "Pooling", "Dense", "Normalize")


@dataclass(frozen=True)
class DenseLayer:
    """One Dense module: ``activation(x @ weight.T + bias)`` (plus ``x`` or ``x @ residual.T``
    with ``use_residual``). ``weight [out, in]``; ``activation`` is a ``torch.nn`` class name."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    activation: str = "Tanh"
    residual: torch.Tensor | None = None
    use_residual: bool = False


@dataclass(frozen=True, kw_only=True)
class SentencePipeline:
    """What turns a model's last hidden states into its sentence embedding.

    ``pooling``: the modes, concatenated in this order (:data:`POOLING_MODES`);
    ``include_prompt``: whether prompt tokens count in the pooling; ``dense``: the Dense
    modules in order; ``normalize``: a Normalize module ends it; ``prompts`` and
    ``default_prompt_name``: the folder's prompts; ``max_seq_length``: its truncation (None:
    the model's context); ``assumed``: no ``modules.json`` (mean pooling and Normalize assumed);
    ``folder``: where it was read from."""

    pooling: tuple[str, ...] = ("mean",)
    include_prompt: bool = True
    dense: tuple[DenseLayer, ...] = ()
    normalize: bool = True
    prompts: dict = field(default_factory=dict)
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    assumed: bool = False
    folder: str | None = None

    def __post_init__(self):
        bad = [m for m in self.pooling if m not in POOLING_MODES]
        if not self.pooling or bad:
            raise ValueError(f"pooling must be a non-empty tuple of {POOLING_MODES}; got {self.pooling!r}")

    def prompt(self, name: str | None = None) -> str | None:
        """The prompt text of ``name`` (None: the folder's ``default_prompt_name``, if any);
        ``ValueError`` naming the folder's prompts for an unknown name."""
        if name is None:
            return self.prompts.get(self.default_prompt_name) if self.default_prompt_name else None
        if name not in self.prompts:
            have = ", ".join(self.prompts) or "none"
            raise ValueError(f"prompt {name!r} is not one of the model's prompts ({have})")
        return self.prompts[name]

    def describe(self) -> str:
        """The pipeline in words, e.g. ``"mean pooling, Normalize"``."""
        parts = [f"{'+'.join(self.pooling)} pooling" + ("" if self.include_prompt else " (prompt excluded)")]
        parts += [f"Dense {d.weight.shape[1]}->{d.weight.shape[0]} ({d.activation})" for d in self.dense]
        parts += ["Normalize"] if self.normalize else []
        text = ", ".join(parts)
        return f"{text} (assumed: the folder has no modules.json)" if self.assumed else text

    def record(self) -> dict:
        """run.json's ``embedding``: the pipeline without its weights."""
        return {
            "pooling": list(self.pooling),
            "include_prompt": self.include_prompt,
            "dense": [
                {"in": d.weight.shape[1], "out": d.weight.shape[0], "activation": d.activation} for d in self.dense
            ],
            "normalize": self.normalize,
            "prompts": sorted(self.prompts),
            "default_prompt_name": self.default_prompt_name,
            "max_seq_length": self.max_seq_length,
            "assumed": self.assumed,
            "describe": self.describe(),
        }


#: a folder without ``modules.json``: mean over real tokens, then Normalize (all-MiniLM-L6-v2's recipe)
ASSUMED = SentencePipeline(assumed=True)


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable ({e})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None


def pooling_config(path: Path) -> tuple[tuple[str, ...], bool]:
    """``(modes, include_prompt)`` of a Pooling module's ``config.json``: ``pooling_mode`` (a
    name or a list), or the legacy ``pooling_mode_*`` flags (none set: mean, as
    sentence-transformers reads them); ``CheckpointError`` for an unknown mode."""
    cfg = _json(path)
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = tuple(m for flag, m in _LEGACY_FLAGS.items() if cfg.get(flag) is True) or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    modes = tuple("mean_sqrt_len_tokens" if m == "mean_sqrt_len" else m for m in modes)
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad or not modes:
        raise CheckpointError(f"{path}: pooling mode {bad[0] if bad else mode!r} is not one of {POOLING_MODES}")
    return modes, bool(cfg.get("include_prompt", True))


def _dense(where: Path) -> DenseLayer:
    """A Dense module's folder: its ``config.json`` and ``model.safetensors`` (or ``pytorch_model.bin``)."""
    cfg = _json(where / "config.json")
    act = str(cfg.get("activation_function") or "torch.nn.modules.activation.Tanh")
    name = act.rsplit(".", 1)[-1]
    if not act.startswith("torch.") or not isinstance(getattr(torch.nn, name, None), type):
        raise CheckpointError(
            f"{where / 'config.json'}: activation {act!r} is not a torch.nn module; only torch.nn activations are applied"
        )
    if (where / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(where / "model.safetensors"))
    elif (where / "pytorch_model.bin").is_file():
        state = torch.load(where / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(f"{where}: a Dense module without model.safetensors or pytorch_model.bin")
    if "linear.weight" not in state:
        raise CheckpointError(f"{where}: no 'linear.weight' in the Dense module's weights ({', '.join(state)})")
    return DenseLayer(
        weight=state["linear.weight"].float(),
        bias=state["linear.bias"].float() if "linear.bias" in state else None,
        activation=name,
        residual=state["residual.weight"].float() if "residual.weight" in state else None,
        use_residual=bool(cfg.get("use_residual", False)),
    )


def read_pipeline(folder: str | Path | None) -> SentencePipeline:
    """The pipeline of the sentence-transformers ``folder`` (its ``modules.json``), or
    :data:`ASSUMED` when ``folder`` is None or has none. ``CheckpointError`` (one line naming the
    file) for a module other than :data:`MODULES`, or an unreadable config.

    >>> read_pipeline(None) is ASSUMED
    True
    """
    if folder is None or not (Path(folder) / "modules.json").is_file():
        return ASSUMED
    folder = Path(folder)
    modules = _json(folder / "modules.json")
    if not isinstance(modules, list):
        raise CheckpointError(f"{folder / 'modules.json'}: expected a JSON list of modules")
    pooling, include_prompt, dense, normalize = None, True, [], False
    for i, m in enumerate(modules):
        kind = str(m.get("type", "")).rsplit(".", 1)[-1] if isinstance(m, dict) else ""
        where = folder / str(m.get("path", "")) if isinstance(m, dict) else folder
        if kind not in MODULES:
            raise CheckpointError(
                f"{folder / 'modules.json'}: module {i} is {kind or m!r}; headscope applies {', '.join(MODULES)}"
            )
        if kind == "Pooling":
            pooling, include_prompt = (
                pooling_config(where / "config.json") if (where / "config.json").is_file() else (("mean",), True)
            )
        elif kind == "Dense":
            dense.append(_dense(where))
        elif kind == "Normalize":
            normalize = True
    st = (
        _json(folder / "config_sentence_transformers.json")
        if (folder / "config_sentence_transformers.json").is_file()
        else {}
    )
    bert = _json(folder / "sentence_bert_config.json") if (folder / "sentence_bert_config.json").is_file() else {}
    prompts = st.get("prompts") or {}
    if not isinstance(prompts, dict):
        raise CheckpointError(f"{folder / 'config_sentence_transformers.json'}: 'prompts' must be an object")
    return SentencePipeline(
        pooling=pooling or ("mean",),
        include_prompt=include_prompt,
        dense=tuple(dense),
        normalize=normalize,
        prompts={str(k): str(v) for k, v in prompts.items()},
        default_prompt_name=st.get("default_prompt_name") or None,
        max_seq_length=bert.get("max_seq_length"),
        folder=str(folder),
    )
