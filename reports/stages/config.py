"""What one report run does: :class:`RunConfig` (the model's load, which stages run, their settings).

Example::

    RunConfig(seed=1, only=("roles", "pruning"))
    RunConfig(full=True, patching=False)   # the same as skip=("patching",) but said "turned off (--no-patching)"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from headscope.analyses.kvcache.stage import KVStageConfig
from headscope.analyses.pruning.study import PruneConfig
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.run_patching import CausalConfig
from headscope.analyses.run_weights import WeightsConfig
from headscope.reports.stages.sharded import RayConfig

if TYPE_CHECKING:
    import torch

__all__ = ["BACKEND_CHOICES", "RunConfig"]

#: ``RunConfig.backend``: ``"auto"`` or one of the backends of :func:`~headscope.probes.models.loading.load_model`
BACKEND_CHOICES = ("auto", "inhouse", "bridge", "hf")

#: the settings fields of :class:`RunConfig` per stage (a newer stage's go in ``configs``)
_GIVEN = {
    "roles": "roles_config",
    "pruning": "prune_config",
    "patching": "causal_config",
    "weights": "weights_config",
    "kv": "kv_config",
}
#: the stages whose settings run.json's ``config`` records (its keys as they were)
_RECORDED = ("roles", "pruning", "patching")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What one report run does.

    ``backend``: ``"auto"`` (the loader's choice; a held model keeps its own backend),
    ``"inhouse"``, ``"bridge"`` or ``"hf"``; ``dtype`` / ``device`` / ``device_map`` /
    ``trust_remote_code``: as :func:`~headscope.probes.models.loading.load_model`; ``max_memory``
    (``{gpu index: bytes}``, with ``device_map``): the devices the placement is planned over
    (:mod:`~headscope.reports.device_plan`; None: every CUDA device's free memory).
    ``full``: every stage's full settings (default: the quick ones, sized by the model's cost over
    ``large_cost``, None: :data:`~headscope.reports.stages.quick.LARGE_COST`). ``seed``: every
    random draw. ``only`` / ``skip`` / ``off``: registered stage names to run alone / leave out /
    turn off (``--no-<stage>``); ``patching`` / ``weights`` / ``kv`` False: those stages turned off.
    ``roles_config`` / ``prune_config`` / ``causal_config`` / ``weights_config`` / ``kv_config``:
    those stages' settings, ``configs``: any stage's by name (None / absent: the stage's defaults for
    ``seed`` and ``full``). ``role_groups``: a subset of the registered role groups (default all);
    ``role_inputs``: ``text`` / ``conllu`` / ``coref`` for the role analyses (default: the shipped corpora).
    ``ray``: run the stages that shard on Ray workers (:mod:`~headscope.reports.stages.sharded`; None: in process).

    >>> RunConfig(backend="onnx")
    Traceback (most recent call last):
    ...
    ValueError: backend must be 'auto', 'inhouse', 'bridge' or 'hf'; got 'onnx'
    """

    backend: str = "auto"
    full: bool = False
    seed: int = 0
    roles_config: RolesConfig | None = None
    prune_config: PruneConfig | None = None
    causal_config: CausalConfig | None = None
    role_groups: str | tuple[str, ...] | list[str] | None = None
    role_inputs: dict | None = field(default=None, compare=False)
    trust_remote_code: bool = False
    dtype: str = "fp32"
    device: str | torch.device | None = None
    device_map: str | None = None
    max_memory: Mapping[int, int] | None = field(default=None, compare=False)
    patching: bool = True
    weights: bool = True
    kv: bool = True
    weights_config: WeightsConfig | None = None
    kv_config: KVStageConfig | None = None
    large_cost: float | None = None
    only: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()
    off: tuple[str, ...] = ()
    on: tuple[str, ...] = ()
    configs: Mapping[str, object] = field(default_factory=dict, compare=False)
    ray: RayConfig | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.backend not in BACKEND_CHOICES:
            raise ValueError(f"backend must be 'auto', 'inhouse', 'bridge' or 'hf'; got {self.backend!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer; got {self.seed!r}")
        for k in ("only", "skip", "off", "on"):
            v = getattr(self, k)
            if isinstance(v, str):  # "roles,pruning" as from the command line
                object.__setattr__(self, k, tuple(x.strip() for x in v.split(",") if x.strip()))
            elif v is not None:
                object.__setattr__(self, k, tuple(v))
        if self.max_memory is not None and self.device_map is None:
            raise ValueError("--max-memory goes with --device-map auto (it bounds what each GPU holds)")
        legacy = tuple(n for n in ("patching", "weights", "kv") if getattr(self, n) is False)
        object.__setattr__(self, "off", tuple(dict.fromkeys((*self.off, *legacy))))

    def given(self, stage: str) -> object | None:
        """The settings given for ``stage`` (None: its defaults)."""
        name = _GIVEN.get(stage)
        return getattr(self, name) if name is not None else self.configs.get(stage)

    def settings(self, cfgs: Mapping[str, object]) -> dict:
        """run.json's ``config``: ``{"roles": ..., "pruning": ..., "patching": ...}``, each of those
        stages' settings as run (``cfgs``: stage -> settled config) as a dict."""
        return {k: _cfg_dict(cfgs[k]) for k in _RECORDED if k in cfgs}


def _cfg_dict(cfg) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}
