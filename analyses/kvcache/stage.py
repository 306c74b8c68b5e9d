"""The KV-cache study on a loaded model: ``headscope kv``'s run and the report's stage.

:func:`kv_blocker` says why the study cannot run on a model (an encoder has no KV cache; only
the in-house backend can restrict a group's cache); :func:`run_kv` builds the inputs, measures,
and returns the frames (``kv_study``, and ``kv_roles`` where a roles frame with retrieval
scores is given) and a summary for run.json.
"""

from __future__ import annotations

import time

import pandas as pd

from headscope.analyses.kvcache.study import KVConfig, kv_study, savings_at
from headscope.probes.errors import ModelIncompatibleError


class KVStudyError(ModelIncompatibleError):
    """A model the KV-cache study cannot run on (one line, exit 2 at the CLI)."""


def kv_blocker(model) -> str | None:
    """Why the study cannot run on ``model``, or None."""
    from headscope.probes.chunked import inhouse_network

    if not model.spec.causal:
        return f"{model.spec.name} is an encoder: the KV cache is a decoder's (it caches past keys for generation)"
    if inhouse_network(model) is None:
        return f"the KV-cache study restricts caches inside the in-house attention; backend {model.backend}"
    return None


#: the shortest context the report's stage runs at (a needle item and its window need room)
MIN_REPORT_TOKENS = 64


def report_config(model, seed: int = 0) -> KVConfig:
    """The report's stage: :data:`~headscope.analyses.kvcache.study.REPORT_KV` (1,024 tokens, a
    window of 128), at the model's context where shorter, the window and sink scaled with it."""
    import dataclasses

    from headscope.analyses.kvcache.study import REPORT_KV

    tokens = min(REPORT_KV.tokens, int(model.spec.max_positions))
    scale = tokens / REPORT_KV.tokens
    return dataclasses.replace(
        REPORT_KV,
        tokens=tokens,
        window=max(1, int(REPORT_KV.window * scale)),
        sink=max(1, int(REPORT_KV.sink * scale)) if REPORT_KV.sink else 0,
        seed=seed,
    )


def report_blocker(model) -> str | None:
    """Why the report's stage does not run on ``model`` (:func:`kv_blocker`, or a context too short), or None."""
    if (why := kv_blocker(model)) is not None:
        return why
    if model.spec.max_positions < MIN_REPORT_TOKENS:
        return (
            f"a context of {model.spec.max_positions} tokens is too short for the study (at least {MIN_REPORT_TOKENS})"
        )
    return None


def check_tokens(model, tokens: int) -> None:
    """``KVStudyError`` when ``tokens`` is past the model's context."""
    if tokens > model.spec.max_positions:
        raise KVStudyError(
            f"--tokens {tokens} is past {model.spec.name}'s context of {model.spec.max_positions} tokens"
        )


def run_kv(model, cfg: KVConfig, roles: pd.DataFrame | None = None) -> tuple[dict[str, pd.DataFrame], dict]:
    """``(frames, summary)`` of the study on ``model`` (see :mod:`~headscope.analyses.kvcache.study`);
    ``KVStudyError`` where :func:`kv_blocker` refuses or ``cfg.tokens`` is past the context."""
    from headscope.analyses.kvcache.bytes import groups_bytes
    from headscope.analyses.kvcache.quality import Evaluator, study_inputs
    from headscope.analyses.kvcache.roles_join import retrieval_join

    if (why := kv_blocker(model)) is not None:
        raise KVStudyError(why)
    check_tokens(model, cfg.tokens)
    t0 = time.perf_counter()
    inputs = study_inputs(
        model.tokenizer,
        cfg.tokens,
        n_items=cfg.items,
        n_texts=cfg.texts,
        sink=cfg.sink,
        window=cfg.window,
        seed=cfg.seed,
    )
    net_cfg = model.network.cfg
    spec = model.spec
    groups = [
        (l, g) for l in range(spec.n_layers) for g in sorted({net_cfg.kv_head_of(h) for h in range(spec.n_heads)})
    ]
    windows = {l: net_cfg.window(l) for l in range(spec.n_layers)}
    kept = cfg.sink + cfg.window
    context = max(int(x.input_ids.shape[1]) for x in inputs)
    nbytes = groups_bytes(groups, windows, spec.d_head, context, kept)
    nbytes_max = groups_bytes(groups, windows, spec.d_head, spec.max_positions, kept)
    evaluate = Evaluator(model, inputs)
    t1 = time.perf_counter()
    frame, summary = kv_study(evaluate, groups, nbytes, nbytes_max, cfg)
    frames = {"kv_study": frame}
    join, join_summary = retrieval_join(summary, roles, spec)
    if join is not None:
        frames["kv_roles"] = join
    summary.update(
        {
            "settings": cfg.settings(),
            "context": context,
            "max_context": int(spec.max_positions),
            "groups": len(groups),
            "inputs": {"needle_items": cfg.items, "long_texts": cfg.texts},
            "forwards": evaluate.runs,
            "layers_run": evaluate.layers_run,
            "roles_join": join_summary,
            "savings_at_tolerance": savings_at(frame),
        }
    )
    summary["timings"]["inputs_s"] = round(t1 - t0, 3)
    return frames, summary
