"""What a head's effective OV circuit reads (Gould et al. 2023): each token's **extended embedding**,
its residual after block 0 when it stands alone (a one-token sequence, no BOS: the embedding, with
the first position's where the model adds one, layer 0's attention, which can only read the token
itself, and MLP0), and the value ``v = norm_L(e) W_V + b_V`` each head of layer ``L`` would read from
a position holding it, through the layer's own input norm module. In-house: ``ln1`` and ``v_proj``;
hf: the norm whose output the value projection reads, found on one forward, with the provider's
``W_V`` and ``b_V`` (:func:`~headscope.probes.models.weights_provider.model_weights`). The two agree on
a random Llama (tests/analyses/roles/test_successor_ov.py). A post-norm model, or a layer whose value
projection reads no norm found, raises :class:`ModelIncompatibleError`.
"""

from __future__ import annotations

import torch

from headscope.probes.errors import ModelIncompatibleError

__all__ = ["extended_embeddings", "ov_values"]


def extended_embeddings(model, ids: list[int]) -> torch.Tensor:
    """``[n, d_model]`` (float32, the model's device): each token's residual after block 0 when it
    stands alone (module docstring)."""
    from headscope.probes.capture import on_model_device
    from headscope.probes.tokens import collate, pad_id

    tok = model.tokenizer
    rows = [
        {"ids": [i], "text": "", "words": [], "tokens": tok.convert_ids_to_tokens([i]), "offsets": [(0, 0)]}
        | {"word_ids": [None], "special": [False]}
        for i in ids
    ]
    batch = on_model_device(collate(rows, pad_id(tok)), model)
    with torch.inference_mode():
        out = model.run(batch, quantities=("resid_post",), layers=[0])
    return out["resid_post", 0][:, 0].float()


def _inhouse_values(model, e: torch.Tensor, layers) -> dict[int, torch.Tensor]:
    net = model.network
    if net.cfg.post_norm:
        raise ModelIncompatibleError("a post-norm model reads the extended embedding through later norms first")
    out = {}
    with torch.inference_mode():
        for l in layers:
            block = net.blocks[l]
            x = block.ln1(e.to(block.ln1.weight.dtype)[:, None])  # [n, 1, d_model]
            v = block.attn._split(block.attn.v_proj(x), block.attn.n_kv_heads)[:, :, 0]  # [n, kv_head, d_head]
            out[l] = v[:, block.attn.kv_index.to(v.device)].transpose(0, 1).float()  # [head, n, d_head]
    return out


def _hf_norms(model, weights, layers) -> dict[int, torch.nn.Module | None]:
    """Per layer, the norm module whose output the value projection reads (None: the residual itself),
    found on one forward; ``ModelIncompatibleError`` where neither matches."""
    kept: dict = {}
    norms: dict = {l: {} for l in layers}
    blocks = model.layout.blocks

    def first(t):
        return t[0] if isinstance(t, tuple) else t

    handles = []
    for l in layers:
        handles.append(
            blocks[l].register_forward_pre_hook(
                lambda m, a, kw, l=l: kept.__setitem__(("in", l), a[0] if a else kw.get("hidden_states")),
                with_kwargs=True,
            )
        )
        handles.append(
            weights.source.projections[l].v.register_forward_pre_hook(
                lambda m, a, l=l: kept.__setitem__(("v", l), first(a))
            )
        )
        for rel, m in blocks[l].named_modules():
            if rel and "norm" in type(m).__name__.lower():
                handles.append(
                    m.register_forward_hook(lambda m, a, o, l=l, rel=rel: norms[l].__setitem__(rel, (m, first(o))))
                )
    text = model.encode(texts=["1 2 3 Monday Tuesday"])
    try:
        with torch.inference_mode():
            model.forward(text.input_ids.to(model.input_device), text.attention_mask.to(model.input_device))
    finally:
        for h in handles:
            h.remove()
    out: dict = {}
    for l in layers:
        v_in = kept["v", l]
        hit = [m for m, t in norms[l].values() if torch.is_tensor(t) and t.shape == v_in.shape and _close(t, v_in)]
        if hit:
            out[l] = hit[0]
        elif torch.is_tensor(kept.get(("in", l))) and kept["in", l].shape == v_in.shape and _close(kept["in", l], v_in):
            out[l] = None
        else:
            raise ModelIncompatibleError(f"layer {l}'s value projection reads no norm of the residual found here")
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float(), b.float()
    return bool((a - b).norm() <= 1e-4 * b.norm().clamp_min(1e-12))


def _hf_values(model, e: torch.Tensor, layers) -> dict[int, torch.Tensor]:
    from headscope.probes.models.weights_provider import model_weights

    w = model_weights(model)
    norms = _hf_norms(model, w, layers)
    out = {}
    with torch.inference_mode():
        for l in layers:
            norm = norms[l]
            x = e if norm is None else norm(e.to(next(norm.parameters(), e).dtype)[:, None])[:, 0]
            lw = w.layer(l)
            v = torch.einsum("nd,kde->kne", x.float().cpu(), lw.W_V)  # [kv_head, n, d_head]
            if lw.b_V is not None:
                v = v + lw.b_V[:, None]
            out[l] = v[lw.kv_index]
    return out


def ov_values(model, e: torch.Tensor, layers) -> dict[int, torch.Tensor]:
    """``{layer: [head, n, d_head]}`` (float32, CPU): the value each head reads from the extended
    embeddings ``e [n, d_model]``; ``ModelIncompatibleError`` (one line) where it cannot be read."""
    backend = getattr(model, "backend", "inhouse")
    if backend == "inhouse":
        return {l: v.cpu() for l, v in _inhouse_values(model, e, layers).items()}
    if backend == "hf":
        return _hf_values(model, e, layers)
    raise ModelIncompatibleError(f"the effective OV circuit is read on the in-house and hf backends; got {backend}")
