"""Head roles: each role's definition, its streaming reducer, and :func:`head_roles`, which runs them.

:mod:`.pipeline` holds :func:`head_roles`; one module per role family (:mod:`.positional`,
:mod:`.special`, :mod:`.rareword`, :mod:`.induction`, :mod:`.syntactic`, :mod:`.coreference`),
the per-head pattern statistics and masks (:mod:`.pattern_stats`), clustering of heads
(:mod:`.clustering`), word-level pooling (:mod:`.wordlevel`) and the thresholds (:mod:`.config`).
"""

from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.pipeline import ROLE_GROUPS, RolesResult, head_roles, roles_by_head, summary

__all__ = ["ROLE_GROUPS", "RoleOutput", "RolesConfig", "RolesResult", "head_roles", "roles_by_head", "summary"]
