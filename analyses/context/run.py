"""The contextualisation run: from static rows to contextual representations, per layer and head.

:func:`run_context` reads a sense set (the shipped English one by default), runs the model
over its sentences, ``batch_size`` to a padded forward (:func:`~headscope.probes.states.batch_states`), and
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
from headscope.probes.states import attention_scales, batch_states, output_matrices


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
    batch_size: int = field(default=32, metadata={"help": "sentences per forward"})
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
        for name in ("attention_sentences", "batch_size", "n_boot", "n_perm"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
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


def run_sentences(cfg: ContextConfig) -> list[str]:
    """The distinct sentences a run of ``cfg`` feeds the model (the sense set's, then
    ``cfg.sentence``); the sense file's warnings are left to the run."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, items = _items(cfg)
    return list(dict.fromkeys([it.sentence for it in items] + ([cfg.sentence] if cfg.sentence else [])))


def _ci_row(vals: torch.Tensor, cfg: ContextConfig, **keys) -> dict:
    vals = vals[~torch.isnan(vals)]
    lo, hi = bootstrap_ci(vals, n_boot=cfg.n_boot, seed=cfg.seed) if vals.numel() > 1 else ([float("nan")],) * 2
    return {**keys, "value": float(vals.mean()), "ci_low": float(lo[0]), "ci_high": float(hi[0]), "n": vals.numel()}


def _similarity(occ: dict, intra: torch.Tensor, tokens: list, cfg: ContextConfig) -> pd.DataFrame:
    """occ: word -> [n, depth, d]; intra: [sentence, depth] intra-sentence similarities;
    tokens: per sentence (ids [n_tok], reps [depth, n_tok, d])."""
    ids = torch.cat([t for t, _ in tokens])
    # one depth at a time (the same pairs at each): a [depth, every token, d] copy of all the
    # sentences' states, and its gathered pairs, cost SmolLM2-135M 790 MB more than the states
    depths = tokens[0][1].shape[0]
    aniso = torch.stack(
        [SIM.anisotropy(torch.cat([r[d] for _, r in tokens]), ids, seed=cfg.seed) for d in range(depths)]
    )  # [depth]
    by_depth = [r.transpose(0, 1) for r in occ.values()]  # [depth, n, d] per word
    ss = torch.stack([SIM.self_similarity(r) for r in by_depth], 1)  # [depth, word]
    mev = torch.stack([SIM.max_explainable_variance(r) for r in by_depth], 1)
    rows = []
    for d in range(ss.shape[0]):
        depth = d - 1
        rows.append(_ci_row(ss[d], cfg, depth=depth, metric="self_similarity"))
        rows.append({"depth": depth, "metric": "anisotropy", "value": float(aniso[d]), "n": ids.numel()})
        rows.append(_ci_row(ss[d] - aniso[d], cfg, depth=depth, metric="corrected_self_similarity"))
        rows.append(_ci_row(intra[:, d], cfg, depth=depth, metric="intra_sentence"))
        rows.append(_ci_row(mev[d], cfg, depth=depth, metric="max_explainable_variance"))
    return pd.DataFrame(rows)


def _senses(occ: dict, labels: dict, cfg: ContextConfig) -> tuple[pd.DataFrame, int | None]:
    acc, base, sil, sig = [], [], [], []
    for w, reps in occ.items():
        by_depth = reps.transpose(0, 1)  # [depth, n, d]
        acc.append(S.loo_centroid_accuracy(by_depth, labels[w]))
        b, p = S.permutation_baseline(by_depth, labels[w], n_perm=cfg.n_perm, seed=cfg.seed)
        base.append(b), sig.append(p < 0.05), sil.append(S.silhouette(by_depth, labels[w]))
    acc_t, base_t, sil_t, sig_t = (torch.stack(x, 1) for x in (acc, base, sil, sig))  # [depth, word]
    rows, first = [], None
    for d in range(acc_t.shape[0]):
        r = _ci_row(acc_t[d], cfg, depth=d - 1, metric="accuracy")
        r["baseline"] = float(base_t[d].mean())
        diff = _ci_row(acc_t[d] - base_t[d], cfg, depth=d - 1, metric="margin")
        r["margin_ci_low"], r["margin_ci_high"] = diff["ci_low"], diff["ci_high"]
        r["silhouette"] = float(sil_t[d].mean())
        r["n_beyond_chance"] = int(sig_t[d].sum())
        rows.append(r)
        if first is None and diff["ci_low"] > 0:
            first = d - 1
    return pd.DataFrame(rows), first


def _batches(sentences: list[str], size: int) -> list[list[str]]:
    """``sentences`` in batches of ``size``, each of sentences of similar length (less padding)."""
    by_len = sorted(sentences, key=len)
    return [by_len[i : i + size] for i in range(0, len(by_len), size)]


def collect(model, items, cfg: ContextConfig, part: tuple[int, int] | None = None) -> dict:
    """Run every distinct sentence once, ``cfg.batch_size`` to a forward -> the per-sentence and
    per-item values (``reps_of`` item -> pooled word reps, ``per_sentence`` -> (reps, ids),
    ``intra``, ``per_head``, ``per_layer`` of the first ``cfg.attention_sentences`` sentences,
    ``first``: their scale and causality); each sentence's tensors dropped once read. ``part``
    ``(k, n)`` (a sharded run): only every ``n``-th batch from the ``k``-th; :func:`merge_collected`
    of the parts is the whole run's, each value from the same batch."""
    weights = output_matrices(model)
    order = _order(items)
    of_sentence: dict[str, list[int]] = {}
    for n, it in enumerate(items):
        of_sentence.setdefault(it.sentence, []).append(n)
    raw = {"reps_of": {}, "per_sentence": {}, "intra": {}, "per_head": {}, "per_layer": {}, "first": None}
    for b, batch in enumerate(_batches(list(order), cfg.batch_size)):
        if part is not None and b % part[1] != part[0]:
            continue
        for sentence, st in zip(batch, batch_states(model, batch, weights=weights)):
            rows = M.content_positions(st)
            reps = torch.cat([st.static[None], st.states], 0)[:, rows]  # [depth, n_tok, d]
            raw["per_sentence"][sentence] = (reps, st.tokens.input_ids[0].cpu()[rows])
            if reps.shape[1] > 1:
                raw["intra"][sentence] = SIM.intra_sentence_similarity(reps)  # [depth]
            if order[sentence] < cfg.attention_sentences:
                raw["per_head"][sentence], raw["per_layer"][sentence] = M.head_stats(st), M.layer_stats(st)
                raw["first"] = raw["first"] or (st.scale, st.causal)
            for n in of_sentence[sentence]:
                pos = M.target_positions(st, items[n].start, items[n].end)
                if pos:
                    static, layers = M.pooled(st, pos, cfg.pooling)
                    raw["reps_of"][n] = torch.cat([static[None], layers], 0)
    return raw


def collect_part(model, cfg: ContextConfig, part: tuple[int, int]) -> dict:
    """:func:`collect` of part ``part`` of the sense set ``cfg`` reads (a sharded run's worker)."""
    _sset, items = _items(cfg)
    return collect(model, items, cfg, part)


def merge_collected(parts: list[dict]) -> dict:
    """The parts' :func:`collect` in one (each sentence's and item's values from the part that ran it)."""
    out = {k: {} for k in ("reps_of", "per_sentence", "intra", "per_head", "per_layer")}
    for p in parts:
        for k in out:
            out[k].update(p[k])
    out["first"] = next((p["first"] for p in parts if p["first"] is not None), None)
    return out


def _order(items) -> dict[str, int]:
    order = {s: i for i, s in enumerate(dict.fromkeys(it.sentence for it in items))}
    if not order:
        raise ValueError("the sense set has no sentence left to run")
    return order


def _collected(items, raw: dict):
    """:func:`collect`'s values -> ``(occ, labels, intra, tokens, (per, lay, scale, causal))``."""
    order, reps_of = _order(items), raw["reps_of"]
    occ, labels_raw = {}, {}
    for n, it in enumerate(items):  # in the sense set's order (the permutations draw in it)
        if n in reps_of:
            occ.setdefault(it.lemma, []).append(reps_of[n])
            labels_raw.setdefault(it.lemma, []).append(it.sense)
    occ = {w: torch.stack(v) for w, v in occ.items() if len(set(labels_raw[w])) > 1}
    labels = {w: torch.tensor([sorted(set(labels_raw[w])).index(s) for s in labels_raw[w]]) for w in occ}
    in_order = sorted(order, key=order.get)
    per_sentence, intra = raw["per_sentence"], raw["intra"]
    tokens = [(per_sentence[s][1], per_sentence[s][0]) for s in in_order]
    intra_t = torch.stack([intra[s] for s in in_order if s in intra])  # [sentence, depth]
    attn = sorted(raw["per_head"], key=order.get)
    per = torch.stack([raw["per_head"][s] for s in attn])  # [sentence, layer, head, metric]
    lay = torch.stack([raw["per_layer"][s] for s in attn])  # [sentence, layer, 2]
    return occ, labels, intra_t, tokens, (per, lay, *raw["first"])


def _heads(per: torch.Tensor, lay: torch.Tensor, scale: list[float], cfg: ContextConfig):
    """The ``heads`` and ``layers`` frames from ``per [sentence, layer, head, metric]`` and
    ``lay [sentence, layer, 2]`` (:func:`~.measures.head_stats`, :func:`~.measures.layer_stats`)."""
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
    layers = pd.DataFrame(
        {
            "layer": range(n_l),
            "qk_std": lay[..., 0].mean(0).numpy(),
            "reversals": lay[..., 1].sum(0).numpy().astype(int),
            "scale": scale,
        }
    )
    return frame, layers


def run_context(
    model, cfg: ContextConfig | None = None, collected: dict | None = None
) -> tuple[dict[str, pd.DataFrame], dict]:
    """Run every contextualisation measurement on ``model`` (in-house backend); see the module doc.
    ``collected``: the forwards' values already run (a sharded run's :func:`merge_collected`)."""
    cfg = cfg or ContextConfig()
    sset, items = _items(cfg)
    raw = collect(model, items, cfg) if collected is None else collected
    occ, labels, intra, tokens, (per, lay, scale, causal) = _collected(items, raw)
    weights = output_matrices(model)
    if len(occ) < 1:
        raise ValueError(f"{sset.path}: no word with two senses left to measure (skipped: {sset.skipped})")
    frames = {"similarity": _similarity(occ, intra, tokens, cfg)}
    frames["senses"], first = _senses(occ, labels, cfg)
    frames["heads"], frames["layers"] = _heads(per, lay, scale, cfg)
    dist = {m: per[..., M.HEAD_METRICS.index(m)] for m in ("distance_raw", "distance_norm")}
    trends = {m.split("_")[1]: distance_trend(d, n_boot=cfg.n_boot, seed=cfg.seed) for m, d in dist.items()}
    if cfg.sentence is not None:
        frames["contributions"] = contributions_frame(model, cfg.sentence, cfg.word, cfg.pooling, cfg.piece, weights)
    scales = attention_scales(model)
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
        "n_sentences": len(tokens),
        "n_attention_sentences": per.shape[0],
        "senses_first_depth_beyond_chance": first,
        "distance_trend": trends,
        "scale": sorted({src for _, _, src in scales}),
        "softcap": sorted({c for _, c, _ in scales if c is not None}),
        "reversals": int(frames["layers"]["reversals"].sum()),
    }
    return frames, summary
