"""The loader's check: headscope's forward against tracr's own, on the export's reference inputs.

:func:`forward_error` runs every reference input (tracr's ``apply`` on seeded random inputs,
:func:`~headscope.probes.models.compiled.tracr.compile_export`) through the loaded model and
returns the largest absolute difference over the residual after every half-layer (tracr's
``residuals``: ``blocks.{l}.hook_resid_mid`` and ``hook_resid_post``), on the program's own
residual dimensions (distractors add others), and the output: the value (numerical) or the
unembedded output space, whose argmax must equal tracr's decoded output at every position but BOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headscope.probes.models.inhouse.hooks import hooks


@dataclass(frozen=True)
class ForwardCheck:
    """``max_error`` over every reference input, half-layer residual and output; ``decoded_equal``:
    tracr's decoded output equals headscope's argmax at every non-BOS position; ``n_inputs``."""

    max_error: float
    decoded_equal: bool
    n_inputs: int


def forward_error(cm) -> ForwardCheck:
    """:class:`ForwardCheck` of a :class:`~headscope.probes.models.compiled.loader.CompiledModel`
    against its export's references (module docstring)."""
    export = cm.export
    net = cm.model.module
    n_layers = net.cfg.n_layers
    names = [f"blocks.{l}.hook_resid_{w}" for l in range(n_layers) for w in ("mid", "post")]
    worst, same = 0.0, True
    n_out = len(export["output_dims"])
    kept: dict[str, torch.Tensor] = {}

    def keep(name):
        def fn(x, _name=None):
            kept[name] = x.detach()
            return x

        return fn

    for ref in export["references"]:
        ids = torch.tensor([cm.encode(ref["tokens"])])

        with torch.inference_mode(), hooks((net.hook_points[n], keep(n)) for n in names):
            logits = net(ids)[0, :, :n_out]  # [pos, output]
        d = ref["residuals"].shape[-1]
        ours = torch.stack([kept[n][0, :, :d] for n in names])  # [half-layer, pos, d_program]
        worst = max(worst, float((ours - ref["residuals"]).abs().max()))
        if cm.output_values is None:
            worst = max(worst, float((logits[:, 0] - ref["unembedded"]).abs().max()))
        else:
            same &= bool((logits.argmax(-1)[1:] == ref["unembedded"][1:].long()).all())
    return ForwardCheck(max_error=worst, decoded_equal=same, n_inputs=len(export["references"]))
