"""The backends a loaded model runs on, one module each, and the protocol they share.

* :mod:`.protocol` — :class:`~.protocol.Backend` (what analyses may ask of any loaded model),
  :class:`~.protocol.ModelSpec`, and the helpers every backend shares (``batch_to``, ``placement``,
  ``unembed_at``, ``check_head_hooks``);
* :mod:`.inhouse` — headscope's own transformer (every hook point, head gates);
* :mod:`.hf` — plain HF transformers, eager attention (the reference);
* :mod:`.bridge` — transformer-lens' ``TransformerBridge``;
* :mod:`.resume` — a forward stopped and resumed at a layer, for hf and the bridge.

The registry of backends, and the loader that chooses among them, is
:mod:`headscope.probes.models.loading` (``BACKENDS``, ``load_model``).
"""
