"""Circuits read from the weights alone (Elhage et al. 2021): per-head OV copying scores and
OV/QK norms (:mod:`.ov_qk`), composition scores between heads of different layers
(:mod:`.composition`), each against a Gaussian baseline (:mod:`.baselines`), as tidy frames
(:mod:`.frames`). Weights come from :func:`headscope.probes.models.weights_provider.model_weights` (in-house or hf).
"""
