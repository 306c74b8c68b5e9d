"""#47: the embedding is the folder's own sentence-transformers pipeline (parity with
``SentenceTransformer(folder).encode``, sentence-transformers 6.2.0, on the shipped MiniLM and on
tiny random folders saved by sentence-transformers itself), and what a checkpoint is for is
decided once at load and read by every metric choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import tiny_model_dir

from headscope.probes.embedding import embed, pipeline_of

st = pytest.importorskip("sentence_transformers")
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer  # noqa: E402

TEXTS = [
    "A cat sat on the mat.",
    "The weather was cold, so the children stayed at home and read books all afternoon.",
    "Yes.",
    "Prices rose again in March.",
]
TOL = 1e-5


def _st_folder(
    root, hf_dir, name, pooling, *, dense=0, normalize=True, prompts=None, default=None, include_prompt=True
):
    """A sentence-transformers folder saved by sentence-transformers: the tiny HF model, Pooling
    (``pooling``), ``dense`` Dense layers (Tanh, then Identity; seeded), Normalize."""
    t = Transformer(str(hf_dir))
    modules = [t, Pooling(t.get_embedding_dimension(), pooling_mode=pooling, include_prompt=include_prompt)]
    width = modules[1].get_embedding_dimension()
    torch.manual_seed(1)
    for i in range(dense):
        modules.append(Dense(width, 24, activation_function=torch.nn.Tanh() if i == 0 else torch.nn.Identity()))
        width = 24
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu", prompts=prompts, default_prompt_name=default)
    out = root / name
    model.save(str(out))
    return out


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("st-bert"), "bert")


def _parity(folder, **kw):
    ref = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_numpy=True, **kw)
    ours = embed(str(folder), TEXTS, prompt=kw.get("prompt_name"))
    assert ours.shape == ref.shape and ours.dtype == np.float32
    return float(np.abs(ours - ref).max()), ours


def test_minilm_matches_sentence_transformers(minilm):
    folder = pipeline_of(minilm).folder
    assert folder is not None and pipeline_of(minilm).describe() == "mean pooling, Normalize"
    ref = SentenceTransformer(folder, device="cpu").encode(TEXTS, convert_to_numpy=True)
    ours = embed(minilm, TEXTS)
    assert float(np.abs(ours - ref).max()) <= TOL
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize(
    "pooling, dense",
    [
        ("cls", 0),
        ("lasttoken", 0),
        ("mean", 2),
        ("max", 0),
        ("weightedmean", 0),
        ("mean_sqrt_len_tokens", 0),
        (("cls", "mean"), 0),  # two modes, concatenated in sentence-transformers' order
    ],
)
def test_tiny_folders_match_sentence_transformers(tmp_path, tiny_bert, pooling, dense):
    name = "-".join(pooling) if isinstance(pooling, tuple) else pooling
    folder = _st_folder(tmp_path, tiny_bert, name, pooling, dense=dense)
    diff, ours = _parity(folder)
    assert diff <= TOL, diff
    width = 24 if dense else 64 * (2 if isinstance(pooling, tuple) else 1)
    assert ours.shape == (len(TEXTS), width)


def test_pooling_modes_differ_on_the_same_model(tmp_path, tiny_bert):
    """The parity above could not catch a pipeline that ignored its pooling: the modes disagree."""
    a = embed(str(_st_folder(tmp_path, tiny_bert, "a", "cls")), TEXTS)
    b = embed(str(_st_folder(tmp_path, tiny_bert, "b", "mean")), TEXTS)
    assert float(np.abs(a - b).max()) > 1e-2


def test_prompts_default_named_and_excluded_from_pooling(tmp_path, tiny_bert):
    prompts = {"query": "query: ", "doc": "passage: "}
    folder = _st_folder(tmp_path, tiny_bert, "prompt", "mean", prompts=prompts, default="query", include_prompt=False)
    diff, with_default = _parity(folder)  # default_prompt_name applied, prompt tokens left out of the mean
    assert diff <= TOL, diff
    diff, with_doc = _parity(folder, prompt_name="doc")
    assert diff <= TOL, diff
    assert float(np.abs(with_default - with_doc).max()) > 1e-3  # the prompt reaches the embedding
    with pytest.raises(ValueError, match=r"prompt 'nope' is not one of the model's prompts \(doc, document, query\)"):
        embed(str(folder), TEXTS, prompt="nope")
    kept = _st_folder(tmp_path, tiny_bert, "kept", "mean", prompts=prompts, default="query", include_prompt=True)
    diff, with_prompt_pooled = _parity(kept)
    assert diff <= TOL and float(np.abs(with_prompt_pooled - with_default).max()) > 1e-3


def test_causal_lasttoken_folder_matches(tmp_path):
    """A causal decoder pooled by its last token (Qwen3-Embedding's recipe): its final hidden
    states are read without computing logits."""
    hf = tiny_model_dir(tmp_path, "llama")
    folder = _st_folder(tmp_path, hf, "llama-last", "lasttoken")
    diff, _ = _parity(folder)
    assert diff <= TOL, diff


def test_bidirectional_gemma_folder_with_two_dense_layers_matches(tmp_path):
    """The issue's case: a decoder family run with use_bidirectional_attention, pooled, two
    Dense layers, Normalize; no LM head of its own (tied), loaded on the hf backend."""
    hf = tiny_model_dir(tmp_path, "gemma3_text", use_bidirectional_attention=True)
    folder = _st_folder(tmp_path, hf, "gemma-bi", "mean", dense=2)
    diff, ours = _parity(folder)
    assert diff <= TOL, diff
    assert ours.shape == (len(TEXTS), 24)


def test_embed_refuses_bad_texts(minilm):
    with pytest.raises(TypeError, match="texts must be a list of strings; got str"):
        embed(minilm, "one text")
    with pytest.raises(ValueError, match="at least one text"):
        embed(minilm, [])


# ----------------------------------------------------------------------------- what it is for


def _gemma(tmp_path, bidirectional: bool):
    from headscope.probes.models.loading import load_model

    folder = tiny_model_dir(
        tmp_path / ("bi" if bidirectional else "causal"), "gemma3_text", use_bidirectional_attention=bidirectional
    )
    return load_model(str(folder))


def test_bidirectional_gemma_gets_the_embedding_metrics(tmp_path):
    from headscope.analyses.patching.tasks import load_task
    from headscope.analyses.pruning.metrics import default_metric

    bi = _gemma(tmp_path, True)
    assert not bi.spec.causal  # masked both ways, as transformers runs it
    assert (bi.purpose.kind, bi.purpose.reason) == (
        "embedding",
        "bidirectional attention (use_bidirectional_attention)",
    )
    assert default_metric(bi) == "cosine_to_unpruned"
    assert load_task(bi, "induction", n_items=2).metric == "embedding_cosine"

    causal = _gemma(tmp_path, False)
    assert causal.spec.causal and causal.purpose.kind == "lm"
    assert default_metric(causal) == "lm_loss"
    assert load_task(causal, "induction", n_items=2).metric == "logprob"


def test_minilm_and_smollm_purposes(minilm, smollm):
    assert minilm.purpose.kind == "embedding" and not minilm.purpose.has_mlm_head
    assert smollm.purpose.kind == "lm" and smollm.purpose.has_lm_head
