"""run.json, written one way by every command (``roles``, ``patch``, ``prune``, ``report``).

Every run.json starts with the same keys, :data:`COMMON_KEYS`: the output's kind
(``output``, :func:`~headscope.probes.outputs.kinds.manifest_header`), then which model ran
and where (``model``, ``backend``, ``backend_choice``, ``backend_rejected``, ``head_modules``, ``device``,
``dtype``, ``trust_remote_code``, ``purpose``, ``embedding``: :func:`model_record` of the loaded model). Each command adds its own
keys (config, items, timings, summaries, memory, ...) through :func:`run_json`.

>>> rec = {"model": "m", "backend": "inhouse", "backend_choice": "inhouse", "device": "cpu", "dtype": "fp32"}
>>> doc = run_json("roles", rec, seed=0)
>>> sorted(doc) == sorted((*COMMON_KEYS, "seed")), doc["output"]["kind"], doc["trust_remote_code"]
(True, 'roles', False)
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Mapping
from pathlib import Path

from headscope.probes.outputs.atomic import write_json
from headscope.probes.outputs.kinds import manifest_header

__all__ = [
    "COMMON_KEYS",
    "MODEL_KEYS",
    "VERSION_PACKAGES",
    "add_to_run_json",
    "model_record",
    "purpose_record",
    "run_json",
    "versions",
    "write_run_json",
]

#: the model's keys of every run.json (:func:`model_record`)
MODEL_KEYS = (
    "model",
    "backend",
    "backend_choice",
    "backend_rejected",
    "head_modules",
    "device",
    "dtype",
    "trust_remote_code",
    "purpose",
    "embedding",
)
#: the keys every run.json holds, whatever the command
COMMON_KEYS = ("output", *MODEL_KEYS)

#: run.json's ``versions`` (the report's): key -> distribution name
VERSION_PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "transformer_lens": "transformer-lens",
    "headscope": "headscope",
    "numpy": "numpy",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
}


def versions() -> dict[str, str | None]:
    """The installed version of each of :data:`VERSION_PACKAGES` (None when not installed)."""
    out = {}
    for key, dist in VERSION_PACKAGES.items():
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    return out


def model_record(model) -> dict:
    """:data:`MODEL_KEYS` of a loaded model: its name, backend (and why it was chosen), where
    it runs (:func:`~headscope.probes.models.backends.protocol.placement`: ``device``,
    ``dtype``) and whether checkpoint code was allowed to run."""
    from headscope.probes.models.backends.protocol import placement

    return {
        "model": model.spec.name,
        "backend": model.backend,
        "backend_choice": getattr(model, "backend_choice", model.backend),
        "backend_rejected": list(getattr(model, "backend_rejected", [])),  # --backend auto: [{backend, reason}]
        "head_modules": getattr(model, "head_modules", None),  # hf: the module the head hooks use, how found
        **placement(model),
        "trust_remote_code": bool(getattr(model, "trust_remote_code", False)),
        **purpose_record(model),
    }


def purpose_record(model) -> dict:
    """run.json's ``purpose`` (what the model is for, decided at load:
    :func:`~headscope.probes.models.purpose.purpose_of`) and ``embedding`` (an embedding model's
    pipeline, :meth:`~headscope.probes.models.sentence_pipeline.SentencePipeline.record`; None for a
    language model)."""
    from headscope.probes.embedding import pipeline_of
    from headscope.probes.models.purpose import purpose_of

    purpose = purpose_of(model)
    return {
        "purpose": purpose.record(),
        "embedding": pipeline_of(model).record() if purpose.kind == "embedding" else None,
    }


def run_json(kind: str, record: Mapping, **fields) -> dict:
    """The run.json of a ``kind`` run: :data:`COMMON_KEYS` (the manifest header, then
    :data:`MODEL_KEYS` from ``record``, :func:`model_record` or a mapping holding those keys;
    a key it lacks is None), then the command's own ``fields``. A field named like a model key
    says what the command records there instead (``roles`` records the dtype asked)."""
    model = {k: record.get(k) for k in MODEL_KEYS}
    model["trust_remote_code"] = bool(model["trust_remote_code"])
    model["backend_rejected"] = list(model["backend_rejected"] or [])
    return {**manifest_header(kind), **model, **fields}


def write_run_json(folder, kind: str, record: Mapping, **fields) -> Path:
    """Write :func:`run_json` atomically as ``folder/run.json``; returns its path."""
    path = Path(folder) / "run.json"
    write_json(run_json(kind, record, **fields), path)
    return path


def add_to_run_json(folder, **fields) -> bool:
    """Add ``fields`` to the run.json a run wrote in ``folder`` (rewritten atomically; a
    pruning study's, which the command completes with its notes and memory). False, and
    nothing written, when ``folder`` is None or holds no run.json (an incomplete study)."""
    if folder is None:
        return False
    path = Path(folder) / "run.json"
    if not path.is_file():
        return False
    write_json({**json.loads(path.read_text(encoding="utf-8")), **fields}, path)
    return True
