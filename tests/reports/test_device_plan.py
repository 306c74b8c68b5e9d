"""The ``--device-map auto`` plan (reports/device_plan.py, probes/models/placement.py) and ``--dry-run``.

A Qwen2-shaped checkpoint saved as its config alone (no weights: the plan must not need them) is
placed over 2 and 3 simulated GPUs (``--max-memory``), each smaller than the model and its working
set: the layers go to the devices in order, each device's weights and working set fit its memory,
the bytes add up to the model's, and the map is the one accelerate's ``infer_auto_device_map`` and
transformers' ``from_pretrained(device_map="auto")`` path compute under the same memory.
"""

from __future__ import annotations

import re

import pytest

from headscope.probes.budget import Shape, WorkingSet
from headscope.probes.errors import MemoryBudgetError

MiB = 1 << 20
N_LAYERS = 12


def _qwen2_config(vocab_size: int, tied: bool):
    """A Qwen2 config of ``N_LAYERS`` small layers (4 query heads on 2 KV heads), no weights."""
    from transformers import AutoConfig

    return AutoConfig.for_model(
        "qwen2",
        num_hidden_layers=N_LAYERS,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=1024,
        vocab_size=vocab_size,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory):

    cfg = _qwen2_config(vocab_size=2048, tied=False)
    out = tmp_path_factory.mktemp("qwen2-config-only")
    cfg.save_pretrained(out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]  # no weight file anywhere
    return out


@pytest.fixture(scope="module")
def meta(folder):
    from headscope.probes.models.checkpoints import resolve
    from headscope.probes.models.placement import meta_model

    return meta_model(resolve(str(folder)))


@pytest.fixture(scope="module")
def budget(folder):
    """A report's memory plan of one roles-like stage (every layer's patterns kept, every logit read)."""
    from headscope.probes.models.checkpoints import read_hf_config, resolve
    from headscope.reports.budget import plan

    shape = Shape.from_hf_config(read_hf_config(resolve(str(folder))))
    ws = WorkingSet(name="roles", batch_size=4, longest=64, kept_layers=N_LAYERS, logits="all", reducers=True)
    return plan("report", shape, [ws])


def _layers(plan) -> list[tuple[int, ...]]:
    return [plan.placement.layers()[d] for d in plan.given]


@pytest.mark.parametrize("n_devices, each", [(2, 44 * MiB), (3, 30 * MiB)])
def test_layers_contiguous_bytes_add_up_each_device_within_its_memory(meta, budget, n_devices, each):
    from headscope.probes.models.placement import model_bytes
    from headscope.reports.device_plan import plan_devices

    given = dict.fromkeys(range(n_devices), each)
    p = plan_devices(meta, budget, given, source="--max-memory")
    weights, total = p.placement.weights(), model_bytes(meta)
    assert total == sum(int(t.numel()) * t.element_size() for t in [*meta.parameters(), *meta.buffers()])
    assert total > each  # the model alone needs more than one device: it is spread
    layers = _layers(p)
    assert [i for held in layers for i in held] == list(range(N_LAYERS))  # in order, each layer once
    assert all(held == tuple(range(held[0], held[-1] + 1)) for held in layers if held)
    assert sum(1 for held in layers if held) >= 2
    assert sum(weights[d] for d in given) == total == p.placement.total_bytes
    assert not p.placement.offloaded()
    for d in given:
        assert weights[d] + p.working[d] <= given[d]
        assert p.max_memory[d] <= given[d]  # what the load passes to from_pretrained
    # the working set lands where its parts are made: logits with the unembedding, patterns gathered with the embedding
    parts = budget.estimate.parts["roles"]
    assert p.working[p.placement.output_device] >= parts["logits"]
    assert p.working[p.placement.input_device] >= parts["patterns"] + parts["reducers"]
    rows = p.rows()
    assert [r["n_layers"] for r in rows] == [len(h) for h in layers]
    lines = p.lines()
    assert lines[0].startswith("device plan (--device-map auto")
    for d, held in zip(given, layers):
        row = next(line for line in lines if line.strip().startswith(f"cuda:{d} "))
        assert (f"{held[0]}-{held[-1]} ({len(held)})" if held else " - ") in row


@pytest.mark.parametrize("n_devices, each", [(2, 44 * MiB), (3, 30 * MiB)])
def test_the_map_is_accelerates_and_from_pretrained_auto(meta, budget, n_devices, each):
    import accelerate
    from transformers.integrations.accelerate import _get_device_map, get_balanced_memory

    from headscope.reports.device_plan import plan_devices

    p = plan_devices(meta, budget, dict.fromkeys(range(n_devices), each), source="--max-memory")
    room = p.max_memory  # what the load passes to from_pretrained(max_memory=...)
    no_split = meta._no_split_modules
    balanced = get_balanced_memory(meta, max_memory=dict(room), no_split_module_classes=no_split)
    theirs = accelerate.infer_auto_device_map(meta, max_memory=balanced, no_split_module_classes=no_split)
    assert dict(theirs) == p.placement.device_map
    assert dict(_get_device_map(meta, "auto", dict(room), None)) == p.placement.device_map


def test_a_model_that_fits_no_combination_is_refused_in_one_line(meta, budget):
    from headscope.reports.device_plan import plan_devices

    with pytest.raises(MemoryBudgetError, match=r"needs ~.* MiB and the devices hold 16.0 MiB") as err:
        plan_devices(meta, budget, {0: 8 * MiB, 1: 8 * MiB}, source="--max-memory")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["0", "0=", "a=1GiB", "-1=1GiB", "0=8XB", "0=1GiB,0=2GiB", "0=0", "0=1GiB,,"])
def test_bad_max_memory_is_one_line(text):
    from headscope.probes.models.placement import parse_max_memory

    with pytest.raises(ValueError, match=r"^--max-memory must be GPU=SIZE pairs") as err:
        parse_max_memory(text)
    assert "\n" not in str(err.value)


def test_max_memory_reads_sizes_as_accelerate_does():
    from headscope.probes.models.placement import parse_max_memory

    assert parse_max_memory("0=8GiB, 1=1.5GB,2=4096") == {0: 8 << 30, 1: 1_500_000_000, 2: 4096}


def test_a_gpu_not_here_is_refused_before_a_load():
    from headscope.reports.device_plan import check_present

    with pytest.raises(ValueError, match="names GPU 64; this machine has"):
        check_present({64: 1 << 30})


def test_dry_run_prints_the_plan_and_loads_nothing(folder, monkeypatch, capsys):
    import headscope.probes.models.loading as loading
    from headscope.reports.cli.app import main

    loads = []
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loads.append(a))
    argv = ["report", str(folder), "--only", "roles", "--device-map", "auto", "--max-memory", "0=400MiB,1=400MiB"]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert loads == []  # and the folder holds no weights to read
    assert out[0] == f"plan of {folder.name} (dry run: no weight loaded)"
    roles = next(line for line in out if line.split()[:1] == ["roles"])
    # its peak counts what this process holds (MiB alone; GiB in a worker that loaded other tests' models)
    assert roles.split()[-1] == "planned" and re.search(r" \d+\.\d+ (MiB|GiB) ", roles), roles
    assert next(line for line in out if line.split()[:1] == ["pruning"]).endswith("not in --only")
    assert any(line.startswith("memory: ~") for line in out)
    assert any(line.startswith("device plan (--device-map auto") for line in out)
    assert any(line.strip().startswith("cuda:1 ") for line in out)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--device-map", "auto", "--max-memory", "0=8MiB,1=8MiB"], "the devices hold 16.0 MiB"),
        (["--device-map", "auto", "--max-memory", "0=8XB"], "argument --max-memory: must be GPU=SIZE"),
        (["--max-memory", "0=8GiB"], "--max-memory goes with --device-map auto"),
    ],
)
def test_dry_run_refusals_are_one_line_exit_2(folder, capsys, extra, message):
    from headscope.reports.cli.app import main

    assert main(["report", str(folder), "--only", "roles", "--dry-run", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_tied_unembedding_lands_with_the_embedding_as_from_pretrained_builds_it(tmp_path):
    """A tied Qwen2 (the unembedding is the embedding): the map equals transformers' on the model as
    ``from_pretrained`` builds it (meta device, weights not tied yet), and the logits go to the embedding's device."""
    import torch
    from transformers import Qwen2ForCausalLM
    from transformers.integrations.accelerate import _get_device_map
    from transformers.utils.generic import ContextManagers

    from headscope.probes.models.checkpoints import read_hf_config, resolve
    from headscope.probes.models.placement import meta_model
    from headscope.reports.budget import plan
    from headscope.reports.device_plan import plan_devices

    cfg = _qwen2_config(vocab_size=8192, tied=True)
    cfg.save_pretrained(tmp_path)
    source = resolve(str(tmp_path))
    shape = Shape.from_hf_config(read_hf_config(source))
    budget = plan("report", shape, [WorkingSet(name="pruning", batch_size=4, longest=64, logits="all")])
    p = plan_devices(meta_model(source), budget, dict.fromkeys(range(3), 32 * MiB), source="--max-memory")
    assert p.placement.output_device == p.placement.input_device == 0
    assert p.working[0] >= budget.estimate.parts["pruning"]["logits"] > 0
    assert [i for d in range(3) for i in p.placement.layers()[d]] == list(range(N_LAYERS))
    with ContextManagers(Qwen2ForCausalLM.get_init_context(torch.float32, False, False, None, cfg)):
        as_loaded = Qwen2ForCausalLM(cfg)
    assert dict(_get_device_map(as_loaded, "auto", p.max_memory, None)) == p.placement.device_map


def test_a_stage_command_plans_its_stage_and_loads_nothing(folder, monkeypatch, capsys):
    import headscope.probes.models.loading as loading
    from headscope.reports.cli.app import main

    loads = []
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loads.append(a))
    assert main(["context", str(folder), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert loads == []
    assert next(line for line in out if line.split()[:1] == ["context"]).endswith("planned")
    assert next(line for line in out if line.split()[:1] == ["roles"]).endswith("not in --only")


def test_an_encoders_layers_are_its_layer_list_and_it_has_no_unembedding():
    """MiniLM-L6 (BERT): its embeddings are an unsplit module too, but not a layer; its base model has no unembedding."""
    from headscope.probes.models.checkpoints import resolve
    from headscope.probes.models.placement import meta_model, place

    p = place(meta_model(resolve("minilm-l6")), {0: 1 << 30})
    assert p.layer_devices == (0,) * 6
    assert p.input_device == 0 and p.output_device is None and not p.offloaded()


def test_a_run_naming_a_gpu_not_here_is_refused_before_the_load(folder, monkeypatch, capsys, tmp_path):
    import headscope.probes.models.loading as loading
    from headscope.reports.cli.app import main

    loads = []
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loads.append(a))
    argv = ["report", str(folder), "--only", "roles", "--device-map", "auto", "--max-memory", "64=1GiB"]
    assert main([*argv, "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("headscope: error: --max-memory names GPU 64; this machine has") and "\n" not in err
    assert loads == [] and not (tmp_path / "r").exists()


def test_run_json_keeps_the_device_plan_of_a_device_map_run_only():
    from headscope.reports.pipeline import _report_json

    plan = {"device_map": {"model.layers.0": "cuda:0"}, "devices": [], "stage": "roles"}
    assert _report_json({}, {}, {"device_plan": plan})["device_plan"] == plan
    assert "device_plan" not in _report_json({}, {}, {})
