"""Models: the in-house transformer, checkpoint readers, the loaders of every backend, the card.

* :mod:`.arch` — a checkpoint's architecture (:class:`ArchSpec`), read once from its HF config or GGUF
  metadata; the card, the backends' :class:`ModelSpec` and the in-house config derive from it;
* :mod:`.backends` — :class:`Backend`, the protocol every loaded model satisfies, and :class:`ModelSpec`
  (:mod:`.backends.protocol`); one module per backend (:mod:`.backends.inhouse`, :mod:`.backends.hf`,
  :mod:`.backends.bridge`);
* :mod:`.config`, :mod:`.attention`, :mod:`.transformer`, :mod:`.hooks` — the in-house stack;
* :mod:`.checkpoints` — shipped models, HF folders and GGUF files, read safely;
* :mod:`.loading` — :func:`load_model` and the registry of backends it chooses from (``BACKENDS``);
* :mod:`.card` — a model's spec sheet from its config alone;
* :mod:`.physical` — a smaller in-house model whose layers hold fewer heads;
* :mod:`.planted` — tiny models with heads built by hand (ground truth for the roles).
"""

from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.backends.bridge import BridgeModel
from headscope.probes.models.backends.hf import HFReference
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.backends.protocol import Backend, ModelSpec
from headscope.probes.models.gguf import arch_from_gguf
from headscope.probes.models.loading import load_model
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
