"""The KV-cache study on a loaded model: ``headscope kv``'s run and the report's stage.

:func:`kv_blocker` says why the study cannot run on a model (an encoder has no KV cache; only
the in-house backend can restrict a group's cache); :func:`run_kv` builds the inputs, measures,
and returns the frames (``kv_study``, and ``kv_roles`` where a roles frame with retrieval
scores is given) and a summary for run.json.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from headscope.analyses.kvcache.study import KVConfig, kv_study, savings_at
from headscope.probes.errors import ModelIncompatibleError


class KVStudyError(ModelIncompatibleError):
    """A model the KV-cache study cannot run on (one line, exit 2 at the CLI)."""


def kv_blocker(model) -> str | None:
    """Why the study cannot run on ``model``, or None."""
    from headscope.probes.chunked import inhouse_network
    from headscope.probes.models.purpose import purpose_of

    purpose = purpose_of(model)  # decided at load
    if purpose.kind != "lm":
        return (
            f"{model.spec.name} is {purpose.words} ({purpose.reason}): the KV cache is a language model's "
            "(a causal decoder's: it caches past keys for generation)"
        )
    if inhouse_network(model) is None:
        return f"the KV-cache study restricts caches inside the in-house attention; backend {model.backend}"
    return None


#: the shortest context the report's stage runs at (a needle item and its window need room)
MIN_REPORT_TOKENS = 64


def report_config(model, seed: int = 0, tokens: int | None = None) -> KVConfig:
    """The report's stage: :data:`~headscope.analyses.kvcache.study.REPORT_KV` (1,024 tokens, a
    window of 128), at ``tokens`` (None: 1,024) or the model's context where shorter, the window
    and sink scaled with it."""
    import dataclasses

    from headscope.analyses.kvcache.study import REPORT_KV

    tokens = min(REPORT_KV.tokens if tokens is None else tokens, int(model.spec.max_positions))
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


def _units(cfg: KVConfig, groups, nbytes, nbytes_max, evaluate):
    """The study's units (``(layer, kv_group)``, or ``(layer, None)`` for a whole layer), their
    bytes, and the evaluator of a configuration of units."""
    if cfg.unit == "group":
        return groups, nbytes, nbytes_max, evaluate
    layers = sorted({l for l, _ in groups})
    members = {(l, None): [x for x in groups if x[0] == l] for l in layers}

    def summed(b):
        return {u: tuple(sum(b[x][i] for x in gs) for i in (0, 1)) for u, gs in members.items()}

    def spread(windows):
        return {x: w for u, w in windows.items() for x in members[u]}

    def measure(windows):
        return evaluate(spread(windows))

    if hasattr(evaluate, "many"):  # a sharded run's evaluator takes a round of configurations at once
        measure.many = lambda configs: evaluate.many([spread(w) for w in configs])
    return list(members), summed(nbytes), summed(nbytes_max), measure


def kv_inputs(model, cfg: KVConfig):
    """The study's inputs on ``model``'s tokenizer (:func:`~headscope.analyses.kvcache.quality.study_inputs`)."""
    from headscope.analyses.kvcache.quality import study_inputs

    return study_inputs(
        model.tokenizer,
        cfg.tokens,
        n_items=cfg.items,
        n_texts=cfg.texts,
        sink=cfg.sink,
        window=cfg.window,
        seed=cfg.seed,
    )


#: the long-context roles and causal check beside a study: 16 needle items (the sign-flip p of n items is at least
#: 2**-n; 16 let SmolLM2's best retrieval heads pass BH over its 270 heads) at 512 tokens (the study's context where
#: shorter), the causal check on 4 items of its own (needles at depths (i + 0.5) / 4; 7 forwards an item: unmasked,
#: top, 5 random draws)
LONG_ITEMS, LONG_TOKENS, CAUSAL_ITEMS = 16, 512, 4


@dataclass(frozen=True)
class KVStageConfig:
    """The report's KV-cache stage: the study at ``tokens`` (None: :func:`report_config`'s 1,024),
    the long-context roles on ``role_items`` needle items of ``role_tokens`` tokens, their causal
    check on ``causal_items``; ``logit_rows``: the study's final hidden states unembedded that many
    rows at a time (None: whole; :class:`~headscope.analyses.kvcache.quality.Evaluator`). The
    defaults are the stage's; the report's memory plan sets ``logit_rows`` and, in quick mode on a
    model over :data:`~headscope.reports.stages.quick.LARGE_COST`, the shorter settings of
    :data:`~headscope.reports.stages.quick.QUICK_KV_LARGE`.

    ``study``: the study's own settings, taken as they are instead of :func:`report_config`'s (the
    report leaves it None; ``headscope kv --ray`` sets its ``--tokens``/``--sink``/``--window``/
    ``--quick`` study here, ``role_tokens`` None for the study's context); ``bos_pass``: the
    long-context roles' second sink pass (:func:`long_roles_config`)."""

    tokens: int | None = None
    role_items: int = LONG_ITEMS
    role_tokens: int | None = LONG_TOKENS
    causal_items: int = CAUSAL_ITEMS
    logit_rows: int | None = None
    study: KVConfig | None = None
    bos_pass: bool = False

    def study_config(self, model, seed: int = 0) -> KVConfig:
        """The study's settings on ``model``: ``study`` where given, else :func:`report_config`'s."""
        return self.study if self.study is not None else report_config(model, seed, self.tokens)


def long_roles_config(
    cfg: KVConfig, items: int = LONG_ITEMS, *, tokens: int | None = LONG_TOKENS, causal_items=None, bos_pass=False
):
    """The long-context roles' and causal check's settings beside a study of ``cfg``: ``items``
    needle items of ``tokens`` tokens (at most the study's; None: the study's), the causal check on
    ``causal_items`` of them (None: all), the study's sink and seed, the streaming windows 16, 64
    and the study's own (a window holding the whole item scores 1, as its baseline), the second
    (BOS) sink pass with ``bos_pass``."""
    from headscope.analyses.longctx.config import LongContextConfig

    n = cfg.tokens if tokens is None else min(tokens, cfg.tokens)
    return LongContextConfig(
        n_tokens=n,
        n_items=items,
        causal_items=None if causal_items is None else min(causal_items, items),
        sink_tokens=max(1, cfg.sink),
        windows=tuple(sorted({16, 64, cfg.window})),
        seed=cfg.seed,
        sink_bos_pass=bos_pass,
    )


def run_long_roles(model, lcfg) -> tuple[dict[str, pd.DataFrame], dict]:
    """Helper B's long-context roles (:func:`~headscope.analyses.longctx.roles.long_context_roles`)
    and their causal check (:func:`~headscope.analyses.longctx.causal.causal_check`) on ``model``:
    frames ``long_context_roles`` and ``long_context_causal``, and their summary."""
    from headscope.analyses.longctx.causal import causal_check
    from headscope.analyses.longctx.roles import long_context_roles

    t0, c0 = time.perf_counter(), time.process_time()
    roles = long_context_roles(model, lcfg)
    t1, c1 = time.perf_counter(), time.process_time()
    causal, causal_summary = causal_check(model, lcfg, roles=roles)
    t2, c2 = time.perf_counter(), time.process_time()
    keep = ("copy_accuracy", "copy_accuracy_other_bos", "bos", "n_tokens", "n_items", "notes")
    attrs = {k: v for k, v in roles.attrs.items() if k in keep}
    summary = {
        **attrs,
        "pattern_statistics": str(roles.attrs.get("pattern_statistics")),
        "settings": {k: v for k, v in lcfg.to_dict().items() if k != "stats"},
        "causal": causal_summary,
        "timings": {
            "roles_s": round(t1 - t0, 3),
            "causal_s": round(t2 - t1, 3),
            "roles_cpu_s": round(c1 - c0, 3),
            "causal_cpu_s": round(c2 - c1, 3),
        },
    }
    roles = roles.copy()
    roles.attrs = {}
    return {"long_context_roles": roles, "long_context_causal": causal}, summary


def run_kv(
    model,
    cfg: KVConfig,
    roles: pd.DataFrame | None = None,
    *,
    role_items: int = 0,
    role_tokens: int | None = LONG_TOKENS,
    causal_items: int | None = CAUSAL_ITEMS,
    bos_pass: bool = False,
    logit_rows: int | None = None,
    evaluator=None,
    long: tuple[dict, dict] | None = None,
) -> tuple[dict[str, pd.DataFrame], dict]:
    """``(frames, summary)`` of the study on ``model`` (see :mod:`~headscope.analyses.kvcache.study`);
    with ``role_items``, first the long-context roles and their causal check on that many needle
    items of ``role_tokens`` tokens, the check on ``causal_items`` of them, with ``bos_pass`` the
    roles' second sink pass with BOS put in or taken out (:func:`long_roles_config`,
    :func:`run_long_roles`), whose retrieval scores the study is joined with (else those of
    ``roles``, where it has any). ``logit_rows``: the study's logits that many rows at a time
    (:class:`~headscope.analyses.kvcache.quality.Evaluator`; None: whole). ``evaluator``: what measures
    the configurations instead (a sharded run's); ``long``: the long-context roles' ``(frames,
    summary)`` already run (a sharded run's first pass). ``KVStudyError`` where :func:`kv_blocker` refuses or
    ``cfg.tokens`` is past the context. ``summary["timings"]["cpu_s"]``: the CPU seconds of it all."""
    from headscope.analyses.kvcache.bytes import groups_bytes
    from headscope.analyses.kvcache.quality import Evaluator
    from headscope.analyses.kvcache.roles_join import retrieval_join

    if (why := kv_blocker(model)) is not None:
        raise KVStudyError(why)
    check_tokens(model, cfg.tokens)
    c_start = time.process_time()
    frames: dict[str, pd.DataFrame] = {}
    long_summary = None
    if role_items:
        if long is None:
            lcfg = long_roles_config(cfg, role_items, tokens=role_tokens, causal_items=causal_items, bos_pass=bos_pass)
            long = run_long_roles(model, lcfg)
        frames, long_summary = dict(long[0]), long[1]
        roles = frames["long_context_roles"]
    t0 = time.perf_counter()
    inputs = kv_inputs(model, cfg)
    net_cfg = model.network.cfg
    spec = model.spec
    held = net_cfg.heads_kept or [range(spec.n_heads)] * spec.n_layers  # a physically pruned layer holds fewer
    groups = [(l, g) for l in range(spec.n_layers) for g in sorted({net_cfg.kv_head_of(h) for h in held[l]})]
    windows = {l: net_cfg.window(l) for l in range(spec.n_layers)}
    kept = cfg.sink + cfg.window
    context = max(int(x.input_ids.shape[1]) for x in inputs)
    nbytes = groups_bytes(groups, windows, spec.d_head, context, kept)
    nbytes_max = groups_bytes(groups, windows, spec.d_head, spec.max_positions, kept)
    evaluate = Evaluator(model, inputs, logit_rows=logit_rows) if evaluator is None else evaluator
    units, nbytes, nbytes_max, measure = _units(cfg, groups, nbytes, nbytes_max, evaluate)
    t1 = time.perf_counter()
    frame, summary = kv_study(measure, units, nbytes, nbytes_max, cfg)
    frames["kv_study"] = frame
    join, join_summary = retrieval_join(summary, roles, spec)
    if join is not None:
        frames["kv_roles"] = join
    summary.update(
        {
            "settings": cfg.settings(),
            "context": context,
            "max_context": int(spec.max_positions),
            "groups": len(groups),
            "units": len(units),
            "inputs": {"needle_items": cfg.items, "long_texts": cfg.texts},
            "forwards": evaluate.runs,
            "layers_run": evaluate.layers_run,
            "logit_rows": logit_rows,
            "roles_join": join_summary,
            "long_context": long_summary,
            "savings_at_tolerance": savings_at(frame),
        }
    )
    summary["timings"]["inputs_s"] = round(t1 - t0, 3)
    summary["timings"]["cpu_s"] = round(time.process_time() - c_start, 3)
    return frames, summary
