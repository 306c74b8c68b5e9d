"""Edge attribution scores: EAP (Syed et al. 2023) and EAP-IG's inputs variant (Hanna et al. 2024).

For an edge ``s -> r`` (sender ``s``, receiver input ``r``; :mod:`.graph`) and one item:

* **EAP**: ``score = Σ_{pos, d_model} (a_s(corrupted) - a_s(clean)) · ∂m/∂x_r`` at the clean run,
  the first-order estimate of ``m(clean with only that edge corrupted) - m(clean)``
  (:func:`~headscope.analyses.circuits.edges.evaluate.edge_effects` computes it exactly);
* **EAP-IG** (inputs variant): the same difference times the gradient averaged over ``steps``
  runs whose input embeddings are ``e(corrupted) + α (e(clean) - e(corrupted))`` with ``α = k /
  steps`` for ``k = 0 … steps - 1`` (exactly the reference repository's ``get_scores_eap_ig``,
  github.com/hannamw/EAP-IG at commit 795f5607b256; its default is 30 steps, ours
  :data:`DEFAULT_STEPS`). MIB calls this variant "EAP-IG-inputs";
* **EAP-IG-activations** (``"eap-ig-activations"``, MIB's name): the gradient averaged over runs in
  which one node of the reference's list (the input, a layer's attention as a whole, an MLP) has its
  output interpolated, ``α = k / steps`` for ``k = 1 … steps``, as ``get_scores_ig_activations``
  does: ``(2 · layers + 1) · steps`` forward and backward passes.

Scores are means over items (the reference sums over items and divides by their number).
Sign: negative when corrupting the edge lowers the task's metric (the metric is higher on the
clean input: ``logprob``/``logit_diff`` of the clean answer). Circuits rank edges by ``|score|``
(MIB's default). One gradient per receiver input per run: a backward gives ``∂m/∂x_r`` for every
receiver at once (:func:`~headscope.probes.models.inhouse.edge_forward.graph_forward`'s probes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headscope.analyses.circuits.edges.graph import EdgeGraph
from headscope.analyses.patching.items import Task
from headscope.analyses.patching.tasks import check_decoder, metric_fn
from headscope.probes.models.inhouse.edge_forward import EdgeLayout, check_graph_model, graph_forward

METHODS = ("eap", "eap-ig", "eap-ig-activations")
#: EAP-IG's default number of interpolation steps (the reference repository uses 30; MIB's runs 5 to 30)
DEFAULT_STEPS = 5


@dataclass(frozen=True, kw_only=True)
class EdgeConfig:
    """Options of an edge attribution run: ``method`` (:data:`METHODS`), ``steps`` (EAP-IG's
    interpolation points), ``batch_size`` (items per forward)."""

    method: str = "eap-ig"
    steps: int = DEFAULT_STEPS
    batch_size: int = 16

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}; got {self.method!r}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1; got {self.steps}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {self.batch_size}")


def model_graph(model) -> EdgeGraph:
    """The :class:`EdgeGraph` of an in-house pre-norm decoder (``ModelIncompatibleError`` otherwise)."""
    cfg = check_graph_model(model).cfg
    return EdgeGraph.of(EdgeLayout(n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads))


def receiver_gradients(net, ids, metric, answer, wrong, embed=None, **patch) -> torch.Tensor:
    """``∂(Σ_items m)/∂x_r`` for every receiver ``[receiver, batch, pos, d_model]`` (items are
    independent rows: each item's own gradient), optionally with replaced input ``embed`` or
    patched edges (``corrupted=``, ``keep=`` of :func:`graph_forward`)."""
    with torch.enable_grad():
        logits, _, probes = graph_forward(net, ids, embed=embed, grad_probes=True, **patch)
        grads = torch.autograd.grad(metric(logits, answer, wrong).sum(), probes)
    return torch.cat(grads).detach()


def _batch_scores(net, clean, corrupted, answer, wrong, metric, cfg: EdgeConfig) -> torch.Tensor:
    """Σ over the batch's items of the edge scores ``[sender, receiver]`` (arbitrary off the graph's edges)."""
    with torch.no_grad():
        _, outs_c, _ = graph_forward(net, clean)
    if cfg.method == "eap-ig":
        grad, outs_x = _ig_gradients(net, clean, corrupted, metric, answer, wrong, cfg.steps)
    else:
        with torch.no_grad():
            _, outs_x, _ = graph_forward(net, corrupted)
        if cfg.method == "eap":
            grad = receiver_gradients(net, clean, metric, answer, wrong)
        else:
            grad = _activation_gradients(net, clean, outs_c, outs_x, metric, answer, wrong, cfg.steps)
    return _upstream_products(outs_x.sub_(outs_c), grad, net.cfg)  # outs_x is this batch's own: the difference in place


def _ig_gradients(net, clean, corrupted, metric, answer, wrong, steps: int):
    """``(mean gradient [receiver, batch, pos, d_model], outs_x)`` of EAP-IG's inputs variant: run
    ``k`` reads the input embeddings ``e_x + (k / steps)(e_c - e_x)``; run 0 is the corrupted run
    itself, which also gives the corrupted sender outputs ``outs_x``. The other runs keep no
    sender output (``senders=False``); each run's gradients are added in place."""
    with torch.no_grad():
        e_c, e_x = net.embed_tokens(clean)[0], net.embed_tokens(corrupted)[0]
    total = outs_x = None
    for k in range(steps):
        with torch.enable_grad():
            if k == 0:
                logits, outs_x, probes = graph_forward(net, corrupted, grad_probes=True)
            else:
                embed = e_x + (k / steps) * (e_c - e_x)
                logits, _, probes = graph_forward(net, clean, embed=embed, grad_probes=True, senders=False)
            grads = torch.autograd.grad(metric(logits, answer, wrong).sum(), probes)
        if total is None:
            total = torch.cat(grads)
        else:
            start = 0
            for g in grads:  # [receivers of a group, batch, pos, d_model]
                total[start : start + len(g)] += g
                start += len(g)
        # dropped now, not at the next step's rebinding: else the next backward runs beside a third receiver set
        del grads, probes, logits
    return total.div_(steps), outs_x.detach()  # in place: no second [receiver, ...] copy (the same floats)


def _upstream_products(diff: torch.Tensor, grad: torch.Tensor, cfg) -> torch.Tensor:
    """``Σ_{batch, pos, d_model} diff[s] · grad[r]`` as ``[sender, receiver]`` float32, computed
    for the senders upstream of each receiver only (one product per layer: layer ``l``'s
    attention receivers and the MLP receiver below them read the senders below layer ``l``);
    the other entries are 0 or the MLP receiver's own MLP (no edge)."""
    lay = EdgeLayout(n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads)
    d, g = diff.flatten(1).float(), grad.flatten(1).float()  # [sender, item-values], [receiver, item-values]
    out = torch.zeros(lay.n_senders, lay.n_receivers, device=d.device)
    start = 0
    for layer in range(lay.n_layers + 1):
        top = layer < lay.n_layers
        stop = lay.mlp_receiver(layer) if top else lay.n_receivers
        n_up = lay.head_sender(layer, 0) if top else lay.n_senders
        out[:n_up, start:stop] = d[:n_up] @ g[start:stop].T
        start = stop
    return out


def _activation_gradients(net, clean, outs_c, outs_x, metric, answer, wrong, steps: int) -> torch.Tensor:
    """EAP-IG-activations' mean gradient: for each node of the reference (the input, each layer's
    attention as a whole, each MLP) and ``α = k / steps``, ``k = 1 … steps``, every receiver reads
    that node's output as the constant ``α·clean + (1 - α)·corrupted`` (no gradient through the
    node, as the reference's hook replaces it), the rest of the run clean; the gradients of all
    those runs averaged (the reference's ``get_scores_ig_activations``)."""
    cfg = net.cfg
    lay = EdgeLayout(n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads)
    nodes = [[0]]
    for l in range(lay.n_layers):
        nodes += [[lay.head_sender(l, h) for h in range(lay.n_heads)], [lay.mlp_sender(l)]]
    grad, n = torch.zeros(0), 0
    for senders in nodes:
        keep = torch.ones(lay.n_senders, lay.n_receivers, dtype=outs_x.dtype, device=outs_x.device)
        keep[senders] = 0.0  # every receiver reads the node's value from ``fixed``
        for k in range(1, steps + 1):
            fixed = outs_x.clone()
            fixed[senders] = (k / steps) * outs_c[senders] + (1 - k / steps) * outs_x[senders]
            g = receiver_gradients(net, clean, metric, answer, wrong, corrupted=fixed, keep=keep)
            grad, n = (g if n == 0 else grad + g), n + 1
    return grad / n


def batch_sums(model, task: Task, cfg: EdgeConfig = EdgeConfig(), part: tuple[int, int] | None = None) -> dict:
    """``{batch number: Σ over the batch's items of the edge scores [sender, receiver]}`` (float32,
    on the host) of the task's batches (:meth:`~headscope.analyses.patching.items.Task.batches`,
    numbered from 0); ``part`` ``(k, n)``: only every ``n``-th batch from the ``k``-th
    (:func:`~headscope.probes.capture.in_part`), as a sharded run's worker computes it.
    ``ModelIncompatibleError`` off a pre-norm in-house decoder; ``ValueError`` for a task
    without items."""
    from headscope.probes.capture import in_part

    check_decoder(model)
    if not task.items:
        raise ValueError(f"task {task.name!r} has no usable items ({task.n_unusable} unusable)")
    net, metric = check_graph_model(model), metric_fn(task.metric)
    dev = next(net.parameters()).device
    out = {}
    for b, (clean, corrupted, answer, wrong, _) in enumerate(task.batches(cfg.batch_size)):
        if not in_part(part, b):
            continue
        wrong = None if wrong is None else wrong.to(dev)
        out[b] = _batch_scores(net, clean.to(dev), corrupted.to(dev), answer.to(dev), wrong, metric, cfg).cpu()
    return out


def mean_scores(graph: EdgeGraph, sums: dict, n_items: int, n_batches: int | None = None) -> torch.Tensor:
    """The edges' mean scores ``[sender, receiver]`` from :func:`batch_sums` (of one process, or
    the parts' joined): the batches' sums added in batch order from zero, as one process adds
    them (so the same floats), divided by ``n_items``; 0 off the graph's edges. ``n_batches``:
    the task's batches, all of which ``sums`` must hold (``ValueError`` naming the missing ones)."""
    if n_batches is not None and sorted(sums) != list(range(n_batches)):
        missing = sorted(set(range(n_batches)) - set(sums))
        raise ValueError(f"edge scores need every one of the task's {n_batches} batches; batches {missing} are missing")
    total = torch.zeros(graph.valid.shape)
    for b in sorted(sums):
        total += sums[b]
    return torch.where(graph.valid, total / n_items, torch.zeros(()))


def edge_scores(model, task: Task, cfg: EdgeConfig = EdgeConfig()) -> tuple[EdgeGraph, torch.Tensor]:
    """``(graph, scores [sender, receiver])``: each edge's mean score over the task's items
    (module docstring), 0 off the graph's edges. ``ModelIncompatibleError`` off a pre-norm
    in-house decoder; ``ValueError`` for a task without items."""
    graph = model_graph(model)
    return graph, mean_scores(graph, batch_sums(model, task, cfg), len(task.items))
