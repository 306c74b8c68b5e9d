"""Sentence embeddings as the checkpoint's own sentence-transformers pipeline makes them, without
importing sentence-transformers: :func:`embed` (texts -> ``[n, d]`` array), and the arithmetic
the embedding metrics share (:func:`pool`, :func:`sentence_embedding`, :func:`token_states`).

The pipeline (pooling modes, Dense layers, Normalize, prompts) is read once per model from its
folder (:func:`pipeline_of`, :func:`~headscope.probes.models.sentence_pipeline.read_pipeline`).
Each step follows sentence-transformers 6.2's own modules (``Pooling._forward_padded``,
``Dense.forward``, ``Normalize.forward``): pooling over the real tokens of right-padded
batches, prompt tokens left out of the pooling where the folder says ``include_prompt: false``.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F

from headscope.probes.models.sentence_pipeline import ASSUMED, SentencePipeline, read_pipeline
from headscope.probes.shapes import Float, Shaped, Tensor

__all__ = ["embed", "pipeline_of", "pool", "prompt_length", "sentence_embedding", "token_states"]

#: last hidden states, and the mask of real tokens
Hidden = Float[Tensor, "batch pos d_model"]
TokenMask = Shaped[Tensor, "batch pos"]
Pooled = Float[Tensor, "batch d"]


def pipeline_of(model) -> SentencePipeline:
    """The sentence-transformers pipeline of a loaded ``model``: read once from the folder it was
    loaded from (``model.source.st_folder``) and kept on the model; :data:`ASSUMED` (mean
    pooling, Normalize) for a model without one."""
    source = getattr(model, "source", None)
    cached = getattr(model, "_sentence_pipeline", None)
    if cached is not None and cached[0] is source:
        return cached[1]
    pipe = read_pipeline(getattr(source, "st_folder", None))
    try:
        model._sentence_pipeline = (source, pipe)  # read again only if the model's source changes
    except AttributeError:  # an object that takes no attributes: read again next time
        pass
    return pipe


def pool(hidden: Hidden, attention_mask: TokenMask | None, modes: tuple[str, ...] = ("mean",)) -> Pooled:
    """``hidden [batch, pos, d_model]`` pooled over the real tokens (``attention_mask [batch, pos]``,
    right padding; None: every position) by each of ``modes``, concatenated -> ``[batch, len(modes)
    × d_model]``, as sentence-transformers' ``Pooling`` computes it (in the hidden states' dtype,
    sums of half types in float32).

    >>> h = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [9.0, 9.0]]])
    >>> m = torch.tensor([[1, 1, 0]])
    >>> [pool(h, m, (mode,)).tolist()[0] for mode in ("mean", "cls", "max", "lasttoken")]
    [[2.0, 1.0], [1.0, 0.0], [3.0, 2.0], [3.0, 2.0]]
    """
    if attention_mask is None:
        attention_mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
    attention_mask = attention_mask.to(hidden.device)
    acc = torch.float32 if hidden.dtype in (torch.float16, torch.bfloat16) else hidden.dtype
    out = []
    for mode in modes:
        if mode == "cls":
            first = attention_mask.to(torch.int).argmax(dim=1)
            out.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), first])
        elif mode == "max":
            keep = attention_mask[..., None].expand_as(hidden).to(hidden.dtype)
            out.append(hidden.masked_fill(keep == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            m = attention_mask[..., None].to(hidden.dtype)
            total = (hidden * m).sum(dim=1, dtype=acc)
            count = m.sum(dim=1, dtype=acc).clamp(min=1e-9)
            out.append((total / (count if mode == "mean" else count.sqrt())).to(hidden.dtype))
        elif mode == "weightedmean":
            m = attention_mask[..., None].to(acc)
            w = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=acc).view(1, -1, 1) * m
            out.append(((hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1e-9)).to(hidden.dtype))
        elif mode == "lasttoken":
            seen, idx = attention_mask.flip(1).max(1)
            idx = torch.where(seen == 0, hidden.shape[1] - 1, idx)
            last = hidden.shape[1] - idx - 1
            masked = hidden * attention_mask[..., None].to(hidden.dtype)
            out.append(masked[torch.arange(hidden.shape[0], device=hidden.device), last])
        else:
            raise ValueError(
                f"pooling mode must be one of cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken; got {mode!r}"
            )
    return torch.cat(out, dim=-1)


def sentence_embedding(
    hidden: Hidden,
    attention_mask: TokenMask | None,
    pipeline: SentencePipeline = ASSUMED,
    *,
    prompt_tokens: int = 0,
    normalize: bool | None = None,
) -> Pooled:
    """The pipeline's sentence embedding ``[batch, d]`` of ``hidden [batch, pos, d_model]``:
    :func:`pool` (the first ``prompt_tokens`` positions left out where the pipeline excludes the
    prompt), each Dense layer, then Normalize where the pipeline has it (``normalize`` overrides).
    ``hidden`` is not written to.

    >>> h = torch.tensor([[[3.0, 0.0], [0.0, 4.0], [9.0, 9.0]]])
    >>> sentence_embedding(h, torch.tensor([[1, 1, 0]])).tolist()
    [[0.6000000238418579, 0.800000011920929]]
    """
    mask = attention_mask
    if prompt_tokens and not pipeline.include_prompt:
        mask = (torch.ones(hidden.shape[:2], dtype=torch.long) if mask is None else mask).clone()
        mask[:, :prompt_tokens] = 0  # right padding: the prompt is the first tokens of every row
    x = pool(hidden, mask, pipeline.pooling)
    for d in pipeline.dense:
        y = F.linear(x, d.weight.to(x.device, x.dtype), None if d.bias is None else d.bias.to(x.device, x.dtype))
        y = getattr(torch.nn, d.activation)()(y)
        if d.use_residual:
            y = y + (x if d.residual is None else F.linear(x, d.residual.to(x.device, x.dtype)))
        x = y
    if pipeline.normalize if normalize is None else normalize:
        x = F.normalize(x, p=2, dim=-1)
    return x


def token_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Hidden:
    """The token embeddings a sentence-transformers Transformer module hands to Pooling: the last
    hidden states ``[batch, pos, d_model]`` (after the final norm) of ``model``'s forward; a causal
    model with an LM head's through :meth:`final_states` (its logits are not computed). ``ModelIncompatibleError``
    for a causal model whose final states cannot be read."""
    from headscope.probes.models.purpose import purpose_of

    if not model.spec.causal or not purpose_of(model).has_lm_head:  # no logits: the forward's output is the states
        return model.forward(input_ids, attention_mask)
    with model.final_states() as kept:
        model.forward(input_ids, attention_mask)
    return kept[-1]


def prompt_length(tokenizer, prompt: str | None) -> int:
    """How many leading tokens a prompt takes once prepended, as sentence-transformers counts
    them: the prompt tokenised alone, less a trailing special token (``[SEP]``, EOS); 0 without one."""
    if not prompt:
        return 0
    ids = tokenizer(prompt)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    return len(ids) - (1 if ids and ids[-1] in special else 0)


def embed(model, texts, prompt: str | None = None, *, batch_size: int = 32) -> np.ndarray:
    """Sentence embeddings of ``texts`` through ``model``'s own pipeline -> ``[n, d]`` float32 array.

    ``model``: a shipped name (``"minilm-l6"``), a folder (a sentence-transformers folder is
    read whole: ``modules.json``, Pooling, Dense, Normalize, prompts) or a loaded model
    (:func:`~headscope.probes.models.loading.load_model`). ``prompt``: the name of one of the
    folder's prompts (``config_sentence_transformers.json``); None applies its
    ``default_prompt_name`` if it has one. Texts are truncated to the folder's ``max_seq_length``
    (else the model's context). These are the vectors ``cosine_to_unpruned``,
    ``paraphrase_accuracy`` and ``embedding_cosine`` compare.

    Raises ``TypeError`` for ``texts`` that are not a list of strings, ``ValueError`` for an empty
    list or an unknown prompt name, :class:`~headscope.probes.errors.ModelIncompatibleError` where
    the model's final hidden states cannot be read.

    >>> e = embed("minilm-l6", ["A cat sat on the mat.", "A dog lay on the rug."])
    >>> e.shape, round(float((e[0] * e[0]).sum()), 4)
    ((2, 384), 1.0)
    """
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError(f"texts must be a list of strings; got {type(texts).__name__}")
    texts = list(texts)
    if not texts:
        raise ValueError("texts must hold at least one text; got an empty list")
    if isinstance(model, (str, os.PathLike)):
        from headscope.probes.models.loading import load_model

        model = load_model(model)
    pipe = pipeline_of(model)
    text = pipe.prompt(prompt)
    tok = model.tokenizer
    n_prompt = prompt_length(tok, text)
    limit = min(pipe.max_seq_length or model.spec.max_positions, model.spec.max_positions)
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            chunk = [(text or "") + t for t in texts[i : i + batch_size]]
            enc = tok(chunk, padding=True, truncation=True, max_length=limit, return_tensors="pt")
            ids, am = enc["input_ids"], enc["attention_mask"]
            if getattr(tok, "padding_side", "right") == "left":  # pooling reads right-padded rows
                ids, am = _right_pad(ids, am, tok.pad_token_id)
            device = getattr(model, "input_device", None) or model.device
            h = token_states(model, ids.to(device), am.to(device))
            out.append(sentence_embedding(h.float(), am.to(h.device), pipe, prompt_tokens=n_prompt).cpu())
    return torch.cat(out).numpy().astype(np.float32)


def _right_pad(ids: torch.Tensor, am: torch.Tensor, pad: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded rows moved to the right (real tokens first)."""
    order = torch.argsort(1 - am, dim=1, stable=True)
    return ids.gather(1, order), am.gather(1, order)
