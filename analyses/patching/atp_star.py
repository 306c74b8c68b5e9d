"""AtP* corrections to attribution patching (Kramár et al. 2024), ``PatchConfig.atp_fix``.

Plain attribution patching (:mod:`~headscope.analyses.patching.attribution`) estimates a
unit's effect by ``Δz · ∂m/∂z``, ``∂m/∂z`` the total derivative. Two of its failure modes
have corrections here (in-house backend only: they read its hook points):

* **QK-fix** (``"qk"``): a later head whose softmax saturates passes almost no gradient to
  its queries and keys, so a sender whose effect runs through them (a previous-token head
  feeding an induction head's keys) gets an estimate near 0. The fix replaces, for every
  later layer ``l'``, the linearised change of its attention patterns by the exact one:
  the sender's write into the residual stream, ``Δr = W_O Δz`` (what a pre-norm model adds
  unchanged to every later layer's input), is added to the input of layer ``l'``, its
  patterns ``A'`` are recomputed (norm, Q/K projections, RoPE, softmax) and the estimate
  becomes ``Δz · ∂m/∂z − Σ_l' ⟨∂m/∂A_l', J_l' Δr⟩ + Σ_l' ⟨∂m/∂A_l', A'_l' − A_l'⟩``:
  the gradient's own first-order term along that route (``J_l' Δr``, a local backward of
  ``⟨∂m/∂A_l', A_l'(r)⟩``) is taken out and the exact pattern change put in. Every other
  path (values, MLPs, the residual stream, the route through intermediate layers) keeps its
  first-order term. Pre-norm models only (a post-norm or sandwich-norm layer does not add a
  sender's write unchanged to later inputs): ``ModelIncompatibleError`` otherwise.
* **GradDrop** (``"graddrop"``): a unit's direct and indirect effects can cancel in the
  gradient. For each layer ``ℓ`` other than the unit's own, the estimate is recomputed with
  the gradient through layer ``ℓ``'s residual contribution dropped (its attention and MLP
  outputs detached; forward values unchanged), and the unit's figure is the mean of their
  absolute values, ``1/(L−1) Σ_{ℓ≠l} |ĉ_ℓ|`` per item (a layer below the unit leaves its
  estimate as it is). GradDrop values are magnitudes: compare them with ``|effect|``.
* ``"both"``: GradDrop over QK-fixed estimates.

Whole-sequence units only (``per_position`` is refused), the total gradient only.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from headscope.analyses.patching.activation import ATP_FIXES, readout
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.inhouse.hooks import hooks
from headscope.probes.models.inhouse.layer_ops import dropped_layer, head_write, layer_pattern

#: the method label of each correction's frames (``{label}_{direction}``)
ATP_LABELS = {"qk": "attribution_qk_fix", "graddrop": "attribution_graddrop", "both": "attribution_qk_fix_graddrop"}


def check_atp_model(model, fix: str) -> None:
    """``ModelIncompatibleError`` where ``fix`` cannot run on ``model`` (module docstring)."""
    if fix == "none":
        return
    if getattr(model, "backend", None) != "inhouse" or not hasattr(model, "network"):
        raise ModelIncompatibleError(
            f"--atp-fix {fix} needs the in-house backend's hook points; got backend "
            f"{getattr(model, 'backend', '?')!r}: load with --backend inhouse"
        )
    cfg = model.network.cfg
    if fix in ("graddrop", "both") and model.spec.n_layers < 2:
        raise ModelIncompatibleError(f"--atp-fix {fix} drops other layers' gradients; the model has one layer")
    if fix in ("qk", "both"):
        if cfg.post_norm or cfg.sandwich_norm:
            layout = "post-norm" if cfg.post_norm else "sandwich-norm"
            raise ModelIncompatibleError(
                f"--atp-fix {fix}: the QK-fix adds a sender's write W_O Δz to every later layer's input, as a pre-norm "
                f"model does; {model.spec.name!r} is {layout} (use --atp-fix graddrop or none)"
            )
        if cfg.heads_kept is not None:
            raise ModelIncompatibleError(f"--atp-fix {fix} needs every head of every layer; the model is pruned")


def gradients(model, ids, metric, answer, wrong, *, drop: int | None = None, patterns: bool = False):
    """One forward and backward at ``ids``: ``({layer: ∂m/∂z}, {layer: ∂m/∂A} (``patterns``),
    {layer: residual entering the layer} (``patterns``))``, layer ``drop``'s residual
    contribution dropped from the gradient (:func:`~headscope.probes.models.inhouse.layer_ops.dropped_layer`)."""
    module, n_layers = model.network, model.spec.n_layers
    zs: dict[int, torch.Tensor] = {}
    pats: dict[int, torch.Tensor] = {}
    pre: dict[int, torch.Tensor] = {}

    def zprobe(l):
        def fn(z):
            d = zs[l] = torch.zeros_like(z, requires_grad=True)
            return z + d

        return fn

    def aprobe(l):
        def fn(a, name):
            d = pats[l] = torch.zeros_like(a, requires_grad=True)
            return a + d

        return fn

    pairs = []
    if patterns:
        for l in range(n_layers):
            pairs.append((model.hook_points[f"blocks.{l}.attn.hook_pattern"], aprobe(l)))
            pairs.append((model.hook_points[f"blocks.{l}.hook_resid_pre"], lambda t, name, l=l: pre.__setitem__(l, t)))
    with ExitStack() as stack:
        stack.enter_context(torch.enable_grad())
        stack.enter_context(model.head_hooks({l: zprobe(l) for l in range(n_layers)}))
        stack.enter_context(hooks(pairs))
        stack.enter_context(dropped_layer(module, drop))
        m = metric(readout(model, ids), answer, wrong)
        leaves = [zs[l] for l in range(n_layers)] + ([pats[l] for l in range(n_layers)] if patterns else [])
        grads = torch.autograd.grad(m.sum(), leaves, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g.detach() for x, g in zip(leaves, grads)]
    gz = dict(enumerate(grads[:n_layers]))
    ga = dict(enumerate(grads[n_layers:]))
    return gz, ga, {l: t.detach() for l, t in pre.items()}


def _writes(module, units, dz: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """Per unit, its heads' write into the residual stream ``W_O Δz`` ``[batch, pos, d_model]``."""
    out = []
    for heads in units:
        l = heads[0][0]
        keep = torch.zeros(dz[l].shape[1], dtype=dz[l].dtype)
        keep[[h for _, h in heads]] = 1
        out.append(head_write(module, l, dz[l] * keep[None, :, None, None]))  # the unit's heads only
    return out


def qk_terms(model, ids, units, dz, grads_a: list[dict], pre: dict, max_rows: int) -> torch.Tensor:
    """``[variant, batch, unit]``: per gradient variant (``grads_a[v]`` its ``{layer: ∂m/∂A}``)
    the QK-fix's correction ``Σ_l' ⟨∂m/∂A_l', A'_l' − A_l'⟩ − Σ_l' ⟨∂m/∂A_l', J_l' Δr⟩`` of
    each unit (module docstring), ``Δr`` its write (:func:`_writes`), ``l'`` above its layer."""
    module, n_layers = model.network, model.spec.n_layers
    with torch.no_grad():
        writes = _writes(module, units, dz)
    b = ids.shape[0]
    out = torch.zeros(len(grads_a), b, len(units))
    for lp in range(1, n_layers):
        below = [i for i, heads in enumerate(units) if heads[0][0] < lp]
        r = pre[lp]
        with torch.enable_grad():
            leaf = r.clone().requires_grad_(True)
            base = layer_pattern(module, lp, leaf, ids)
            for v, ga in enumerate(grads_a):  # the gradient's own term along the route: ⟨J^T G, Δr⟩
                (g_r,) = torch.autograd.grad(base, leaf, grad_outputs=ga[lp].to(base.dtype), retain_graph=True)
                for i in below:
                    out[v, :, i] -= (g_r * writes[i]).float().sum((1, 2)).cpu()
        base = base.detach()
        g_stack = torch.stack([ga[lp] for ga in grads_a]).float()  # [variant, batch, head, q, k]
        per = max(1, max_rows // b)
        for s in range(0, len(below), per):
            chunk = below[s : s + per]
            resid = (r[None] + torch.stack([writes[i] for i in chunk])).reshape(len(chunk) * b, *r.shape[1:])
            with torch.inference_mode():
                new = layer_pattern(module, lp, resid, ids.repeat(len(chunk), 1))
            diff = (new.view(len(chunk), *base.shape) - base[None]).float()  # [R, batch, head, q, k]
            out[:, :, chunk] += torch.einsum("vbhqk,rbhqk->vbr", g_stack, diff).cpu()
    return out


def atp_star_estimates(model, ids, dz: dict, metric, answer, wrong, units, fix: str, max_rows: int) -> torch.Tensor:
    """``[batch, unit]``: the ``fix``-corrected estimate of ``Δz · ∂m/∂z`` at ``ids`` for each
    unit (``dz``: ``{layer: z_other − z_at}``); GradDrop's are magnitudes (module docstring)."""
    if fix not in ATP_FIXES or fix == "none":
        raise ValueError(f"atp_fix must be one of {ATP_FIXES[1:]} here; got {fix!r}")
    qk, gd = fix in ("qk", "both"), fix in ("graddrop", "both")
    n_layers = model.spec.n_layers
    plain, grads_a, pre = [], [], None
    for drop in [None, *(range(1, n_layers) if gd else ())]:  # dropping layer 0 changes no estimate above it
        gz, ga, p = gradients(model, ids, metric, answer, wrong, drop=drop, patterns=qk)
        pre = p if pre is None else pre
        per_head = {l: (dz[l] * gz[l]).float().sum((2, 3)).cpu() for l in gz}  # [batch, head]
        plain.append(torch.stack([sum(per_head[l][:, h] for l, h in heads) for heads in units], 1))
        grads_a.append(ga)
    est = torch.stack(plain)  # [variant, batch, unit]: variant 0 the full gradient, v >= 1 layer v dropped
    if qk:
        est = est + qk_terms(model, ids, units, dz, grads_a, pre, max_rows)
    if not gd:
        return est[0]
    layer_of = torch.tensor([heads[0][0] for heads in units])
    total = torch.zeros_like(est[0])
    for drop in range(n_layers):  # 1/(L-1) Σ_{ℓ ≠ the unit's layer} |ĉ_ℓ|
        total += est[drop].abs() * (layer_of != drop)
    return total / (n_layers - 1)
