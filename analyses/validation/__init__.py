"""Validation against known truth: compiled transformers (:mod:`.tracr`, issue #44)."""
