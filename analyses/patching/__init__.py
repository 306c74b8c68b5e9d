"""Causal evidence per head by patching: tasks as minimal pairs (:mod:`.tasks`, by name; the
item format :mod:`.items`, task files :mod:`.task_files`, generated and sentence tasks
:mod:`.generated`, :mod:`.sentence_tasks`; their metrics: :mod:`headscope.analyses.metrics`), activation
patching (:mod:`.activation`), zero/mean/resample ablation (:mod:`.ablation`), attribution
patching (:mod:`.attribution`), path patching
through a receiver's Q/K/V (:mod:`.path`), and the tidy frame with its statistics and
agreement (:mod:`.frames`); :func:`~.study.patching_study` runs them for the CLI."""

from headscope.analyses.patching.ablation import ablation_patching
from headscope.analyses.patching.activation import PatchConfig, activation_patching
from headscope.analyses.patching.attribution import attribution_patching
from headscope.analyses.patching.frames import PATCH_COLUMNS, agreement, effect_frame
from headscope.analyses.patching.items import Task
from headscope.analyses.patching.path import path_patching
from headscope.analyses.patching.tasks import TASKS, load_task

__all__ = [
    "PATCH_COLUMNS",
    "TASKS",
    "PatchConfig",
    "Task",
    "ablation_patching",
    "activation_patching",
    "agreement",
    "attribution_patching",
    "effect_frame",
    "load_task",
    "path_patching",
]
