"""Shared fixtures: real models are loaded once per test session.

``minilm`` / ``smollm``: in-house backend; ``*_hf``: HF transformers eager reference;
``*_bridge``: transformer-lens TransformerBridge. SmolLM2's GGUF is dequantised once and
cached (``HEADSCOPE_CACHE``), so later sessions load in seconds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# tests mirror the package layout (tests/probes, tests/analyses/{roles,pruning,patching,stats},
# tests/reports, tests/reports/tools/{bench,experiments,sweep}); what several test modules share lives in helper modules
# (tests/tiny_models.py, tests/pruning_cases.py, tests/analyses/patching/patching_cases.py,
# tests/probes/gguf_writer.py ...). A few modules of probes/ and reports/ still import a sibling
# test module (test_report, test_gguf_card, test_checkpoint_inputs); these folders are on the
# path so that does not depend on the order pytest collects them in
sys.path.extend(str(Path(__file__).parent / sub) for sub in ("probes", "analyses", "reports"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# under pytest-xdist (`make test` runs -n 2) each worker gets its share of the cores as torch
# threads, and so does every subprocess a test starts (OMP_NUM_THREADS is inherited): torch's
# default, every core per process, oversubscribes the machine, and its spinning threads then
# slow small ops several times (SmolLM2's held-out perplexity on 24 items: 59 s with 2 threads,
# 11 s with 1, on a 2-core machine busy with other jobs)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _THREADS)

import pytest  # noqa: E402 (after the thread settings above)
import torch  # noqa: E402

if _WORKERS > 1:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` compare CPU and CUDA: skipped, with the reason, where CUDA is absent."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"needs CUDA (torch {torch.__version__} sees no GPU); run .ci/gpu-check on one")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _load(name, backend):
    from headscope.probes.models.loading import load_model

    return load_model(name, backend)


@pytest.fixture(scope="session")
def minilm():
    return _load("minilm-l6", "inhouse")


@pytest.fixture(scope="session")
def smollm():
    return _load("smollm2-135m", "inhouse")


@pytest.fixture(scope="session")
def minilm_hf():
    return _load("minilm-l6", "hf")


@pytest.fixture(scope="session")
def smollm_hf():
    return _load("smollm2-135m", "hf")


@pytest.fixture(scope="session")
def minilm_bridge():
    return _load("minilm-l6", "bridge")


@pytest.fixture(scope="session")
def smollm_bridge():
    return _load("smollm2-135m", "bridge")


SENTENCES = [
    "The cat didn't climb on the table because it was too tired.",
    "Heads can be pruned.",
    "After the long meeting, the engineers who had argued about the pruning schedule finally agreed to keep half of the heads in every layer.",
    "Why?",
    "Grouped-query attention lets three query heads share one key-value head, which shrinks the cache.",
]


@pytest.fixture(scope="session")
def sentences():
    return list(SENTENCES)


# the planted induction circuit and its task, shared by the patching tests: the planted model
# whose induction head (1, 1) is given an output (writing_induction), and 12 induction items of
# [BOS] + 8 + 7 tokens on it; a module built around another planted model (pruning,
# coreference, the causal report) defines its own ``planted``, which takes precedence there
@pytest.fixture(scope="module")
def planted():
    from headscope.probes.models.inhouse.planted import planted_model, writing_induction

    return writing_induction(planted_model())


@pytest.fixture(scope="module")
def induction(planted):
    from headscope.analyses.patching.tasks import induction_task

    return induction_task(planted.tokenizer, n_items=12, seq_len=8, seed=0)
