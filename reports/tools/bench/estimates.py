"""``headscope bench --estimates`` (``make estimates``): every registered stage's memory estimate
against the peak it reaches, on real and random-weight checkpoints.

Each :data:`CASES` row runs, in a child process of its own (a fresh resident set), the report's
own path: the model's context opened once, every registered stage's settings settled (its
batch sizes scaled by the case's ``batch`` factor), the memory plan made before the load, the
model loaded, every stage run in order with its peak sampled
(:func:`~headscope.reports.stages.runner.run_stages`). :func:`calibrate` writes one row per case
and stage (``estimate_mb``, ``peak_mb``, ``error``, ``seconds``, ``units``) to
``data/figures/estimates.json``; ``tests/test_estimates_calibration.py`` holds every row to
:data:`BAND` and fails for a registered stage with no row.

The random-weight shapes (:data:`SHAPES`) are HF folders written once under the cache: a long
vocabulary (151,936, Qwen2's) and a large ``d_head`` (256), with SmolLM2-135M's tokenizer.

Example (minutes)::

    rows = calibrate(cases=[c for c in CASES if c.model == "minilm-l6"], out=None)
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from headscope.reports.tools.bench.case_inputs import QWEN05_CORPORA, QWEN05_ITEMS, case_model, longest_items

log = logging.getLogger(__name__)

__all__ = ["BAND", "CASES", "SHAPES", "Case", "calibrate", "in_band", "run_case"]

#: an estimate may be this far under / over its measured peak (a share of the peak) ...
BAND = (-0.10, 0.30)
#: ... or this close to it in MiB (small stages: the sampling of the peak is coarser than their work)
SMALL_MB = 150.0

#: random-weight shapes: (HF config, what it stands for)
SHAPES: dict[str, dict] = {
    "qwen2-vocab152k": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "intermediate_size": 512,
        "vocab_size": 151936,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
    },
    "llama-dhead256": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "vocab_size": 49152,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
    },
}


@dataclass(frozen=True)
class Case:
    """One run of the calibration: ``model`` (a shipped name or a :data:`SHAPES` key), ``dtype``,
    ``batch`` (every stage's batch sizes times this), ``items`` (stage -> {field: value}: a subset
    of a slow stage's items whose per-item working set is the same)."""

    model: str
    dtype: str = "fp32"
    batch: float = 1.0
    items: dict = field(default_factory=dict)
    only: tuple = ()  # these stages alone (empty: every registered one)
    #: role corpus -> how many of its longest items the roles stage reads (the largest batch, the one the
    #: plan sizes, is made of them); empty: the shipped corpora whole
    corpora: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        alone = f"/{'+'.join(self.only)} alone" if self.only else ""
        return f"{self.model}/{self.dtype}/batch x{self.batch:g}{alone}"


#: every case: the contextualisation stage on its first 6 words (each sentence is its own forward: the
#: working set of one is the same), the pruning study of a decoder on 8 items
_SUBSET = {"context": {"max_words": 6}}
_SMOL_SUBSET = {**_SUBSET, "pruning": {"n_items": 8}}
CASES: tuple[Case, ...] = (
    Case("minilm-l6", items=_SUBSET),
    Case("minilm-l6", batch=0.25, items=_SUBSET),
    Case("minilm-l6", dtype="bf16", items=_SUBSET),
    Case("smollm2-135m", items=_SMOL_SUBSET),
    Case("smollm2-135m", batch=0.25, items=_SMOL_SUBSET),
    Case("qwen2-vocab152k", items=_SMOL_SUBSET),
    Case("qwen2-vocab152k", batch=0.25, items=_SMOL_SUBSET),
    Case("qwen2-vocab152k", dtype="bf16", items=_SMOL_SUBSET),
    Case("llama-dhead256", items=_SMOL_SUBSET),
    Case("llama-dhead256", batch=0.25, items=_SMOL_SUBSET),
    # the KV stage alone on the two shapes (its logits block is the largest at a long vocabulary)
    Case("qwen2-vocab152k", items=_SMOL_SUBSET, only=("kv",)),
    Case("llama-dhead256", items=_SMOL_SUBSET, only=("kv",)),
    # off by default, on decoders only: SmolLM2-135M's induction circuit as the stage runs it (8 items)
    Case("smollm2-135m", only=("circuits",)),
    # the weights stage at d_head 256, its composition nulls on 64 draws (of 1,000): each null is drawn in
    # blocks of 16 draws (16 MiB a matrix) whatever their number, so the working set is the default's
    Case("llama-dhead256", only=("roles", "weights"), items={"weights": {"null": 64}}),
    # Qwen2-0.5B's shape as a GGUF (F16, random weights), its default stages in two runs, cut where the peak is
    # one batch's (:mod:`.case_inputs`): the forward stages, then patching and weights, which read the roles'
    # frame (``requires``: without roles they are absent), so the roles run before them on the same cut corpora
    Case("qwen2-0.5b-gguf", items=QWEN05_ITEMS, only=("roles", "pruning", "kv", "context"), corpora=QWEN05_CORPORA),
    Case("qwen2-0.5b-gguf", items=QWEN05_ITEMS, only=("roles", "patching", "weights"), corpora=QWEN05_CORPORA),
    Case("qwen2-0.5b-gguf", items=QWEN05_ITEMS, only=("context",)),  # the anisotropy baseline by depth
)

#: the batch-size fields of the stages' settings that :attr:`Case.batch` scales
_BATCH_FIELDS = ("batch_size", "max_rows")


def in_band(estimate_mb: float, peak_mb: float) -> bool:
    """Whether an estimate is within :data:`BAND` of the peak, or :data:`SMALL_MB` of it."""
    err = (estimate_mb - peak_mb) / peak_mb
    return BAND[0] <= err <= BAND[1] or abs(estimate_mb - peak_mb) <= SMALL_MB


def shape_dir(name: str) -> Path:
    """The HF folder of random-weight shape ``name`` (:data:`SHAPES`), written once under the cache:
    its config, random float32 weights (seed 0), SmolLM2-135M's tokenizer."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from headscope.probes.models.checkpoints import cache_dir, resolve
    from headscope.probes.models.gguf.cache import gguf_as_hf_dir

    out = cache_dir() / "calibration" / name
    if (out / "model.safetensors").exists():
        return out
    hf = dict(SHAPES[name])
    cfg = AutoConfig.for_model(hf.pop("model_type"), **{k: v for k, v in hf.items() if k != "architectures"})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(out)
    smol = gguf_as_hf_dir(resolve("smollm2-135m").path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smol / f, out / f)
    return out


def _scaled(cfg, case: Case, stage: str):
    """``cfg`` with its batch sizes times ``case.batch`` (at least 1) and the case's item subset."""
    names = {f.name for f in fields(cfg)}
    change = {k: max(1, int(getattr(cfg, k) * case.batch)) for k in _BATCH_FIELDS if k in names and case.batch != 1}
    change.update({k: v for k, v in case.items.get(stage, {}).items() if k in names})
    return replace(cfg, **change) if change else cfg


def _plan_case(case: Case, progress=None):
    """The report's path up to the load for ``case``: ``(ctx, config, cfgs, budget, model)``."""
    from headscope.reports.stages import registry
    from headscope.reports.stages.config import RunConfig
    from headscope.reports.stages.runner import open_context, plan_memory

    model = case_model(case.model)
    inputs = longest_items(case.corpora) or None
    config = RunConfig(dtype=case.dtype, backend="auto", on=tuple(registry.STAGES), role_inputs=inputs)
    ctx, extra = open_context(model, config, progress=progress)
    stages = list(registry.STAGES.values())
    cfgs = {s.name: _scaled(s.config(ctx, None), case, s.name) for s in stages}
    budget, cfgs = plan_memory(ctx, cfgs, [s for s in stages if not case.only or s.name in case.only], extra)
    return ctx, config, cfgs, budget, model


def run_case(case: Case) -> list[dict]:
    """Run ``case`` in this process (see the module doc) -> one row per registered stage, with the
    CPU-clock reference rate measured around the stages (``rate``, GFLOP/s) and torch's ``threads``."""
    import math
    import time

    import torch

    from headscope.probes.timing import reference_rate
    from headscope.reports.stages.runner import _estimates, load_into, run_stages

    def progress(stage, done, total):
        if done == 0 or done == total:
            log.warning("calibration %s: %s %s", case.name, stage, "started" if done == 0 else "done")

    ctx, config, cfgs, budget, model = _plan_case(case, progress)
    load_into(ctx, model, config)
    off = {n: "not in the case" for n in cfgs if case.only and n not in case.only}
    before = reference_rate(clock=time.thread_time)
    status, _counts = run_stages(ctx, cfgs, off, _estimates(budget))
    cpu = {
        "rate": round(math.sqrt(before * reference_rate(clock=time.thread_time)), 2),
        "threads": torch.get_num_threads(),
    }
    rows = [_whole(case, budget)]
    rows += [_stage_row(case, budget, name, rec, rec.get("estimate_mb")) | cpu for name, rec in status.items()]
    return rows


def _stage_row(case: Case, budget, name: str, rec: dict, estimate_mb: float | None) -> dict:
    """One stage's row: its estimate against the peak ``rec`` (run.json's ``stages[name]``) measured."""
    peak = rec.get("peak_mb")
    return {
        "case": case.name,
        "model": case.model,
        "dtype": case.dtype,
        "batch": case.batch,
        "stage": name,
        "status": rec["status"],
        "reason": rec.get("reason"),
        "estimate_mb": estimate_mb,
        "peak_mb": peak,
        "error": None if not (estimate_mb and peak) else round((estimate_mb - peak) / peak, 4),
        "seconds": rec.get("seconds"),
        "cpu_s": rec.get("cpu_s"),
        "batch_sizes": dict(budget.estimate.batch_sizes) if budget.estimate else {},
    }


def replan_rows(case: Case, rows: list[dict]) -> list[dict]:
    """``rows`` measured for ``case`` with each estimate planned again by the code as it is now (the
    plan is arithmetic on the shape and settings, made before any load: no model is loaded here),
    the peaks kept; ``estimate_before_mb`` keeps the estimate the run made. Run it in a fresh
    process, as :func:`run_case` is (the plan counts the process's resident memory)."""
    from headscope.reports.stages.runner import _estimates

    _ctx, _config, _cfgs, budget, _model = _plan_case(case)
    est = _estimates(budget)
    out = []
    for r in rows:
        new = round(budget.estimate.total / 2**20, 1) if r["stage"] == WHOLE else est.get(r["stage"], est.get("*"))
        new = new if r["estimate_mb"] is not None else None
        err = None if not (new and r["peak_mb"]) else round((new - r["peak_mb"]) / r["peak_mb"], 4)
        out.append(r | {"estimate_before_mb": r["estimate_mb"], "estimate_mb": new, "error": err, "replanned": True})
    return out


#: the stage name of a case's whole-run row (the largest phase against the process's VmHWM)
WHOLE = "(whole run)"


def _whole(case: Case, budget) -> dict:
    from headscope.probes.budget import peak_rss_bytes

    est = round(budget.estimate.total / 2**20, 1) if budget.estimate else None
    peak = round(peak_rss_bytes() / 2**20, 1)
    err = None if not est else round((est - peak) / peak, 4)
    phase = budget.estimate.phase if budget.estimate else None
    return {
        "case": case.name,
        "model": case.model,
        "dtype": case.dtype,
        "batch": case.batch,
        "stage": WHOLE,
        "status": "ran",
        "reason": f"largest phase: {phase}",
        "estimate_mb": est,
        "peak_mb": peak,
        "error": err,
        "seconds": None,
        "batch_sizes": {},
    }


def rows_from_run(case: Case, run: dict) -> list[dict]:
    """The rows of ``case`` from the run.json of a report already run with its settings (a slow
    model's default report): the peaks and seconds it measured, each stage's estimate planned
    again here, before any load (:func:`~headscope.reports.stages.runner.plan_report`), so a
    change of the plan is read against the peaks measured."""
    from headscope.reports.stages.config import RunConfig
    from headscope.reports.stages.runner import _estimates, plan_report

    model = str(shape_dir(case.model)) if case.model in SHAPES else case.model
    _ctx, budget, _cfgs, _off = plan_report(model, RunConfig(dtype=case.dtype))
    est = _estimates(budget)
    whole = _whole(case, budget)
    peak = (run.get("memory") or {}).get("peak_rss_bytes")
    whole["peak_mb"] = None if peak is None else round(peak / 2**20, 1)
    whole["error"] = (
        None if not (whole["estimate_mb"] and peak) else round(whole["estimate_mb"] / whole["peak_mb"] - 1, 4)
    )
    rows = [whole | {"measured_by": "report run.json"}]
    for name, rec in (run.get("stages") or {}).items():
        e = est.get(name, est.get("*")) if rec.get("peak_mb") is not None else None
        rows.append(_stage_row(case, budget, name, rec, e) | {"measured_by": "report run.json"})
    return rows


def measure_report(model: str, out: Path) -> dict:
    """A default report of ``model`` run in this process (:func:`~headscope.reports.pipeline.build_report`,
    as ``headscope report MODEL`` runs it; the folder written to ``out``), with this machine's
    reference rate (:func:`~headscope.probes.timing.reference_rate`) measured just before it and
    just after, glibc's allocator tuned as the ``headscope`` command tunes it -> {"model", "rate_before", "rate_after", "threads", "run"}`` (``run``: its run.json)."""
    import time

    import torch

    from headscope.probes.allocator import tune_allocator
    from headscope.probes.timing import reference_rate
    from headscope.reports.pipeline import build_report

    tune_allocator()  # as the headscope command does
    before, cpu_before = reference_rate(), reference_rate(clock=time.thread_time)
    build_report(str(shape_dir(model)) if model in SHAPES else model, out_dir=out, quiet=True)
    after, cpu_after = reference_rate(), reference_rate(clock=time.thread_time)
    run = json.loads((Path(out) / "run.json").read_text(encoding="utf-8"))
    return {
        "model": model,
        "rate_before": before,
        "rate_after": after,
        "cpu_rate_before": cpu_before,
        "cpu_rate_after": cpu_after,
        "threads": torch.get_num_threads(),
        "run": run,
    }


#: the default reports (``headscope report MODEL``) the time factors are fitted on, whose per-stage and
#: whole-run memory the band holds too: MiniLM-L6, the two random-weight decoders of :data:`SHAPES` and
#: SmolLM2-135M (its report measured apart, on one thread, and read with ``--measured``)
REPORT_MODELS = ("minilm-l6", "qwen2-vocab152k", "llama-dhead256", "smollm2-135m")
#: a stage's time estimate may be this many times over or under its measured seconds
TIME_BAND = 1.5


def report_case(model: str) -> str:
    """The case name of ``model``'s default report in the calibration JSON."""
    return f"{model}/fp32/default report"


def report_rows(measured: dict) -> tuple[list[dict], list[dict]]:
    """``(memory rows, time rows)`` of one :func:`measure_report` result: each stage's estimate
    planned again here (before any load) against the peak its run.json measured; per stage that
    ran, its work (:meth:`~headscope.reports.stages.base.Stage.work`: GFLOP and calls), its seconds and the
    reference rate the run measured (the geometric mean of the rates before and after it). On one
    thread the seconds are the stage's CPU seconds and the rate the CPU-clock one: a core of its
    own, whatever else the shared machine runs (its wall seconds are kept as ``wall_s``)."""
    import math

    from headscope.reports.stages import registry
    from headscope.reports.stages.config import RunConfig
    from headscope.reports.stages.runner import plan_report
    from headscope.reports.tools.bench.estimates_time import one_thread_rate, work_fields

    model, run, name = measured["model"], measured["run"], report_case(measured["model"])
    memory = [r | {"case": name} for r in rows_from_run(Case(model), run)]
    ctx, _budget, cfgs, _off = plan_report(str(shape_dir(model)) if model in SHAPES else model, RunConfig())
    cpu = measured["threads"] == 1 and "cpu_rate_before" in measured
    rate = math.sqrt(
        one_thread_rate(measured["cpu_rate_before"], measured["rate_before"])
        * one_thread_rate(measured["cpu_rate_after"], measured["rate_after"])
        if cpu
        else measured["rate_before"] * measured["rate_after"]
    )
    times = []
    for stage, rec in run["stages"].items():
        if rec["status"] != "ran" or stage not in registry.STAGES:
            continue
        times.append(
            {
                "case": name,
                "model": model,
                "stage": stage,
                "seconds": rec["cpu_s"] if cpu else rec["seconds"],
                "wall_s": rec["seconds"],
                "clock": "cpu" if cpu else "wall",
                **work_fields(registry.STAGES[stage].work(ctx, cfgs[stage])),
                "rate": round(rate, 2),
                "threads": measured["threads"],
            }
        )
    return memory, times


def calibrate_reports(measured: list[dict], doc_path: Path) -> dict:
    """Put the default reports ``measured`` (:func:`measure_report` results) into the calibration
    JSON at ``doc_path``: their memory and time rows replace those of the same reports, the other
    reports' rows stay, and the ``time`` section's factors are fitted again over all -> the document written."""
    doc = json.loads(Path(doc_path).read_text(encoding="utf-8"))
    names = {report_case(m["model"]) for m in measured}
    mem, times = [], [r for r in (doc.get("time") or {}).get("rows", []) if r["case"] not in names]
    for m in measured:
        a, b = report_rows(m)
        mem += a
        times += b
    doc["rows"] = [r for r in doc["rows"] if r["case"] not in names] + mem
    from headscope.reports.tools.bench.estimates_time import time_section

    doc["time"] = time_section(times)
    Path(doc_path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


def _child(case: Case, timeout: float) -> list[dict]:
    """:func:`run_case` in a child process of its own (its own resident set); a :data:`~.estimates_time.TIMED_CASES`
    case on one thread, as its time row is read (its memory row, from that run, is planned at that thread count)."""
    import os

    from headscope.reports.tools.bench.estimates_time import TIMED_CASES

    env = {**os.environ, "OMP_NUM_THREADS": "1"} if case.name in TIMED_CASES else None
    code = (
        "import json,sys; from headscope.reports.tools.bench.estimates import Case, run_case; "
        "print(json.dumps(run_case(Case(**json.loads(sys.argv[1])))))"
    )
    args = [sys.executable, "-c", code, json.dumps(asdict(case))]  # its log goes to this process's stderr
    proc = subprocess.run(args, stdout=subprocess.PIPE, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"calibration case {case.name} failed (exit {proc.returncode}); its log is above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _replan_child(case: Case, rows: list[dict], timeout: float = 600) -> list[dict]:
    """:func:`replan_rows` in a child process of its own (the plan counts the process's resident
    memory, as the case's own run did); ``rows`` with their first estimate put back first."""
    back = [r | {"estimate_mb": r["estimate_before_mb"]} if "estimate_before_mb" in r else r for r in rows]
    code = (
        "import json,sys; from headscope.reports.tools.bench.estimates import Case, replan_rows; "
        "a = json.loads(sys.stdin.read()); print(json.dumps(replan_rows(Case(**a['case']), a['rows'])))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps({"case": asdict(case), "rows": back}),
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"replanning {case.name} failed (exit {proc.returncode}); its log is above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def replan(names, out: Path) -> dict:
    """The rows of the cases ``names`` in the calibration JSON ``out`` planned again by the code as
    it is now (:func:`replan_rows`, no model loaded), their measured peaks kept -> the document written."""
    doc = json.loads(Path(out).read_text(encoding="utf-8"))
    for case in [c for c in CASES if c.name in set(names)]:
        new = iter(_replan_child(case, [r for r in doc["rows"] if r["case"] == case.name]))
        doc["rows"] = [next(new) if r["case"] == case.name else r for r in doc["rows"]]
    Path(out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


def _report_child(model: str, progress=None, timeout: float = 3600) -> dict:
    """:func:`measure_report` of ``model`` in a child process of its own, on one thread
    (``OMP_NUM_THREADS=1``, as the committed factors were measured), its folder in a temporary directory."""
    import os
    import tempfile

    if progress:
        progress(report_case(model))
    with tempfile.TemporaryDirectory() as tmp:
        code = (
            "import json,sys; from headscope.reports.tools.bench.estimates import measure_report; "
            "json.dump(measure_report(sys.argv[1], sys.argv[2] + '/report'), open(sys.argv[2] + '/m.json', 'w'))"
        )
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-c", code, model, tmp], check=True, timeout=timeout, env=env)
        return json.loads((Path(tmp) / "m.json").read_text(encoding="utf-8"))


def calibrate(cases=CASES, out: Path | None = None, *, timeout: float = 3600, progress=None) -> list[dict]:
    """Run every case (each in its own process) -> the rows; written as JSON to ``out`` (None: not
    written) with the band and the machine, replacing the rows of the cases run and keeping the others."""
    import os

    rows = []
    for c in cases:
        if progress:
            progress(c.name)
        rows.extend(_child(c, timeout))
    if out is not None:
        kept = json.loads(Path(out).read_text(encoding="utf-8")) if Path(out).exists() else {}
        ran, known = {c.name for c in cases}, {c.name for c in CASES}
        # the cases of CASES not run this time keep their rows (a subset can be run again alone), as do
        # the default reports' rows and time section (:func:`calibrate_reports` writes them)
        keep = lambda name: name not in ran and (name in known or name.endswith("/default report"))  # noqa: E731
        doc = {
            "band": list(BAND),
            "small_mb": SMALL_MB,
            "cpus": os.cpu_count(),
            "cases": [c for c in kept.get("cases", []) if keep(c["name"])]
            + [asdict(c) | {"name": c.name} for c in cases],
            "rows": [r for r in kept.get("rows", []) if keep(r["case"])] + rows,
            **({"time": kept["time"]} if "time" in kept else {}),
        }
        Path(out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return rows


#: where the guide page keeps the table :func:`render_table` writes (``make estimates`` rewrites it)
TABLE_START, TABLE_END = "<!-- estimates table: written by make estimates -->", "<!-- end of estimates table -->"


def render_table(doc: dict) -> str:
    """The Markdown table of a calibration document: one line per case and stage that ran
    (estimate, measured peak, error, seconds), then the largest under- and over-estimate."""
    lines = [
        "| case | stage | estimate MiB | before MiB | peak MiB | error | seconds |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    measured = [r for r in doc["rows"] if r["estimate_mb"] and r["peak_mb"]]
    for r in measured:
        before, secs = r.get("estimate_before_mb"), r.get("seconds")
        before = "-" if before is None else f"{before:.0f}"
        secs = "-" if secs is None else f"{secs:.1f}"
        lines.append(
            f"| {r['case']} | {r['stage']} | {r['estimate_mb']:.0f} | {before} | {r['peak_mb']:.0f} "
            f"| {r['error']:+.1%} | {secs} |"
        )
    if measured:
        lo, hi = min(measured, key=lambda r: r["error"]), max(measured, key=lambda r: r["error"])
        lines += [
            "",
            f"Largest under-estimate: {lo['error']:+.1%} ({lo['case']}, {lo['stage']}); largest over-estimate: "
            f"{hi['error']:+.1%} ({hi['case']}, {hi['stage']}).",
        ]
    from headscope.reports.tools.bench.estimates_time import time_lines

    return "\n".join(lines + time_lines(doc.get("time")))


def write_page(doc: dict, page: Path) -> None:
    """Replace the table between :data:`TABLE_START` and :data:`TABLE_END` in ``page``."""
    text = page.read_text(encoding="utf-8")
    head, _, rest = text.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    page.write_text(f"{head}{TABLE_START}\n{render_table(doc)}\n{TABLE_END}{tail}", encoding="utf-8")


def main(argv=None) -> int:
    """``python -m headscope.reports.tools.bench.estimates [--out JSON] [--page MD] [--cases a,b]``:
    :func:`calibrate` (``--cases``: only the cases of these models, or of these names), the JSON written
    (``--replan``: these cases' rows planned again, their peaks kept; ``--replan-time``: the time
    rows' work planned again and the factors fitted again), the guide page's table rewritten from it."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m headscope.reports.tools.bench.estimates")
    p.add_argument("--out", default="data/figures/estimates.json")
    p.add_argument("--page", default="docs/guide/estimates.md")
    p.add_argument(
        "--cases", default=None, help="comma-separated models or case names (default: every case; none: no case)"
    )
    p.add_argument(
        "--reports", default=",".join(REPORT_MODELS), help="default reports to measure (none: keep the JSON's)"
    )
    p.add_argument("--measured", default=None, help="comma-separated measure_report JSON files instead of --reports")
    p.add_argument("--replan", default=None, help="comma-separated case names whose rows are planned again (no run)")
    p.add_argument(
        "--replan-time",
        action="store_true",
        help="the time rows' work planned again (no run), the factors fitted again",
    )
    args = p.parse_args(argv)
    keep = None if args.cases is None else set(args.cases.split(","))
    cases = [c for c in CASES if keep is None or c.model in keep or c.name in keep]
    say = lambda name: print(f"estimates: {name}", file=sys.stderr, flush=True)  # noqa: E731
    if cases:
        calibrate(cases, Path(args.out), progress=say)
    if args.measured:
        measured = [json.loads(Path(f).read_text(encoding="utf-8")) for f in args.measured.split(",")]
    else:
        measured = [_report_child(m, say) for m in args.reports.split(",") if m and m != "none"]
    if measured:
        calibrate_reports(measured, Path(args.out))
    if args.replan:
        replan(args.replan.split(","), Path(args.out))
    if args.replan_time:
        doc = json.loads(Path(args.out).read_text(encoding="utf-8"))
        from headscope.reports.tools.bench.estimates_time import replan_time

        doc["time"] = replan_time(doc)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    write_page(json.loads(Path(args.out).read_text(encoding="utf-8")), Path(args.page))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
