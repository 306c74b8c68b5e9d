"""The device plan against the map that loads: a step of ``.ci/gpu-check``
(``python -m headscope.reports.cli.device_map_check [--dry-run] [--out DIR]``).

A random Llama-shaped checkpoint (8 layers, d_model 256, vocab 4096) is saved to a temporary folder;
its ``--device-map auto`` plan (:func:`~headscope.reports.device_plan.plan_devices`, on the meta
device, over every CUDA device's free memory) is printed; then the checkpoint loads with
``from_pretrained(device_map="auto", max_memory=<the plan's>)``, as the hf backend loads it, and
its ``hf_device_map`` must equal the plan's map (exit 1 with both maps otherwise). ``--dry-run``
(the CPU): the plan over two simulated 96 MiB GPUs, no load. ``--out``: ``device_map_check.json``.
"""

from __future__ import annotations

import tempfile

#: the simulated GPUs of ``--dry-run``
DRY_GPUS = {0: 96 << 20, 1: 96 << 20}


def check(dry: bool) -> dict:
    """Plan (and, unless ``dry``, load and compare) -> ``{"plan", "lines", "loaded", "equal"}``: the plan's
    record and printed lines, the loaded ``hf_device_map`` and whether it equals the plan's (None: no load)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from headscope.probes.budget import Shape, WorkingSet
    from headscope.probes.models.checkpoints import read_hf_config, resolve
    from headscope.probes.models.placement import gpu_memory, meta_model
    from headscope.reports.budget import plan
    from headscope.reports.device_plan import device_name, plan_devices

    cfg = AutoConfig.for_model(
        "llama",
        num_hidden_layers=8,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=1024,
        vocab_size=4096,
        max_position_embeddings=512,
    )
    with tempfile.TemporaryDirectory() as folder:
        cfg.save_pretrained(folder)
        source = resolve(folder)
        shape = Shape.from_hf_config(read_hf_config(source))
        ws = WorkingSet(name="roles", batch_size=8, longest=128, kept_layers=shape.n_layers, logits="all")
        budget = plan("report", shape, [ws])
        given, where = (DRY_GPUS, "simulated") if dry else (gpu_memory(), "free CUDA memory")
        placed = plan_devices(meta_model(source), budget, given, source=where)
        want = {k: device_name(v) for k, v in placed.placement.device_map.items()}
        out = {"plan": placed.record(), "lines": placed.lines(), "loaded": None, "equal": None}
        if dry:
            return out
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, device_map="auto", max_memory=placed.max_memory)
        got = {k: device_name(v) for k, v in model.hf_device_map.items()}
        out.update(loaded=got, equal=got == want)
        return out
