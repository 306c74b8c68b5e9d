"""The weights joined with behaviour (#28 part 3), on planted ground truth: the planted model's
previous-token head (0, 0) feeds its induction head (1, 1) through K, and (1, 1) copies
(``writing_induction``: OV = 4 × identity on the token block). The roles and patching frames
are measured on the model (not written by hand), the circuits read from its weights; the joins
must put the planted heads first."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from headscope.analyses.circuits.weights.joins import (
    COPY_JOIN_COLUMNS,
    K_JOIN_COLUMNS,
    PATH_JOIN_COLUMNS,
    copying_patching_join,
    k_composition_join,
    path_composition_join,
)
from headscope.analyses.patching import PatchConfig, activation_patching, path_patching
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.pipeline import head_roles
from headscope.analyses.run_weights import WeightsConfig, run_weights, weights_blocker
from headscope.probes.models.inhouse.planted import D_HEAD, planted_model, writing_induction
from headscope.reports.document import Figure, Table
from headscope.reports.sections.weights import weights_section

CFG = PatchConfig(n_perm=200, n_boot=50)


@pytest.fixture(scope="module")
def planted():
    """The planted circuit, where layer 0's other three heads also write (small random V and O):
    as built only (0, 0) writes, so there would be one sender to rank."""
    model = writing_induction(planted_model())
    gen = torch.Generator().manual_seed(0)
    attn = model.module.blocks[0].attn
    with torch.no_grad():
        for h in (1, 2, 3):
            s = slice(h * D_HEAD, (h + 1) * D_HEAD)
            attn.v_proj.weight[s] = 0.05 * torch.randn(attn.v_proj.weight[s].shape, generator=gen)
            attn.o_proj.weight[:, s] = 0.05 * torch.randn(attn.o_proj.weight[:, s].shape, generator=gen)
    return model


@pytest.fixture(scope="module")
def measured(planted, induction):
    """Roles, activation patching on the induction task (named as the report names it) and
    path patching into (1, 1) via k, all measured on the planted model."""
    roles = head_roles(planted, roles=("induction",), cfg=RolesConfig(n_boot=50, n_perm=50), examples=False).frame
    act, _ = activation_patching(planted, induction, CFG)
    path, _ = path_patching(planted, induction, receiver=(1, 1), via="k", cfg=CFG)
    patching = pd.concat([act.assign(task="induction"), path.assign(task="induction")], ignore_index=True)
    frames, summary = run_weights(planted, {"roles": roles, "patching": patching}, WeightsConfig(draws=20, null=50))
    return roles, patching, frames, summary


def test_roles_see_the_planted_pair(measured):
    roles = measured[0]
    held = roles[roles["verdict"].astype(bool)]
    assert {(0, 0, "previous-token"), (1, 1, "induction")} <= set(
        zip(held["layer"], held["head"], held["role"].astype(str))
    )


def test_the_previous_token_head_k_composes_most_into_the_induction_head(measured):
    j = measured[2]["join_k_composition"]
    row = j[(j.receiver == "L1H1") & (j.level == "head")].iloc[0]
    assert row.receiver_basis == "verdict"
    assert row.top_senders.split(", ")[0] == "L0H0"
    assert (row.best_role_rank, row.role_in_top_k, row.n_senders) == (1, 1, 4)
    assert row.rank_biserial == pytest.approx(1.0)
    assert (j.level == "kv_group").sum() == 0  # MHA: a KV group is one head, no second row


def test_path_patching_through_k_agrees_with_k_composition(measured):
    j = measured[2]["join_path"]
    assert list(j.columns) == PATH_JOIN_COLUMNS
    row = j.iloc[0]
    assert (row.receiver, row.n_senders) == ("L1H1", 4)
    assert row.top_by_path.split(", ")[0] == row.top_by_composition.split(", ")[0] == "L0H0"


def test_the_copying_head_carries_the_induction_task(measured):
    j = measured[2]["join_copying"]
    row = j[j.task == "induction"].iloc[0]
    assert row.n_heads == 4  # (0, 0) writes the previous-token block, which W_U does not read: no OV circuit
    assert row.top_copying.split(", ")[0] == "L1H1"
    assert row.top_by_patching.split(", ")[0] == "L1H1"
    assert "L1H1" in row.copying_heads_significant.split(", ")


def test_the_section_has_one_picture_per_join(measured):
    roles, patching, frames, summary = measured
    sec = weights_section(
        {"roles": roles, "patching": patching, **frames}, {"weights_summary": summary}, n_layers=2, n_heads=4
    )
    names = [b.name for b in sec.blocks if isinstance(b, Figure)]
    assert names[0] == "weights_copying"
    assert "weights_k_L1H1" in names and "weights_copying_vs_induction" in names
    assert any(n.startswith("weights_path_L1H1") for n in names)
    tables = {b.name for b in sec.blocks if isinstance(b, Table)}
    assert {"join_k_composition", "join_copying", "join_path"} <= tables


def _comp(kv_index):
    """K rows into layer 1 from two layer-0 heads, receivers sharing KV heads as ``kv_index`` says."""
    rows = []
    for rh, kv in enumerate(kv_index):
        for sh, v in enumerate((0.9, 0.1)):
            rows.append(
                dict(
                    sender_layer=0,
                    sender_head=sh,
                    receiver_layer=1,
                    receiver_head=rh,
                    receiver_kv_head=kv,
                    mode="K",
                    level="head",
                    value=v + 0.01 * rh,
                )
            )
    for kv in sorted(set(kv_index)):
        for sh, v in enumerate((0.2, 0.8)):
            rows.append(
                dict(
                    sender_layer=0,
                    sender_head=sh,
                    receiver_layer=1,
                    receiver_head=None,
                    receiver_kv_head=kv,
                    mode="K",
                    level="kv_group",
                    value=v,
                )
            )
    return pd.DataFrame(rows)


ROLES = pd.DataFrame(
    {"layer": [0, 1], "head": [1, 0], "role": ["previous-token", "induction"], "verdict": [True, True], "score": [1, 1]}
)


def test_a_shared_kv_group_gets_its_own_row_ranked_by_the_shared_key():
    j = k_composition_join(_comp([0, 0]), ROLES)
    assert list(j.level) == ["head", "kv_group"]
    assert j.iloc[0].best_role_rank == 2 and j.iloc[1].best_role_rank == 1
    assert j.iloc[1].receiver == "L1 kv0"


def test_without_an_induction_verdict_the_top_scores_are_the_receivers_and_say_so():
    roles = ROLES.assign(verdict=[True, False])
    j = k_composition_join(_comp([0, 1]), roles)
    assert list(j.receiver) == ["L1H0"] and j.iloc[0].receiver_basis == "top 3 induction score (no verdict)"


def test_empty_inputs_give_empty_frames_with_their_columns():
    empty = pd.DataFrame(columns=["layer", "head", "role", "verdict", "score"])
    assert list(k_composition_join(_comp([0, 1]), empty).columns) == K_JOIN_COLUMNS
    assert list(copying_patching_join(pd.DataFrame(), pd.DataFrame()).columns) == COPY_JOIN_COLUMNS
    assert path_composition_join(_comp([0, 1]), pd.DataFrame()).empty
    report_like = pd.DataFrame(
        {"task": ["induction"], "layer": [0], "head": [0], "method": ["activation_denoising"], "effect": [0.5]}
    )  # the report's patching frame: no path rows, no receiver column
    assert list(path_composition_join(_comp([0, 1]), report_like).columns) == PATH_JOIN_COLUMNS


def test_the_stage_runs_on_hf_where_the_weights_pass_and_says_why_not_on_the_bridge(minilm_hf):
    """#39: the hf backend has checked per-head weights (the shipped MiniLM's pass); the bridge has none."""

    class Bridge:
        backend = "bridge"

    assert weights_blocker(minilm_hf) is None
    why = weights_blocker(Bridge())
    assert why is not None and why.startswith("no per-head weights on backend bridge")


@pytest.mark.parametrize("mode, level", [("K", "head"), ("V", "kv_group")])
def test_the_null_is_the_same_for_any_block_size(mode, level):
    """The report draws the composition null in small blocks (its peak memory); the scores must be
    those of one draw. 16 numbers are randn's unit: blocks of 16 and of 48 draws, and one block."""
    from headscope.analyses.circuits.weights.composition import null_scores

    d_model, d_head, n = 24, 4, 100
    one = null_scores(d_model, d_head, mode, level, n, torch.Generator().manual_seed(3), block_bytes=1 << 30)
    for draws in (16, 48):
        block = draws * d_model * d_head * 8
        got = null_scores(d_model, d_head, mode, level, n, torch.Generator().manual_seed(3), block_bytes=block)
        assert torch.equal(got, one)
