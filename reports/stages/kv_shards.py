"""The KV-cache stage on Ray workers (``--ray``): the study's logic in the driver, its measurements
on the workers, cut by KV groups.

The study (:func:`~headscope.analyses.kvcache.study.kv_study`) measures configurations of KV
groups whose cache is restricted to sink + window: each group alone (the single-group damage), then
per greedy step every candidate's configuration, then each order's checkpoints. A configuration's
measurement is one forward per input from the unrestricted run's residual stream at its first
restricted layer, and does not depend on what else is measured. Each worker builds the study's
inputs and runs the unrestricted pass once; the driver sends each round's configurations (all
groups alone; a greedy step's candidates; an order's checkpoints) in contiguous runs, one per
worker, and takes the results back in order. The greedy choice, the bytes and the frame run in the
driver, as one process runs them: ``kv_study`` and ``kv_roles`` ``DataFrame.equals`` the
single-process run. The long-context roles and their causal check (one unit) run on the first
worker during the first pass, while the others run their unrestricted pass.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KVRequest", "ShardedEvaluator", "serve_kv"]

#: a worker's evaluator, built once per model and settings (its inputs and the unrestricted pass)
_BUILT: dict = {}


@dataclass(frozen=True)
class KVRequest:
    """Configurations (``{(layer, kv_group): (sink, window)}`` each) for one worker to measure."""

    configs: tuple

    def __repr__(self) -> str:
        return f"{len(self.configs)} configurations"


def worker_evaluator(model, kcfg, logit_rows):
    """The study's :class:`~headscope.analyses.kvcache.quality.Evaluator` on ``model``, its
    unrestricted pass run (built once per worker and settings)."""
    from headscope.analyses.kvcache.quality import Evaluator
    from headscope.analyses.kvcache.stage import kv_inputs

    key = (id(model), kcfg, logit_rows)
    if key not in _BUILT:
        _BUILT.clear()
        ev = Evaluator(model, kv_inputs(model, kcfg), logit_rows=logit_rows)
        full = ev({})
        _BUILT[key] = (ev, full, ev.runs, ev.layers_run)
    return _BUILT[key]


def serve_kv(model, kcfg, logit_rows, configs) -> dict:
    """On a worker: ``results`` of each configuration of ``configs`` (in order), the unrestricted
    ``full`` result, and the forwards and layers the configurations ran (``runs``, ``layers``) and
    the unrestricted pass ran (``full_runs``, ``full_layers``)."""
    ev, full, full_runs, full_layers = worker_evaluator(model, kcfg, logit_rows)
    runs, layers = ev.runs, ev.layers_run
    results = [ev(w) for w in configs]
    return {
        "results": results,
        "full": full,
        "runs": ev.runs - runs,
        "layers": ev.layers_run - layers,
        "full_runs": full_runs,
        "full_layers": full_layers,
    }


class ShardedEvaluator:
    """The study's evaluator in the driver: ``evaluate(windows)`` and ``evaluate.many(list)``, the
    configurations cut in contiguous runs over ``n`` workers through ``call(requests) -> replies``;
    ``runs`` / ``layers_run`` count the forwards and layers as one process's evaluator does (the
    unrestricted pass once). ``first``: the first pass's reply (the unrestricted result)."""

    def __init__(self, call, n: int, first: dict):
        self._call, self._n, self._first = call, n, first
        self.runs, self.layers_run = 0, 0
        self._full_counted = False

    def __call__(self, windows: dict) -> dict:
        return self.many([windows])[0]

    def many(self, configs: list) -> list[dict]:
        from headscope.reports.stages.sharded import contiguous

        out: list = [None] * len(configs)
        todo = []
        for i, w in enumerate(configs):
            if w:
                todo.append(i)
            else:  # the unrestricted run: the first pass's, counted once as one process counts it
                out[i] = dict(self._first["full"])
                if not self._full_counted:
                    self.runs += self._first["full_runs"]
                    self.layers_run += self._first["full_layers"]
                    self._full_counted = True
        if todo:
            cuts = contiguous(len(todo), self._n)
            replies = self._call([KVRequest(tuple(configs[todo[j]] for j in cut)) for cut in cuts])
            for cut, rep in zip(cuts, replies):
                for j, res in zip(cut, rep["results"]):
                    out[todo[j]] = res
                self.runs += rep["runs"]
                self.layers_run += rep["layers"]
        return out
