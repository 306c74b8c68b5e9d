"""The KV-cache compression study: which KV groups need their whole cache and which can keep
only a few sink tokens plus a recent window (a pruning study of the cache, not of the heads).

:mod:`.bytes` holds the card's arithmetic per KV group; :mod:`.quality` measures a restriction
(long-context LM loss and the needle copy task) on the in-house model
(:meth:`~headscope.probes.models.inhouse.transformer.Transformer.kv_windows_set`); :mod:`.study`
ranks the groups, chooses greedily which keep a full cache, draws the random-order band and
returns one tidy frame; :mod:`.stage` is the report's stage and ``headscope kv``'s run.
"""
