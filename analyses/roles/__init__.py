"""Head roles: each role's definition, its streaming reducer, and :func:`head_roles`, which runs them.

:mod:`.pipeline` holds :func:`head_roles` and :func:`run_role` (its inputs in :mod:`.inputs`, the
report's examples in :mod:`.examples`); :mod:`.base` the :class:`Role` contract and the registry;
one module per role family, each defining its group as ``ROLE_DEF`` (:mod:`.positional`,
:mod:`.special`, :mod:`.rareword`, :mod:`.induction`, :mod:`.syntactic`, :mod:`.coreference`),
registered in pipeline order by :mod:`.shipped`, the one place that lists them;
the per-head pattern statistics and masks (:mod:`.pattern_stats`), clustering of heads
(:mod:`.clustering`), word-level pooling (:mod:`.wordlevel`) and the thresholds (:mod:`.config`).
"""

from headscope.analyses.roles.base import REGISTRY, Role, RoleContext, register, role_tasks, unregister
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.pipeline import (
    ROLE_GROUPS,
    RolesResult,
    head_roles,
    roles_by_head,
    run_role,
    summary,
    verdict_overlap,
)

__all__ = [
    "REGISTRY",
    "ROLE_GROUPS",
    "Role",
    "RoleContext",
    "RoleOutput",
    "RolesConfig",
    "RolesResult",
    "head_roles",
    "register",
    "role_tasks",
    "roles_by_head",
    "run_role",
    "summary",
    "unregister",
    "verdict_overlap",
]
