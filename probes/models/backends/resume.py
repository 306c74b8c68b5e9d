"""A forward that stops before a block and resumes there, for models whose own code runs the
blocks (HF transformers, the transformer-lens bridge), as the in-house ``Transformer.forward``
does with ``stop_at_layer`` / ``start_at_layer``.

Pruning and patching run many replicas of a batch that differ from layer ``l`` on (a head of
layer ``l`` ablated or patched): the blocks before ``l`` are run once and each replica resumes
at ``l``. On a model that runs its blocks one after another with the hidden states as first
argument (HF's layer loop in every family transformers 5 ships; the bridge's blocks)::

    stop at l:    a pre-hook on block l keeps its input and ends the forward (``_Halt``)
    resume at l:  blocks 0..l-1 hand their input back untouched; a pre-hook on block l
                  swaps in the stream kept before

The embeddings, masks and position tables are still computed (a gather and a few small
tensors). Whether a model's loop allows it is checked once per model, on a tiny input: stopped
at block 1 and resumed there, the output must be the whole forward's (within 1e-5). The same
check tells whether the output embedding may read chosen rows only (a decoder's logits where a
metric reads them). A model that fails either check runs whole, as before.

A class mixes this in and says where its blocks are (``_resume_blocks``), how it runs whole
(``_whole``), where the ids go (``_place``) and its output embedding (``_output_embedding``).
"""

from __future__ import annotations

import logging

import torch

from headscope.probes.errors import ModelIncompatibleError

log = logging.getLogger(__name__)


class _Halt(Exception):
    """Raised by the pre-hook of the block a stopped forward ends at."""


class ResumableForward:
    """``forward(ids, mask, *, stop_at_layer=None, start_at_layer=None, resid=None)``,
    ``resumable`` and ``unembedding`` over a model whose own code runs the blocks."""

    _resume_checked: tuple[bool, bool] | None = None  # (resumable, rows unembedded), once per model
    _tuple_out = False  # whether a block returns a tuple (hidden states first)

    def forward(
        self,
        input_ids,
        attention_mask,
        *,
        stop_at_layer: int | None = None,
        start_at_layer: int | None = None,
        resid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The model's output (logits of a decoder, last hidden states of an encoder). Where
        :attr:`resumable`, as the in-house forward: ``stop_at_layer=l`` returns the hidden
        states entering block ``l``; ``start_at_layer=l`` with that ``resid [batch, pos,
        d_model]`` runs blocks ``l..`` only."""
        ids, am = self._place(input_ids, attention_mask)
        if not stop_at_layer and not start_at_layer:
            return self._whole(ids, am)
        if not self.resumable:
            raise ModelIncompatibleError(
                f"{self.spec.name}: this model's blocks cannot be resumed from a layer (checked on load)"
            )
        return self._resumed(ids, am, stop_at_layer, start_at_layer or 0, resid)

    @property
    def resumable(self) -> bool:
        """Whether :meth:`forward` stops and resumes at a layer on this model (checked once)."""
        return self._check_resume()[0]

    @property
    def unembedding(self) -> torch.nn.Module | None:
        """A decoder's output embedding, whose input rows a caller may select
        (:func:`~headscope.probes.models.backends.protocol.unembed_at`), where checked on this model
        to give the whole forward's logits at those rows; None otherwise."""
        if not self.spec.causal or not self._check_resume()[1]:
            return None
        return self._output_embedding()

    def _resumed(self, ids, am, stop: int | None, start: int, resid) -> torch.Tensor:
        blocks = self._resume_blocks()
        if start and (resid is None or tuple(resid.shape[:2]) != tuple(ids.shape)):
            raise ValueError(
                f"start_at_layer={start} needs resid [batch={ids.shape[0]}, pos={ids.shape[1]}, d_model]; "
                f"got {None if resid is None else tuple(resid.shape)}"
            )
        kept: list[torch.Tensor] = []
        tuple_out = self._tuple_out

        def hidden(args, kwargs):
            return args[0] if args else kwargs["hidden_states"]

        def swap_in(module, args, kwargs):
            x = resid.to(hidden(args, kwargs).device)
            return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

        def halt(module, args, kwargs):
            kept.append(hidden(args, kwargs))
            raise _Halt

        def passthrough(*args, **kwargs):
            x = hidden(args, kwargs)
            return (x,) if tuple_out else x

        handles = []
        own = [vars(block).get("forward") for block in blocks[:start]]  # a wrapper may set its own
        try:
            for block in blocks[:start]:  # the instance's own entry shadows the class's forward; set in
                vars(block)["forward"] = passthrough  # its __dict__: a wrapper's __setattr__ may delegate
            if start:
                handles.append(blocks[start].register_forward_pre_hook(swap_in, with_kwargs=True))
            if stop is not None and stop < len(blocks):
                handles.append(blocks[stop].register_forward_pre_hook(halt, with_kwargs=True))
            try:
                return self._whole(ids, am)
            except _Halt:
                return kept[0]
        finally:
            for h in handles:
                h.remove()
            for block, forward in zip(blocks[:start], own, strict=True):
                if forward is None:
                    vars(block).pop("forward", None)
                else:
                    vars(block)["forward"] = forward

    def _check_resume(self) -> tuple[bool, bool]:
        if self._resume_checked is not None:
            return self._resume_checked
        resumable = rows = False
        try:
            blocks = self._resume_blocks()
            n = min(6, self.spec.max_positions or 6)
            ids, am = self._place(torch.arange(1, n + 1).remainder(self.vocab_size or 2).view(1, n), torch.ones(1, n))
            am = am.long()
            seen: list[bool] = []
            h = blocks[-1].register_forward_hook(lambda m, a, o: seen.append(isinstance(o, tuple)))
            with torch.inference_mode():
                try:
                    whole = self._whole(ids, am)
                finally:
                    h.remove()
                self._tuple_out = bool(seen and seen[0])
                if len(blocks) > 1:
                    again = self._resumed(ids, am, None, 1, self._resumed(ids, am, 1, 0, None))
                    resumable = again.shape == whole.shape and torch.allclose(again, whole, rtol=0, atol=1e-5)
                out = self._output_embedding() if self.spec.causal else None
                if resumable and out is not None:
                    keep = torch.zeros(1, n, dtype=torch.bool)
                    keep[0, -2:] = True
                    h = out.register_forward_pre_hook(lambda m, a: (a[0][keep.to(a[0].device)], *a[1:]))
                    try:
                        some = self._whole(ids, am)
                    finally:
                        h.remove()
                    want = whole[keep.to(whole.device)]
                    rows = some.shape == want.shape and torch.allclose(some, want, rtol=0, atol=1e-5)
        except Exception as e:  # noqa: BLE001 - any failure: the model runs whole, as before
            log.info("%s: forward not resumable (%s: %s)", self.spec.name, type(e).__name__, e)
            resumable = rows = False
        self._resume_checked = (bool(resumable), bool(rows))
        return self._resume_checked
