"""Statistics of per-item scores: resampling (:mod:`.resampling`) and the verdict rows (:mod:`.verdicts`)."""
