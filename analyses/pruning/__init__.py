"""Removing heads.

* what is removed: head masks and prune units (:mod:`.masks`), applied through gates on the
  model's head hooks (:mod:`.gates`);
* how a metric is scored under many masks: the shared-stream engine (:mod:`.scoring`), the
  memo of scored masks (:mod:`.memo`);
* the metrics: interface (:mod:`.metric_base`), pure functions (:mod:`.metric_functions`),
  decoder and encoder metrics (:mod:`.decoder_metrics`, :mod:`.encoder_metrics`), the registry
  by name (:mod:`.metrics`);
* the studies: ablation (:mod:`.ablation`), gradient importance (:mod:`.importance`),
  iterative curves (:mod:`.curves`), their impact frames (:mod:`.impact`), the resumable
  study (:mod:`.study`, its tables and state on disk: :mod:`.store`), and what MHA -> GQA
  conversion costs (:mod:`.gqa_conversion`).
"""

from headscope.analyses.pruning.importance import head_importance
from headscope.analyses.pruning.study import PruneConfig, PruneResult, pruning_study

__all__ = ["PruneConfig", "PruneResult", "head_importance", "pruning_study"]
