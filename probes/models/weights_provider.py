"""One provider of per-head weights for every backend: :func:`model_weights` gives a loaded model's
:class:`~headscope.probes.models.inhouse.head_weights.ModelWeights` — the in-house model's
(:func:`~headscope.probes.models.inhouse.head_weights.head_weights`, unchanged: norms folded), or an
hf-backend model's, read from its modules and checked against its forward
(:func:`~headscope.probes.models.hf_weights.hf_weights`). :func:`weights_refusal` says, in one line,
why a model has none (the module path not understood, the check that failed, or the backend).

>>> from headscope.probes.models.inhouse.planted import planted_model
>>> type(model_weights(planted_model())).__name__, weights_refusal(planted_model())
('ModelWeights', None)
"""

from __future__ import annotations

import weakref

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.inhouse.head_weights import ModelWeights, head_weights

__all__ = ["model_weights", "weights_refusal"]

#: model -> its weights or the refusal's message (the hf check runs a forward: once per model)
_DONE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _provide(model) -> ModelWeights:
    backend = getattr(model, "backend", None)
    if backend == "hf":
        from headscope.probes.models.hf_weights import hf_weights

        try:
            return hf_weights(model)
        except ModelIncompatibleError:
            raise
        except Exception as e:  # noqa: BLE001 - a module tree the reader cannot walk: the stage is absent, saying why
            raise ModelIncompatibleError(
                f"per-head weights of {model.spec.name!r} could not be read ({type(e).__name__}: {str(e).strip()[:160]})"
            ) from None
    if backend in (None, "inhouse") or not hasattr(model, "backend"):
        return head_weights(model)
    raise ModelIncompatibleError(
        f"per-head weights are read from the in-house and hf backends; backend {backend} has none "
        "(load with --backend hf or inhouse)"
    )


def model_weights(model) -> ModelWeights:
    """``model``'s :class:`ModelWeights` (in-house: folded norms; hf: checked, not folded);
    :class:`ModelIncompatibleError` with the reason where it has none (the same one on each call)."""
    try:
        done = _DONE.get(model)
    except TypeError:  # not weak-referenceable
        done = None
    if done is None:
        try:
            done = _provide(model)
        except ModelIncompatibleError as e:
            done = e
        try:
            _DONE[model] = done
        except TypeError:
            pass
    if isinstance(done, ModelIncompatibleError):
        raise ModelIncompatibleError(str(done))
    return done


def weights_refusal(model) -> str | None:
    """Why ``model`` has no per-head weights (one line), or None."""
    try:
        model_weights(model)
    except ModelIncompatibleError as e:
        return str(e).strip().splitlines()[0]
    return None
