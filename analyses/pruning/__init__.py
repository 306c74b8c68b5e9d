"""Removing heads: ablation (:mod:`.ablation`), gradient importance (:mod:`.importance`), the metrics
a pruned model is scored with (:mod:`.metrics`), iterative curves (:mod:`.curves`), the resumable
study (:mod:`.study`) and MHA -> GQA conversion (:mod:`.gqa_conversion`)."""

from headscope.analyses.pruning.importance import head_importance
from headscope.analyses.pruning.study import PruneConfig, PruneResult, pruning_study

__all__ = ["PruneConfig", "PruneResult", "head_importance", "pruning_study"]
