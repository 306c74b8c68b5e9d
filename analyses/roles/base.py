"""What a role analysis is, and the registry :func:`~headscope.analyses.roles.pipeline.head_roles` iterates.

A :class:`Role` is a *group* of role rows measured on one corpus in one streaming pass:
``positional`` emits ``positional:previous``, ``positional:first``, …; ``syntactic`` one
row per head × relation × direction. It says

* ``name``: the group (``--roles`` takes these names);
* ``corpus``: which input it reads — ``"text"`` (plain sentences), ``"conllu"``
  (dependency trees), ``"coref"`` (coreference items) or ``"generated"`` (items the role
  makes itself from the model's tokenizer, e.g. repeated random tokens);
* ``score_kind``: what its per-item values are — ``"share"`` (a continuous share or mass
  in [0, 1]), ``"hit"`` (0/1 per item), or ``"none"`` for a group that emits per-head
  statistics but no verdict rows (``summary``, ``clustering``); the verdict layer picks the test and interval
  that fit (:mod:`headscope.analyses.stats.verdicts`);
* ``reducer(ctx)``: a streaming reducer (``update(cap)``, ``merge(other)``) for the
  items of ``ctx``;
* ``finish(reducer, report, ctx)``: the filled reducer and the stream's
  :class:`~headscope.probes.capture.StreamReport` -> :class:`RoleOutput`;
* ``feed(ctx, reducers, progress)`` (``"generated"`` corpora only): runs the model over
  the role's own items into ``reducers`` and returns a ``StreamReport``;
  ``items(ctx)`` makes those items.

Roles of one corpus share one pass over it. Adding a role = one module that builds a
:class:`Role` + :func:`register` + its tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headscope.analyses.roles.config import RoleOutput, RolesConfig

CORPORA = ("text", "conllu", "coref", "generated")
SCORE_KINDS = ("share", "hit", "none")


@dataclass
class RoleContext:
    """What a role sees: the loaded ``model``, the ``cfg`` and the ``items`` of its corpus
    (texts, :class:`~headscope.probes.corpora.DependencySentence`\\ s,
    :class:`~headscope.probes.corpora.CorefItem`\\ s, or the role's own generated items)."""

    model: Any
    cfg: RolesConfig
    items: list = field(default_factory=list)


@dataclass(frozen=True)
class Role:
    name: str
    corpus: str
    score_kind: str
    reducer: Callable[[RoleContext], Any]
    finish: Callable[[Any, Any, RoleContext], RoleOutput]
    description: str = ""
    items: Callable[[RoleContext], list] | None = None
    feed: Callable[[RoleContext, list, Any], Any] | None = None

    def __post_init__(self):
        if self.corpus not in CORPORA:
            raise ValueError(f"role {self.name!r}: corpus must be one of {CORPORA}; got {self.corpus!r}")
        if self.score_kind not in SCORE_KINDS:
            raise ValueError(f"role {self.name!r}: score_kind must be one of {SCORE_KINDS}; got {self.score_kind!r}")
        if self.corpus == "generated" and (self.items is None or self.feed is None):
            raise ValueError(f"role {self.name!r}: a generated corpus needs items() and feed()")


#: every registered role group, in pipeline order (registration order)
REGISTRY: dict[str, Role] = {}


def register(role: Role, *, replace: bool = False) -> Role:
    """Add ``role`` to :data:`REGISTRY` (``replace=True`` to redefine a name)."""
    if not isinstance(role, Role):
        raise TypeError(f"register takes a Role; got {type(role).__name__}")
    if role.name in REGISTRY and not replace:
        raise ValueError(f"a role group named {role.name!r} is registered already; pass replace=True")
    REGISTRY[role.name] = role
    return role


def unregister(name: str) -> None:
    """Remove a role group (tests that register a toy role clean up with this)."""
    REGISTRY.pop(name, None)
