"""The edge-circuit paths: EAP-IG's edge scores priced against the forward and backward passes it
is made of, on the patching paths' induction batch (:data:`~.patching_paths.PATCHING`).

:func:`eap_ig` scores every edge of the model's graph (:func:`~headscope.analyses.circuits.edges.attribution.edge_scores`,
EAP-IG inputs variant, :data:`STEPS` steps): one plain graph forward (clean) and ``STEPS``
forward + backward passes (the first is the corrupted run), each backward reaching every receiver input.
:func:`eap_ig_forward_backward` is its price: ``STEPS + 1`` forward + backward passes of the model's
own forward on the same (clean) batch, the backward reaching every head's output ``z`` (as
attribution patching's). The target (issue #42): EAP-IG at most 1.3 times that.
A model the edge graph refuses (an encoder, another backend, post-norm) skips both
(:class:`~headscope.reports.tools.bench.state.PathSkipped`).
"""

from __future__ import annotations

from headscope.reports.tools.bench import patching_paths as patch
from headscope.reports.tools.bench.state import BenchState, PathSkipped, Prepared

__all__ = ["STEPS", "eap_ig", "eap_ig_forward_backward"]

#: EAP-IG's interpolation steps in the bench (headscope's default)
STEPS = 5


def _task(bench: BenchState):
    """``(model, task)``: the patching paths' induction batch, on a model the edge graph takes."""
    from headscope.probes.errors import ModelIncompatibleError
    from headscope.probes.models.inhouse.edge_forward import check_graph_model

    model, task, _ = patch._task(bench)
    try:
        check_graph_model(model)
    except ModelIncompatibleError as e:
        raise PathSkipped(str(e).splitlines()[0]) from None
    return model, task


def eap_ig(bench: BenchState) -> Prepared:
    from headscope.analyses.circuits.edges.attribution import EdgeConfig, edge_scores

    model, task = _task(bench)
    cfg = EdgeConfig(method="eap-ig", steps=STEPS, batch_size=len(task.items))

    def one_pass():
        edge_scores(model, task, cfg)

    note = patch._note(bench, task) + f"; {STEPS} steps; gflop: 1 forward + {STEPS} fwd+bwd"
    return Prepared(one_pass, one_pass, patch._gflop(bench, task, 1 + 2 * STEPS), note)


def eap_ig_forward_backward(bench: BenchState) -> Prepared:
    model, task = _task(bench)
    ids = next(task.batches(len(task.items)))[0]  # the clean inputs, where EAP-IG's runs start

    def one_pass():
        for _ in range(STEPS + 1):
            patch.forward_backward(model, ids)

    note = patch._note(bench, task) + f"; {STEPS + 1} x (forward + backward); gflop counted 2x forward each"
    return Prepared(one_pass, one_pass, patch._gflop(bench, task, 2 * (STEPS + 1)), note)


#: the two paths of the price
PATHS = ("eap_ig", "eap_ig_forward_backward")
#: the bench target row both paths feed (:mod:`~headscope.reports.tools.bench.targets`)
TARGET = f"EAP-IG({STEPS}) / {STEPS + 1} x (forward+backward) <= 1.3"


def ratio_runs_doc(benches: list[dict]) -> dict:
    """The committed figure of EAP-IG's price (``data/figures/bench_smollm2_eap_ig.json``) from the
    JSON of one or more ``headscope bench smollm2-135m --paths eap_ig eap_ig_forward_backward
    --json`` runs: per run, the target's ratio (median of paired rounds), the ratio of fastest
    rounds, both paths' fastest seconds, threads and load average. ``RuntimeError`` when a run
    lacks either path or the target row.

    >>> run = {"paths": [{"path": "eap_ig", "status": "ok", "seconds": 5.0, "median_seconds": 5.2},
    ...     {"path": "eap_ig_forward_backward", "status": "ok", "seconds": 4.5, "median_seconds": 4.6}],
    ...     "targets": [{"target": TARGET, "value": 1.13, "threshold": 1.3, "met": True}],
    ...     "info": {"model": "smollm2-135m", "machine": {"load_average": [4.0, 5.0, 6.0], "threads": 1}}}
    >>> doc = ratio_runs_doc([run])
    >>> doc["runs"][0]["ratio"], doc["runs"][0]["fastest_ratio"], doc["target"]
    (1.13, 1.1111, 1.3)
    """
    runs = []
    for bench in benches:
        rows = {p["path"]: p for p in bench["paths"]}
        target = next((t for t in bench["targets"] if t["target"] == TARGET), None)
        if target is None or any(rows.get(p, {}).get("status") != "ok" for p in PATHS):
            raise RuntimeError(f"a bench run lacks the paths {PATHS} or the target {TARGET!r}")
        eap, fb = rows["eap_ig"], rows["eap_ig_forward_backward"]
        machine = bench["info"]["machine"]
        runs.append(
            {
                "ratio": target["value"],
                "met": target["met"],
                "fastest_ratio": round(eap["seconds"] / fb["seconds"], 4),
                "eap_ig_seconds": eap["seconds"],
                "forward_backward_seconds": fb["seconds"],
                "threads": machine["threads"],
                "load_average": machine["load_average"],
            }
        )
    return {
        "model": benches[0]["info"]["model"],
        "generated_by": "make circuit-bench (headscope bench smollm2-135m --paths eap_ig eap_ig_forward_backward "
        "--json, twice; python -m headscope.reports.tools.bench.circuit_paths --record FILE B1 B2)",
        "target_row": TARGET,
        "target": 1.3,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m headscope.reports.tools.bench.circuit_paths --record FILE B1 [B2 ...]``: record the
    bench runs' EAP-IG price (:func:`ratio_runs_doc`) into FILE."""
    import argparse
    import json
    import sys
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m headscope.reports.tools.bench.circuit_paths", description=main.__doc__)
    p.add_argument("benches", nargs="+", type=Path, help="`headscope bench --json` outputs")
    p.add_argument("--record", type=Path, required=True, help="data/figures/bench_smollm2_eap_ig.json")
    args = p.parse_args(argv)
    try:
        doc = ratio_runs_doc([json.loads(b.read_text(encoding="utf-8")) for b in args.benches])
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        print(f"headscope: error: {e}", file=sys.stderr)
        return 2
    args.record.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
