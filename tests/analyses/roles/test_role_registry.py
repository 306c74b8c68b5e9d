"""The role registry: pipeline order, the Role contract, per-group options, a toy role
added through :func:`~headscope.analyses.roles.base.register` alone, and :func:`verdict_overlap`."""

from __future__ import annotations

import math
from collections import Counter

import pandas as pd
import pytest
import torch

from headscope.analyses.frames import ROLE_COLUMNS, roles_frame
from headscope.analyses.roles import base, shipped
from headscope.analyses.roles.base import REGISTRY, Role, RoleContext, register, unregister
from headscope.analyses.roles.config import RoleOutput, RolesConfig
from headscope.analyses.roles.pattern_stats import ItemValuesReducer
from headscope.analyses.roles.pipeline import (
    ROLE_GROUPS,
    TEXT_GROUPS,
    check_roles,
    corpora_for,
    head_roles,
    run_role,
    verdict_overlap,
)
from headscope.analyses.roles.special import set_mass
from headscope.analyses.stats.verdicts import layered_rows
from headscope.probes.capture import capture
from headscope.probes.models.inhouse.planted import planted_model, planted_sentences

#: the shipped groups, in the order analyses/roles/shipped.py registers them
SHIPPED = tuple(m.ROLE_DEF.name for m in shipped.MODULES)
CFG = RolesConfig(n_boot=200, n_perm=500)


# -- the shipped registry -------------------------------------------------------------------------
def test_shipped_groups_are_registered_in_the_order_shipped_lists_them():
    assert tuple(REGISTRY)[: len(SHIPPED)] == SHIPPED == ROLE_GROUPS
    assert TEXT_GROUPS == tuple(g for g in SHIPPED if REGISTRY[g].corpus == "text")
    assert all(REGISTRY[g].description for g in SHIPPED)
    assert check_roles(["coreference", "summary", "positional"]) == ("positional", "summary", "coreference")
    assert corpora_for(["induction", "coreference", "rare-word"]) == ("text", "coref", "generated")
    with pytest.raises(ValueError, match="unknown role group 'nope'"):
        check_roles(["nope"])


def test_each_role_carries_its_patching_task_and_example_picker():
    assert base.role_tasks() == {
        "induction": "induction",
        "coreference": "coreference",
        "syntactic:nsubj": "agreement",
        "previous-token": "duplicate_token",
        "positional:previous": "duplicate_token",
        "duplicate-token": "duplicate_token",
    }
    assert {g: REGISTRY[g].task for g in SHIPPED if REGISTRY[g].task} == {
        "induction": "induction",
        "coreference": "coreference",
    }
    assert {g for g in SHIPPED if REGISTRY[g].example is not None} == {"syntactic", "coreference"}
    with pytest.raises(TypeError, match="task must be a task name"):
        Role("x", "text", "share", print, print, task=3)
    with pytest.raises(TypeError, match="row_tasks must map"):
        Role("x", "text", "share", print, print, row_tasks={"x": 1})


def test_every_threshold_field_is_checked_without_a_list():
    from dataclasses import fields

    names = [f.name for f in fields(RolesConfig) if f.name.endswith("_threshold")]
    assert "positional_threshold" in names and "rare_threshold" in names
    for name in names:
        with pytest.raises(ValueError, match=f"The '{name}' parameter of RolesConfig must be in \\[0, 1\\]; got 1.5"):
            RolesConfig(**{name: 1.5})


def test_the_three_first_position_roles_say_how_they_differ():
    pos, spec = REGISTRY["positional"].description, REGISTRY["special"].description
    assert "MAXIMUM" in pos and "MASS" in pos and "sink:first-token" in pos and "special" in pos
    assert "MASS" in spec and "positional:first" in spec and "position 0" in spec and "[SEP]" in spec


def test_role_contract_is_checked():
    def noop(*a):
        return None

    with pytest.raises(ValueError, match="corpus must be one of"):
        Role("x", "web", "share", noop, noop)
    with pytest.raises(ValueError, match="score_kind must be one of"):
        Role("x", "text", "mass", noop, noop)
    with pytest.raises(ValueError, match="generated corpus needs items"):
        Role("x", "generated", "share", noop, noop)
    with pytest.raises(TypeError, match="options must be a tuple"):
        Role("x", "text", "share", noop, noop, options="k")
    with pytest.raises(TypeError, match="register takes a Role"):
        register("positional")
    with pytest.raises(ValueError, match="registered already"):
        register(Role("positional", "text", "share", noop, noop))


def test_register_adds_last_and_replace_keeps_the_place():
    def finish(*a):
        return None

    names = ("toy-a", "toy-b")
    shipped = tuple(REGISTRY)
    try:
        register(Role("toy-a", "text", "none", finish, finish))
        register(Role("toy-b", "text", "none", finish, finish))
        register(Role("toy-a", "coref", "none", finish, finish), replace=True)
        assert tuple(REGISTRY) == (*shipped, "toy-a", "toy-b") and REGISTRY["toy-a"].corpus == "coref"
    finally:
        for n in names:
            unregister(n)
    assert tuple(REGISTRY) == shipped


def test_options_are_checked_per_group():
    model = planted_model(causal=True)
    with pytest.raises(TypeError, match="role group 'positional' takes no option 'frequencies'"):
        head_roles(model, text=["the cat sat ."], roles=["positional"], options={"positional": {"frequencies": {}}})
    with pytest.raises(ValueError, match="unknown role group 'nope'"):
        head_roles(model, text=["the cat sat ."], roles=["positional"], options={"nope": {}})
    with pytest.raises(TypeError, match="takes no option 'k'"):
        run_role("special", model, ["the cat sat ."], k=3)


def test_run_role_options_reach_the_group():
    model = planted_model(causal=True)
    texts = planted_sentences(12, seed=1)
    cfg = RolesConfig(n_boot=10, n_perm=10)
    default = run_role("rare-word", model, texts, cfg)
    counts = Counter({i: 1 for i in range(3)})
    given = run_role("rare-word", model, texts, cfg, frequencies=counts)
    assert default.extra["n_token_types"] > 3 and given.extra["n_token_types"] == 3
    excl = run_role("positional", model, iter(texts), cfg)  # any iterable of texts
    incl = run_role("positional", model, texts, cfg, include_special=True)
    assert excl.n_items == incl.n_items == 12
    # [BOS] as a query row: its max can only be key 0 (itself), so positional:first rises (the sink head is at 1 already)
    first = {
        o: f[f.role == "positional:first"].set_index(["layer", "head"]).score
        for o, f in (("ex", excl.frame), ("in", incl.frame))
    }
    assert bool((first["in"] >= first["ex"]).all()) and int((first["in"] > first["ex"]).sum()) == 7
    ind = run_role("induction", model, cfg=RolesConfig(n_boot=10, n_perm=10, induction_n_sequences=3), exclude_bos=True)
    seqs = ind.extra["sequences"]
    again = run_role("induction", model, seqs, RolesConfig(n_boot=10, n_perm=10), exclude_bos=True)
    pd.testing.assert_frame_equal(ind.frame, again.frame)


# -- a toy role, through register alone --------------------------------------------------------
class LastTokenReducer(ItemValuesReducer):
    """Mass each analysed query row puts on the item's last real token, and its uniform baseline."""

    def update(self, cap) -> None:
        allowed, rows, _ = self._masks(cap)
        km = cap.key_mask
        last = torch.zeros_like(km)
        last[torch.arange(km.shape[0]), km.sum(-1) - 1] = True
        vals, b = [], None
        for layer in cap.layers:
            v, b = set_mass(cap["pattern", layer], allowed, rows, last)
            vals.append(v)
        self.values.add("last-token", cap.item_ids, torch.stack(vals, 1))
        self.values.add("baseline:last-token", cap.item_ids, b)

    def result(self):
        return self._by_role(("last-token",))


def _last_token_finish(reducer, report, ctx: RoleContext) -> RoleOutput:
    values, base_, layers = reducer.result()
    rows = layered_rows(
        values["last-token"],
        base_["last-token"],
        layers,
        role="last-token",
        cfg=ctx.cfg,
        threshold_kind="absolute",
        threshold=0.5,
        score_kind="share",
    )
    return RoleOutput(frame=roles_frame(rows), skipped=Counter(report.skipped), n_items=report.n_used)


@pytest.fixture
def last_token_role():
    role = register(
        Role(
            name="last-token",
            corpus="text",
            score_kind="share",
            reducer=lambda ctx: LastTokenReducer(causal=ctx.model.spec.causal),
            finish=_last_token_finish,
            description="mass each query row puts on the item's last real token, against uniform attention",
        )
    )
    yield role
    unregister("last-token")
    assert "last-token" not in REGISTRY


def test_a_role_added_by_register_alone_runs_in_head_roles(last_token_role):
    model = planted_model(causal=False)  # bidirectional: every query row sees the last token
    texts = planted_sentences(40, seed=3)
    assert check_roles(None)[-1] == "last-token"
    res = head_roles(model, text=texts, roles=["positional", "last-token"], cfg=CFG)
    assert res.n_items == {"positional": 40, "last-token": 40}  # one pass over the text, shared
    assert "text" in res.timings
    f = res.frame[res.frame.role == "last-token"].set_index(["layer", "head"])
    assert list(res.frame.columns) == ROLE_COLUMNS and len(f) == 8

    # by hand: per item, the mean over its non-[BOS] rows of the weight on position L-1; baseline 1/L
    cap = capture(model, texts)
    score, baseline = torch.zeros(2, 4, dtype=torch.float64), 0.0
    for i in range(len(texts)):
        n = cap.tokens.lengths[i]
        rows = [q for q in range(n) if not cap.tokens.special[i][q]]
        for layer in (0, 1):
            p = cap["pattern", layer][i].double()
            for h in range(4):
                score[layer, h] += sum(float(p[h, q, n - 1]) for q in rows) / len(rows)
        baseline += 1 / n
    score /= len(texts)
    baseline /= len(texts)
    for (layer, h), row in f.iterrows():
        assert row.score == pytest.approx(float(score[layer, h]), abs=1e-6)
        assert row.baseline == pytest.approx(baseline, abs=1e-6)  # float32 masses
        assert row.margin == pytest.approx(float(score[layer, h]) - baseline, abs=1e-6)
        assert int(row.n) == 40
        # every head's mass on the last token is far from its baseline one way or the other:
        # the verdict is the threshold
        assert bool(row.verdict) == (float(score[layer, h]) >= 0.5)
    held = set(f.index[f.verdict])
    assert (1, 2) in held  # the punctuation head: every sentence ends with . ! or ?
    assert held <= {(1, 2), (0, 2)}  # the next-token head reaches the end from the row before it

    one = run_role("last-token", model, texts, CFG)  # the same code with one group: the same rows
    pd.testing.assert_frame_equal(one.frame.set_index(["layer", "head"]), f)


# -- verdict_overlap -----------------------------------------------------------------------------
def test_verdict_overlap_counts_shared_heads():
    rows = []
    held = {"a": {(0, 0), (0, 1), (1, 0)}, "b": {(0, 1), (1, 0), (1, 1)}, "c": set()}
    for role, heads in held.items():
        for layer in (0, 1):
            for h in (0, 1):
                rows.append(
                    {
                        "layer": layer,
                        "head": h,
                        "role": role,
                        "relation": "",
                        "direction": "",
                        "verdict": (layer, h) in heads,
                    }
                )
    rows.append(
        {"layer": 0, "head": 0, "role": "syntactic", "relation": "det", "direction": "dep->head", "verdict": True}
    )
    frame = pd.DataFrame(rows)
    out = verdict_overlap(frame, ["a", "b", "c", "syntactic/det/dep->head"])
    assert list(out.columns) == ["role_a", "role_b", "n_a", "n_b", "n_both", "jaccard"]
    got = {(r.role_a, r.role_b): (r.n_a, r.n_b, r.n_both, r.jaccard) for r in out.itertuples()}
    assert got[("a", "b")] == (3, 3, 2, pytest.approx(2 / 4))
    assert got[("a", "c")] == (3, 0, 0, 0.0)
    assert got[("a", "syntactic/det/dep->head")] == (3, 1, 1, pytest.approx(1 / 3))
    assert len(out) == 6  # every pair, once
    # default: the roles some head holds, sorted; c holds none
    assert verdict_overlap(frame)[["role_a", "role_b"]].values.tolist() == [
        ["a", "b"],
        ["a", "syntactic/det/dep->head"],
        ["b", "syntactic/det/dep->head"],
    ]
    nan = verdict_overlap(frame[frame.role == "c"], ["c", "c"])
    assert math.isnan(nan.jaccard.iloc[0])
    with pytest.raises(ValueError, match="'d' is not in the frame"):
        verdict_overlap(frame, ["a", "d"])
    assert verdict_overlap(frame.iloc[:0], []).empty


def test_every_group_counts_its_progress_in_items_as_the_time_estimate_reads_it(smollm):
    """The report's time estimate divides the first call's seconds by ``done`` and multiplies by the
    run's items (:func:`~headscope.reports.stages.plans.roles_items`): a group counting batches
    instead made a 15 s run say "~7 min". Every generated group counts sequences, up to its total."""
    from headscope.reports.stages.plans import roles_items

    cfg = RolesConfig(n_boot=10, n_perm=10, induction_n_sequences=5, batch_size=2)
    groups = [g for g in SHIPPED if REGISTRY[g].generated is not None]
    assert {"induction", "successor", "copy-suppression"} <= set(groups)
    calls: list[tuple[str, int, int]] = []
    head_roles(
        smollm,
        roles=groups,
        cfg=cfg,
        progress=lambda stage, done, total: calls.append((stage, done, total)),
        options={"function-vector": {"layers": (29,)}},  # the last layer's heads patched: the same items, seconds
    )
    for stage in {s for s, _, _ in calls}:
        seen = [(d, t) for s, d, t in calls if s == stage]
        work = REGISTRY[stage].work if stage in REGISTRY else None
        first = 2 if work is None else work(cfg, smollm.spec, 2)  # a group whose items cost more counts its work
        assert seen[0][0] <= first and seen[-1][0] == seen[-1][1], (stage, seen)  # the first batch's items ... all
    assert sum(t for s, d, t in calls if (d, t) == (t, t)) == roles_items(groups, {}, cfg, smollm.spec)
    # function vectors: 12 scored prompts (2 per task), each its forward, its mean prompt's and the re-runs
    assert [t for s, d, t in calls if s == "function-vector"][-1] == round(12 * (2 + 2 * 2 * 9 * 31 / 256))
