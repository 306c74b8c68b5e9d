"""Intersphinx inventories written offline from the installed packages' public names.

``make docs`` runs with no network, so Sphinx cannot fetch ``objects.inv`` from python.org,
pytorch.org, pandas.pydata.org, numpy.org or huggingface.co. At configuration time this module
writes a small inventory for each (format 2, what Sphinx reads) into ``docs/_build/inventories``
from the names the installed packages export, each with the URL scheme of its documentation
site; ``conf.py`` points ``intersphinx_mapping`` at them. Regenerated on every build, so they
follow the installed versions; a name a site does not document gives a dead link, not a build
failure.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import zlib
from pathlib import Path

SITES = {
    "python": "https://docs.python.org/3/",
    "torch": "https://docs.pytorch.org/docs/stable/",
    "pandas": "https://pandas.pydata.org/docs/",
    "numpy": "https://numpy.org/doc/stable/",
    "transformers": "https://huggingface.co/docs/transformers/main/en/",
}

_STDTYPES = {"str", "int", "float", "bool", "list", "dict", "tuple", "set", "frozenset", "bytes", "complex", "range"}
_STDLIB = ("pathlib", "typing", "collections.abc", "os", "dataclasses", "logging", "json", "collections", "enum")
_TRANSFORMERS = {
    "PreTrainedModel": "main_classes/model",
    "PreTrainedTokenizerBase": "main_classes/tokenizer",
    "PreTrainedTokenizer": "main_classes/tokenizer",
    "PreTrainedTokenizerFast": "main_classes/tokenizer",
    "PretrainedConfig": "main_classes/configuration",
    "AutoModel": "model_doc/auto",
    "AutoModelForCausalLM": "model_doc/auto",
    "AutoModelForMaskedLM": "model_doc/auto",
    "AutoTokenizer": "model_doc/auto",
    "AutoConfig": "model_doc/auto",
}


def _role(obj) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if callable(obj):
        return "function"
    return "data"


def _public(module) -> list[tuple[str, object]]:
    out = []
    for name in sorted(getattr(module, "__all__", None) or dir(module)):
        if name.startswith("_"):
            continue
        try:
            out.append((name, getattr(module, name)))
        except Exception:  # noqa: BLE001 - a lazy attribute that fails to import is left out
            continue
    return out


def _python() -> list[tuple[str, str, str]]:
    rows = []
    for name, obj in _public(builtins):
        role = _role(obj)
        page = (
            "library/stdtypes.html"
            if name in _STDTYPES
            else "library/exceptions.html"
            if role == "exception"
            else "library/functions.html"
        )
        rows.append((name, role, f"{page}#{name}"))
    rows.append(("None", "data", "library/constants.html#None"))
    for mod_name in _STDLIB:
        module = importlib.import_module(mod_name)
        rows.append((mod_name, "module", f"library/{mod_name}.html#module-{mod_name}"))
        for name, obj in _public(module):
            if not inspect.ismodule(obj):
                rows.append((f"{mod_name}.{name}", _role(obj), f"library/{mod_name}.html#{mod_name}.{name}"))
    return rows


def _torch() -> list[tuple[str, str, str]]:
    import torch
    import torch.nn

    rows = [("torch", "module", "torch.html#module-torch"), ("torch.Tensor", "class", "tensors.html#torch.Tensor")]
    rows += [(f"torch.{n}", "class", f"tensor_attributes.html#torch.{n}") for n in ("device", "dtype")]
    for prefix, module in (("torch", torch), ("torch.nn", torch.nn)):
        for name, obj in _public(module):
            if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj):
                if f"{prefix}.{name}" not in {"torch.Tensor", "torch.device", "torch.dtype"}:
                    rows.append((f"{prefix}.{name}", _role(obj), f"generated/{prefix}.{name}.html"))
    return rows


def _pandas() -> list[tuple[str, str, str]]:
    import pandas

    rows = [("pandas", "module", "reference/index.html#module-pandas")]
    for name, obj in _public(pandas):
        if inspect.isclass(obj) or inspect.isfunction(obj):
            rows.append((f"pandas.{name}", _role(obj), f"reference/api/pandas.{name}.html"))
    for cls in ("DataFrame", "Series"):
        for name, _ in _public(getattr(pandas, cls)):
            rows.append((f"pandas.{cls}.{name}", "method", f"reference/api/pandas.{cls}.{name}.html"))
    return rows


def _numpy() -> list[tuple[str, str, str]]:
    import numpy

    rows = [("numpy", "module", "reference/index.html#module-numpy")]
    for name, obj in _public(numpy):
        if inspect.isclass(obj) or callable(obj):
            rows.append((f"numpy.{name}", _role(obj), f"reference/generated/numpy.{name}.html"))
    return rows


def _transformers() -> list[tuple[str, str, str]]:
    return [(f"transformers.{n}", "class", f"{page}#transformers.{n}") for n, page in _TRANSFORMERS.items()]


def write_inventory(path: Path, project: str, rows: list[tuple[str, str, str]]) -> None:
    """Write ``rows`` of ``(name, role, uri)`` as a Sphinx objects inventory (format 2)."""
    header = f"# Sphinx inventory version 2\n# Project: {project}\n# Version: \n# The remainder of this file is compressed using zlib.\n"
    seen: set[tuple[str, str]] = set()
    lines = []
    for name, role, uri in rows:
        if (name, role) in seen:
            continue
        seen.add((name, role))
        lines.append(f"{name} py:{role} 1 {uri} -\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header.encode() + zlib.compress("".join(lines).encode()))


def inventories(folder: Path) -> dict[str, tuple[str, str]]:
    """Write every inventory into ``folder``; the ``intersphinx_mapping`` that reads them."""
    makers = {"python": _python, "torch": _torch, "pandas": _pandas, "numpy": _numpy, "transformers": _transformers}
    mapping = {}
    for name, make in makers.items():
        path = folder / f"{name}.inv"
        write_inventory(path, name, make())
        mapping[name] = (SITES[name], str(path))
    return mapping
