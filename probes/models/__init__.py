"""Models: the in-house transformer, checkpoint readers, the loaders of every backend, the card.

* :mod:`.arch` — a checkpoint's architecture (:class:`ArchSpec`), read once from its HF config or GGUF
  metadata; the card, the backends' :class:`ModelSpec` and the in-house config derive from it;
* :mod:`.backend` — :class:`Backend`, the protocol every loaded model satisfies, and :class:`ModelSpec`;
* :mod:`.config`, :mod:`.attention`, :mod:`.transformer`, :mod:`.hooks` — the in-house stack;
* :mod:`.checkpoints` — shipped models, HF folders and GGUF files, read safely;
* :mod:`.loading` — :func:`load_model` and the backends it returns (in-house, HF, bridge);
* :mod:`.card` — a model's spec sheet from its config alone;
* :mod:`.physical` — a smaller in-house model whose layers hold fewer heads;
* :mod:`.planted` — tiny models with heads built by hand (ground truth for the roles).
"""

from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.backend import Backend, ModelSpec
from headscope.probes.models.gguf import arch_from_gguf
from headscope.probes.models.loading import BridgeModel, HFReference, InHouseModel, load_model
from headscope.probes.models.spec import ArchSpec

__all__ = [
    "ArchSpec",
    "Backend",
    "BridgeModel",
    "HFReference",
    "InHouseModel",
    "ModelSpec",
    "arch_from_gguf",
    "arch_from_hf_config",
    "load_model",
]
