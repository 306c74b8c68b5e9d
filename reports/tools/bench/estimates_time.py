"""The time half of the calibration (``make estimates``): the ``time`` rows of
``data/figures/estimates.json`` (per default report of
:data:`~headscope.reports.tools.bench.estimates.REPORT_MODELS` and per :data:`TIMED_CASES` case, a
stage's CPU seconds on one thread, its work as :meth:`~headscope.reports.stages.base.Stage.work`
plans it, the CPU-clock reference rate), the factors fitted on them
(:func:`~headscope.reports.stages.clock.fit_factors`) and the guide page's time tables.
``tests/test_estimates_calibration.py`` holds every row within
:data:`~headscope.reports.tools.bench.estimates.TIME_BAND`.
"""

from __future__ import annotations

from headscope.reports.tools.bench.estimates import CASES, SHAPES, TIME_BAND, _plan_case, report_case, shape_dir

__all__ = [
    "TIMED_CASES",
    "case_time_rows",
    "one_thread_rate",
    "replan_time",
    "time_lines",
    "time_section",
    "work_fields",
]


def work_fields(work) -> dict:
    """A time row's ``work_gflop`` and ``work_calls`` (:class:`~headscope.reports.stages.clock.Work`)."""
    if work is None:
        return {"work_gflop": None, "work_calls": None, "work_slow_gflop": None}
    return {
        "work_gflop": round(work.gflop, 3),
        "work_calls": round(work.calls, 1),
        "work_slow_gflop": round(work.slow_gflop, 3),
    }


#: calibration cases whose stage joins the time fit (a stage the default reports leave off): case name ->
#: stage; its row's CPU seconds (the case run on one thread) against the CPU-clock rate measured around it
TIMED_CASES = {"smollm2-135m/fp32/batch x1/circuits alone": "circuits"}


def case_time_rows(doc: dict) -> list[dict]:
    """The time rows of :data:`TIMED_CASES` from their memory rows in ``doc`` (those run on one
    thread, with their CPU seconds and rate), each stage's work planned here (no model loaded)."""
    from headscope.reports.stages import registry

    out = []
    for name, stage in TIMED_CASES.items():
        rows = [r for r in doc["rows"] if r["case"] == name and r["stage"] == stage and r["status"] == "ran"]
        rows = [r for r in rows if r.get("cpu_s") and r.get("rate") and r.get("threads") == 1]
        if not rows:
            continue
        case = next(c for c in CASES if c.name == name)
        ctx, _config, cfgs, _budget, _model = _plan_case(case)
        r = rows[0]
        out.append(
            {
                "case": name,
                "model": case.model,
                "stage": stage,
                "seconds": r["cpu_s"],
                "wall_s": r["seconds"],
                "clock": "cpu",
                **work_fields(registry.STAGES[stage].work(ctx, cfgs[stage])),
                "rate": r["rate"],
                "threads": 1,
            }
        )
    return out


def _measured_groups(doc: dict, case: str) -> tuple[str, ...] | None:
    """The role groups a default report ran, read off its roles row's plan: a generated group whose
    working set is not in it was not registered then (None: no such row)."""
    from headscope.analyses.roles.base import REGISTRY

    rows = [r for r in doc["rows"] if r["case"] == case and r["stage"] == "roles" and r.get("batch_sizes")]
    if not rows:
        return None
    plan = rows[0]["batch_sizes"]
    return tuple(g for g, role in REGISTRY.items() if role.generated is None or g in plan)


def replan_time(doc: dict) -> dict:
    """``doc``'s time rows with each stage's work planned again by the code as it is now (no model
    loaded; a default report with the role groups it ran), :data:`TIMED_CASES`' rows added, and
    the factors fitted again -> the ``time`` section."""
    from headscope.reports.stages import registry
    from headscope.reports.stages.config import RunConfig
    from headscope.reports.stages.runner import plan_report

    timed = set(TIMED_CASES)
    rows = [r for r in (doc.get("time") or {}).get("rows", []) if r["case"] not in timed]
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        name = report_case(model)
        where = str(shape_dir(model)) if model in SHAPES else model
        ctx, _budget, cfgs, _off = plan_report(where, RunConfig(role_groups=_measured_groups(doc, name)))
        for r in (r for r in rows if r["model"] == model):
            out.append(r | work_fields(registry.STAGES[r["stage"]].work(ctx, cfgs[r["stage"]])))
    return time_section(out + case_time_rows(doc))


def time_section(rows: list[dict]) -> dict:
    """The JSON's ``time``: the factors fitted on ``rows`` (:func:`~headscope.reports.stages.clock.fit_factors`)
    and each row with the estimate those factors give at its rate (``estimate_s``), and estimate /
    measured (``ratio``)."""
    from headscope.reports.stages.clock import Work, fit_factors, seconds

    factors = fit_factors(rows)
    out = []
    for r in rows:
        work = Work(r["work_gflop"] or 0.0, r.get("work_calls") or 0.0, r.get("work_slow_gflop") or 0.0)
        est = seconds(r["stage"], work, r["rate"], factors) if (work.gflop or work.calls or work.slow_gflop) else None
        ratio = None if est is None or not r["seconds"] else round(est / r["seconds"], 3)
        out.append(r | {"estimate_s": None if est is None else round(est, 1), "ratio": ratio})
    return {"band": TIME_BAND, "factors": factors, "rows": out}


def time_lines(time_doc: dict | None) -> list[str]:
    """The time tables of a calibration document: per stage, its fitted factors
    (:func:`~headscope.reports.stages.clock.fit_factors`) and its rows' range of estimate /
    measured; then per row, its work (GFLOP and calls), the rate, the estimate, the measured CPU
    seconds and their ratio."""
    if not time_doc:
        return []
    rows = [r for r in time_doc["rows"] if r["ratio"] is not None]
    lines = [
        "",
        "| stage | reference GFLOP per GFLOP | reference GFLOP per call | per slow GFLOP | rows | estimate / measured |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for stage, f in time_doc["factors"].items():
        ratios = [r["ratio"] for r in rows if r["stage"] == stage]
        span = f"{min(ratios):.2f}" if len(ratios) == 1 else f"{min(ratios):.2f} to {max(ratios):.2f}"
        lines.append(
            f"| {stage} | {f['gflop']:.4g} | {f['calls']:.4g} | {f['slow_gflop']:.4g} | {len(ratios)} | {span} |"
        )
    lines += [
        "",
        "| case | stage | work GFLOP | calls | slow GFLOP | rate GFLOP/s | estimate s | measured s | estimate / measured |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in time_doc["rows"]:
        est = "-" if r["estimate_s"] is None else f"{r['estimate_s']:.1f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(
            f"| {r['case']} | {r['stage']} | {r['work_gflop']:.1f} | {r.get('work_calls') or 0:,.0f} "
            f"| {r.get('work_slow_gflop') or 0:.1f} | {r['rate']:.1f} "
            f"| {est} | {r['seconds']:.1f} | {ratio} |"
        )
    if rows:
        lo, hi = min(rows, key=lambda r: r["ratio"]), max(rows, key=lambda r: r["ratio"])
        lines += [
            "",
            f"Time: estimate / measured from {lo['ratio']:.2f} ({lo['case']}, {lo['stage']}) to "
            f"{hi['ratio']:.2f} ({hi['case']}, {hi['stage']}); the band is {1 / time_doc['band']:.2f} to "
            f"{time_doc['band']:g}.",
        ]
    return lines


def one_thread_rate(cpu_rate: float, wall_rate: float) -> float:
    """The CPU-clock reference rate of a one-thread run, read with its wall-clock one: on one
    thread a product's CPU seconds cannot exceed its wall seconds, so a CPU-clock rate below the
    wall-clock rate counted other threads of the process (the process clock: SmolLM2-135M's report
    measured 25.6 GFLOP/s on it after its run, 84.9 by the wall clock), and the wall-clock rate
    is the better reading; otherwise the CPU-clock rate (a core of its own on a shared machine).

    >>> one_thread_rate(90.0, 60.0), one_thread_rate(25.6, 84.9)
    (90.0, 84.9)
    """
    return max(cpu_rate, wall_rate)
