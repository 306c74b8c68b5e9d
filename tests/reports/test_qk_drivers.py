"""The report's roles section says what drives each task role's top head (analyses.qk.roles and the
roles stage's qk_drivers table): on the planted induction circuit the key-side driver of the
induction head is the planted previous-token head; roles without a verdict or a task give no row."""

from __future__ import annotations

import pandas as pd

from headscope.analyses.qk.roles import DRIVER_COLUMNS, role_drivers, top_heads
from headscope.probes.models.inhouse.planted import planted_model, writing_induction
from headscope.reports.document import Paragraph, Table
from headscope.reports.sections.roles import qk_drivers_blocks
from headscope.reports.stages.roles import STAGE


def _roles(rows):
    return pd.DataFrame(rows, columns=["layer", "head", "role", "score", "verdict"])


def test_the_induction_heads_keys_are_driven_by_the_planted_previous_token_head():
    m = writing_induction(planted_model())
    roles = _roles(
        [(1, 1, "induction", 0.9, True), (0, 0, "previous-token", 0.95, True), (1, 3, "induction", 0.95, False)]
    )
    assert top_heads(roles) == {"induction": (1, 1), "previous-token": (0, 0)}
    frame, notes = role_drivers(m, roles, n_items=8)
    assert list(frame.columns) == DRIVER_COLUMNS and not notes
    key = frame[(frame.role == "induction") & (frame.side == "key")].set_index("rank")
    assert key.component[1] == "L0H0" and key.share[1] > 0.9 and (frame.n == 8).all()
    blocks = qk_drivers_blocks(frame)
    assert isinstance(blocks[0], Paragraph) and "induction: L1H1's keys are driven by L0H0 (" in blocks[0].text
    assert isinstance(blocks[1], Table) and set(blocks[1].frame.columns) == {
        "role", "head", "side", "rank", "component", "share", "n"
    }  # fmt: skip
    assert set(STAGE.schemas["qk_drivers"]) == set(DRIVER_COLUMNS)


def test_a_task_the_model_cannot_build_is_a_note_and_no_role_no_rows(minilm):
    frame, notes = role_drivers(minilm, _roles([(1, 2, "ioi:name-mover", 1.0, True)]))  # an encoder: no IOI
    assert frame.empty and notes and notes[0].startswith("ioi:name-mover: no ioi items")
    empty, none = role_drivers(minilm, _roles([(1, 2, "successor", 1.0, True)]))
    assert empty.empty and none == [] and qk_drivers_blocks(empty) == []
