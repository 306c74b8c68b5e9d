"""Where the pure metric functions used to live: they are in :mod:`headscope.analyses.metrics`,
beside the one registry. This module only re-exports them for callers in other areas
(``reports/tools/bench/gpu.py``, ``analyses/pruning/gqa_conversion.py``,
``tests/analyses/pruning/test_importance_per_example.py``); new code imports :mod:`headscope.analyses.metrics`.
"""

from headscope.analyses.metrics import mean_pool, paraphrase_hits, token_nll, token_nll_at, weighted_mean

__all__ = ["mean_pool", "paraphrase_hits", "token_nll", "token_nll_at", "weighted_mean"]
