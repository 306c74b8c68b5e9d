"""headscope's own transformer, written to be read: the stack (``transformer``: embeddings,
blocks, norms, MLP; ``attention``: MHA/GQA/MQA, RoPE, masks, soft caps), its hook points
(``hooks``), heads physically removed (``physical``), MHA → GQA by pooled K/V
(``kv_pooling``), hand-built heads with known roles (``planted``) and per-head weight
matrices for weights-only analyses (``head_weights``). The in-house backend
(:mod:`headscope.probes.models.backends.inhouse`) wraps it; families
(:mod:`headscope.probes.models.families`) say how a checkpoint maps onto it."""
