"""Issue #38: the report's memory plan, before any load, on the shapes it was wrong on.

* A Qwen2-0.5B-shaped GGUF (its header and tensor table; the tensors' bytes a hole of zeros: the
  plan reads no weight) cuts no stage's batch on a 24 GiB machine (20.6 GiB available, as the issue
  measured), nor under ``HEADSCOPE_MEMORY_LIMIT=8G``: every stage runs with the settings it asked
  for, and run.json's ``memory`` says so (``batch_sizes`` equal to ``batch_sizes_asked``).
* MiniLM-L6 (an encoder) plans no working set for the roles read through the logits (successor,
  copy suppression, function vectors, IOI): they have no items there and run no forward.
"""

from __future__ import annotations

import pytest

from headscope.analyses.roles.base import REGISTRY, RoleContext
from headscope.analyses.roles.config import RolesConfig
from headscope.reports.stages import registry
from headscope.reports.stages.config import RunConfig
from headscope.reports.stages.runner import open_context, plan_memory

GiB = 1 << 30
#: MemAvailable of the 24 GiB machine the issue's Qwen runs were measured on
AVAILABLE_24G = int(20.6 * GiB)
LOGIT_ROLES = {"successor", "copy-suppression", "function-vector", "ioi"}


@pytest.fixture(scope="module")
def qwen_gguf_context(tmp_path_factory):
    """``(ctx, extra)`` of a header-only GGUF of Qwen2-0.5B's shape (a sparse file: nothing is loaded)."""
    from headscope.reports.tools.bench.qwen_gguf import write_qwen05_gguf

    path = write_qwen05_gguf(tmp_path_factory.mktemp("qwen05") / "qwen2-0.5b-shape.gguf", weights=False)
    return open_context(str(path), RunConfig())


#: the resident memory of a fresh ``headscope report`` process before its load (the plan counts what
#: the process holds: a pytest worker that has loaded other tests' models holds gigabytes more)
FRESH_PROCESS = int(0.5 * GiB)


def _machine(monkeypatch, available: int, limit: str | None) -> None:
    monkeypatch.setattr("headscope.probes.models.checkpoints.available_memory_bytes", lambda: available)
    monkeypatch.setattr("headscope.probes.budget._status", lambda: {"VmRSS": FRESH_PROCESS})
    monkeypatch.setattr("headscope.probes.budget._cgroup_headroom", lambda: None)
    if limit is None:
        monkeypatch.delenv("HEADSCOPE_MEMORY_LIMIT", raising=False)
    else:
        monkeypatch.setenv("HEADSCOPE_MEMORY_LIMIT", limit)


@pytest.mark.parametrize("limit", [None, "8G"])
def test_qwen05_gguf_plan_cuts_no_batch_where_the_machine_has_room(qwen_gguf_context, monkeypatch, limit):
    ctx, extra = qwen_gguf_context
    _machine(monkeypatch, AVAILABLE_24G, limit)
    stages = list(registry.STAGES.values())  # circuits too, off by default
    asked = {s.name: s.config(ctx, None) for s in stages}
    budget, cfgs = plan_memory(ctx, dict(asked), stages, extra)
    assert extra["convert"] and budget.shape.vocab_size == 151936 and budget.shape.n_params == 494032768
    assert budget.available.budget <= (8 * GiB if limit else AVAILABLE_24G + budget.available.resident)
    assert budget.shrunk() == {}, budget.line()
    assert cfgs == asked  # no batch, row block or item cut anywhere
    rec = budget.record()
    assert rec["batch_sizes"] == rec["batch_sizes_asked"]
    assert rec["batch_sizes"]["pruning"] == 64 and rec["batch_sizes"]["kv logits"] == 512
    # the largest working set's phase (the pruning logits term alone was 9.67 GiB before #38)
    phases = {k: v for k, v in budget.estimate.phases.items() if k != "load"}
    assert max(phases.values()) < 6.5 * GiB, budget.estimate.describe(phase=max(phases, key=phases.get))


def test_roles_read_through_the_logits_have_no_items_and_no_working_set_on_an_encoder(minilm, qwen_gguf_context):
    assert {n for n, r in REGISTRY.items() if r.needs_logits} == LOGIT_ROLES
    for name, role in REGISTRY.items():
        if role.corpus == "generated":
            items = role.items(RoleContext(model=minilm, cfg=RolesConfig()))
            assert (len(items) == 0) == role.needs_logits, (name, len(items))
    ctx, _extra = open_context("minilm-l6", RunConfig())
    assert {w.name for w in registry.STAGES["roles"].plan(ctx, RolesConfig())} == {
        "text",
        "induction",
        "syntactic",
        "coreference",
    }
    qwen, _extra = qwen_gguf_context
    assert LOGIT_ROLES <= {w.name for w in registry.STAGES["roles"].plan(qwen, RolesConfig())}
