"""The one metrics registry (:data:`headscope.analyses.metrics.METRICS`), checked on every
registered metric as scikit-learn's common checks run on every estimator: each gives its
documented value on a case small enough to compute by hand, states its direction, what it
reads and where it applies, and the analysis that scores it reaches it by name (pruning:
``build_metric``, ``PruneConfig`` and ``headscope prune --metric``; patching: ``metric_fn``
and ``Task``), while the other analysis refuses it with the valid names."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.analyses.metrics import ANALYSES, METRICS, MODELS, READS, get_metric, metrics_for
from headscope.analyses.patching.items import PairItem, Task
from headscope.analyses.patching.tasks import metric_fn
from headscope.analyses.pruning.metrics import METRICS as PRUNING_METRICS
from headscope.analyses.pruning.metrics import build_metric
from headscope.analyses.pruning.scoring import evaluate
from headscope.analyses.pruning.study import PruneConfig
from headscope.reports.cli.app import build_parser, main

LN2, LN3 = math.log(2.0), math.log(3.0)

#: name -> (arguments of the metric's function, the per-item values it must give, computed by
#: hand). A metric registered without a case here fails test_every_metric_has_a_hand_case.
HAND_CASES = {
    # logits [1, 3, vocab 2]: position 0 uniform (p = 1/2), position 1 logits (ln 3, 0) (p(0) = 3/4);
    # targets 1 then 0 -> NLLs ln 2 and ln 4/3; mean over the 2 predicted tokens, weight 2
    "lm_loss": (
        (torch.tensor([[[0.0, 0.0], [LN3, 0.0], [5.0, -5.0]]]), torch.tensor([[0, 1, 0]]), torch.tensor([[1, 1, 1]])),
        ((LN2 + math.log(4 / 3)) / 2, 2.0),
    ),
    # the same with the last token padding: only the first target counts
    "perplexity": (
        (torch.tensor([[[0.0, 0.0], [LN3, 0.0], [5.0, -5.0]]]), torch.tensor([[0, 1, 0]]), torch.tensor([[1, 1, 0]])),
        (LN2, 1.0),
    ),
    # candidates' summed log-probs; gold 0: a hit, a miss, a hit over a missing (-inf) candidate
    "coref_accuracy": (
        (torch.tensor([[-1.0, -3.0], [-4.0, -2.0], [-1.0, -math.inf]]), torch.tensor([0, 0, 0])),
        ([1.0, 0.0, 1.0],),
    ),
    # unit-norm embeddings against the unpruned ones: a 3-4-5 triangle and the same vector
    "cosine_to_unpruned": (
        (torch.tensor([[0.6, 0.8], [1.0, 0.0]]), torch.tensor([[1.0, 0.0], [1.0, 0.0]])),
        ([0.6, 1.0],),
    ),
    # item 0: cos(anchor, positive) 0.6 beats negatives 0 and -1; item 1: 1 beats 0.6, and the
    # padding negative (cos 1, a tie that would not be beaten) is masked out
    "paraphrase_accuracy": (
        (
            torch.tensor([[1.0, 0.0], [1.0, 0.0]]),
            torch.tensor([[0.6, 0.8], [1.0, 0.0]]),
            torch.tensor([[[0.0, 1.0], [-1.0, 0.0]], [[0.6, 0.8], [1.0, 0.0]]]),
            torch.tensor([[True, True], [True, False]]),
        ),
        ([1.0, 1.0],),
    ),
    # logits (0, ln 3): p(1) = 3/4
    "logprob": ((torch.tensor([[0.0, LN3]]), torch.tensor([1])), ([math.log(3 / 4)],)),
    "logit_diff": ((torch.tensor([[1.0, 3.0, 0.5]]), torch.tensor([1]), torch.tensor([2])), ([2.5],)),
    # p = (0.1, 0.2, 0.3, 0.4) over 4 candidates; row 0 in id order, threshold the number 1 (id 1):
    # above 0.3 + 0.4, at or below 0.1 + 0.2 -> 0.4; row 1 lists the ids reversed (number k is id 3 - k),
    # threshold id 2 = number 1: above ids 1, 0 (0.3), at or below ids 3, 2 (0.7) -> -0.4
    "greater_than": (
        (
            torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]])),
            torch.tensor([1, 2]),
            torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]]),
        ),
        ([0.4, -0.4],),
    ),
    # the same, strictly below: row 0 above 0.7, below 0.1 -> 0.6; row 1 above 0.3, below 0.4 -> -0.1
    "greater_than_tens": (
        (
            torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]])),
            torch.tensor([1, 2]),
            torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]]),
        ),
        ([0.6, -0.1],),
    ),
    # pooled (3, 4) against (1, 0): 3/5; (0, 2) against (0, 5): 1
    "embedding_cosine": (
        (torch.tensor([[3.0, 4.0], [0.0, 2.0]]), torch.tensor([[1.0, 0.0], [0.0, 5.0]])),
        ([0.6, 1.0],),
    ),
}

#: name -> (per-item values, weights, the reported value by hand)
AGGREGATES = {
    "lm_loss": (torch.tensor([LN2, math.log(8.0)]), torch.tensor([1.0, 1.0]), math.log(4.0)),
    "perplexity": (torch.tensor([LN2, math.log(8.0)]), torch.tensor([1.0, 1.0]), 4.0),  # exp(ln 4)
    "coref_accuracy": (torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.ones(4), 0.75),
}


def test_every_metric_has_a_hand_case():
    assert sorted(HAND_CASES) == sorted(METRICS)


@pytest.mark.parametrize("name", list(METRICS))
def test_metric_gives_its_hand_computed_value(name):
    args, expected = HAND_CASES[name]
    got = METRICS[name].fn(*args)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, torch.tensor(e, dtype=torch.float32).reshape(g.shape))


@pytest.mark.parametrize("name", list(METRICS))
def test_metric_states_what_it_is(name):
    m = METRICS[name]
    assert m.name == name and get_metric(name) is m
    assert isinstance(m.higher_is_better, bool) and m.definition
    assert m.reads in READS and m.model in MODELS and m.analysis in ANALYSES
    assert m.higher_is_better == (name not in ("lm_loss", "perplexity"))
    values, weights, reported = AGGREGATES.get(name, (torch.tensor([0.5, 1.0]), torch.tensor([1.0, 3.0]), 0.875))
    torch.testing.assert_close(m.aggregate(values, weights), torch.tensor(reported))


@pytest.mark.parametrize("name", list(METRICS))
def test_metric_signature_states_the_shapes(name):
    """The function's shape annotations hold on its hand case (jaxtyping's run-time check),
    and a batch that disagrees with itself is refused by name."""
    from beartype import beartype
    from jaxtyping import TypeCheckError, jaxtyped

    checked = jaxtyped(typechecker=beartype)(METRICS[name].fn)
    args, _ = HAND_CASES[name]
    checked(*args)
    bad = (args[0], args[1][..., :-1], *args[2:])  # the second tensor one short in its last dimension
    with pytest.raises(TypeCheckError):
        checked(*bad)


def test_metric_functions_leave_their_inputs_alone():
    for name, (args, _) in HAND_CASES.items():
        before = [a.clone() for a in args]
        METRICS[name].fn(*args)
        assert all(torch.equal(a, b) for a, b in zip(args, before, strict=True)), name


def test_an_unknown_metric_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown metric 'bleu'; valid metrics: lm_loss, perplexity"):
        get_metric("bleu")
    with pytest.raises(
        ValueError, match="valid metrics: logprob, logit_diff, greater_than, greater_than_tens, embedding_cosine$"
    ):
        get_metric("lm_loss", "patching")
    with pytest.raises(ValueError, match="analysis must be one of"):
        metrics_for("roles")


# ----------------------------------------------------------------------------- reachable


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``{"decoder": a tiny random Llama, "encoder": a tiny random BERT}``, in-house."""
    from tiny_models import tiny_model_dir

    from headscope.probes.models.loading import load_model

    root = tmp_path_factory.mktemp("tiny")
    return {
        "decoder": load_model(str(tiny_model_dir(root, "llama")), "inhouse"),
        "encoder": load_model(str(tiny_model_dir(root, "bert")), "inhouse"),
    }


@pytest.mark.parametrize("name", list(metrics_for("pruning")))
def test_pruning_reaches_its_metric(name, tiny, capsys):
    m = METRICS[name]
    assert PRUNING_METRICS[name] == m.model and PruneConfig(metric=name).metric == name
    assert build_parser().parse_args(["prune", "minilm-l6", "--metric", name]).metric == name
    model = tiny[m.model]
    scorer = build_metric(name, model, n_items=3, batch_size=2)
    assert scorer.registered is m and scorer.name == name and scorer.higher_is_better == m.higher_is_better
    ones = torch.ones(1, model.spec.n_layers, model.spec.n_heads)
    values, weights = evaluate(model, scorer, ones)
    assert values.shape == (1, scorer.n_items) and torch.isfinite(scorer.aggregate(values, weights)).all()
    other = tiny["encoder" if m.model == "decoder" else "decoder"]
    with pytest.raises(
        ValueError, match=f"metric '{name}' [^;]*needs an? (language|embedding) model; .* metrics that apply: "
    ):
        build_metric(name, other, n_items=3)


def test_pruning_scores_lm_loss_with_the_registered_function(tiny):
    """The scorer's per-item values are the registry's function of the model's logits."""
    model = tiny["decoder"]
    scorer = build_metric("lm_loss", model, n_items=4, batch_size=2)
    values, weights = evaluate(model, scorer, torch.ones(1, model.spec.n_layers, model.spec.n_heads))
    direct_v, direct_w = torch.empty(scorer.n_items), torch.empty(scorer.n_items)
    with torch.inference_mode():
        for u in scorer.units:
            logits = model.forward(u.batch.input_ids, u.batch.attention_mask)
            direct_v[u.items], direct_w[u.items] = METRICS["lm_loss"].fn(
                logits, u.batch.input_ids, u.batch.attention_mask
            )
    torch.testing.assert_close(values[0], direct_v)
    torch.testing.assert_close(weights, direct_w)


@pytest.mark.parametrize("name", list(metrics_for("patching")))
def test_patching_reaches_its_metric(name, capsys):
    m = METRICS[name]
    assert metric_fn(name) is m.fn
    task = Task(name="t", items=[PairItem((1, 2, 3), (1, 4, 3), 2, 5)], metric=name)
    assert task.metric == name
    assert main(["prune", "minilm-l6", "--metric", name]) == 2  # not a pruning metric: refused by the CLI
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(metrics_for("pruning")))
def test_patching_refuses_a_pruning_metric(name):
    with pytest.raises(ValueError, match=f"unknown metric '{name}'; valid metrics: logprob"):
        Task(name="t", items=[PairItem((1, 2), (1, 3), 2)], metric=name)


@pytest.mark.parametrize("name", list(metrics_for("patching")))
def test_pruning_refuses_a_patching_metric(name):
    with pytest.raises(ValueError, match=f"unknown metric '{name}'; valid metrics: lm_loss"):
        build_metric(name, None)
    with pytest.raises(ValueError, match="'metric' parameter of PruneConfig"):
        PruneConfig(metric=name)
