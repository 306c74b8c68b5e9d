"""headscope.probes: load models (in-house or bridge), capture Q, K, V, patterns and per-head outputs."""
