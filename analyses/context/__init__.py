"""From static to contextual: how each layer and head turns an embedding row into meaning.

Self-similarity and anisotropy (:mod:`.similarity`), sense separation (:mod:`.senses`),
norm-based attention, saturation, distance and rollout (:mod:`.attention`), per-sentence
measurements (:mod:`.measures`), the trend test (:mod:`.trend`), the ranked context words of
one token (:mod:`.contributions`) and the run (:mod:`.run`).
"""

from headscope.analyses.context.run import ContextConfig, run_context

__all__ = ["ContextConfig", "run_context"]
