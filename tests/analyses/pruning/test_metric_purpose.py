"""#47: an LM metric is refused on a model that is not a language model (exit 2, one line naming
the metrics that apply), and an LM metric worse than uniform over the vocabulary is caveated in
the summary, the report's pruning section and its curves."""

from __future__ import annotations

import math

import torch
from cli_checks import cli_error
from tiny_models import tiny_model_dir

from headscope.analyses.pruning.study import PruneConfig, pruning_study
from headscope.reports.sections.pruning import pruning_section


def test_lm_loss_on_an_encoder_exits_2_naming_the_metrics_that_apply(capsys, tmp_path):
    for metric in ("lm_loss", "perplexity"):
        line = cli_error(capsys, "prune", "minilm-l6", "--metric", metric, "--out", tmp_path / metric)
        assert line == (
            f"headscope: error: metric '{metric}' scores next-token predictions: it needs a language model; "
            "'minilm-l6' is an embedding model (bidirectional attention (an encoder family)); "
            "metrics that apply: cosine_to_unpruned, paraphrase_accuracy"
        )


def _randomised_head_model(tmp_path):
    """A tiny Llama whose LM head is re-randomised with a large scale: confidently wrong, its
    loss far above ln V."""
    from transformers import AutoModelForCausalLM

    from headscope.probes.models.loading import load_model

    folder = tiny_model_dir(tmp_path, "llama")
    hf = AutoModelForCausalLM.from_pretrained(folder)
    torch.manual_seed(3)
    with torch.no_grad():
        hf.lm_head.weight.normal_(0.0, 5.0)
    hf.save_pretrained(folder)
    return load_model(str(folder))


def test_an_lm_loss_worse_than_uniform_is_caveated(tmp_path):
    model = _randomised_head_model(tmp_path)
    assert model.purpose.kind == "lm"  # a language model by its shape: the metric applies, the value says otherwise
    cfg = PruneConfig(
        quick=True, n_items=4, studies=("ablation", "curves"), orders=("ablation",), ablation_modes=("zero",)
    )
    result = pruning_study(model, cfg)
    s = result.summary
    v = model.vocab_size
    assert s["metric"] == "lm_loss" and s["base_value"] > math.log(v)
    assert s["caveat"].startswith(f"the unpruned lm_loss ({s['base_value']:.2f}) is worse than guessing uniformly")
    assert f"ln V = {math.log(v):.2f}" in s["caveat"] and "does not predict tokens here" in s["caveat"]
    assert s["measures"].startswith("mean next-token cross-entropy")

    frames = {f"prune_{k}": d for k, d in result.tables.by_file().items()}  # the report's frame names
    section = pruning_section(frames, None, model.spec.n_layers, model.spec.n_heads, "lm_loss", s)
    kinds = [type(b).__name__ for b in section.blocks]
    assert kinds[0] == "Note" and "does not predict tokens here" in section.blocks[0].text
    figures = [b for b in section.blocks if type(b).__name__ == "Figure" and b.name == "pruning_curves"]
    assert figures and "does not predict tokens here" in figures[0].caption


def test_an_embedding_metric_has_no_caveat_and_says_what_it_measures(minilm):
    from headscope.analyses.pruning.metrics import metric_notes

    notes = metric_notes(minilm, "cosine_to_unpruned", 1.0)
    assert "caveat" not in notes
    assert notes["measures"] == (
        "cosine of each sentence's embedding (the model's own pooling, Dense and Normalize) to the unpruned "
        "model's; embedding: mean pooling, Normalize"
    )
