"""Models: the in-house transformer, checkpoint readers, the loaders of every backend, the card.

* :mod:`.config`, :mod:`.attention`, :mod:`.transformer`, :mod:`.hooks` — the in-house stack;
* :mod:`.checkpoints` — shipped models, HF folders and GGUF files, read safely;
* :mod:`.loading` — :func:`load_model` and the backends it returns (in-house, HF, bridge);
* :mod:`.card` — a model's spec sheet from its config alone;
* :mod:`.physical` — a smaller in-house model whose layers hold fewer heads;
* :mod:`.planted` — tiny models with heads built by hand (ground truth for the roles).
"""

from headscope.probes.models.loading import BridgeModel, InHouseModel, ModelSpec, load_model

__all__ = ["BridgeModel", "InHouseModel", "ModelSpec", "load_model"]
