"""Compile a RASP program with tracr and export what headscope needs, with no jax left in it.

:func:`compile_export` runs the steps of tracr's ``compile_rasp_to_model`` one by one (the same
calls, the same arguments), so the compiler's graph stays at hand: each attention head of the
assembled model is matched (by identity) to the graph node whose craft block it is, and so to
the RASP ``Select`` it implements. The export is a plain dict (torch tensors, Python values):

* ``weights``: the assembled Haiku parameters (token and position embeddings, per layer
  ``query``/``key``/``value``/``linear`` ``[d_model, head·key_size]`` and the MLP's
  ``linear_1``/``linear_2``), as float32 tensors; every bias of tracr's assembly is zero (checked);
* ``residual_labels``, ``input_map`` (token -> id, BOS and PAD included), ``output_values``
  (the categorical output space in unembedding order; None for a numerical output) and
  ``output_dims`` (the residual dimensions the unembedding reads);
* ``heads``: per compiled head its layer, slot, the Select's key and query s-ops, the predicate's
  name, the relation it computes over the value sets (``relation_of``), whether BOS is always
  attended (SelectorWidth), the node's label and whether the output depends on it;
  ``mlps``: per MLP node its layer, label and the same dependence;
* ``references``: tracr's own ``apply`` on seeded random inputs (residual after every half-layer,
  the final residual, the unembedded output): what the loader is checked against.

``ModelIncompatibleError`` (one line naming the layer) for assembled weights this loader does
not read: a layer norm, an activation other than ReLU, a non-zero bias, a parameter it does not know.
"""

from __future__ import annotations

import logging
import random
import time

import numpy as np
import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.compiled.programs import ProgramSetting, build_program
from headscope.probes.models.compiled.relations import relation_of

log = logging.getLogger(__name__)

#: tracr's names of the BOS and PAD tokens it adds (``compiling.COMPILER_BOS``/``COMPILER_PAD``)
BOS, PAD = "BOS", "PAD"
#: random inputs per compiled model whose tracr outputs are kept as the reference
N_REFERENCES = 6


def require_tracr():
    """Import tracr (and jax); ``ModelIncompatibleError`` naming the extra when it is absent."""
    try:
        import tracr.compiler.compiling  # noqa: F401
    except ImportError as e:
        raise ModelIncompatibleError(
            f"compiled models need tracr and jax ({e.name} is not installed): pip install 'headscope[tracr]'"
        ) from None


def _compile(setting: ProgramSetting):
    """tracr's ``compile_rasp_to_model``, step by step: ``(assembled model, graph, sink, craft model)``."""
    from tracr.compiler import (
        basis_inference,
        craft_graph_to_model,
        craft_model_to_transformer,
        expr_to_craft_graph,
        rasp_to_graph,
        validating,
    )
    from tracr.craft import bases
    from tracr.rasp import rasp

    program = build_program(setting)
    unsupported = validating.static_validate(program)
    if unsupported:
        raise ValueError(f"{setting.label}: tracr cannot compile {unsupported[0].expr.name}: {unsupported[0].reason}")
    extracted = rasp_to_graph.extract_rasp_graph(program)
    graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
    basis_inference.infer_bases(graph, sink, set(setting.vocab), setting.max_seq_len)
    expr_to_craft_graph.add_craft_components_to_rasp_graph(
        graph, bos_dir=bases.BasisDirection(rasp.tokens.label, BOS), mlp_exactness=100
    )
    craft_model = craft_graph_to_model.craft_graph_to_model(graph, sources)
    assembled = craft_model_to_transformer.craft_model_to_transformer(
        craft_model=craft_model,
        graph=graph,
        sink=sink,
        max_seq_len=setting.max_seq_len,
        causal=setting.causal,
        compiler_bos=BOS,
        compiler_pad=PAD,
    )
    return assembled, graph, sink, craft_model


def _block_heads(block) -> list:
    """The attention heads of a node's craft block (a SelectorWidth block: its attention half)."""
    from tracr.craft import transformers

    if isinstance(block, transformers.SeriesWithResiduals):
        block = block.blocks[0]
    if isinstance(block, (transformers.AttentionHead, transformers.MultiAttentionHead)):
        return list(block.as_multi().heads())
    return []


def _graph_truth(graph, sink, craft_model) -> tuple[list[dict], list[dict]]:
    """``(heads, mlps)`` of the assembled model, read off the compiler's graph (module docstring)."""
    import networkx as nx
    from tracr.compiler import assemble, nodes
    from tracr.craft import transformers
    from tracr.rasp import rasp

    _, module_names = assemble._get_model_config_and_module_names(craft_model)
    node_of = {}
    for node_id, node in graph.nodes.items():
        for head in _block_heads(node.get(nodes.MODEL_BLOCK)):
            node_of[id(head)] = node_id
    sink_id = sink[nodes.ID]
    heads, mlps = [], []
    for block, name in zip(craft_model.blocks, module_names):
        layer = int(name.split("_")[1].split("/")[0])
        if isinstance(block, transformers.MLP):
            continue
        for slot, head in enumerate(block.as_multi().heads()):
            node_id = node_of[id(head)]
            expr = graph.nodes[node_id][nodes.EXPR]
            select = expr.selector
            if not isinstance(select, rasp.Select):
                raise ModelIncompatibleError(
                    f"layer {layer} head {slot}: a {type(select).__name__} selector is not read"
                )
            keys, queries = graph.nodes[select.keys.label], graph.nodes[select.queries.label]
            pred = select.predicate
            relation = relation_of(pred, sorted_values(keys[nodes.VALUE_SET]), sorted_values(queries[nodes.VALUE_SET]))
            heads.append(
                {
                    "layer": layer,
                    "slot": slot,
                    "node": expr.label,
                    "kind": type(expr).__name__,
                    "keys": select.keys.label,
                    "queries": select.queries.label,
                    "predicate": pred.name if isinstance(pred, rasp.Comparison) else "custom",
                    "relation": relation,
                    "always_bos": isinstance(expr, rasp.SelectorWidth),
                    "used": node_id == sink_id or nx.has_path(graph, node_id, sink_id),
                }
            )
    for node_id, node in graph.nodes.items():
        block = node.get(nodes.MODEL_BLOCK)
        if isinstance(block, transformers.MLP) or (
            isinstance(block, transformers.SeriesWithResiduals) and isinstance(block.blocks[-1], transformers.MLP)
        ):
            mlps.append(
                {"node": node[nodes.EXPR].label, "used": node_id == sink_id or nx.has_path(graph, node_id, sink_id)}
            )
    return heads, mlps


def sorted_values(values) -> list:
    """A value set in a stable order (mixed types by their text)."""
    return sorted(values, key=lambda v: (type(v).__name__, str(v)))


def _weights(assembled) -> dict[str, torch.Tensor]:
    """The assembled parameters as float32 tensors, checked (module docstring)."""
    cfg = assembled.model_config
    if cfg.layer_norm:
        raise ModelIncompatibleError("tracr model with layer norm: the loader reads norm-free models only")
    import jax

    if cfg.activation_function is not jax.nn.relu:
        raise ModelIncompatibleError(f"tracr MLP activation {cfg.activation_function!r}: the loader reads ReLU only")
    out = {}
    for module, params in assembled.params.items():
        for key, value in params.items():
            arr = np.asarray(value, dtype=np.float32)
            if key == "b":
                if np.any(arr != 0):
                    raise ModelIncompatibleError(f"{module}: a non-zero bias; the loader reads bias-free layers only")
                continue
            if key not in ("w", "embeddings"):
                raise ModelIncompatibleError(f"{module}: parameter {key!r} is not one the loader reads")
            out[module] = _tensor(arr)
    return out


def _references(assembled, setting: ProgramSetting, seed: int) -> list[dict]:
    """tracr's forward (its ``apply``, jitted) on :data:`N_REFERENCES` seeded random inputs, the
    first of the longest length (module docstring)."""
    import jax
    import jax.numpy as jnp

    forward = jax.jit(assembled.forward)
    rng = random.Random(seed)
    out = []
    for i in range(N_REFERENCES):
        length = setting.max_seq_len if i == 0 else rng.randint(1, setting.max_seq_len)
        tokens = setting.sample(rng, length)
        res = forward(assembled.params, jnp.array([assembled.input_encoder.encode([BOS, *tokens])]))
        body = res.transformer_output
        out.append(
            {
                "tokens": tokens,
                "residuals": _tensor(np.stack([np.asarray(r[0]) for r in body.residuals])),
                "final": _tensor(body.output[0]),
                "unembedded": _tensor(res.unembedded_output[0]),
            }
        )
    return out


def _tensor(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float32))


def compile_export(setting: ProgramSetting, *, seed: int = 0) -> dict:
    """Compile ``setting`` and export it (module docstring). Needs the ``tracr`` extra."""
    require_tracr()
    t0 = time.perf_counter()
    assembled, graph, sink, craft_model = _compile(setting)
    seconds = time.perf_counter() - t0
    heads, mlps = _graph_truth(graph, sink, craft_model)
    labels = list(assembled.residual_labels)
    enc = assembled.input_encoder
    categorical = hasattr(assembled.output_encoder, "encoding_map")
    from tracr.compiler import nodes

    out_basis = list(sink[nodes.OUTPUT_BASIS])
    cfg = assembled.model_config
    export = {
        "setting": {
            "program": setting.program,
            "vocab": list(setting.vocab),
            "max_seq_len": setting.max_seq_len,
            "causal": setting.causal,
            "unique": setting.unique,
        },
        "config": {"n_layers": cfg.num_layers, "n_heads": cfg.num_heads, "key_size": cfg.key_size},
        "weights": _weights(assembled),
        "residual_labels": labels,
        "input_map": dict(enc.encoding_map),
        "output_values": [d.value for d in out_basis] if categorical else None,
        "output_dims": [labels.index(str(d)) for d in out_basis],
        "heads": heads,
        "mlps": mlps,
        "compile_seconds": seconds,
    }
    t0 = time.perf_counter()
    export["references"] = _references(assembled, setting, seed)
    log.info("compiled %s in %.1f s (references %.1f s)", setting.label, seconds, time.perf_counter() - t0)
    return export
