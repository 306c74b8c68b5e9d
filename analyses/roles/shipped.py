"""The shipped role groups, registered here in pipeline order: the one place that lists them.

Each role module defines its group as ``ROLE_DEF`` (a :class:`~headscope.analyses.roles.base.Role`)
and registers nothing itself; this module registers them in the order the pipeline runs
them (its stages, the statistics table, ``skipped.json`` and ``--roles`` follow it).
Everything else (the pipeline, the CLI help, the report, the tests) iterates
:data:`~headscope.analyses.roles.base.REGISTRY`. A new role is its module and one line
below (plus its import).

>>> from headscope.analyses.roles.base import REGISTRY
>>> tuple(REGISTRY)[:3]
('positional', 'special', 'rare-word')
"""

from __future__ import annotations

from headscope.analyses.roles import (
    clustering,
    copy_suppression,
    coreference,
    function_vector,
    induction,
    ioi,
    pattern_stats,
    positional,
    rareword,
    special,
    successor,
    syntactic,
)
from headscope.analyses.roles.base import register

#: the modules defining the shipped groups, in pipeline order
MODULES = (
    positional,
    special,
    rareword,
    pattern_stats,  # summary
    clustering,
    induction,
    successor,
    copy_suppression,
    function_vector,
    ioi,
    syntactic,
    coreference,
)
for _module in MODULES:
    register(_module.ROLE_DEF)
