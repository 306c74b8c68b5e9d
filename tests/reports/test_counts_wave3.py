"""Count flags, list flags, task-file encodings and runs with nothing usable (issues #23, #29).

Every count flag has a bound: a value that can never be met is refused in one line before
any model loads, a count past what the data holds is capped with a one-line note (stderr
and run.json), never a run that hangs. List flags (``--layers``, ``--receiver``) name
themselves and what they expect. A task file that is not UTF-8 is named with its line. A
run left with no usable item exits 2 saying how many were read and why each kind was
skipped; skipped items of a run that goes on are counted on stderr and in run.json.

The load of a model is replaced by a spy (``loads``) where only the order matters: it
records what stderr held when the load was reached and stops the run there, so a test can
tell "answered before the model loads" from "validated, then went on to load".
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from headscope.analyses.patching.tasks import MAX_GENERATED_ITEMS, read_task_jsonl
from headscope.probes.errors import InputFileError, ModelIncompatibleError
from headscope.reports.cli.app import build_parser, main

LOAD_REACHED = "spy: the model load was reached"
LINE = '{"clean": "the cat sat", "corrupted": "a dog sat", "answer": " on"}'


class LoadSpy:
    """Stands in for the model load (and bench's and report's own runs): records stderr as
    it was when the load was reached, then stops the run with a one-line error."""

    def __init__(self, read_err):
        self.read_err = read_err
        self.calls: list[str] = []

    def __call__(self, *args, **kwargs):
        self.calls.append(self.read_err())
        raise ModelIncompatibleError(LOAD_REACHED)


def _install_spy(monkeypatch, read_err) -> LoadSpy:
    from headscope.probes.models import lazy_weights, loading
    from headscope.reports import pipeline
    from headscope.reports.tools.bench import harness

    spy = LoadSpy(read_err)
    monkeypatch.setattr(loading, "load_model", spy)
    monkeypatch.setattr(lazy_weights, "lazy_weights", spy)  # `weights` reads a checkpoint without loading a model
    monkeypatch.setattr(harness, "run_bench", spy)
    monkeypatch.setattr(harness, "memory_scaling", spy)
    monkeypatch.setattr(pipeline, "build_report", spy)
    return spy


@pytest.fixture(autouse=True)
def _quiet_transformers():
    """transformers' own log handler keeps the stderr of the test that first used it (a
    closed capture later on): its warning of a long text is silenced here, so stderr holds
    what headscope printed."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    yield
    hf_logging.set_verbosity(level)


@pytest.fixture
def loads(monkeypatch, capsys):
    """The spy on model loads; stderr printed before the load is in ``loads.calls``."""
    return _install_spy(monkeypatch, lambda: capsys.readouterr().err)


@pytest.fixture
def shared_minilm(minilm, monkeypatch):
    """The CLI's load_model returns the session's MiniLM (loaded once for all tests)."""
    from headscope.probes.models import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: minilm)
    return minilm


def run_cli(capsys, *argv) -> tuple[int, list[str]]:
    """``(exit code, stderr lines)`` of one CLI run."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return rc, err.strip().splitlines()


def one_error(lines: list[str]) -> str:
    """The one error line among stderr's lines (the others are notes or progress)."""
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1, lines
    return errors[0]


# ------------------------------------------------------------------ 1. counts with no bound


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["patch", "--n-items", "1000000000"],
            f"--n-items 1000000000: task induction generates at most {MAX_GENERATED_ITEMS}",
        ),
        (["patch", "--task", "duplicate_token", "--n-items", str(10**18)], "task duplicate_token generates at most"),
        (["patch", "--seq-len", str(10**18)], "argument --seq-len: must be an integer <= 1048576"),
        (["patch", "--top-k", str(10**18)], "argument --top-k: must be an integer <= 65536 (heads listed)"),
        (["patch", "--max-rows", str(10**18)], "argument --max-rows: must be an integer <= 65536"),
        (["patch", "--batch-size", "0"], "argument --batch-size: must be an integer >= 1; got '0'"),
        (["prune", "--seeds", str(10**18)], "argument --seeds: must be an integer <= 1000 (random-order seeds"),
        (["prune", "--batch-size", str(2**63)], "argument --batch-size: must be an integer <= 65536"),
        (["roles", "--top", str(10**21)], "argument --top: must be an integer <= 65536 (heads listed)"),
        (["roles", "--batch-size", "-4"], "argument --batch-size: must be an integer >= 1; got '-4'"),
        (["bench", "--sentences", str(10**18)], "argument --sentences: must be an integer <= 1000000 (sentences)"),
        (["bench", "--repeats", "0"], "argument --repeats: must be an integer >= 1"),
        (["bench", "--seed", "-1"], "argument --seed: must be an integer in [0, 2**32 - 1]"),
        (["bench", "--memory", "--memory-sizes", f"10,{10**18}"], "--memory-sizes: a corpus size must be at most"),
        (["card", "--context", str(10**18)], "argument --context: must be an integer <= 4294967296"),
        (["diff", "a", "b", "--top-heads", str(10**18)], "argument --top-heads: must be an integer <= 65536"),
    ],
)
def test_a_count_that_can_never_be_met_is_refused_before_the_model_loads(capsys, loads, tmp_path, argv, message):
    rc, lines = run_cli(capsys, *argv, *(["--out", tmp_path / "o"] if argv[0] in ("patch", "prune", "roles") else []))
    assert rc == 2 and message in one_error(lines) and len(lines) == 1, lines
    assert loads.calls == []
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "argv, note",
    [
        (
            ["prune", "--n-items", "1000000000"],
            "note: --n-items 1000000000: the default metric's data (heldout/lm_text.txt) holds 168 items; using all 168",
        ),
        (["prune", "--n-items", str(10**18)], "holds 168 items; using all 168"),
        (
            ["prune", "--metric", "coref_accuracy", "--n-items", "121"],
            "note: --n-items 121: the coref_accuracy data (coref/coref.jsonl, winograd/number items) holds 120 items",
        ),
        (
            ["patch", "--task", "agreement", "--n-items", "3000"],
            "note: --n-items 3000: task agreement holds 2304 items; using all 2304",
        ),
        (
            ["patch", "--task", "coreference", "--n-items", str(10**18)],
            "task coreference holds 170 items; using all 170",
        ),
    ],
)
def test_a_count_past_the_data_is_capped_with_a_note_before_the_model_loads(capsys, loads, tmp_path, argv, note):
    rc, lines = run_cli(capsys, *argv, "--out", tmp_path / "o")
    assert rc == 2 and one_error(lines) == f"headscope: error: {LOAD_REACHED}"
    assert len(loads.calls) == 1 and note in loads.calls[0] and len(loads.calls[0].splitlines()) == 1


def test_counts_within_the_data_load_the_model_without_a_note(capsys, loads, tmp_path):
    for argv in (["prune", "--n-items", "168"], ["patch", "--task", "agreement", "--n-items", "2304"]):
        rc, lines = run_cli(capsys, *argv, "--out", tmp_path / argv[0])
        assert rc == 2 and lines == [f"headscope: error: {LOAD_REACHED}"]
    assert loads.calls == ["", ""]  # nothing printed before the load


def test_prune_records_the_capped_count_in_run_json(capsys, monkeypatch, tmp_path):
    from headscope.probes.models import loading
    from headscope.probes.models.inhouse.planted import planted_model

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: planted_model())
    argv = ["prune", "planted", "--n-items", str(10**9), "--studies", "importance", "--batch-size", "256"]
    rc = main([*argv, "--out", str(tmp_path / "o"), "--json"])
    out, err = capsys.readouterr()
    note = "--n-items 1000000000: the default metric's data (heldout/lm_text.txt) holds 168 items; using all 168"
    assert rc == 0 and f"note: {note}" in err.splitlines()
    assert json.loads(out)["notes"] == [note]
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["notes"] == [note] and run["config"]["n_items"] == 168


def test_patch_records_the_capped_count_and_the_unusable_items_in_run_json(capsys, shared_minilm, tmp_path):
    task = tmp_path / "t.jsonl"
    task.write_text(
        "\n".join(
            [
                LINE,
                '{"clean": "the cat sat", "corrupted": "the big cat sat", "answer": " on"}',  # 5 vs 6 tokens
                '{"clean": "one two", "corrupted": "three four", "answer": " on"}',
            ]
        )
        + "\n"
    )
    argv = ["patch", "minilm-l6", "--task", task, "--n-items", str(10**9), "--method", "activation"]
    rc, lines = run_cli(capsys, *argv, "--direction", "denoising", "--out", tmp_path / "o")
    note = f"--n-items 1000000000: task file {task} holds 3 items; using all 3"
    assert rc == 0 and f"note: {note}" in lines
    assert "task t: 1 of 3 items unusable (length_mismatch 1); listed in run.json" in lines
    assert not [line for line in lines if "UserWarning" in line]  # said once, in the line above
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["notes"] == [note]
    assert run["task"]["n_items"] == 2 and run["task"]["unusable_counts"] == {"length_mismatch": 1}
    assert run["task"]["unusable"][0]["line"] == 2 and run["task"]["unusable"][0]["kind"] == "length_mismatch"


def test_a_sequence_past_the_models_context_is_refused_naming_seq_len(capsys, shared_minilm, tmp_path):
    rc, lines = run_cli(capsys, "patch", "minilm-l6", "--seq-len", "300", "--out", tmp_path / "o")
    assert rc == 2 and one_error(lines) == (
        "headscope: error: task induction: seq_len 300 makes items of 600 tokens; the model's context is 512 "
        "positions (seq_len at most 256)"
    )
    rc, lines = run_cli(capsys, "patch", "minilm-l6", "--task", "duplicate_token", "--seq-len", "600")
    assert rc == 2 and "task duplicate_token: seq_len 600 makes items of 602 tokens" in one_error(lines)
    assert "(seq_len at most 510)" in one_error(lines)


def test_generated_tasks_refuse_an_absurd_count_in_the_library_too():
    from headscope.analyses.patching.tasks import duplicate_token_task, induction_task
    from headscope.probes.models.inhouse.planted import planted_tokenizer

    for make in (induction_task, duplicate_token_task):
        with pytest.raises(ValueError, match=rf"n_items must be in \[1, {MAX_GENERATED_ITEMS}\]"):
            make(planted_tokenizer(), n_items=MAX_GENERATED_ITEMS + 1, seq_len=4)


# ---------------------------------------------------------------------- 2. list-valued flags


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["capture", "--layers", "a"],
            "argument --layers: must be comma-separated layer indices (integers >= 0, e.g. 0,2,5); got 'a'",
        ),
        (["capture", "--layers", "0,,1"], "got '0,,1' (an empty item is not a layer index)"),
        (["capture", "--layers", "-1"], "got '-1' ('-1' is not a layer index)"),
        (["capture", "--layers", "1.5"], "got '1.5' ('1.5' is not a layer index)"),
        (["capture", "--layers", ""], "argument --layers: must be comma-separated layer indices"),
        (["capture", "--quantities", "pattern,attn"], "--quantities: unknown quantity 'attn'; choose from pattern,"),
        (
            ["patch", "--method", "path", "--receiver", "x"],
            "argument --receiver: must be LAYER.HEAD (two integers >= 0, e.g. 1.1); got 'x'",
        ),
        (["patch", "--receiver", "1.2.3"], "argument --receiver: must be LAYER.HEAD"),
        (["patch", "--receiver", "L1H1"], "argument --receiver: must be LAYER.HEAD"),
        (
            ["patch", "--sender", "-1.0"],
            "argument --sender: must be LAYER.HEAD (two integers >= 0, e.g. 1.1); got '-1.0'",
        ),
        (["bench", "--memory", "--memory-sizes", "10,x"], "--memory-sizes must be comma-separated integers"),
    ],
)
def test_a_bad_list_flag_names_itself_and_what_it_expects(capsys, loads, argv, message):
    rc, lines = run_cli(capsys, *argv)
    assert rc == 2 and len(lines) == 1 and message in lines[0], lines
    assert loads.calls == []


def test_good_list_flags_parse():
    p = build_parser()
    assert p.parse_args(["capture", "--layers", "0, 2,5,2"]).layers == (0, 2, 5)
    args = p.parse_args(["patch", "--receiver", "1.1", "--sender", "0.3"])
    assert (args.receiver, args.sender) == ((1, 1), (0, 3))


def test_a_layer_past_the_model_names_the_flag_and_layers_go_through(capsys, shared_minilm):
    rc, lines = run_cli(capsys, "capture", "minilm-l6", "--layers", "0,6")
    assert rc == 2 and one_error(lines) == "headscope: error: --layers: minilm-l6 has layers 0..5; got layer 6"
    assert main(["capture", "minilm-l6", "only one text", "--layers", "4,1", "--json"]) == 0
    assert [row["layer"] for row in json.loads(capsys.readouterr().out)["layers"]] == [4, 1]


# ---------------------------------------------------------------------- 3. task-file encodings


@pytest.mark.parametrize(
    "name, data, where, detail",
    [
        ("utf16.jsonl", (LINE + "\n").encode("utf-16"), 1, "it reads as utf-16-le"),
        ("utf16be.jsonl", (LINE + "\n").encode("utf-16-be"), 1, "it reads as utf-16-be (no BOM)"),
        ("binary.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", 1, "byte 0x89 at column 1: invalid start byte"),
        ("latin1.jsonl", (LINE + "\n").encode() + b'{"clean": "caf\xe9"}\n', 2, "byte 0xe9 at column 15"),
    ],
)
def test_a_task_file_that_is_not_utf8_is_named_with_its_line(capsys, loads, tmp_path, name, data, where, detail):
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(InputFileError, match=rf"^{p}:{where}: not UTF-8 text \(") as e:
        read_task_jsonl(p)
    assert detail in str(e.value) and "re-save" in str(e.value)
    rc, lines = run_cli(capsys, "patch", "--task", p)
    assert rc == 2 and lines == [f"headscope: error: {e.value}"]
    assert loads.calls == []


def test_a_task_file_with_a_utf8_byte_order_mark_is_read(capsys, loads, tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + f"{LINE}\r\n{LINE}\r".encode())
    assert [line for line, _ in read_task_jsonl(p)] == [1, 2]
    rc, lines = run_cli(capsys, "patch", "--task", p)
    assert rc == 2 and lines == [f"headscope: error: {LOAD_REACHED}"] and len(loads.calls) == 1


# ----------------------------------------------------------------- 4. runs with nothing usable


def test_roles_with_no_usable_item_exits_2_saying_what_was_read_and_skipped(capsys, shared_minilm, tmp_path):
    text = tmp_path / "long.txt"
    text.write_text(("word " * 700 + "\n") * 3)
    rc, lines = run_cli(capsys, "roles", "--roles", "positional", "--text", text, "--out", tmp_path / "o", "--json")
    assert rc == 2 and one_error(lines) == (
        f"headscope: error: {text}: no usable items: read 3 text lines, and every role group (positional) skipped "
        "all of them (positional: longer than context 3); nothing written"
    )
    assert not (tmp_path / "o").exists()


def test_roles_with_some_usable_items_counts_the_skipped_on_stderr_and_in_run_json(capsys, shared_minilm, tmp_path):
    text = tmp_path / "mixed.txt"
    text.write_text("The cat sat on the mat .\n" + "word " * 700 + "\nDogs bark at night .\n")
    rc, lines = run_cli(capsys, "roles", "--roles", "positional", "--text", text, "--out", tmp_path / "o", "--json")
    assert rc == 0 and "skipped: positional: longer than context 1 (skipped.json)" in lines
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["n_items"] == {"positional": 2} and run["skipped"]["positional"] == {"longer than context": 1}


def test_patch_with_no_usable_item_exits_2_with_the_count_of_each_kind(capsys, shared_minilm, tmp_path):
    task = tmp_path / "none.jsonl"
    task.write_text(
        '{"clean": "the cat sat", "corrupted": "the big cat sat", "answer": " on"}\n'
        '{"clean": "x", "corrupted": "x y z", "answer": " on"}\n'
    )
    rc, lines = run_cli(capsys, "patch", "minilm-l6", "--task", task, "--out", tmp_path / "o")
    assert rc == 2 and one_error(lines) == (
        f"headscope: error: {task}: no usable items: read 2 items, all unusable (length_mismatch 2; first at line 1: "
        "clean has 5 tokens, corrupted 6)"
    )
    assert not [line for line in lines if "Warning" in line] and not (tmp_path / "o").exists()


def test_unusable_kinds_are_counted_on_a_planted_decoder(tmp_path):
    from headscope.analyses.patching.tasks import UNUSABLE_KINDS, tokenize_rows
    from headscope.probes.models.inhouse.planted import planted_model

    p = tmp_path / "t.jsonl"
    p.write_text(
        "\n".join(
            [
                '{"clean": "the cat sat", "corrupted": "the big cat sat", "answer": "on"}',
                '{"clean": "the cat sat", "corrupted": "a dog sat", "answer": "on the"}',
                '{"clean_ids": [1, 5, 6], "corrupted_ids": [1, 7, 6], "answer_id": 9999}',
            ]
        )
        + "\n"
    )
    with pytest.warns(UserWarning), pytest.raises(InputFileError) as e:
        tokenize_rows(planted_model(), read_task_jsonl(p), name="t", source=str(p))
    assert str(e.value).startswith(
        f"{p}: no usable items: read 3 items, all unusable (id_past_vocab 1, length_mismatch 1, not_single_token 1; "
    )
    assert {"id_past_vocab", "length_mismatch", "not_single_token"} <= set(UNUSABLE_KINDS)


# --------------------------------------------------- 5. every count flag, hostile values (hypothesis)


def _count_flags() -> list[tuple[str, str, object]]:
    """``(command, flag, type)`` of every integer flag of every command, read off the parser."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for command, p in sub.choices.items():
        for a in p._actions:
            if a.option_strings[-1:] in (
                ["--workers"],
                ["--worker-threads"],
            ):  # with --ray and a cluster: test_ray_flags.py
                continue
            if a.option_strings and (a.type is int or hasattr(a.type, "low")):
                out.append((command, a.option_strings[-1], a.type))
    return out


COUNT_FLAGS = _count_flags()
#: counts with no upper bound of their own: capped at what the data holds, or refused at run time
CAPPED = {("prune", "--n-items"): 168, ("patch", "--n-items"): MAX_GENERATED_ITEMS}


def test_every_count_flag_is_typed_and_bounded():
    assert len(COUNT_FLAGS) >= 19, COUNT_FLAGS
    for command, flag, kind in COUNT_FLAGS:
        assert kind is not int, f"{command} {flag}: a bare int has no bound"
        assert kind.high is not None or (command, flag) in CAPPED, f"{command} {flag} has no upper bound"


HOSTILE = st.one_of(
    st.integers(-3, 3),
    st.integers(-(10**18), 10**18),
    st.sampled_from([10**18, 2**63, 10**30, 2**32, 2**32 - 1, 65536, 65537, 1000, 1001, 168, 169, 100_000, 100_001]),
)
OUT_FLAG = {"roles", "prune", "patch", "report", "weights", "kv"}
#: what a command needs besides the flag under test (diff: two runs; qk: a head)
REQUIRED = {"diff": ["a", "b"], "qk": ["--head", "0.0"]}


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _hang_guard(seconds: int):
    """A run past ``seconds`` fails the test instead of hanging it (real time, main thread)."""

    def alarm(*_):
        raise _Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _cli_with_spy(argv) -> tuple[int, list[str], LoadSpy]:
    """One CLI run with the model load spied on (no pytest fixture: hypothesis runs it many times)."""
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        spy = _install_spy(mp, err.getvalue)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), _hang_guard(60):
            rc = main([str(a) for a in argv])
    text = err.getvalue()
    assert "Traceback" not in text and "internal error" not in text, (argv, text)
    return rc, text.strip().splitlines(), spy


@settings(max_examples=90, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flag=st.sampled_from(COUNT_FLAGS), value=HOSTILE)
def test_every_count_flag_answers_in_one_line_and_absurd_values_before_any_model_loads(tmp_path_factory, flag, value):
    command, name, kind = flag
    out = tmp_path_factory.mktemp("o") / "o"
    argv = [command, *REQUIRED.get(command, []), f"{name}={value}"]
    rc, lines, spy = _cli_with_spy([*argv, *(["--out", out] if command in OUT_FLAG else [])])
    low, high = kind.low, kind.high if kind.high is not None else CAPPED[(command, name)]
    notes = [line for line in lines if line.startswith("note: ")]
    errors = [line for line in lines if line not in notes]
    event(f"exit {rc}, {'loaded' if spy.calls else 'not loaded'}")
    assert rc in (0, 2) and len(errors) <= 1, lines
    if not low <= value <= high and (command, name) != ("prune", "--n-items") or value < low:
        # a value that can never be met: one line naming the flag, before anything loads
        assert rc == 2 and not spy.calls and len(lines) == 1, (argv, lines)
        assert f"argument {name}: must be an integer" in lines[0] or lines[0].startswith(f"headscope: error: {name} ")
    elif spy.calls:  # validated, then went on to load: a count past the data said so first
        capped = (command, name) == ("prune", "--n-items") and value > high
        assert (f"note: {name} {value}: " in spy.calls[0]) == capped, (argv, spy.calls)
    elif command in ("card", "diff"):  # no model needed: it answered (card), or refused its other inputs (diff a b)
        assert rc == 0 or len(errors) == 1, (argv, lines)
    else:  # a count the run could meet, refused up front because its memory estimate does not fit
        assert rc == 2 and len(errors) == 1 and f"{command} needs ~" in errors[0] and "this run may use" in errors[0], (
            argv,
            lines,
        )


LIST_VALUES = st.one_of(
    st.text(alphabet="0123456789,.- x", max_size=12),
    st.lists(st.integers(-2, 10**12), min_size=1, max_size=4).map(lambda v: ",".join(map(str, v))),
    st.tuples(st.integers(-2, 10**12), st.integers(-2, 10**12)).map(lambda t: f"{t[0]}.{t[1]}"),
)
LIST_FLAGS = [("capture", "--layers"), ("patch", "--receiver"), ("patch", "--sender"), ("bench", "--memory-sizes")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flag=st.sampled_from(LIST_FLAGS), value=LIST_VALUES)
def test_every_list_flag_answers_in_one_line_before_any_model_loads(flag, value):
    command, name = flag
    extra = ["--memory"] if name == "--memory-sizes" else []
    rc, lines, spy = _cli_with_spy([command, f"{name}={value}", *extra])
    event(f"exit {rc}, {'loaded' if spy.calls else 'not loaded'}")
    assert rc == 2 and len(lines) == 1, lines  # refused, or stopped by the spy at the load
    if not spy.calls:
        assert f"argument {name}: must be " in lines[0] or lines[0].startswith(f"headscope: error: {name}"), lines
