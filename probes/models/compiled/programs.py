"""The RASP programs compiled as known truth: tracr's library (``tracr/compiler/lib.py``), each
at two settings (a vocabulary and a maximum length).

A :class:`ProgramSetting` names one compiled model: ``program`` (a key of :data:`PROGRAMS`),
its ``vocab``, ``max_seq_len``, whether it compiles ``causal`` (the library marks
``make_length``, ``make_reverse``, ``make_pair_balance``, ``make_hist``, ``make_sort_unique``
and ``make_sort`` as working only non-causally: those compile bidirectional) and whether its
inputs must hold ``unique`` tokens (``make_sort_unique`` sorts distinct keys only).
:func:`build_program` makes the RASP expression (tracr imported here, lazily: the core install
has no jax).

>>> [s.label for s in settings("shift_by")]
['shift_by-v3-n5', 'shift_by-v4-n8']
>>> settings("nope")
Traceback (most recent call last):
...
ValueError: unknown tracr program 'nope'; known programs: length, reverse, hist, sort_unique, sort, frac_prevs, shift_by, detect_pattern, pair_balance
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ProgramSetting:
    """One compiled model: ``program`` (:data:`PROGRAMS`), its input ``vocab``, ``max_seq_len``,
    ``causal`` compilation, and ``unique``: inputs hold distinct tokens."""

    program: str = "shift_by"
    vocab: tuple = ("a", "b", "c")
    max_seq_len: int = 5
    causal: bool = True
    unique: bool = False

    def __post_init__(self):
        if self.program not in PROGRAMS:
            raise ValueError(unknown_program(self.program))
        if not isinstance(self.max_seq_len, int) or self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be an int >= 2; got {self.max_seq_len!r}")
        if len(set(self.vocab)) != len(self.vocab) or len(self.vocab) < 2:
            raise ValueError(f"vocab must hold at least 2 distinct values; got {self.vocab!r}")
        if self.unique and len(self.vocab) < self.max_seq_len:
            raise ValueError(
                f"unique inputs of up to {self.max_seq_len} tokens need as many values; got {self.vocab!r}"
            )

    @property
    def label(self) -> str:
        """``<program>-v<vocabulary size>-n<max_seq_len>``: the model's name and cache key."""
        return f"{self.program}-v{len(self.vocab)}-n{self.max_seq_len}"

    def sample(self, rng: random.Random, length: int) -> list:
        """``length`` input tokens drawn from ``vocab`` (distinct where ``unique``)."""
        if not 1 <= length <= self.max_seq_len:
            raise ValueError(f"length must be in [1, {self.max_seq_len}]; got {length}")
        if self.unique:
            return rng.sample(list(self.vocab), length)
        return [rng.choice(self.vocab) for _ in range(length)]


def _length(s):
    from tracr.compiler import lib

    return lib.make_length()


def _reverse(s):
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return lib.make_reverse(rasp.tokens)


def _hist(s):
    from tracr.compiler import lib

    return lib.make_hist()


def _sort_unique(s):
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return lib.make_sort_unique(rasp.tokens, rasp.tokens)


def _sort(s):
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return lib.make_sort(rasp.tokens, rasp.tokens, max_seq_len=s.max_seq_len, min_key=min(s.vocab))


def _frac_prevs(s):
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return lib.make_frac_prevs(rasp.tokens == "x")


def _shift_by(s):
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return lib.shift_by(1, rasp.tokens)


def _detect_pattern(s):
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return lib.detect_pattern(rasp.tokens, "abc")


def _pair_balance(s):
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return lib.make_pair_balance(rasp.tokens, "(", ")")


#: program -> (the RASP builder, its arguments in words, its two settings' (vocab, max_seq_len), causal, unique)
PROGRAMS = {
    "length": (_length, "make_length()", ((("a", "b", "c"), 5), (("a", "b", "c", "d", "e"), 8)), False, False),
    "reverse": (_reverse, "make_reverse(tokens)", ((("a", "b", "c"), 5), (("a", "b", "c", "d"), 7)), False, False),
    "hist": (_hist, "make_hist()", ((("a", "b", "c"), 5), (("a", "b", "c", "d", "e"), 8)), False, False),
    "sort_unique": (
        _sort_unique,
        "make_sort_unique(tokens, tokens)",
        (((1, 2, 3, 4, 5), 5), ((1, 2, 3, 4, 5, 6, 7, 8), 7)),
        False,
        True,
    ),
    "sort": (
        _sort,
        "make_sort(tokens, tokens, max_seq_len=n, min_key=min(vocab))",
        (((1, 2, 3, 4), 5), ((1, 2, 3, 4, 5, 6), 6)),
        False,
        False,
    ),
    "frac_prevs": (
        _frac_prevs,
        'make_frac_prevs(tokens == "x")',
        ((("x", "y", "z"), 5), (("x", "a", "b", "c"), 8)),
        True,
        False,
    ),
    "shift_by": (_shift_by, "shift_by(1, tokens)", ((("a", "b", "c"), 5), (("a", "b", "c", "d"), 8)), True, False),
    "detect_pattern": (
        _detect_pattern,
        'detect_pattern(tokens, "abc")',
        ((("a", "b", "c"), 5), (("a", "b", "c", "d"), 8)),
        True,
        False,
    ),
    "pair_balance": (
        _pair_balance,
        'make_pair_balance(tokens, "(", ")")',
        ((("(", ")"), 5), (("(", ")", "x"), 8)),
        False,
        False,
    ),
}


def unknown_program(name) -> str:
    """The one line naming the known programs."""
    return f"unknown tracr program {name!r}; known programs: {', '.join(PROGRAMS)}"


def settings(program: str) -> list[ProgramSetting]:
    """The two :class:`ProgramSetting` s of ``program``; ``ValueError`` listing the known programs."""
    if program not in PROGRAMS:
        raise ValueError(unknown_program(program))
    _, _, pairs, causal, unique = PROGRAMS[program]
    return [
        ProgramSetting(program=program, vocab=vocab, max_seq_len=n, causal=causal, unique=unique) for vocab, n in pairs
    ]


def describe(program: str) -> str:
    """The library call that builds ``program``, e.g. ``'shift_by(1, tokens)'``."""
    if program not in PROGRAMS:
        raise ValueError(unknown_program(program))
    return PROGRAMS[program][1]


def build_program(setting: ProgramSetting):
    """The RASP expression of ``setting`` (needs the ``tracr`` extra)."""
    return PROGRAMS[setting.program][0](setting)
