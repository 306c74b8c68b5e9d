"""Where checkpoints come from and where headscope caches what it derives from them; the layout of a
sentence-transformers folder (:func:`sentence_transformers_layout`)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from headscope.probes.errors import CheckpointError


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


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ----------------------------------------------------------------------------- sentence-transformers folders

#: ``1_Pooling/config.json``'s ``pooling_mode_*`` flags -> the mode's name
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclass(frozen=True)
class SentenceTransformersLayout:
    """What a sentence-transformers folder's ``modules.json`` says: where its transformer is
    (the root or ``0_Transformer/``), how it pools (``"mean"``, ``"cls"``, …; None without a
    Pooling module or its ``config.json``) and whether it normalises the pooled embedding."""

    transformer_dir: Path
    pooling: str | None
    normalize: bool


def _read_json(path: Path):
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 (byte offset {e.start}); save it as UTF-8 JSON") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None


def _pooling_mode(path: Path) -> str:
    cfg = _read_json(path)
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object of pooling_mode_* flags")
    if isinstance(cfg.get("pooling_mode"), str):
        return cfg["pooling_mode"]
    if isinstance(cfg.get("pooling_mode"), list) and cfg["pooling_mode"]:  # several modes, concatenated
        return "+".join(map(str, cfg["pooling_mode"]))
    modes = [name for flag, name in _POOLING_FLAGS.items() if cfg.get(flag) is True]
    if not modes:
        raise CheckpointError(f"{path}: no pooling mode set (expected one of {', '.join(_POOLING_FLAGS)} true)")
    return "+".join(modes)


def sentence_transformers_layout(folder: Path) -> SentenceTransformersLayout | None:
    """The layout of a sentence-transformers ``folder`` (None: it has no ``modules.json``); a
    ``modules.json`` without a Transformer module, or naming a folder that is not there, is refused
    in one line naming the file and the module."""
    modules_json = Path(folder) / "modules.json"
    if not modules_json.is_file():
        return None
    modules = _read_json(modules_json)
    if not isinstance(modules, list) or not all(
        isinstance(m, dict) and isinstance(m.get("type"), str) for m in modules
    ):
        raise CheckpointError(f"{modules_json}: expected a JSON list of modules, each with a 'type'")
    transformer = pooling = None
    normalize = False
    for i, m in enumerate(modules):
        kind = m["type"].rsplit(".", 1)[-1]
        where = Path(folder) / str(m.get("path", ""))
        if kind == "Transformer" and transformer is None:
            if not (where / "config.json").is_file():
                raise CheckpointError(f"{modules_json}: module {i} (Transformer) has no config.json in {where}")
            transformer = where
        elif kind == "Pooling" and (where / "config.json").is_file():  # a copy without it: pooling unknown
            pooling = _pooling_mode(where / "config.json")
        elif kind == "Normalize":
            normalize = True
    if transformer is None:
        raise CheckpointError(f"{modules_json}: no sentence_transformers.models.Transformer module")
    return SentenceTransformersLayout(transformer, pooling, normalize)
