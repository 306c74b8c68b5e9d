"""The quick pruning stage's settings, defined once.

The report's default pruning stage (``headscope report`` without ``--full``,
``analyses.run.RunConfig.pruning``) and the bench's ``quick_pruning`` paths (which time that stage) both
build their :class:`~headscope.analyses.pruning.study.PruneConfig` from
:data:`QUICK_PRUNING`, so the bench times what the report runs. The quick stage leaves out
mean ablation (an extra corpus pass and H more evaluations) and all-but-one (H more
evaluations); ``--full`` runs every study, both ablation modes, on all items.

>>> dict(QUICK_PRUNING)
{'quick': True, 'ablation_modes': ('zero',), 'studies': ('ablation', 'importance', 'curves')}
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["QUICK_PRUNING", "QUICK_STUDIES"]

#: pruning studies of the default (quick) report; ``--full`` runs them all
QUICK_STUDIES: tuple[str, ...] = ("ablation", "importance", "curves")

#: ``PruneConfig`` keywords of the quick stage (read-only): ``PruneConfig(**QUICK_PRUNING, seed=seed)``
QUICK_PRUNING: Mapping[str, object] = MappingProxyType(
    {"quick": True, "ablation_modes": ("zero",), "studies": QUICK_STUDIES}
)
