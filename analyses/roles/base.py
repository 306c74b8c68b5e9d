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
  ``items(ctx)`` makes those items;
* ``options``: the names of the per-run options the role reads from ``ctx.options``
  (e.g. ``include_special``; :func:`~headscope.analyses.roles.pipeline.head_roles` takes
  ``options={group: {name: value}}`` and refuses a name not listed here). Options are
  for values that are not configuration (a frequency table, given items) or that only
  one group reads; each role documents its options and their defaults;
* ``task``: the patching task (a name in :data:`~headscope.analyses.patching.tasks.TASKS`)
  that tests the group's rows (``role`` equal to ``name`` or ``name:<kind>``), or None;
  ``row_tasks``: the task of particular rows, by row role (``"previous-token"``) or
  ``"role:relation"`` (``"syntactic:nsubj"``); :func:`role_tasks` collects both;
* ``example(output, row, inputs)``: the item to draw for the report's example of the
  head in ``row`` (a row of the group's frame) -> ``(item index or None, gold (query, key)
  word marks, words or None)``; None: the first readable item of the corpus.

Roles of one corpus share one pass over it. Adding a role = one module that defines its
:class:`Role` as ``ROLE_DEF`` + its line in :mod:`.shipped` (which registers the shipped groups
in pipeline order) + its tests: the role contract test (tests/analyses/roles/test_role_contract.py)
runs on every registered group. :func:`register` adds a group at run time (last);
:func:`~headscope.analyses.roles.pipeline.run_role` runs one group through the same code as
``head_roles``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
    #: the per-run options of this group (names from :attr:`Role.options`); roles read
    #: them with ``ctx.options.get(name, default)``
    options: dict = field(default_factory=dict)
    #: a sharded run's part ``(k, n)``: a feed that honours it (:attr:`Role.shards`) runs only its
    #: batches (:func:`~headscope.probes.capture.in_part`); None: every batch
    part: tuple[int, int] | None = None


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
    options: tuple[str, ...] = ()
    task: str | None = None
    row_tasks: Mapping[str, str] = field(default_factory=dict, hash=False)  # a Role stays hashable
    example: Callable[[RoleOutput, Any, dict], tuple[int | None, list, list | None]] | None = None
    #: a role on generated inputs: ``(longest tokens, items)`` of its sequences under a ``RolesConfig``,
    #: for the memory plan and the time estimate (None: it reads a corpus, measured there)
    generated: Callable[[Any], tuple[int, int]] | None = None
    #: where one of its items costs more than one forward: ``work(cfg, spec, n_items=None)`` -> the
    #: forwards of one item it runs (the time estimate's unit), from the config and the model's shape
    work: Callable[..., int] | None = None
    #: its rows are per relation (dozens of them): examples and summaries pick relations with a verdict
    per_relation: bool = False
    #: what the report adds under the patching result of its ``task`` ("" for nothing)
    task_note: str = ""
    #: it runs when no groups are named (False: only when asked by name, ``--roles <name>``: a group
    #: whose cost is minutes of CPU on a small model)
    default: bool = True
    #: its ``feed`` honours ``ctx.part`` (a corpus role always does: the pipeline's stream runs the
    #: part); False: a sharded run feeds it whole on the first part only
    shards: bool = False
    #: its items are read through the logits: on an encoder (no unembedding) it has none and runs no
    #: forward, so the memory plan holds no working set for it there
    #: (:func:`~headscope.reports.stages.plans.roles_stages`)
    needs_logits: bool = False
    #: its own working sets ``plan(shape, cfg) -> [WorkingSet]`` where its forwards are not a stream
    #: batch of its generated sequences (None: one such batch, ``generated``'s longest)
    plan: Callable[..., list] | None = None

    def __post_init__(self):
        if self.corpus not in CORPORA:
            raise ValueError(f"role {self.name!r}: corpus must be one of {CORPORA}; got {self.corpus!r}")
        if self.score_kind not in SCORE_KINDS:
            raise ValueError(f"role {self.name!r}: score_kind must be one of {SCORE_KINDS}; got {self.score_kind!r}")
        if self.corpus == "generated" and (self.items is None or self.feed is None):
            raise ValueError(f"role {self.name!r}: a generated corpus needs items() and feed()")
        if isinstance(self.options, str) or not all(isinstance(o, str) for o in self.options):
            raise TypeError(f"role {self.name!r}: options must be a tuple of option names; got {self.options!r}")
        if self.task is not None and not isinstance(self.task, str):
            raise TypeError(f"role {self.name!r}: task must be a task name or None; got {self.task!r}")
        if not isinstance(self.row_tasks, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.row_tasks.items()
        ):
            raise TypeError(f"role {self.name!r}: row_tasks must map row roles to task names; got {self.row_tasks!r}")


#: every registered role group, in pipeline order (registration order; :mod:`.shipped`
#: registers the shipped ones)
REGISTRY: dict[str, Role] = {}


def register(role: Role, *, replace: bool = False) -> Role:
    """Add ``role`` to :data:`REGISTRY`, last (``replace=True`` to redefine a name, which
    keeps its place)."""
    if not isinstance(role, Role):
        raise TypeError(f"register takes a Role; got {type(role).__name__}")
    known = REGISTRY.get(role.name)
    if known is not None and not replace:
        if _source(known) is not None and _source(known) == _source(role):
            return known  # the same module imported again under another name (pytest --doctest-modules)
        raise ValueError(f"a role group named {role.name!r} is registered already; pass replace=True")
    REGISTRY[role.name] = role
    return role


def _source(role: Role) -> str | None:
    """The file that defines ``role.finish``."""
    return getattr(getattr(role.finish, "__code__", None), "co_filename", None)


def unregister(name: str) -> None:
    """Remove a role group (tests that register a toy role clean up with this)."""
    REGISTRY.pop(name, None)


def per_relation_roles() -> frozenset[str]:
    """The registered roles whose rows are per relation (:attr:`Role.per_relation`)."""
    from headscope.analyses.roles import shipped  # noqa: F401  (registers the shipped roles)

    return frozenset(n for n, r in REGISTRY.items() if r.per_relation)


def task_notes() -> dict[str, str]:
    """Patching task -> the note its role adds under the task's result (:attr:`Role.task_note`)."""
    from headscope.analyses.roles import shipped  # noqa: F401  (registers the shipped roles)

    return {r.task: r.task_note for r in REGISTRY.values() if r.task and r.task_note}


def role_tasks() -> dict[str, str]:
    """The patching task of each role key, from every registered group's :attr:`Role.task`
    (keyed by the group's name) and :attr:`Role.row_tasks`: ``{role or "role:relation": task}``.
    A row role ``a:b`` without its own key takes ``a``'s task.

    >>> role_tasks()["syntactic:nsubj"], role_tasks()["coreference"]  # doctest: +SKIP
    ('agreement', 'coreference')
    """
    out: dict[str, str] = {}
    for role in REGISTRY.values():
        if role.task is not None:
            out[role.name] = role.task
        out.update(role.row_tasks)
    return out
