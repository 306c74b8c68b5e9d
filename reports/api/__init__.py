"""headscope: what each attention head of a transformer does, how sure it is, and what
happens when heads are removed.

The short API a notebook needs; each name is the library's own object (a re-export), or a
thin function over it, documented at its module path too::

    import headscope as hs

    model = hs.load("minilm-l6")
    roles = hs.roles(model)  # ROLE_COLUMNS: one row per (layer, head, role[, relation, direction])

============================  ==========================================================================
``hs.load``                   :func:`headscope.probes.models.loading.load_model`
``hs.roles``                  :func:`headscope.analyses.roles.pipeline.head_roles`, its role frame
``hs.head_roles``             :func:`headscope.analyses.roles.pipeline.head_roles` (the whole result)
``hs.capture``                :func:`headscope.probes.capture.capture`
``hs.prune``                  :func:`headscope.analyses.pruning.study.pruning_study`
``hs.patch``                  :func:`headscope.analyses.patching.study.patching_study`
``hs.load_task``              :func:`headscope.analyses.patching.tasks.load_task`
``hs.report``                 :func:`headscope.reports.pipeline.build_report`
``hs.load_run``               :func:`headscope.reports.runs.load_run`
``hs.RunConfig`` …            the configs: RunConfig, RolesConfig, PruneConfig, PatchConfig, StudyConfig
============================  ==========================================================================

Heavy modules (torch, transformers) are imported on first use of a name, so ``import
headscope`` (and the ``headscope`` command, which imports this package first) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - names for type checkers; at run time __getattr__ imports them
    import pandas

#: public name -> (module, attribute): imported on first access (PEP 562)
_EXPORTS = {
    "load": ("headscope.probes.models.loading", "load_model"),
    "load_model": ("headscope.probes.models.loading", "load_model"),
    "capture": ("headscope.probes.capture", "capture"),
    "head_roles": ("headscope.analyses.roles.pipeline", "head_roles"),
    "RolesConfig": ("headscope.analyses.roles.config", "RolesConfig"),
    "prune": ("headscope.analyses.pruning.study", "pruning_study"),
    "pruning_study": ("headscope.analyses.pruning.study", "pruning_study"),
    "PruneConfig": ("headscope.analyses.pruning.study", "PruneConfig"),
    "patch": ("headscope.analyses.patching.study", "patching_study"),
    "patching_study": ("headscope.analyses.patching.study", "patching_study"),
    "StudyConfig": ("headscope.analyses.patching.study", "StudyConfig"),
    "PatchConfig": ("headscope.analyses.patching.activation", "PatchConfig"),
    "load_task": ("headscope.analyses.patching.tasks", "load_task"),
    "RunConfig": ("headscope.reports.stages.config", "RunConfig"),
    "report": ("headscope.reports.pipeline", "build_report"),
    "build_report": ("headscope.reports.pipeline", "build_report"),
    "load_run": ("headscope.reports.runs", "load_run"),
    "RunFolder": ("headscope.reports.runs", "RunFolder"),
    "embed": ("headscope.probes.embedding", "embed"),
}

__all__ = sorted([*_EXPORTS, "roles"])


def roles(model, **options) -> pandas.DataFrame:
    """Every head of ``model`` scored for every role: the role frame of
    :func:`~headscope.analyses.roles.pipeline.head_roles` (its ``frame``).

    ``model``: what :func:`~headscope.probes.models.loading.load_model` returned (``hs.load``);
    ``options``: :func:`~headscope.analyses.roles.pipeline.head_roles`'s keywords (``roles=``,
    ``text=``, ``conllu=``, ``coref=``, ``cfg=``, ...). Returns a frame of
    :data:`~headscope.analyses.frames.ROLE_COLUMNS`: one row per (layer, head, role[, relation,
    direction]) with ``score``, ``baseline``, ``margin``, ``ci_low``, ``ci_high``, ``p_value``,
    ``verdict``. Raises what ``head_roles`` raises (``ValueError`` for an unknown role group).

    >>> import headscope as hs
    >>> hs.roles(None, roles=["no-such-role"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown role group...
    """
    from headscope.analyses.roles.pipeline import head_roles

    return head_roles(model, **options).frame


def __getattr__(name: str):
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'headscope' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
