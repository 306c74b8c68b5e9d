"""The words of the needle-in-a-haystack copy task (:mod:`headscope.analyses.longctx.needle`):
the cue that introduces the needle and the words it is drawn from, none of them in the bench
grammar (:data:`~headscope.probes.corpora.bench_sentences.WORDS`), so the needle is the
only place a copied word appears before the answer. Kept in probes so the planted
long-context model (:mod:`headscope.probes.models.inhouse.planted_long`) can hold them in
its vocabulary.

>>> set(w.lower() for w in NEEDLE_WORDS) & {w for ws in WORDS.values() for w in ws}
set()
"""

from __future__ import annotations

from headscope.probes.corpora.bench_sentences import WORDS

__all__ = ["NEEDLE_WORDS", "PREFIX", "SUFFIX", "WORDS"]

#: what introduces the needle in the haystack and cues the answer at the end
PREFIX = " The secret words are"
#: what closes the needle's sentence
SUFFIX = "."
#: the needle's words (drawn without repeating one)
NEEDLE_WORDS = tuple(
    (
        "apple banana cherry mango lemon peach plum grape olive melon violet orange silver golden purple "
        "crimson amber copper tiger zebra panda falcon eagle salmon dolphin rabbit monkey wolf bear horse "
        "camel parrot London Paris Tokyo Berlin Madrid Rome Cairo Sydney piano guitar violin trumpet "
        "hammer ladder candle pepper"
    ).split()
)
