"""The edge-circuit paths: EAP-IG's edge scores priced against the forward and backward passes it
is made of, on the patching paths' induction batch (:data:`~.patching_paths.PATCHING`).

:func:`eap_ig` scores every edge of the model's graph (:func:`~headscope.analyses.circuits.edges.attribution.edge_scores`,
EAP-IG inputs variant, :data:`STEPS` steps): two plain graph forwards (clean and corrupted) and
``STEPS`` forward + backward passes, each backward reaching every receiver input.
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

    note = patch._note(bench, task) + f"; {STEPS} steps; gflop: 2 forwards + {STEPS} fwd+bwd"
    return Prepared(one_pass, one_pass, patch._gflop(bench, task, 2 + 2 * STEPS), note)


def eap_ig_forward_backward(bench: BenchState) -> Prepared:
    model, task = _task(bench)
    ids = next(task.batches(len(task.items)))[0]  # the clean inputs, where EAP-IG's runs start

    def one_pass():
        for _ in range(STEPS + 1):
            patch.forward_backward(model, ids)

    note = patch._note(bench, task) + f"; {STEPS + 1} x (forward + backward); gflop counted 2x forward each"
    return Prepared(one_pass, one_pass, patch._gflop(bench, task, 2 * (STEPS + 1)), note)
