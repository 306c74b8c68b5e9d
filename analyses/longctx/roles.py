"""The long-context role group: retrieval, streaming and sink heads, on the needle task.

Entry point (``headscope kv`` and the report's long-context stage call it)::

    from headscope.analyses.longctx.roles import long_context_roles
    frame = long_context_roles(model, LongContextConfig(n_tokens=2048, n_items=8))

One tidy frame, :data:`LONG_COLUMNS` (the roles' ROLE_COLUMNS plus ``window``, ``bos``,
``top_key``, ``top_key_token``, ``top_key_mass``), a row per head and role:

* ``retrieval``: Wu et al.'s (2024) retrieval score: over the answer tokens the model copies,
  the share at whose step the head's top-1 key is the needle token copied; baseline: a
  uniformly drawn top-1 key; verdict: score >= ``retrieval_threshold`` (0.1, Wu et al.) and
  p < alpha after the correction across heads;
* ``streaming`` (one row per ``window``): the share of the attention mass on the first
  ``sink_tokens`` keys plus the ``window`` most recent ones, over the queries those keys do not
  all cover; baseline: that share under uniform attention; verdict: score >=
  ``streaming_threshold`` (0.9), margin >= ``margin`` and p < alpha;
* ``sink`` (one row per ``bos`` setting): the mass on the first ``sink_tokens`` keys of the
  queries at long range (the last half of each item); baseline uniform; verdict: score >=
  ``sink_threshold`` (0.5), margin >= ``margin`` and p < alpha. With ``sink_bos_pass`` the
  items run a second time with the BOS put in (a model whose tokenizer adds none, SmolLM2) or
  taken out: ``top_key`` (the key with the most mean mass), ``top_key_token`` and
  ``top_key_mass`` say where each head's sink is, with and without BOS.

Per-item values go through the roles' verdict machinery
(:func:`~headscope.analyses.stats.verdicts.layered_rows`: bootstrap interval, sign-flip p, BH
across the heads of one role and setting, or across every row with ``stats.family="global"``,
:func:`~headscope.analyses.stats.verdicts.apply_family`). Patterns come one query chunk at a time from Q and
K where the backend hands them over (:mod:`.passes`); ``frame.attrs`` says which path ran
(``pattern_statistics``), the copy accuracy, the items and the notes. These roles need a
causal decoder: on an encoder the frame is empty and ``attrs["skipped"]`` says why. They are
not part of the default ``headscope roles`` run.
"""

from __future__ import annotations

import logging

import pandas as pd
import torch

from headscope.analyses.frames import ROLE_COLUMNS, roles_frame
from headscope.analyses.longctx.config import LongContextConfig
from headscope.analyses.longctx.needle import copy_hits, needle_items
from headscope.analyses.longctx.passes import item_pass, pass_mode
from headscope.analyses.longctx.reducers import RetrievalReducer, SinkReducer, StreamingReducer
from headscope.analyses.roles.long_inputs import token_limit
from headscope.analyses.stats.verdicts import apply_family, layered_rows

log = logging.getLogger(__name__)

LONG_COLUMNS = [*ROLE_COLUMNS, "window", "bos", "top_key", "top_key_token", "top_key_mass"]
ROLES = ("retrieval", "streaming", "sink")


def empty_long() -> pd.DataFrame:
    """A frame of :data:`LONG_COLUMNS` and no row."""
    return _typed(roles_frame([]).assign(window=None, bos=None, top_key=None, top_key_token=None, top_key_mass=None))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    df = df.reindex(columns=LONG_COLUMNS)
    return df.astype({"window": "Int64", "bos": "boolean", "top_key": "Int64", "top_key_mass": "float64"})


def long_items(model, cfg: LongContextConfig, *, bos: bool | None = None, n_items: int | None = None) -> list:
    """The needle items of a run: ``cfg.n_tokens`` capped at the model's context."""
    n = min(cfg.n_tokens, token_limit(model))
    k = cfg.n_items if n_items is None else n_items
    return needle_items(model.tokenizer, n, k, seed=cfg.seed, needle_len=cfg.needle_len, corpus=cfg.corpus, bos=bos)


def measure(model, items, cfg: LongContextConfig, *, sink_only: bool = False) -> dict:
    """One pass per item through the reducers of :mod:`.reducers`: ``{"retrieval", "streaming",
    "sink": reducer, "hits": [bool [len(answer)] per item]}`` (no retrieval or streaming
    reducer with ``sink_only``)."""
    L, H = model.spec.n_layers, model.spec.n_heads
    ret = None if sink_only else RetrievalReducer(L, H)
    stream = None if sink_only else StreamingReducer(L, H, windows=cfg.windows, sink=cfg.sink_tokens)
    sink = SinkReducer(L, H, sink=cfg.sink_tokens, long_range=cfg.long_range)
    hits = []
    for k, item in enumerate(items):
        p = item_pass(model, item, cfg.query_chunk)
        hit = copy_hits(p.logits, item).cpu()
        hits.append(hit)
        n = len(item.input_ids)
        for r, arg in ((ret, (item, hit)), (stream, (n,)), (sink, (n,))):
            if r is not None:
                r.begin(*arg)
        for piece in p.pieces():
            for r in (ret, stream, sink):
                if r is not None:
                    r.piece(piece)
        for r in (ret, stream, sink):
            if r is not None:
                r.end()
        log.info("long-context item %d/%d: %d of %d answer tokens copied", k + 1, len(items), int(hit.sum()), len(hit))
    return {"retrieval": ret, "streaming": stream, "sink": sink, "hits": hits}


def _rows(values: list, baselines: list, role: str, cfg: LongContextConfig, threshold: float, margin: bool) -> list:
    v = torch.stack(values).float()
    b = torch.tensor(baselines, dtype=torch.float32)
    ok = ~torch.isnan(b)
    rows = layered_rows(
        v[ok],
        b[ok],
        range(v.shape[1]),
        role=role,
        cfg=cfg.stats,
        threshold_kind="absolute",
        threshold=threshold,
    )
    if margin:
        for r in rows:
            r["meets_threshold"] = bool(r["meets_threshold"] and r["margin"] >= cfg.margin - 1e-12)
            r["verdict"] = bool(r["verdict"] and r["meets_threshold"])
    return rows


def _sink_rows(red: SinkReducer, items, cfg: LongContextConfig, tokenizer, bos: bool) -> list:
    rows = _rows(red.values, red.baselines, "sink", cfg, cfg.sink_threshold, margin=True)
    profile = torch.stack(red.profiles).mean(0)  # [layer, head, key_pos]
    mass, top = profile.max(-1)
    for r in rows:
        key = int(top[r["layer"], r["head"]])
        toks = {int(it.input_ids[key]) for it in items}
        r.update(
            bos=bos,
            top_key=key,
            top_key_mass=float(mass[r["layer"], r["head"]]),
            top_key_token=tokenizer.convert_ids_to_tokens(toks.pop()) if len(toks) == 1 else "(varies)",
        )
    return rows


def _skipped(model, why: str) -> pd.DataFrame:
    frame = empty_long()
    frame.attrs.update(skipped=why, notes=[why])
    log.info("%s", why)
    return frame


def long_context_roles(model, config: LongContextConfig | None = None) -> pd.DataFrame:
    """The long-context roles of ``model`` (module docstring): a :data:`LONG_COLUMNS` frame,
    ``attrs``: ``pattern_statistics``, ``copy_accuracy`` (and ``copy_accuracy_other_bos``),
    ``n_tokens``, ``n_items``, ``bos`` (whether the main pass's items begin with BOS),
    ``notes``; ``skipped`` (and no row) for an encoder."""
    cfg = config or LongContextConfig()
    if not model.spec.causal:
        return _skipped(model, f"long-context roles need a causal decoder; {model.spec.name} is an encoder: skipped")
    items = long_items(model, cfg)
    tok = model.tokenizer
    has_bos = tok.bos_token_id is not None and items[0].input_ids[0] == tok.bos_token_id
    m = measure(model, items, cfg)
    ret, stream = m["retrieval"], m["streaming"]
    rows = _rows(ret.values, ret.baselines, "retrieval", cfg, cfg.retrieval_threshold, margin=False)
    for w in cfg.windows:
        for r in _rows(stream.values[w], stream.baselines[w], "streaming", cfg, cfg.streaming_threshold, True):
            rows.append({**r, "window": w})
    rows += _sink_rows(m["sink"], items, cfg, tok, has_bos)
    acc = float(torch.cat(m["hits"]).float().mean())
    notes = [f"copy accuracy {acc:.3f} over {len(items)} items of {len(items[0].input_ids)} tokens"]
    attrs = {"copy_accuracy": acc}
    if cfg.sink_bos_pass:
        if not has_bos and tok.bos_token_id is None:
            notes.append("no second sink pass: the tokenizer has no BOS token to put in")
        else:
            other = long_items(model, cfg, bos=not has_bos)
            o = measure(model, other, cfg, sink_only=True)
            rows += _sink_rows(o["sink"], other, cfg, tok, not has_bos)
            attrs["copy_accuracy_other_bos"] = float(torch.cat(o["hits"]).float().mean())
    frame = apply_family(_typed(pd.DataFrame(rows)), cfg.stats) if rows else empty_long()
    frame = frame.sort_values(["role", "window", "bos", "layer", "head"], kind="stable", na_position="first")
    frame = frame.reset_index(drop=True)
    frame.attrs.update(
        attrs,
        pattern_statistics=pass_mode(model, cfg.query_chunk),
        n_tokens=len(items[0].input_ids),
        n_items=len(items),
        bos=has_bos,
        notes=notes + sink_notes(frame),
    )
    return frame


def sink_notes(frame: pd.DataFrame) -> list[str]:
    """One line on where the sink heads' top key goes with and without BOS."""
    sink = frame[frame["role"] == "sink"]
    if sink["bos"].nunique() < 2:
        return []
    heads = sink[sink["verdict"]][["layer", "head"]].drop_duplicates()
    if heads.empty:
        return ["no sink head with or without BOS"]
    keyed = sink.merge(heads, on=["layer", "head"]).set_index(["layer", "head", "bos"])["top_key"]
    with_bos, without = keyed.xs(True, level="bos"), keyed.xs(False, level="bos")
    same = int((with_bos == 0).sum()), int((without == 0).sum())
    return [
        f"{len(heads)} sink heads (in either setting): top key at position 0 in {same[0]} with BOS, "
        f"{same[1]} without (the first token then being the text's own)"
    ]
