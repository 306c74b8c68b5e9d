"""Fixtures the patching tests share: the planted induction circuit and its task.

``planted``: the planted model (probes/models/planted.py) whose induction head (1, 1) is given
an output (``writing_induction``); ``induction``: 12 induction items of ``[BOS] + 8 + 7``
tokens on it. A module built around another planted model (pruning, coreference) defines its
own ``planted``, which takes precedence there.
"""

from __future__ import annotations

import pytest

from headscope.analyses.patching.tasks import induction_task
from headscope.probes.models.planted import planted_model, writing_induction


@pytest.fixture(scope="module")
def planted():
    return writing_induction(planted_model())


@pytest.fixture(scope="module")
def induction(planted):
    return induction_task(planted.tokenizer, n_items=12, seq_len=8, seed=0)
