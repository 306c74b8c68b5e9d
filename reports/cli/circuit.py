"""``headscope circuit MODEL --task T [--method eap|eap-ig] [--budgets ...] [--steps N] --out DIR``:
an edge circuit (:mod:`headscope.analyses.circuits.edges`).

Scores every edge of the model's graph (EAP or EAP-IG), keeps the top edges at each budget
(fractions of all edges; default MIB's), prunes dangling nodes, evaluates each circuit by exact
edge patching beside random circuits of the same size, and writes ``edges.csv``/``.parquet``
(:data:`~headscope.analyses.circuits.edges.study.STUDY_EDGE_COLUMNS`: with ``kept_at``, the smallest budget
whose pruned circuit holds the edge), ``faithfulness.csv``/``.parquet``
(:data:`~headscope.analyses.circuits.edges.evaluate.FAITHFULNESS_COLUMNS`) and ``run.json``.
In-house backend, pre-norm decoders (Llama, GPT-2 style).
"""

from __future__ import annotations

import json
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path

#: items the memory plan assumes when ``--n-items`` is not given (the shipped tasks' defaults are 16 to 32)
PLANNED_ITEMS = 32


def _budget(text: str) -> float:
    """A budget: a fraction of the edges in [0, 1] (argparse type: one line, exit 2 otherwise)."""
    import argparse

    try:
        b = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a budget is a number in [0, 1]; got {text!r}") from None
    if not 0.0 <= b <= 1.0:
        raise argparse.ArgumentTypeError(f"a budget is a fraction of the edges in [0, 1]; got {text}")
    return b


def register(sub) -> None:
    from headscope.analyses.circuits.edges.attribution import DEFAULT_STEPS, METHODS
    from headscope.analyses.circuits.edges.graph import MIB_BUDGETS
    from headscope.analyses.patching.tasks import MAX_GENERATED_ITEMS, TASKS
    from headscope.probes.outputs.folder import out_argument
    from headscope.reports.cli.argtypes import (
        MAX_SEQ_LEN,
        add_backend,
        add_device,
        add_dtype,
        add_ray,
        batch_size,
        int_in,
        seed,
    )

    p = sub.add_parser("circuit", help="an edge circuit: EAP/EAP-IG scores, faithfulness at budgets, random baseline")
    p.add_argument("model", nargs="?", default="smollm2-135m", help="shipped name or directory (pre-norm decoder)")
    add_backend(p)
    add_dtype(p)
    add_device(p)
    p.add_argument("--task", default="induction", help=f"shipped task ({', '.join(TASKS)}) or a JSONL file")
    p.add_argument(
        "--method",
        choices=list(METHODS),
        default="eap-ig",
        help="edge scores (default eap-ig: the inputs variant; eap-ig-activations: MIB's activations variant)",
    )
    p.add_argument(
        "--budgets",
        nargs="+",
        type=_budget,
        default=list(MIB_BUDGETS),
        help="fractions of all edges kept (default MIB's: 0.001 ... 1)",
    )
    p.add_argument(
        "--steps", type=int_in(1, 1000, "EAP-IG steps"), default=DEFAULT_STEPS, help="EAP-IG interpolation steps"
    )
    p.add_argument("--seeds", type=int_in(0, 100, "random circuits per budget"), default=5, help="random circuits")
    p.add_argument(
        "--n-items", type=int_in(1, MAX_GENERATED_ITEMS, "items"), default=None, help="items (default: the task's)"
    )
    p.add_argument("--seq-len", type=int_in(2, MAX_SEQ_LEN, "tokens of a generated sequence"), default=10)
    p.add_argument("--seed", type=seed, default=0, help="seed of generated items")
    p.add_argument("--batch-size", type=batch_size, default=16, help="items per forward (default 16)")
    p.add_argument("--out", type=out_argument, default=None, help="folder for edges/faithfulness tables, run.json")
    p.add_argument(
        "--mib",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write every edge's score in the JSON format of MIB's circuit track (in_graph: --mib-budget's circuit)",
    )
    p.add_argument(
        "--mib-budget",
        type=_budget,
        default=None,
        help="the budget whose circuit the MIB file marks in_graph (one of --budgets; default: the smallest "
        "reaching faithfulness 0.8, else the most faithful below 1)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_ray(p)
    p.set_defaults(func=run, backend="inhouse")  # edge circuits run on the in-house stack


def _skipped_lines(task, most: int = 10) -> list[str]:
    """One line per skipped item (the first ``most``: its item, line and reason, e.g. both
    lengths), then the count of each kind; nothing when every item is usable."""
    if not task.n_unusable:
        return []
    out = []
    for u in task.unusable[:most]:
        where = f"item {u.get('item')}" + (f" (line {u['line']})" if u.get("line") is not None else "")
        out.append(f"task {task.name}: {where} skipped: {u.get('reason', u.get('kind'))}")
    counts = ", ".join(f"{k} {n}" for k, n in task.unusable_counts().items())
    out.append(f"task {task.name}: {task.n_unusable} items skipped ({counts}), {len(task.items)} used")
    return out


def render_summary(summary: dict) -> str:
    """The summary in a few lines: the run, the top edges, faithfulness per budget."""
    t = summary["task"]
    lines = [
        f"model {summary['model']}  task {t['name']} ({t['n_items']} items, {t['n_unusable']} unusable)  "
        f"{summary['method']}: m(M) {summary['m_full']:.3f}, m(empty) {summary['m_empty']:.3f}, "
        f"{summary['n_edges_total']} edges",
        "top edges: " + ", ".join(summary["top_edges"][:5]),
        f"CPR {summary['cpr']:.3f}  CMD {summary['cmd']:.3f}  (random CPR {summary['random_cpr']:.3f})",
    ]
    for row in summary["faithfulness"]:
        lines.append(
            f"  budget {row['budget']:<6g} {row['n_edges_pruned']:>6} edges  faithfulness {row['faithfulness']:.3f}"
            f"  random {row['random_mean']:.3f}"
        )
    return "\n".join(lines)


def _write_mib(path: Path, model, edges, faith, asked: float | None) -> dict:
    """Write the MIB export (:mod:`headscope.analyses.circuits.edges.mib`) -> its record for run.json."""
    from headscope.analyses.circuits.edges.attribution import model_graph
    from headscope.analyses.circuits.edges.mib import MIB_FORMAT_SOURCE, mib_from_edges, write_mib
    from headscope.analyses.circuits.edges.study import figure_budget

    b = figure_budget(faith, asked)
    b = 1.0 if b is None else b
    doc = mib_from_edges(edges, model_graph(model), d_model=model.spec.d_model, budget=b)
    write_mib(path, doc)
    return {"path": str(path), "in_graph_budget": b, "n_edges": len(doc["edges"]), "format": MIB_FORMAT_SOURCE}


def _on_workers(pool, model, task, args, batch_size: int) -> dict:
    """``circuit_study``'s ``sums`` and ``evaluate`` from the circuits stage's parts on ``pool``'s
    workers, as the report shards it: each worker sums the edge scores over every other batch of
    the task's items, then evaluates every other circuit over all batches. The workers load the task
    from the settings; ``ValueError`` (one line) where they would not load the items the driver holds."""
    from headscope.analyses.circuits.edges.study import CircuitsConfig, circuit_task
    from headscope.reports.stages.circuits import evaluate_on
    from headscope.reports.stages.command_shards import merged, shard_context

    cfg = CircuitsConfig(
        task=args.task,
        n_items=args.n_items or max(1, len(task.items) + task.n_unusable),
        seq_len=args.seq_len,
        method=args.method,
        steps=args.steps,
        budgets=tuple(args.budgets),
        seeds=args.seeds,
        batch_size=batch_size,
        seed=args.seed,
    )
    if circuit_task(model, cfg).items != task.items:
        raise ValueError(f"--ray: the workers would not load the items of --task {args.task}; give --n-items")
    ctx = shard_context(pool, model, seed=args.seed)
    sums = merged(ctx, "circuits", cfg).summary["sums"]
    return {"sums": sums, "evaluate": lambda masks: evaluate_on(pool, ctx, cfg, masks)}


def run(args) -> int:
    from headscope.analyses.circuits.edges.study import circuit_study
    from headscope.analyses.patching.tasks import load_task
    from headscope.analyses.run_json import model_record, write_run_json
    from headscope.probes.outputs.atomic import write_frame
    from headscope.probes.outputs.folder import claim_output
    from headscope.reports import budget as memory
    from headscope.reports.cli.argtypes import load_from_args, ray_pool, resolve_device

    device = resolve_device(args.device)  # checked before anything loads
    if args.mib_budget is not None and args.mib_budget not in args.budgets:
        raise ValueError(
            f"--mib-budget {args.mib_budget:g} is not one of --budgets ({', '.join(map(str, args.budgets))})"
        )
    if args.mib is not None and (args.mib.is_dir() or not args.mib.parent.is_dir()):
        raise FileNotFoundError(f"--mib {args.mib}: expected a file in an existing folder")
    # the memory plan, from the model's config alone: refused in one line when one item cannot fit
    budget, batch_size = memory.circuit_start(args, device, args.n_items or PLANNED_ITEMS)
    with (
        ray_pool(args) as pool,  # --ray: a bad --ray-address or --workers refused here, before the model loads
        claim_output(args.out, "circuit") if args.out else nullcontext() as folder,
    ):
        model = load_from_args(args, device)
        with warnings.catch_warnings():  # unusable items are said below in one line
            warnings.filterwarnings("ignore", message=r"task .* items unusable", category=UserWarning)
            task = load_task(model, args.task, n_items=args.n_items, seed=args.seed, seq_len=args.seq_len)
        for line in _skipped_lines(task):
            print(line, file=sys.stderr)
        shards = _on_workers(pool, model, task, args, batch_size) if pool is not None else {}
        edges, faith, summary = circuit_study(
            model,
            task,
            method=args.method,
            steps=args.steps,
            budgets=args.budgets,
            seeds=args.seeds,
            batch_size=batch_size,
            **shards,
        )
        used = memory.finish(budget)
        if args.mib is not None:
            summary["mib"] = _write_mib(args.mib, model, edges, faith, args.mib_budget)
        summary = {"model": model.spec.name, "backend": model.backend, **summary, "batch_size": batch_size}
        if folder is not None:
            with folder.staging() as tmp:
                write_frame(edges, tmp / "edges")
                write_frame(faith, tmp / "faithfulness")
                write_run_json(tmp, "circuit", model_record(model), **summary, memory=used)
    print(json.dumps(summary, indent=2, sort_keys=True, default=str) if args.json else render_summary(summary))
    return 0
