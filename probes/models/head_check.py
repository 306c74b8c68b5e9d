"""The numerical check of :func:`~headscope.probes.models.hf_layout.find_layout`: on a probe
input, the attention pattern HF returns (``output_attentions``, eager) times V, head by head,
must reproduce what a candidate attention output projection receives.

V is whatever a module inside the layer's attention computes in one of the shapes V takes: a
value projection's output ``[batch, pos, kv_heads × d_head]``, the V part of a fused QKV
(``[q | k | v]`` as GPT-2 and Phi-3 stack it, ``[head, (q, k, v)]`` as BLOOM and GPT-NeoX
interleave it, ``[kv group, (q…, k, v)]`` as Falcon's new architecture groups it), a fused KV,
or per-head ``[batch, pos, kv_heads, d_head]`` / ``[batch, kv_heads, pos, d_head]`` (a norm
applied to V), any of these with a head axis of 1 (``[batch, 1, pos, features]``: MLA's ``kv_b_proj``,
``[head, (k_nope, v)]``); KV groups (GQA, MQA) are expanded to their query heads.
"""

from __future__ import annotations

import dataclasses

import torch

from headscope.probes.errors import ModelIncompatibleError

__all__ = ["TOLERANCE", "check_candidates", "default_probe", "v_readings"]

#: largest |input - pattern × V| a candidate may show, relative to max(1, its largest |input|), by dtype
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-9, torch.bfloat16: 3e-2, torch.float16: 5e-3}
#: share of pattern × V's signs (where clear of 0) a candidate's input must keep to be read as
#: pattern × V times a positive per-head gate (Beam, AFMoE) or sink scale (Granite SWA)
SIGNS_KEPT = 0.99
#: token ids of the default probe input (spread over the vocabulary, no repeats before 64 tokens)
PROBE_LENGTH = 12


def input_embeddings(model) -> torch.nn.Module | None:
    """``model.get_input_embeddings()``, or where the class has none (FSMT's encoder, a plain module;
    CANINE, which hashes characters) its first ``nn.Embedding``."""
    try:
        return model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)


def default_probe(model, spec):
    """``model``'s attention patterns (``output_attentions``) on a few token ids spread over its
    vocabulary, through its base model."""
    emb = input_embeddings(model)
    vocab = getattr(emb, "num_embeddings", None) or getattr(model.config, "vocab_size", 0) or 1
    device = emb.weight.device if emb is not None and hasattr(emb, "weight") else torch.device("cpu")
    ids = ((torch.arange(PROBE_LENGTH) * 37 + 5) % vocab)[None].to(device)
    kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "output_attentions": True}
    if spec.causal:
        kw["use_cache"] = False
    return getattr(model, "base_model", model)(**kw).attentions


def v_readings(t: torch.Tensor, heads: tuple[int, int, int], batch: int, pos: int) -> list[tuple[str, torch.Tensor]]:
    """Every way ``t`` (a module's output) holds V, with ``heads = (query heads, KV heads, d_head)``:
    ``[(layout, V [batch, pos, kv_heads, d_head])]``."""
    h, k, d = heads
    out: list[tuple[str, torch.Tensor]] = []
    if t.dim() == 4 and t.shape[0] == batch and t.shape[1] == 1 and t.shape[2] == pos and t.shape[-1] != d:
        t = t[:, 0]  # [batch, 1, pos, features]: MLA's kv_b_proj on its latent, viewed with a head axis of 1
    if t.dim() == 3 and tuple(t.shape[:2]) == (batch, pos):
        f = t.shape[-1]
        if f == k * d:
            out.append(("v", t.reshape(batch, pos, k, d)))
        if f == (h + 2 * k) * d:
            out.append(("qkv [q|k|v]", t[..., (h + k) * d :].reshape(batch, pos, k, d)))
            if h == k:
                out.append(("qkv [head, (q, k, v)]", t.reshape(batch, pos, h, 3, d)[..., 2, :]))
            out.append(("qkv [group, (q…, k, v)]", t.reshape(batch, pos, k, h // k + 2, d)[..., -1, :]))
        if h == k and f == 3 * h * d and h % 4 == 0:  # CodeGen: 4 chunks of (q, v, k), each a quarter of the heads
            out.append(
                ("qkv [4, (q, v, k)]", t.reshape(batch, pos, 4, 3, h // 4, d)[:, :, :, 1].reshape(batch, pos, h, d))
            )
        if f == 2 * k * d:
            out.append(("kv [k|v]", t[..., k * d :].reshape(batch, pos, k, d)))
            out.append(("kv [head, (k, v)]", t.reshape(batch, pos, k, 2, d)[..., 1, :]))
    elif t.dim() == 4 and t.shape[0] == batch and t.shape[-1] == d:
        if tuple(t.shape[1:3]) == (pos, k):
            out.append(("v per head", t))
        if tuple(t.shape[1:3]) == (k, pos):
            out.append(("v per head", t.transpose(1, 2)))
    return out


def _z(pattern: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """pattern × V, ``[batch, pos, heads, d_head]``, from ``pattern [batch, heads, pos, pos]`` and
    ``v [batch, pos, kv_heads, d_head]`` (each KV head serving its group of query heads)."""
    v = v.float().repeat_interleave(pattern.shape[1] // v.shape[2], dim=2)
    return torch.einsum("bhqk,bkhd->bqhd", pattern.float(), v)


def _compare(x: torch.Tensor, z: torch.Tensor) -> tuple[float, float]:
    """``(max |x - z|, share of the elements of z clear of 0 whose sign x keeps)`` with ``x`` the
    candidate's input ``[batch, pos, heads × d_head]``."""
    x = x.float().reshape(z.shape)
    clear = z.abs() > 1e-3 * float(z.abs().max())
    same = (torch.sign(x) == torch.sign(z))[clear]
    return float((x - z).abs().max()), float(same.float().mean()) if same.numel() else 0.0


def _kv_counts(spec) -> list[int]:
    """The KV head counts V is read with: the spec's, then every other divisor of the query heads,
    most first (a config may name KV heads its model does not use, or name them its own way)."""
    return list(dict.fromkeys((spec.n_kv_heads, *(k for k in range(spec.n_heads, 0, -1) if spec.n_heads % k == 0))))


#: a bias added to V after a fused projection that has none (DeBERTa's ``v_bias``), by parameter name
V_BIAS_NAMES = ("v_bias", "value_bias")


def _v_biases(outputs, l: int, width: int, v: torch.Tensor) -> list[torch.Tensor]:
    """The biases V may be read with in layer ``l``: none, then each of the layer's parameters named
    :data:`V_BIAS_NAMES` of ``width`` elements (``outputs["v_bias", l]``, kept by :func:`_capture`)."""
    return [torch.zeros(width, dtype=v.dtype, device=v.device)] + [
        b for b in outputs.get(("v_bias", l), ()) if b.numel() == width
    ]


def _worst(inputs, outputs, attentions, i, spec, batch, pos, heads=None) -> tuple[float, float, set[int], bool]:
    """``(largest relative error over the layers, smallest share of signs kept, the KV head counts
    read, whether any module held V)`` of candidate ``i``, each layer read with its best V (a
    layer may have its own KV heads: MiMo's sliding layers double them)."""
    worst, kept, counts, seen = 0.0, 1.0, set(), False
    for l, pattern in enumerate(attentions):
        x = inputs.get((i, l))
        if x is not None and heads is not None:
            x = x[..., :heads]  # the heads' part (ConvBERT: its convolution's outputs follow)
        zs = [
            (k, _z(pattern, v + bias.reshape(1, 1, k, spec.d_head).to(v.dtype)))
            for k in _kv_counts(spec)
            for _, t in outputs[l]
            for _, v in v_readings(t, (spec.n_heads, k, spec.d_head), batch, pos)
            for bias in _v_biases(outputs, l, k * spec.d_head, v)
        ]
        seen = seen or bool(zs)
        if x is None or tuple(x.shape[:2]) != (batch, pos) or not zs:
            return float("inf"), 0.0, counts, seen
        scores = [(*_compare(x, z), k) for k, z in zs]
        err, _, k = min(scores)
        counts.add(k)
        worst = max(worst, err / max(1.0, float(x.float().abs().max())))
        kept = min(kept, max(sign for _, sign, _ in scores))
    return worst, kept, counts, seen


def _capture(model, cands, blocks, probe, spec, inside):
    """One probe run: ``(attentions, inputs {(candidate index, layer): tensor}, outputs
    {layer: [(module path, tensor)]})`` of every module of each block whose path ``inside`` accepts."""
    inputs: dict = {}
    outputs: dict = {l: [] for l in range(len(blocks))}
    handles = []

    def keep_in(key):
        return lambda m, a: inputs.__setitem__(key, a[0].detach()) if a and torch.is_tensor(a[0]) else None

    def keep_out(l, rel):
        def hook(m, a, o):  # a tuple: each tensor of it (ZAYA's CCA projection returns (query, key, value))
            for t in o if isinstance(o, tuple) else (o,):
                if torch.is_tensor(t):
                    outputs[l].append((rel, t.detach()))

        return hook

    try:
        for i, c in enumerate(cands):
            for l, m in enumerate(c.modules):
                handles.append(m.register_forward_pre_hook(keep_in((i, l))))
        for l, block in enumerate(blocks):
            outputs["v_bias", l] = [
                p.detach().reshape(-1)
                for rel, p in block.named_parameters()
                if rel.split(".")[-1] in V_BIAS_NAMES and inside(rel.rpartition(".")[0] or rel)
            ]
            for rel, m in block.named_modules():
                if rel and inside(rel):
                    handles.append(m.register_forward_hook(keep_out(l, rel)))
        with torch.inference_mode():
            attentions = probe(model) if probe is not None else default_probe(model, spec)
    finally:
        for h in handles:
            h.remove()
    return attentions, inputs, outputs


def _why_unchecked(attentions, spec) -> str | None:
    if attentions is None:
        return "the model returns no attention pattern (output_attentions)"
    if not isinstance(attentions, (tuple, list)) or any(not torch.is_tensor(a) or a.dim() != 4 for a in attentions):
        return "output_attentions gives no [batch, head, query, key] pattern per layer (Pegasus-X: local/global dicts)"
    if len(attentions) != spec.n_layers:
        return f"output_attentions gives {len(attentions)} patterns, not one per layer ({spec.n_layers})"
    if attentions[0].shape[1] != spec.n_heads:
        return f"output_attentions has {attentions[0].shape[1]} heads, not {spec.n_heads}"
    return None


def _turned(inputs, outputs, attentions) -> tuple[int, int] | None:
    """The two axes every candidate's input has turned from ``[batch, position, features]``: ``(0, 1)``
    where it is ``[position, batch, features]`` (FSMT's fairseq layers run time-major), ``(1, 2)`` where
    ``[batch, features, position]`` (SqueezeBERT's 1×1 convolutions run channels first); each such tensor
    captured is then turned back in place. None where the inputs are batch and position first."""
    batch, _, pos, _ = attentions[0].shape
    shapes = {tuple(x.shape) for x in inputs.values() if x.dim() == 3}
    if not inputs or len(shapes) != len({tuple(x.shape) for x in inputs.values()}):
        return None
    if batch != pos and {s[:2] for s in shapes} == {(pos, batch)}:
        axes, turned = (0, 1), lambda t: t.dim() == 3 and tuple(t.shape[:2]) == (pos, batch)
    elif all(s[0] == batch and s[2] == pos and s[1] != pos for s in shapes):
        axes, turned = (1, 2), lambda t: t.dim() == 3 and t.shape[0] == batch and t.shape[2] == pos
    else:
        return None
    for key, x in inputs.items():
        inputs[key] = x.transpose(*axes)
    for l, kept in outputs.items():
        if isinstance(l, int):
            outputs[l] = [(rel, t.transpose(*axes) if turned(t) else t) for rel, t in kept]
    return axes


def check_candidates(model, spec, cands, blocks, inside, probe=None):
    """``(candidate, check)``: the first of ``cands`` whose input is pattern × V in every layer on
    the probe input, with its largest error; where the check cannot be made (no pattern returned,
    nothing holding V), the first candidate by name, or the only one, with ``"shape only: <why>"``.
    ``ModelIncompatibleError`` (one line) when none passes, or several match the shape alone.
    ``blocks``: the layers; ``inside(path)``: whether a module of a block lies in its attention
    (its output may hold V)."""
    try:
        attentions, inputs, outputs = _capture(model, cands, blocks, probe, spec, inside)
    except Exception as e:  # noqa: BLE001 - a probe that cannot run leaves the shape alone, saying why
        attentions, inputs, outputs = None, {}, {}
        why = f"the probe forward failed ({type(e).__name__}: {str(e).strip()[:120]})"
    else:
        why = _why_unchecked(attentions, spec)
    turn = _turned(inputs, outputs, attentions) if why is None else None
    if turn is not None:  # read as [batch, position, …]; the layout says so
        cands = [dataclasses.replace(c, turn=turn) for c in cands]
    errors: dict[int, float] = {}
    gated: list[tuple[int, float]] = []  # candidates whose input keeps pattern × V's signs: a gate after it
    v_seen = False
    if why is None:
        batch, _, pos, _ = attentions[0].shape
        tol = TOLERANCE.get(next(model.parameters()).dtype, 1e-5)
        for i, c in enumerate(cands):
            try:
                worst, kept, counts, seen = _worst(inputs, outputs, attentions, i, spec, batch, pos, c.heads)
            except RuntimeError:  # an input or output of a shape no reading fits: this candidate fails
                worst, kept, counts, seen = float("inf"), 0.0, set(), False
            v_seen = v_seen or seen
            errors[i] = worst
            if worst <= tol:
                other = sorted(counts - {spec.n_kv_heads})
                note = (
                    f" (V read with {'/'.join(map(str, sorted(counts)))} KV heads; the config says {spec.n_kv_heads})"
                )
                return c, f"pattern×V max err {worst:.1e}{note if other else ''}"
            if kept >= SIGNS_KEPT:
                gated.append((i, worst))
        if gated:  # each head's slice is that head's pattern × V, scaled by a positive gate: still one head's
            i, worst = gated[0]
            return cands[i], (
                "shape only: a per-head transform after pattern × V (a gate or sink scaling: the input keeps "
                f"pattern × V's signs, max err {worst:.1e})"
            )
        if not v_seen:
            why = "V not capturable (no module inside the attention outputs a tensor shaped as V)"
    if why is not None:
        named = [c for c in cands if c.by_name]
        if named or len(cands) == 1:
            return (named or cands)[0], f"shape only: {why}"
        raise ModelIncompatibleError(
            f"{spec.name!r} ({spec.family}): {len(cands)} modules take heads × d_head to d_model "
            f"({', '.join(c.pattern for c in cands)}) and none can be checked ({why}); use --backend bridge"
        )
    tried = ", ".join(f"{c.pattern} (err {errors.get(i, float('inf')):.1e})" for i, c in enumerate(cands))
    raise ModelIncompatibleError(
        f"{spec.name!r} ({spec.family}): no attention output projection's input is pattern × V on a probe input "
        f"(tried {tried}); use --backend bridge"
    )
