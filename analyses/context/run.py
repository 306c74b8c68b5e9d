"""The contextualisation run: from static rows to contextual representations, per layer and head.

:func:`run_context` reads a sense set (the shipped English one by default), runs the model
over its sentences one at a time (:func:`~headscope.probes.states.sentence_states`) and
returns ``(frames, summary)``:

- ``similarity``: per ``depth`` (-1 static row, 0 input to layer 0, ``l + 1`` layer ``l``'s
  output) and ``metric`` (self_similarity, anisotropy, corrected_self_similarity,
  intra_sentence, max_explainable_variance): ``value, ci_low, ci_high, n``;
- ``senses``: per ``depth``: ``accuracy, baseline, silhouette`` (mean over words) with CIs
  over words and ``n_beyond_chance`` (words whose permutation p < 0.05);
- ``heads``: per ``layer, head, metric`` (:data:`~.measures.HEAD_METRICS`): ``value, ci_low,
  ci_high, n`` over sentences;
- ``layers``: per ``layer``: ``qk_std`` (raw q·k), ``reversals`` (0: ranking invariance), ``scale``;
- ``contributions`` (with ``sentence`` and ``word``): see :mod:`~.contributions`.

``summary`` holds the pooling, the state each table reports, the distance trends with their
verdicts, the first depth at which senses separate, the scales and the skipped words.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd
import torch

from headscope.analyses.context import measures as M
from headscope.analyses.context import senses as S
from headscope.analyses.context import similarity as SIM
from headscope.analyses.context.contributions import contributions_frame
from headscope.analyses.context.trend import distance_trend
from headscope.analyses.stats.resampling import bootstrap_ci
from headscope.probes.corpora.senses import read_senses
from headscope.probes.states import attention_scales, output_matrices, sentence_states


@dataclass(frozen=True, kw_only=True)
class ContextConfig:
    """Settings of :func:`run_context` (written into run.json)."""

    senses: str | None = None  # a sense JSONL; None: the shipped data/senses/en_senses.jsonl
    pooling: str = "mean"  # multi-piece words: "mean" of the pieces or the "first" piece
    max_words: int | None = field(
        default=None, metadata={"low": 2}
    )  # the first words of the sense set only (None: all)
    max_per_sense: int | None = field(default=None, metadata={"low": 2})  # sentences per sense (None: all)
    attention_sentences: int = 40  # sentences the per-head attention statistics use
    sentence: str | None = field(default=None, metadata={"help": "with --word: which context words shape it"})
    word: str | None = field(default=None, metadata={"help": "the word of --sentence whose context is ranked"})
    piece: int | None = field(default=None, metadata={"help": "one tokenizer piece of --word (0-based)", "low": 0})
    n_boot: int = 1000
    n_perm: int = 50
    seed: int = field(default=0, metadata={"cli": False})  # the run's --seed

    def __post_init__(self):
        if self.pooling not in M.POOLINGS:
            raise ValueError(f"pooling must be one of {M.POOLINGS}; got {self.pooling!r}")
        for name in ("max_words", "max_per_sense"):
            v = getattr(self, name)
            if v is not None and v < 2:
                raise ValueError(f"{name} must be >= 2 or None; got {v}")
        if self.attention_sentences < 1 or self.n_boot < 1 or self.n_perm < 1:
            raise ValueError("attention_sentences, n_boot and n_perm must be >= 1")
        if (self.sentence is None) != (self.word is None):
            raise ValueError("sentence and word go together; got only one of them")


def _items(cfg: ContextConfig):
    from headscope.data import path

    sset = read_senses(cfg.senses or path("senses/en_senses.jsonl"))
    words = sset.words()[: cfg.max_words] if cfg.max_words else sset.words()
    chosen = []
    for w in words:
        per = sset.by_word()[w]
        for sense in sorted({it.sense for it in per}):
            chosen.extend([it for it in per if it.sense == sense][: cfg.max_per_sense])
    return sset, chosen


def _ci_row(vals: torch.Tensor, cfg: ContextConfig, **keys) -> dict:
    vals = vals[~torch.isnan(vals)]
    lo, hi = bootstrap_ci(vals, n_boot=cfg.n_boot, seed=cfg.seed) if vals.numel() > 1 else ([float("nan")],) * 2
    return {**keys, "value": float(vals.mean()), "ci_low": float(lo[0]), "ci_high": float(hi[0]), "n": vals.numel()}


def _similarity(occ: dict, sent_reps: list, tokens: list, cfg: ContextConfig) -> pd.DataFrame:
    """occ: word -> [n, depth, d]; sent_reps: per sentence [depth, n_tok, d]; tokens: (ids, reps)."""
    ids = torch.cat([t for t, _ in tokens])
    allreps = torch.cat([r for _, r in tokens], 1)  # [depth, n_tok, d]
    rows = []
    for d in range(allreps.shape[0]):
        depth = d - 1
        ss = torch.stack([SIM.self_similarity(r[:, d]) for r in occ.values()])
        mev = torch.stack([SIM.max_explainable_variance(r[:, d]) for r in occ.values()])
        aniso = SIM.anisotropy(allreps[d], ids, seed=cfg.seed)
        intra = torch.stack([SIM.intra_sentence_similarity(s[d]) for s in sent_reps if s.shape[1] > 1])
        rows.append(_ci_row(ss, cfg, depth=depth, metric="self_similarity"))
        rows.append({"depth": depth, "metric": "anisotropy", "value": float(aniso), "n": ids.numel()})
        rows.append(_ci_row(ss - aniso, cfg, depth=depth, metric="corrected_self_similarity"))
        rows.append(_ci_row(intra, cfg, depth=depth, metric="intra_sentence"))
        rows.append(_ci_row(mev, cfg, depth=depth, metric="max_explainable_variance"))
    return pd.DataFrame(rows)


def _senses(occ: dict, labels: dict, cfg: ContextConfig) -> tuple[pd.DataFrame, int | None]:
    rows, first = [], None
    n_depth = next(iter(occ.values())).shape[1]
    for d in range(n_depth):
        acc, base, sil, sig = [], [], [], 0
        for w, reps in occ.items():
            a = S.loo_centroid_accuracy(reps[:, d], labels[w])
            b, p = S.permutation_baseline(reps[:, d], labels[w], n_perm=cfg.n_perm, seed=cfg.seed)
            acc.append(a), base.append(b), sil.append(S.silhouette(reps[:, d], labels[w]))
            sig += int(p < 0.05)
        acc_t, base_t = torch.stack(acc), torch.stack(base)
        r = _ci_row(acc_t, cfg, depth=d - 1, metric="accuracy")
        r["baseline"] = float(base_t.mean())
        diff = _ci_row(acc_t - base_t, cfg, depth=d - 1, metric="margin")
        r["margin_ci_low"], r["margin_ci_high"] = diff["ci_low"], diff["ci_high"]
        r["silhouette"] = float(torch.stack(sil).mean())
        r["n_beyond_chance"] = sig
        rows.append(r)
        if first is None and diff["ci_low"] > 0:
            first = d - 1
    return pd.DataFrame(rows), first


def _collect(model, items, cfg: ContextConfig):
    """Run every distinct sentence once; pooled word reps, sentence reps and token reps."""
    weights = output_matrices(model)
    cache, occ, labels_raw, sent_reps, tokens, states = {}, {}, {}, [], [], []
    for it in items:
        if it.sentence not in cache:
            st = sentence_states(model, it.sentence, weights=weights)
            cache[it.sentence] = st
            rows = M.content_positions(st)
            reps = torch.cat([st.static[None], st.states], 0)[:, rows]  # [depth, n_tok, d]
            sent_reps.append(reps)
            tokens.append((st.tokens.input_ids[0].cpu()[rows], reps))
            if len(states) < cfg.attention_sentences:
                states.append(st)
        st = cache[it.sentence]
        pos = M.target_positions(st, it.start, it.end)
        if not pos:
            continue
        static, layers = M.pooled(st, pos, cfg.pooling)
        occ.setdefault(it.lemma, []).append(torch.cat([static[None], layers], 0))
        labels_raw.setdefault(it.lemma, []).append(it.sense)
    occ = {w: torch.stack(v) for w, v in occ.items() if len(set(labels_raw[w])) > 1}
    labels = {w: torch.tensor([sorted(set(labels_raw[w])).index(s) for s in labels_raw[w]]) for w in occ}
    return occ, labels, sent_reps, tokens, states, weights


def _heads(states, n_layers: int, cfg: ContextConfig) -> tuple[pd.DataFrame, torch.Tensor, pd.DataFrame]:
    per = torch.stack([M.head_stats(st) for st in states])  # [sentence, layer, head, metric]
    n_s, n_l, n_h, n_m = per.shape
    flat = per.reshape(n_s, -1)
    lo, hi = bootstrap_ci(flat, n_boot=cfg.n_boot, seed=cfg.seed)
    mean = flat.nanmean(0)
    idx = torch.arange(n_l * n_h * n_m)
    frame = pd.DataFrame(
        {
            "layer": (idx // (n_h * n_m)).numpy(),
            "head": ((idx // n_m) % n_h).numpy(),
            "metric": [M.HEAD_METRICS[i % n_m] for i in idx.tolist()],
            "value": mean.numpy(),
            "ci_low": lo.numpy(),
            "ci_high": hi.numpy(),
            "n": n_s,
        }
    )
    lay = torch.stack([M.layer_stats(st) for st in states])  # [sentence, layer, 2]
    layers = pd.DataFrame(
        {
            "layer": range(n_layers),
            "qk_std": lay[..., 0].mean(0).numpy(),
            "reversals": lay[..., 1].sum(0).numpy().astype(int),
            "scale": states[0].scale,
        }
    )
    return frame, per, layers


def run_context(model, cfg: ContextConfig | None = None) -> tuple[dict[str, pd.DataFrame], dict]:
    """Run every contextualisation measurement on ``model`` (in-house backend); see the module doc."""
    cfg = cfg or ContextConfig()
    sset, items = _items(cfg)
    occ, labels, sent_reps, tokens, states, weights = _collect(model, items, cfg)
    if len(occ) < 1:
        raise ValueError(f"{sset.path}: no word with two senses left to measure (skipped: {sset.skipped})")
    frames = {"similarity": _similarity(occ, sent_reps, tokens, cfg)}
    frames["senses"], first = _senses(occ, labels, cfg)
    n_layers = len(states[0].pattern)
    frames["heads"], per, frames["layers"] = _heads(states, n_layers, cfg)
    dist = {m: per[..., M.HEAD_METRICS.index(m)] for m in ("distance_raw", "distance_norm")}
    trends = {m.split("_")[1]: distance_trend(d, n_boot=cfg.n_boot, seed=cfg.seed) for m, d in dist.items()}
    if cfg.sentence is not None:
        frames["contributions"] = contributions_frame(model, cfg.sentence, cfg.word, cfg.pooling, cfg.piece, weights)
    scales = attention_scales(model)
    causal = states[0].causal
    summary = {
        "config": asdict(cfg),
        "pooling": f"{cfg.pooling} of a word's tokenizer pieces",
        "states": (
            "depth -1: token-embedding row alone; depth 0: input to layer 0 (hidden_states[0]); depth l+1: "
            + ("layer l's output (the last one before the final norm)" if causal else "layer l's output")
        ),
        "sense_file": sset.path,
        "skipped_words": sset.skipped,
        "words": sorted(occ),
        "n_sentences": len(sent_reps),
        "n_attention_sentences": len(states),
        "senses_first_depth_beyond_chance": first,
        "distance_trend": trends,
        "scale": sorted({src for _, _, src in scales}),
        "softcap": sorted({c for _, c, _ in scales if c is not None}),
        "reversals": int(frames["layers"]["reversals"].sum()),
    }
    return frames, summary
