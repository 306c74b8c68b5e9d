"""What MHA → GQA conversion by mean-pooling K/V heads (Ainslie et al. 2023) costs, without uptraining.

Ainslie et al. turn a multi-head checkpoint into a grouped-query one by averaging the key
and value projections of the heads in each group, then uptrain for ~5% of pre-training.
:func:`~headscope.probes.models.inhouse.kv_pooling.convert_to_gqa` does the first step on an
in-house model (consecutive heads ``[j·r, (j+1)·r)``, ``r = n_heads / n_groups``, share KV
head ``j``, whose ``W_K``, ``W_V`` and biases are the mean of theirs).

:func:`gqa_study` measures what the conversion alone costs a sentence encoder (MiniLM):
``cosine_to_mha`` — cosine of each sentence embedding to the original model's — and
``paraphrase_accuracy`` on ``data/paraphrase/pairs.jsonl`` (anchor closer to its
paraphrase than to every hard negative), next to the KV cache each setting would need.

>>> kv_cache_bytes_per_token(ModelConfig(family="bert", n_layers=6, d_model=384, n_heads=12), n_kv_heads=3)
4608
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pandas as pd
import torch

from headscope.analyses.pruning.metric_functions import mean_pool, paraphrase_hits
from headscope.analyses.pruning.metrics import read_paraphrases
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.backends.protocol import batch_to, weight_dtype
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.kv_pooling import check_groups, convert_to_gqa
from headscope.probes.tokens import collate, pad_id, tokenize_one

log = logging.getLogger(__name__)

GQA_COLUMNS = ["n_kv_heads", "group_size", "metric", "value", "spread", "n", "kv_cache_bytes_per_token"]


def kv_cache_bytes_per_token(cfg: ModelConfig, n_kv_heads: int | None = None, bytes_per_value: int = 4) -> int:
    """Bytes of K and V one token adds to a cache: ``2 · n_layers · n_kv_heads · d_head · bytes``.

    >>> kv_cache_bytes_per_token(ModelConfig(family="bert", n_layers=6, d_model=384, n_heads=12))
    18432
    """
    n_kv = cfg.n_kv_heads if n_kv_heads is None else n_kv_heads
    return 2 * cfg.n_layers * n_kv * cfg.d_head * bytes_per_value


def _tokenize(model: InHouseModel, texts: Sequence[str]) -> list[dict]:
    toks = []
    for i, t in enumerate(texts):
        tok = tokenize_one(model.tokenizer, text=t)
        if len(tok["ids"]) > model.spec.max_positions:
            raise ValueError(
                f"text {i} has {len(tok['ids'])} tokens; the model's context is {model.spec.max_positions}."
            )
        toks.append(tok)
    return toks


def _embed(model: InHouseModel, toks: list[dict], batch_size: int) -> torch.Tensor:
    pad = pad_id(model.tokenizer)
    order = sorted(range(len(toks)), key=lambda i: len(toks[i]["ids"]))
    out = torch.zeros(len(toks), model.spec.d_model)
    with torch.inference_mode():
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            batch = batch_to(collate([toks[i] for i in idx], pad), model.device)
            hidden = model.forward(batch.input_ids, batch.attention_mask)
            out[idx] = mean_pool(hidden, batch.attention_mask).float().cpu()  # [n_texts, d_model] on the host
    return out


def sentence_embeddings(model: InHouseModel, texts: Sequence[str], batch_size: int = 32) -> torch.Tensor:
    """``[n_texts, d_model]`` mean-pooled, L2-normalised last hidden states (the
    all-MiniLM-L6-v2 recipe), in the order of ``texts``; computed in length-sorted batches.

    Raises ``ValueError`` for a decoder or a text longer than the model's context.
    """
    if model.spec.family != "bert":
        raise ValueError(f"sentence embeddings need an encoder (family 'bert'); got {model.spec.family!r}.")
    return _embed(model, _tokenize(model, texts), batch_size)


def _paraphrase_items(pairs) -> list[dict]:
    if pairs is not None:
        return list(pairs)
    from headscope.data import path

    return read_paraphrases(path("paraphrase/pairs.jsonl"))


def _paraphrase_values(emb: dict[str, torch.Tensor], items: list[dict]) -> torch.Tensor:
    """``[item]`` 1.0 where the anchor is closer to its positive than to every negative."""
    n_neg = max(len(it["negatives"]) for it in items)
    d = next(iter(emb.values())).shape[-1]
    anchor = torch.stack([emb[it["anchor"]] for it in items])
    positive = torch.stack([emb[it["positive"]] for it in items])
    negatives = torch.zeros(len(items), n_neg, d)
    valid = torch.zeros(len(items), n_neg, dtype=torch.bool)
    for i, it in enumerate(items):
        for j, s in enumerate(it["negatives"]):
            negatives[i, j] = emb[s]
            valid[i, j] = True
    return paraphrase_hits(anchor, positive, negatives, valid)


def gqa_study(
    model: InHouseModel,
    groups: Sequence[int] = (12, 6, 4, 3, 2, 1),
    sentences: Sequence[str] | None = None,
    pairs: Sequence[dict] | None = None,
    *,
    batch_size: int = 32,
) -> pd.DataFrame:
    """Convert ``model`` to each KV-head count in ``groups`` and measure the damage.

    ``sentences`` (default ``data/text/sentences.txt``) give ``cosine_to_mha``: the mean
    over sentences of the cosine between the converted and the original embedding.
    ``pairs`` (default ``data/paraphrase/pairs.jsonl``): dicts
    with ``anchor``, ``positive``, ``negatives``; ``paraphrase_accuracy`` is the share of
    items whose anchor is closer to its positive than to every negative.

    Returns a tidy frame, columns :data:`GQA_COLUMNS`: ``n_kv_heads``, ``group_size``
    (query heads per KV head), ``metric``, ``value`` (mean over items), ``spread`` (standard
    deviation over items), ``n`` (items), ``kv_cache_bytes_per_token`` (float32 K+V of all
    layers). Raises ``ValueError`` when a group count does not divide the KV heads or the model is
    not an encoder.
    """
    cfg = model.cfg
    gs = [check_groups(cfg, int(g)) for g in groups]
    if sentences is None:
        from headscope.data import path
        from headscope.probes.corpora import read_text

        sentences = list(read_text(path("text/sentences.txt")).lines)
    sentences = list(sentences)
    items = _paraphrase_items(pairs)
    pair_texts = sorted({s for it in items for s in (it["anchor"], it["positive"], *it["negatives"])})
    if model.spec.family != "bert":
        raise ValueError(f"gqa_study needs an encoder (family 'bert'); got {model.spec.family!r}.")
    toks = _tokenize(model, sentences + pair_texts)
    original = _embed(model, toks, batch_size)
    reference = original[: len(sentences)]
    bytes_per_value = weight_dtype(model).itemsize
    rows = []
    for g in gs:
        emb = original if g == cfg.n_kv_heads else _embed(convert_to_gqa(model, g), toks, batch_size)
        cos = (emb[: len(sentences)] * reference).sum(-1)
        hits = _paraphrase_values(dict(zip(pair_texts, emb[len(sentences) :])), items)
        cache = kv_cache_bytes_per_token(cfg, g, bytes_per_value)
        for metric, values in (("cosine_to_mha", cos), ("paraphrase_accuracy", hits)):
            rows.append(
                {
                    "n_kv_heads": g,
                    "group_size": cfg.n_heads // g,
                    "metric": metric,
                    "value": float(values.mean()),
                    "spread": float(values.std()) if len(values) > 1 else 0.0,
                    "n": len(values),
                    "kv_cache_bytes_per_token": cache,
                }
            )
        log.info("GQA g=%d: cosine %.4f, paraphrase %.3f", g, rows[-2]["value"], rows[-1]["value"])
    df = pd.DataFrame(rows, columns=GQA_COLUMNS)
    df["metric"] = df["metric"].astype("category")
    return df
