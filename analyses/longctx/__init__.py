"""Long context: the needle-in-a-haystack copy task (:mod:`.needle`), the long-context head
roles (:mod:`.roles`: retrieval, streaming, sink) and the causal check of the retrieval heads
(:mod:`.causal`). The KV-cache compression study lives in :mod:`headscope.analyses.kvcache`.

Entry points:

* :func:`headscope.analyses.longctx.needle.needle_items` (``NeedleItem``), ``copy_hits``,
  ``copy_accuracy``, ``item_logits``;
* :func:`headscope.analyses.longctx.roles.long_context_roles` ``(model, config) -> DataFrame``;
* :func:`headscope.analyses.longctx.causal.causal_check` ``(model, config) -> (DataFrame, dict)``.
"""
