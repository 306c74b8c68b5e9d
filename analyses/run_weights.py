"""The report's weights stage: circuits read from the weights alone
(:mod:`headscope.analyses.circuits.weights`), then joined with what the same run measured on text
(:mod:`headscope.analyses.circuits.weights.joins`): K-composition into the induction heads against the
previous-token heads of the roles, OV copying against the patching effect on the induction and
duplicate-token tasks, and path patching through K (when the run's patching frame has it)
against K-composition.

The stage reads the per-head matrices of the loaded model
(:func:`~headscope.probes.models.weights_provider.model_weights`: the in-house model's, or an
hf-backend model's where they pass the check against its forward); where there are none,
:func:`weights_blocker` says why (``headscope weights DIR`` reads a checkpoint lazily without
building the model). Its random draws use their own seeded generators: the
other stages' figures do not depend on whether it ran.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class WeightsConfig:
    """``draws``: Gaussian heads per head baseline; ``null``: Gaussian draws per composition
    null; ``k``: the top-k of the joins' rankings; ``seed``: the baselines' draws;
    ``null_block_bytes``: the null's draws per block (the same numbers for any block size; the
    report keeps its peak near the other stages': 1,000 draws of SmolLM2's shapes are 0.3 GB a matrix)."""

    draws: int = 200
    null: int = 1000
    k: int = 5
    seed: int = 0
    null_block_bytes: int = 16 << 20


def weights_blocker(model) -> str | None:
    """Why the weights stage cannot run on ``model`` (no per-head weights: the module path not
    understood, the check against its forward failed, or the backend has none), or None."""
    from headscope.probes.models.weights_provider import weights_refusal

    why = weights_refusal(model)
    return None if why is None else f"no per-head weights on backend {model.backend}: {why}"


def weights_head_rows(model, cfg: WeightsConfig, layers) -> pd.DataFrame:
    """The per-head rows of ``layers`` before the adjustment over all heads
    (:func:`~headscope.analyses.circuits.weights.ov_qk.head_rows`): one shard of a run sharded by layer;
    :func:`run_weights` given the rows of every layer (``heads=``) finishes the run."""
    from headscope.analyses.circuits.weights.ov_qk import head_rows
    from headscope.probes.models.weights_provider import model_weights

    return head_rows(model_weights(model), n_draws=cfg.draws, seed=cfg.seed, layers=layers)


def weights_composition_part(model, cfg: WeightsConfig, receivers, families) -> dict:
    """One shard of the composition scores: the pairs into the receiver layers ``receivers``
    (:func:`~headscope.analyses.circuits.weights.composition.receiver_scores`: ``scores``, ``units``,
    ``senders``) and the nulls of the families ``families`` (indices into
    :data:`~headscope.analyses.circuits.weights.composition.FAMILIES`, ``nulls``: index -> ``[null]``),
    each as :func:`run_weights` computes it; :func:`composition_from_parts` joins the shards."""
    from headscope.analyses.circuits.weights.composition import family_null, receiver_scores
    from headscope.probes.models.weights_provider import model_weights

    weights = model_weights(model)
    scores, units, senders = receiver_scores(weights, receivers)
    nulls = {
        f: family_null(weights.d_model, weights.d_head, f, cfg.null, cfg.seed, cfg.null_block_bytes) for f in families
    }
    return {"scores": scores, "units": units, "senders": senders, "nulls": nulls}


def composition_from_parts(model, parts) -> pd.DataFrame:
    """``weights_composition`` from :func:`weights_composition_part` of disjoint receivers and
    families covering every layer and family: the frame :func:`run_weights` computes itself
    (``ValueError`` naming what no part computed)."""
    from headscope.analyses.circuits.weights.composition import FAMILIES, composition_frame
    from headscope.probes.models.weights_provider import model_weights

    n_layers = model_weights(model).n_layers
    got: dict = {"scores": {}, "units": {}, "senders": {}, "nulls": {}}
    for part in parts:
        for key, table in got.items():
            table.update(part[key])
    missing = sorted(set(range(1, n_layers)) - set(got["units"])), sorted(set(range(len(FAMILIES))) - set(got["nulls"]))
    if missing[0] or missing[1]:
        raise ValueError(f"the composition shards miss receiver layers {missing[0]} and null families {missing[1]}")
    nulls = [got["nulls"][f] for f in range(len(FAMILIES))]
    return composition_frame(got["scores"], got["units"], got["senders"], n_layers, nulls)


def run_weights(
    model,
    frames: dict[str, pd.DataFrame],
    cfg: WeightsConfig = WeightsConfig(),
    *,
    heads: pd.DataFrame | None = None,
    composition: pd.DataFrame | None = None,
):
    """``(frames, summary)``: ``weights_heads`` (:data:`~headscope.analyses.circuits.weights.frames.HEAD_COLUMNS`),
    ``weights_composition`` (:data:`~headscope.analyses.circuits.weights.frames.COMPOSITION_COLUMNS`) and the
    joins ``join_k_composition``, ``join_copying`` and, where ``frames["patching"]`` holds path
    patching through K, ``join_path``; ``summary``: the weights' reading (folding, unembedding,
    method), the seconds of each part and the settings. ``heads``: the per-head rows of every layer
    computed elsewhere (:func:`weights_head_rows` on shards, concatenated in layer order): only their
    adjustment over all heads runs here, with the same result as computing them here.
    ``composition``: ``weights_composition`` computed elsewhere (:func:`composition_from_parts`)."""
    from headscope.analyses.circuits.weights.composition import composition_scores
    from headscope.analyses.circuits.weights.joins import (
        copying_patching_join,
        k_composition_join,
        path_composition_join,
    )
    from headscope.analyses.circuits.weights.ov_qk import head_circuits, head_verdicts
    from headscope.probes.models.weights_provider import model_weights

    weights = model_weights(model)
    t0 = time.perf_counter()
    if heads is None:
        heads = head_circuits(weights, n_draws=cfg.draws, seed=cfg.seed)
    else:
        heads = head_verdicts(weights, heads)
    t1 = time.perf_counter()
    comp = composition
    if comp is None:
        comp = composition_scores(weights, n_null=cfg.null, seed=cfg.seed, null_block_bytes=cfg.null_block_bytes)
    t2 = time.perf_counter()
    roles, patching = frames.get("roles"), frames.get("patching")
    out = {
        "weights_heads": heads,
        "weights_composition": comp,
        "join_k_composition": k_composition_join(comp, roles, k=cfg.k),
        "join_copying": copying_patching_join(heads, patching, k=2 * cfg.k),
    }
    path = path_composition_join(comp, patching, k=2 * cfg.k)
    if len(path):
        out["join_path"] = path
    summary = {
        **weights.reading(),
        **({"check": _check_record(weights.check)} if getattr(weights, "check", None) else {}),
        "copying_method": ", ".join(sorted(set(heads.loc[heads.statistic == "ov_copying", "method"].astype(str)))),
        "settings": {"draws": cfg.draws, "null": cfg.null, "k": cfg.k, "seed": cfg.seed},
        "timings": {"heads_s": round(t1 - t0, 3), "composition_s": round(t2 - t1, 3)},
    }
    return out, summary


def _check_record(check: dict) -> dict:
    """run.json's record of the hf weights' check: the layout read, the worst relative error of each part."""
    return {
        "layout": check.get("layout"),
        "tolerance": check.get("tolerance"),
        "errors": {k: float(f"{v:.3g}") for k, v in check.get("errors", {}).items()},
        **({"scope": check["scope"]} if "scope" in check else {}),  # the lazy hf reader's: per module
    }
