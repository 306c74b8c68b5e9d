"""Edge scores and a circuit in the JSON format of MIB's circuit-localisation track.

The format is the one ``Graph.to_json`` / ``Graph.from_json`` of hannamw/EAP-IG write and read
(commit 795f5607b256) and MIB's ``MIB_circuit_track/circuit_loading.py`` loads
(hannamw/MIB-circuit-track at commit b759df34433c; its example ``circuits/ioi-eap-ig.json``)::

    {"cfg": {"n_layers": L, "n_heads": H, "parallel_attn_mlp": false, "d_model": D},
     "nodes": {"input": {"in_graph": true}, "a0.h0": {"in_graph": false}, "m0": {...}, ..., "logits": {...}},
     "edges": {"input->a0.h0<q>": {"score": -0.01, "in_graph": false}, "a0.h0->m0": {...},
               "m0->logits": {...}, ...}}

Nodes: ``input``, ``a{layer}.h{head}`` (each query head), ``m{layer}``, ``logits``. Edges:
``{sender}->{receiver}``, with ``<q>``, ``<k>`` or ``<v>`` after an attention receiver. Every
sender upstream of a receiver has an edge to it (a layer's MLP reads its own heads), so a graph of
``L`` layers and ``H`` heads has ``Σ_l [3H (1 + l(H+1)) + 1 + l(H+1) + H] + 1 + L(H+1)`` edges.
MIB's evaluation takes the top edges by ``|score|`` at each budget; ``in_graph`` marks one circuit
(here the one the caller passes, e.g. a budget's pruned circuit).

**GQA/MQA.** MIB's graph gives every query head its own k and v inputs; headscope scores a KV head's
k and v once (:mod:`.graph`). By the chain rule the reference's per-copy scores sum to headscope's
KV score, but how they split is not known from it: each query head of the group gets the KV head's
score divided by the group's size (sums are kept) and the KV edge's ``in_graph``. On multi-head
attention (one KV head per query head) the export is exact.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from headscope.analyses.circuits.edges.graph import EdgeGraph

#: where the format was read: the repositories and commits followed
MIB_FORMAT_SOURCE = {
    "writer": "github.com/hannamw/EAP-IG src/eap/graph.py Graph.to_json, commit 795f5607b256",
    "reader": "github.com/hannamw/MIB-circuit-track MIB_circuit_track/circuit_loading.py, commit b759df34433c",
}

NODE_NAME = re.compile(r"input|logits|a(\d+)\.h(\d+)|m(\d+)")
EDGE_NAME = re.compile(r"(input|a\d+\.h\d+|m\d+)->(logits|m\d+|a\d+\.h\d+<[qkv]>)")


def _mib_node(name: str) -> str:
    """headscope's sender or receiver name -> MIB's (``L3H2`` -> ``a3.h2``, ``MLP3`` -> ``m3``)."""
    if name in ("input", "logits"):
        return name
    if m := re.fullmatch(r"L(\d+)H(\d+)", name):
        return f"a{m[1]}.h{m[2]}"
    if m := re.fullmatch(r"MLP(\d+)", name):
        return f"m{m[1]}"
    raise ValueError(f"no MIB node for {name!r}")


def mib_edges(graph: EdgeGraph, scores: torch.Tensor, circuit: torch.Tensor) -> dict[str, dict]:
    """Every edge of MIB's graph of ``graph``'s model -> ``{"score", "in_graph"}`` (module docstring;
    ``scores`` and ``circuit`` ``[sender, receiver]``)."""
    lay = graph.layout
    group = lay.n_heads // lay.n_kv_heads
    out: dict[str, dict] = {}
    s_idx, r_idx = graph.valid.nonzero(as_tuple=True)
    for s, r in zip(s_idx.tolist(), r_idx.tolist()):
        sender = _mib_node(graph.senders[s])
        name, via = graph.receivers[r]
        score, kept = float(scores[s, r]), bool(circuit[s, r])
        if via in ("q",):
            out[f"{sender}->{_mib_node(name)}<q>"] = {"score": score, "in_graph": kept}
        elif via in ("k", "v"):
            layer, g = (int(x) for x in re.fullmatch(r"L(\d+)KV(\d+)", name).groups())
            for h in range(g * group, (g + 1) * group):
                out[f"{sender}->a{layer}.h{h}<{via}>"] = {"score": score / group, "in_graph": kept}
        else:
            out[f"{sender}->{_mib_node(name)}"] = {"score": score, "in_graph": kept}
    return out


def mib_json(graph: EdgeGraph, scores: torch.Tensor, circuit: torch.Tensor, *, d_model: int) -> dict:
    """The MIB JSON document (module docstring): ``cfg``, ``nodes`` (``in_graph``: the input always,
    as the reference's circuits have it; another node when it sends or receives a kept edge) and
    :func:`mib_edges`."""
    lay = graph.layout
    edges = mib_edges(graph, scores, circuit)
    used = {"input"}
    for name, e in edges.items():
        if e["in_graph"]:
            src, dst = name.split("->")
            used.update((src, dst.split("<")[0]))
    names = ["input"]
    for l in range(lay.n_layers):
        names += [f"a{l}.h{h}" for h in range(lay.n_heads)] + [f"m{l}"]
    names.append("logits")
    return {
        "cfg": {"n_layers": lay.n_layers, "n_heads": lay.n_heads, "parallel_attn_mlp": False, "d_model": int(d_model)},
        "nodes": {n: {"in_graph": n in used} for n in names},
        "edges": edges,
    }


def write_mib(path: str | Path, doc: dict) -> None:
    """Write ``doc`` (:func:`mib_json`) as JSON, whole or not at all."""
    from headscope.probes.outputs.atomic import atomic_write

    with atomic_write(Path(path)) as f:
        json.dump(doc, f)


def mib_edge_count(n_layers: int, n_heads: int) -> int:
    """Edges of MIB's graph of ``n_layers`` layers of ``n_heads`` heads (attention and MLP in sequence).

    >>> mib_edge_count(12, 12)  # GPT-2 small, as MIB counts it
    32491
    """
    total = 1 + n_layers * (n_heads + 1)  # into the logits
    for l in range(n_layers):
        before = 1 + l * (n_heads + 1)
        total += 3 * n_heads * before + before + n_heads
    return total


def read_mib(doc: dict) -> tuple[dict, dict[str, bool], dict[str, tuple[float, bool]]]:
    """``(cfg, nodes, edges)`` of a MIB JSON document, checked against the format: the keys,
    every node and edge name by the grammar (:data:`NODE_NAME`, :data:`EDGE_NAME`), each edge's
    nodes present, q/k/v only into attention nodes, a sender upstream of its receiver, and the
    number of edges :func:`mib_edge_count` gives. Raises ``ValueError`` naming what is wrong."""
    missing = {"cfg", "nodes", "edges"} - set(doc)
    if missing:
        raise ValueError(f"a MIB circuit has keys cfg, nodes and edges; missing {sorted(missing)}")
    cfg = doc["cfg"]
    n_layers, n_heads = int(cfg["n_layers"]), int(cfg["n_heads"])
    if cfg.get("parallel_attn_mlp"):
        raise ValueError("this reader covers parallel_attn_mlp false only")

    def order(node: str) -> float:  # position in the forward pass
        if node == "input":
            return -1
        if node == "logits":
            return n_layers
        m = NODE_NAME.fullmatch(node)
        if m[1] is not None:
            return int(m[1]) + 0.25
        return int(m[3]) + 0.5

    nodes = {}
    for name, info in doc["nodes"].items():
        m = NODE_NAME.fullmatch(name)
        if m is None or (m[1] is not None and (int(m[1]) >= n_layers or int(m[2]) >= n_heads)):
            raise ValueError(f"node {name!r} is not a node of {n_layers} layers x {n_heads} heads")
        nodes[name] = bool(info["in_graph"])
    edges = {}
    for name, info in doc["edges"].items():
        m = EDGE_NAME.fullmatch(name)
        if m is None:
            raise ValueError(f"edge {name!r} does not read sender->receiver[<q|k|v>]")
        src, dst = m[1], m[2].split("<")[0]
        if src not in nodes or dst not in nodes:
            raise ValueError(f"edge {name!r} names a node the document does not list")
        if not order(src) < order(dst):
            raise ValueError(f"edge {name!r}: its sender is not upstream of its receiver")
        edges[name] = (float(info["score"]), bool(info["in_graph"]))
    want = mib_edge_count(n_layers, n_heads)
    if len(edges) != want:
        raise ValueError(f"a MIB graph of {n_layers} layers x {n_heads} heads has {want} edges; got {len(edges)}")
    return cfg, nodes, edges


def mib_from_edges(edges, graph: EdgeGraph, *, d_model: int, budget: float) -> dict:
    """:func:`mib_json` of a study's edges frame (``sender``, ``receiver``, ``via``, ``score``,
    ``kept_at``): ``in_graph`` marks the pruned circuit at ``budget`` (``kept_at <= budget``)."""
    scores = torch.zeros(graph.valid.shape, dtype=torch.float64)
    circuit = torch.zeros(graph.valid.shape, dtype=torch.bool)
    for e in edges.itertuples():
        s, r = graph.edge_index(str(e.sender), str(e.receiver), str(e.via))
        scores[s, r] = float(e.score)
        circuit[s, r] = bool(e.kept_at <= budget)
    return mib_json(graph, scores, circuit, d_model=d_model)
