"""Compiled transformers as known truth: RASP programs compiled by tracr (:mod:`.tracr`, the
``tracr`` extra), cached (:mod:`.cache`), loaded on the in-house backend with their truth table
(:mod:`.loader`), distractor heads (:mod:`.distractors`), the Select -> role table
(:mod:`.relations`) and the programs (:mod:`.programs`). Importing this package needs no jax."""
