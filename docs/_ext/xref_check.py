"""Python cross-references that the API reference does not document: checked, not dropped.

The docstrings hold many ``:func:``/``:class:``/``:mod:`` roles to objects outside the public
API pages (private helpers, internal modules). Sphinx's nitpicky mode would report each one as
a missing target. This extension resolves such a reference when its target *exists*: the name,
looked up relative to the module and class the docstring belongs to, then as an absolute
dotted path, imports to a real object. It is then rendered as code, with no link. A target that
does not import (a renamed or deleted object, a typo) is left to Sphinx, which fails the strict
build with the docstring's file and line.
"""

from __future__ import annotations

import builtins
import importlib

_PY_ROLES = {"func", "meth", "class", "mod", "attr", "data", "obj", "exc", "const", "type"}


def _lookup(dotted: str):
    """The object at ``dotted`` (a module path, then attributes), or raise LookupError."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:  # noqa: BLE001 - not a module at this depth; try a shorter prefix
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                # a dataclass field or an annotated attribute without a class-level value
                annotations = getattr(obj, "__annotations__", {}) or {}
                fields = getattr(obj, "__dataclass_fields__", {}) or {}
                if attr in annotations or attr in fields:
                    obj = None
                    continue
                raise LookupError(dotted)
            obj = getattr(obj, attr)
        return obj
    if hasattr(builtins, dotted):
        return getattr(builtins, dotted)
    raise LookupError(dotted)


def exists(target: str, module: str | None, cls: str | None) -> bool:
    """Whether ``target`` names an importable object, read as Python's domain reads it."""
    target = target.lstrip("~.")
    candidates = []
    if module and cls:
        candidates.append(f"{module}.{cls}.{target}")
    if module:
        candidates.append(f"{module}.{target}")
        # a name relative to a parent package (``.frames`` in headscope.analyses.roles.x)
        parent = module.rsplit(".", 1)[0]
        candidates.append(f"{parent}.{target}")
    candidates.append(target)
    for dotted in candidates:
        try:
            _lookup(dotted)
            return True
        except LookupError:
            continue
    return False


def resolve_existing(app, env, node, contnode):
    if node.get("refdomain") != "py" or node.get("reftype") not in _PY_ROLES:
        return None
    if exists(node.get("reftarget", ""), node.get("py:module"), node.get("py:class")):
        return contnode
    return None


def _missing_docstring(obj) -> bool:
    import dataclasses
    import inspect

    doc = inspect.getdoc(obj) or ""
    if not doc.strip():
        return True
    # a dataclass without a docstring gets its signature as __doc__
    return dataclasses.is_dataclass(obj) and doc.startswith(f"{getattr(obj, '__name__', '')}(")


def check_docstring(app, what, name, obj, options, lines):
    """A public object the API reference documents must say what it does: warn (an error in
    the strict build) where its docstring is empty."""
    if what in {"module", "class", "function", "method", "exception"} and _missing_docstring(obj):
        from sphinx.util import logging

        logging.getLogger(__name__).warning(
            f"{name}: a public object of the API reference without a docstring", type="autodoc", subtype="docstring"
        )


def _setup_docstrings(app):
    app.connect("autodoc-process-docstring", check_docstring)


def setup(app):
    # after intersphinx (priority 500) and Python's own domain: only what neither resolved comes here
    app.connect("missing-reference", resolve_existing, priority=900)
    _setup_docstrings(app)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
