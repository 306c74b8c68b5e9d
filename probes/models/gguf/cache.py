"""A GGUF file dequantised to float32 once (through transformers' GGUF reader) and cached as an
HF-format directory keyed by the file's SHA-256, so later loads take seconds, not the ~30 s of
dequantisation; the keys transformers' reader gets wrong are taken from the metadata.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
from pathlib import Path

import torch

from headscope.probes.errors import CheckpointError, UnknownGGUFArchitectureError
from headscope.probes.models.arch import check_hf_config
from headscope.probes.models.cachelock import cache_lock, drop_leftovers
from headscope.probes.models.families import GGUF_RECORDS
from headscope.probes.models.gguf.metadata import EQUAL_PER_LAYER, GGUF_ARCHITECTURES, gguf_hf_config
from headscope.probes.models.quiet import quiet_transformers
from headscope.probes.models.source import cache_dir, file_sha256
from headscope.probes.models.weights import check_weight_memory

#: under the name its -v lines have always carried (``INFO headscope.probes.models.checkpoints: dequantising ...``)
log = logging.getLogger("headscope.probes.models.checkpoints")


def gguf_as_hf_dir(path: Path) -> Path:
    """Dequantise a GGUF file to float32 once and cache it as an HF-format directory.

    The file's sizes are checked first, from its metadata alone (:func:`gguf_meta_config`), for
    every architecture. transformers writes no ``architectures`` into the config of a GGUF it
    reads (the transformer-lens bridge needs it); the cached ``config.json`` gets it from the
    model class transformers built, and a folder cached before without it is given it here."""
    path = Path(path)
    digest = file_sha256(path)[:16]
    out = cache_dir() / "gguf" / digest
    if not _cached(out):
        meta = gguf_meta_config(path)  # refused on its metadata before anything is written
        check_hf_config(meta, str(path))
        check_weight_memory(meta, str(path))
        with cache_lock(out):  # one process dequantises; another asking at once waits, then reads it
            if not _cached(out):
                drop_leftovers(out)
                _dequantise(path, out, digest, meta)
                return out
    settle_cached_config(out / "config.json", path)
    return out


def _cached(out: Path) -> bool:
    return (out / "model.safetensors").exists() and (out / "config.json").exists()


def _dequantise(path: Path, out: Path, digest: str, meta: dict) -> None:
    """Dequantise ``path`` (``meta``: its checked metadata config) into ``out``: a temporary
    folder, renamed into place once written (under :func:`~headscope.probes.models.cachelock.cache_lock`)."""
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
    os.replace(tmp, out)


@contextlib.contextmanager
def per_layer_arrays_as_numbers(path: Path, keys) -> None:
    """While transformers reads the GGUF file ``path``, show each of ``keys`` (full GGUF keys
    that :func:`~headscope.probes.models.gguf.metadata.gguf_hf_config` found to be per-layer arrays
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
    tensor is read: :func:`~headscope.probes.models.gguf.metadata.gguf_hf_config` (a cut or corrupt file
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
#: file says otherwise (or llama.cpp, whose files these are, derives them): those the families'
#: records name (``GGUF.over_reader``: Gemma's soft-caps, query scale and sliding/global layers),
#: in the order of :data:`~headscope.probes.models.families.GGUF_RECORDS`, then scaled RoPE, which
#: any architecture's file may give (Gemma 3's linear, Llama 3's ``rope_freqs``, yarn). The
#: metadata's value (:func:`gguf_meta_config`) goes into the cached ``config.json`` of every file
#: where it differs, so every backend builds the model the file describes.
METADATA_OVER_READER = tuple(dict.fromkeys([*(k for r in GGUF_RECORDS for k in r.over_reader), "rope_parameters"]))


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
        pairs = set(GGUF_ARCHITECTURES.values())  # a model_type of two classes (T5's) is not guessed
        classes = {mt: cls for mt, cls in pairs if sum(m == mt for m, _ in pairs) == 1}
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
