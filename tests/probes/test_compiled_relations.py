"""The Select -> role table and the program registry of compiled truth (no tracr needed)."""

from __future__ import annotations

import random

import pytest

from headscope.probes.models.compiled.programs import PROGRAMS, ProgramSetting, settings
from headscope.probes.models.compiled.relations import relation_of, role_of
from headscope.reports.cli import main

IDX = list(range(6))


def _comparison(name):
    """tracr's ``Comparison`` table, restated (``pred(key, query)``)."""
    return {
        "EQ": lambda k, q: k == q,
        "LT": lambda k, q: k < q,
        "LEQ": lambda k, q: k <= q,
        "TRUE": lambda k, q: True,
        "FALSE": lambda k, q: False,
    }[name]


@pytest.mark.parametrize(
    ("pred", "keys", "queries", "relation"),
    [
        (lambda k, q: q == k + 1, IDX, IDX, "k == q - 1"),  # shift_by(1)
        (lambda k, q: q == k + 2, IDX, IDX, "k == q - 2"),  # shift_by(2), detect_pattern
        (_comparison("EQ"), ["a", "b", "c"], ["a", "b", "c"], "k == q"),
        (_comparison("LEQ"), IDX, IDX, "k <= q"),
        (_comparison("LT"), [1, 2, 3], [1, 2, 3], "k < q"),
        (_comparison("TRUE"), ["a", "b"], ["a", "b"], "all"),
        (_comparison("FALSE"), IDX, IDX, "none"),
        (_comparison("LT"), [1.0, 2.5], [1.0, 2.5], "other"),  # floats: no integer offset read
    ],
)
def test_relation_of_names_what_the_predicate_computes(pred, keys, queries, relation):
    assert relation_of(pred, keys, queries) == relation


def test_role_table_maps_the_three_roles_and_nothing_else():
    assert role_of("indices", "indices", "k == q - 1", causal=True) == "previous-token"
    assert role_of("indices", "indices", "k == q - 1", causal=False) == "previous-token"
    assert role_of("tokens", "tokens", "k == q", causal=False) == "duplicate-token"
    assert role_of("tokens", "tokens", "all", causal=False) == "uniform"
    assert role_of("indices", "indices", "k <= q", causal=True) == "uniform"
    assert role_of("indices", "indices", "k <= q", causal=False) == "none"  # not uniform over what it sees
    assert role_of("indices", "opp_idx-1", "k == q", causal=False) == "none"  # reverse's flip
    assert role_of("indices", "indices", "k == q - 2", causal=True) == "none"


def test_every_program_has_two_settings_and_samples_its_input_space():
    rng = random.Random(0)
    for name in PROGRAMS:
        both = settings(name)
        assert len({(s.vocab, s.max_seq_len) for s in both}) == 2
        for s in both:
            tokens = s.sample(rng, s.max_seq_len)
            assert len(tokens) == s.max_seq_len and set(tokens) <= set(s.vocab)
            if s.unique:
                assert len(set(tokens)) == len(tokens)
    non_causal = {"length", "reverse", "pair_balance", "hist", "sort_unique", "sort"}
    assert {n for n in PROGRAMS if not settings(n)[0].causal} == non_causal


def test_bad_settings_and_unknown_programs_are_one_line():
    with pytest.raises(ValueError, match="known programs: length, reverse"):
        ProgramSetting(program="nope")
    with pytest.raises(ValueError, match="max_seq_len"):
        ProgramSetting(program="hist", max_seq_len=1)
    with pytest.raises(ValueError, match="unique inputs"):
        ProgramSetting(program="sort_unique", vocab=(1, 2), max_seq_len=5, unique=True)


def test_validate_refuses_an_unknown_program_in_one_line(capsys):
    assert main(["validate", "tracr", "--programs", "shift_by,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown tracr program 'nope'; known programs: length, reverse, hist" in err[0]
    assert main(["validate", "bogus"]) == 2


def test_the_compiled_models_load_path_imports_no_jax():
    """The core install has no jax: the CLI, the loader and the validation import it only when compiling."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import headscope.reports.cli.validate, headscope.reports.cli.app as app\n"
        "import headscope.probes.models.compiled.loader, headscope.probes.models.compiled.check\n"
        "import headscope.analyses.validation.tracr\n"
        "app.build_parser()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'haiku', 'tracr', 'chex')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
