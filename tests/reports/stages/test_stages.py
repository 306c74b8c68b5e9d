"""The report run as registered stages: the contract every stage meets, a new stage added in one
module, --only/--skip, absent stages, and the model resolved once."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import stage_cases as toy_stage
from stage_cases import small_config

from headscope.reports.cli.app import build_parser, main
from headscope.reports.pipeline import build_report
from headscope.reports.stages import registry
from headscope.reports.stages.base import UNITS, Stage, check_config_type
from headscope.reports.stages.config import RunConfig
from headscope.reports.stages.registry import STAGES


@pytest.fixture
def toy(monkeypatch):
    """The toy stage registered as its registry line would (and a stage requiring it)."""
    monkeypatch.setitem(STAGES, toy_stage.STAGE.name, toy_stage.STAGE)
    monkeypatch.setitem(STAGES, toy_stage.AFTER.name, toy_stage.AFTER)
    return toy_stage.STAGE


def _small(**kw):
    return small_config(role_groups=("positional",), **kw)


# ----------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("name", list(STAGES))
def test_every_registered_stage_meets_the_contract(name):
    s = STAGES[name]
    assert isinstance(s, Stage) and s.name == name and s.unit in UNITS
    check_config_type(s.Config)  # frozen dataclass, every field typed (no Any), defaults
    for method in ("config", "blocker", "plan", "fitted", "run", "section", "leaves_out", "merge"):
        assert callable(getattr(s, method)), method
    assert type(s).run is not Stage.run, "a stage must define run()"
    assert set(s.requires) | set(s.after) <= set(STAGES) - {name}
    assert s.schemas and all(isinstance(cols, dict) and cols for cols in s.schemas.values())


def test_config_type_check_refuses_any_and_mutable_configs():
    @dataclasses.dataclass(frozen=True)
    class Loose:
        x: Any = None

    @dataclasses.dataclass
    class Mutable:
        x: int = 1

    with pytest.raises(TypeError, match="no Any"):
        check_config_type(Loose)
    with pytest.raises(TypeError, match="frozen"):
        check_config_type(Mutable)


def _check_schemas(frames, stages):
    owner = {f: s for s in stages for f in s.schemas}
    for name, frame in frames.items():
        assert name in owner, f"frame {name} is declared in no stage's schemas"
        want = dict(owner[name].schemas[name])
        got = {c: str(t) for c, t in frame.dtypes.items()}
        assert got == want, f"{owner[name].name}: frame {name}"


@pytest.mark.slow  # two small reports, shared by the session: ~2 min alone, ~8 under load
def test_the_schemas_match_the_frames_of_real_runs(minilm_report, llama_report):
    """MiniLM (every stage but the KV cache, an encoder's absent) and a tiny Llama (the KV stage too)."""
    (mini, mini_json), (llama, llama_json) = minilm_report, llama_report
    assert {k: v["status"] for k, v in mini_json["stages"].items()} == {
        "roles": "ran",
        "pruning": "ran",
        "patching": "ran",
        "weights": "ran",
        "kv": "blocked",
        "context": "ran",
        "circuits": "blocked",
    }
    assert mini_json["absent"]["circuits"] == "edge circuits need next-token logits; minilm-l6 is an encoder"
    assert llama_json["stages"]["kv"]["status"] == "ran" and llama_json["stages"]["circuits"]["status"] == "ran"
    _check_schemas(mini.frames, STAGES.values())
    _check_schemas(llama.frames, STAGES.values())
    for rec in mini_json["stages"].values():
        assert set(rec) == {"status", "reason", "seconds", "cpu_s", "estimate_mb", "peak_mb", "estimate_s"}
    roles = mini_json["stages"]["roles"]
    assert roles["seconds"] > 0 and roles["peak_mb"] > 100 and roles["estimate_mb"] > 100
    # every stage that ran has a time estimate (#38); a blocked one has none
    assert all(r["estimate_s"] > 0 for r in mini_json["stages"].values() if r["status"] == "ran")
    assert mini_json["stages"]["kv"]["estimate_s"] is None
    # load_run reads both folders back, every table checked against its stage's columns
    from headscope.reports.runs import load_run, schema_of

    for result in (mini, llama):
        run = load_run(result.paths["run_json"].parent)
        assert set(run.tables) == set(result.frames) and all(schema_of("report", t) for t in run.tables)


def test_run_order_is_derived_from_requires():
    order = [s.name for s in registry.run_order()]
    for s in STAGES.values():
        for need in (*s.requires, *s.after):
            assert order.index(need) < order.index(s.name)
    assert [s.name for s in registry.report_order()][-1] == "pruning"  # a cost, after the findings


# ----------------------------------------------------------------------------- a new stage in one module
def test_a_toy_stage_appears_in_the_report_run_json_plan_only_and_as_a_subcommand(toy, tiny_llama_dir, tmp_path):
    out = tmp_path / "count"
    parser = build_parser()
    args = parser.parse_args(["count", str(tiny_llama_dir), "--top", "2", "--out", str(out), "--quiet"])
    assert args.cfg_top == 2 and args.func is not None
    args = parser.parse_args(["report", "--only", "roles,count", "--no-after_count"])
    from headscope.reports.cli.report import stage_selection

    assert stage_selection(args) == {"only": ("roles", "count"), "skip": (), "off": ("after_count",), "on": ()}
    result = build_report(tiny_llama_dir, _small(only=("roles", "count")), out_dir=out, quiet=True)
    run = json.loads((out / "run.json").read_text())
    assert run["stages"]["count"]["status"] == "ran" and run["count_summary"]["roles"] == len(result.frames["count"])
    assert "count" in {s["name"] for s in run["memory"]["stages"]}  # its working set is planned
    assert "## Heads per role" in (out / "report.md").read_text()
    assert (out / "tables" / "count.parquet").exists()
    assert run["absent"]["pruning"] == "not in --only"
    _check_schemas({"count": result.frames["count"]}, [toy])


def test_the_family_sweep_runs_every_registered_stage_and_names_a_failing_toy(toy, tiny_llama_dir, tmp_path):
    """The sweep's report check turns every registered stage on (the toy too, with no edit to the
    sweep), and its outcome names the first stage that did not run, with the runner's reason."""
    from headscope.reports.tools.sweep.run import _inputs, report_check, sweep_config

    inputs = _inputs(tmp_path)
    assert set(sweep_config(inputs).on) == set(STAGES) and "count" in sweep_config(inputs).on
    config = _small(only=("roles", "count"), role_inputs=inputs)
    assert report_check(tiny_llama_dir, tmp_path / "ok", inputs, config) == "ok"
    failing = dataclasses.replace(config, configs={"count": toy_stage.CountConfig(fail=True)})
    outcome = report_check(tiny_llama_dir, tmp_path / "failed", inputs, failing)
    assert outcome == "absent: count: failed: RuntimeError: the toy stage broke"


def test_the_toy_subcommand_runs_the_stage_with_what_it_requires(toy, tiny_llama_dir, tmp_path, monkeypatch):
    seen = {}

    def fake(model, config, **kw):
        seen["config"] = config
        raise ValueError("stop here")

    monkeypatch.setattr("headscope.reports.pipeline.build_report", fake)
    assert main(["count", str(tiny_llama_dir), "--top", "2", "--out", str(tmp_path / "c"), "--quiet"]) == 2
    assert set(seen["config"].only) == {"count", "roles"}
    assert seen["config"].configs["count"] == toy_stage.CountConfig(top=2)


# ----------------------------------------------------------------------------- --only, --skip, absent
def test_an_unknown_stage_name_is_one_line_listing_the_known_ones(capsys):
    assert main(["report", "minilm-l6", "--only", "roles,prune"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "unknown stage 'prune'" in err and "known stages: roles, pruning, patching, weights, kv" in err
    assert main(["report", "minilm-l6", "--skip", "nope"]) == 2
    with pytest.raises(ValueError, match="known stages"):
        build_report("minilm-l6", RunConfig(skip=("nope",)), quiet=True)


def test_every_stage_has_a_no_switch_and_the_old_ones_still_work():
    args = build_parser().parse_args(["report", "--no-patching", "--no-kv", "--no-roles"])
    from headscope.reports.cli.report import stage_selection

    assert stage_selection(args)["off"] == ("roles", "patching", "kv")
    assert RunConfig(patching=False, weights=False).off == ("patching", "weights")


def test_a_skipped_requirement_makes_its_dependants_absent_with_the_reason(tiny_llama_dir, tmp_path):
    result = build_report(
        tiny_llama_dir, RunConfig(only=("roles", "pruning"), skip=("roles",)), out_dir=tmp_path / "r", quiet=True
    )
    run = json.loads(result.paths["run_json"].read_text())
    assert run["absent"]["roles"] == "skipped (--skip roles)"
    assert run["absent"]["pruning"] == "needs roles, which was skipped"
    assert run["stages"]["pruning"]["status"] == "absent" and run["absent"]["kv"] == "not in --only"


def test_a_failing_stage_is_absent_with_its_reason_and_the_others_still_write(toy, tiny_llama_dir, tmp_path):
    config = _small(only=("roles", "count", "after_count"), configs={"count": toy_stage.CountConfig(fail=True)})
    result = build_report(tiny_llama_dir, config, out_dir=tmp_path / "r", quiet=True)
    run = json.loads(result.paths["run_json"].read_text())
    assert run["stages"]["count"]["status"] == "failed"
    assert run["absent"]["count"] == "failed: RuntimeError: the toy stage broke"
    assert run["absent"]["after_count"] == "needs count, which failed: RuntimeError: the toy stage broke"
    assert run["stages"]["roles"]["status"] == "ran" and (tmp_path / "r" / "tables" / "roles.parquet").exists()
    assert "Absent, because failed: RuntimeError: the toy stage broke." in (tmp_path / "r" / "report.md").read_text()


# ----------------------------------------------------------------------------- the model, once
def test_build_report_resolves_the_model_and_reads_its_config_once(monkeypatch, tmp_path):
    from headscope.probes.models import card, checkpoints

    calls = {"resolve": 0, "config": 0}
    real_resolve, real_read = checkpoints.resolve, card.source_hf_config

    def resolve(model):
        calls["resolve"] += 1
        return real_resolve(model)

    def read(source):
        calls["config"] += 1
        return real_read(source)

    monkeypatch.setattr(checkpoints, "resolve", resolve)
    monkeypatch.setattr(card, "source_hf_config", read)
    result = build_report("minilm-l6", _small(only=("roles",)), out_dir=tmp_path / "r", quiet=True)
    assert calls == {"resolve": 1, "config": 1}
    run = json.loads(result.paths["run_json"].read_text())
    assert run["architecture"] == {"layers": 6, "heads": 12, "kv_heads": 12}
    assert run["memory"]["shape"]["n_layers"] == 6 and len(run["model_file"]["sha256"]) == 64


class _OptIn(toy_stage.CountStage):
    name = "opt_in"
    default_on = False


def test_a_stage_off_by_default_runs_only_when_asked(monkeypatch):
    from headscope.reports.stages.config import RunConfig
    from headscope.reports.stages.runner import turned_off

    monkeypatch.setitem(STAGES, "opt_in", _OptIn())
    assert turned_off(RunConfig())["opt_in"] == "off by default (--opt_in or --only opt_in runs it)"
    assert "opt_in" not in turned_off(RunConfig(on=("opt_in",)))
    assert "opt_in" not in turned_off(RunConfig(only=("roles", "opt_in")))
    assert "roles" not in turned_off(RunConfig())
    assert "context" not in turned_off(RunConfig())  # on by default since its batched forwards (#41)
    args = build_parser().parse_args(["report", "--opt_in"])
    from headscope.reports.cli.report import stage_selection

    assert stage_selection(args)["on"] == ("opt_in",)
