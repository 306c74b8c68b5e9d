"""``--dry-run``: a report run's plan, printed before anything loads, and nothing more.

:func:`dry_run` does what a run does before its load (:func:`~headscope.reports.stages.runner.plan_report`:
the MODEL resolved, its config read, every stage's settings settled and their memory planned and
fitted; a run that cannot fit is refused in one line) and the time estimate, then, with
``--device-map auto``, the placement over the devices (:mod:`~headscope.reports.device_plan`, on the
meta device). No weight is read: a folder holding only ``config.json`` is planned as well as a
full checkpoint.

Example::

    for line in dry_run("minilm-l6", RunConfig(only=("roles",))):
        print(line)
"""

from __future__ import annotations

from headscope.reports.stages.config import RunConfig

__all__ = ["dry_run", "stage_rows"]


def stage_rows(budget, cfgs: dict, off: dict[str, str], seconds: dict) -> list[dict]:
    """One dict per registered stage in run order: ``stage``, ``status`` (``planned`` or why it is off),
    ``peak_bytes`` (its largest working set's phase: the weights, the process and what it holds; None
    off), ``batch`` (its working sets' fitted batch sizes), ``seconds`` (its estimated time or None)."""
    from headscope.reports.stages import registry

    est = budget.estimate
    owner = budget.settings.get("owner", {})
    rows = []
    for s in registry.run_order():
        own = [k for k, v in owner.items() if v == s.name]
        peak = max((est.phases[k] for k in own), default=None) if est is not None else None
        if peak is None and est is not None and s.name not in off:  # no working set of its own: what every run holds
            peak = min((v for k, v in est.phases.items() if k != "load"), default=None)
        rows.append(
            {
                "stage": s.name,
                "status": off[s.name] if s.name in off else "planned",
                "peak_bytes": None if s.name in off else peak,
                "batch": {k: est.batch_sizes[k] for k in own} if est is not None else {},
                "seconds": None if s.name in off else seconds.get(s.name),
            }
        )
    return rows


def dry_run(model, config: RunConfig) -> list[str]:
    """The lines of the plan of a report run of MODEL ``model`` under ``config``: each stage's
    estimated peak, batch and time, the whole run's peak (:meth:`~headscope.reports.budget.Budget.line`),
    the time estimate and, with ``config.device_map``, the device plan. Raises what the run would
    before its load (:class:`~headscope.probes.errors.MemoryBudgetError` when it cannot fit)."""
    from headscope.reports import device_plan
    from headscope.reports.stages.clock import describe, duration, rate
    from headscope.reports.stages.runner import plan_report, time_estimates

    ctx, budget, cfgs, off = plan_report(model, config)
    seconds = time_estimates(ctx, cfgs, [n for n in cfgs if n not in off])
    out = [f"plan of {ctx.card.get('name', ctx.name)} (dry run: no weight loaded)"]
    out.append(f"  {'stage':<12} {'peak':>11} {'batch':>7} {'time':>8}  status")
    for r in stage_rows(budget, cfgs, off, seconds):
        peak = "-" if r["peak_bytes"] is None else device_plan.size(r["peak_bytes"])
        batch = ",".join(str(b) for b in sorted(set(r["batch"].values()))) or "-"
        time = "-" if not r["seconds"] else f"~{duration(r['seconds'])}"
        out.append(f"  {r['stage']:<12} {peak:>11} {batch:>7} {time:>8}  {r['status']}")
    out.append(budget.line())
    if any(seconds.values()) and (line := describe(seconds, rate())) is not None:
        out.append(line)
    placed, note = device_plan.plan_run(ctx, budget, config)
    out += placed.lines() if placed is not None else [note] if note else []
    if placed is not None:
        host = device_plan.check_host(placed, budget)
        room = host["available_bytes"]
        out.append(
            f"  host: ~{device_plan.size(host['estimate_bytes'])} with the layers on the GPUs"
            + (f" ({device_plan.size(room)} available)" if room is not None else "")
        )
    return out
