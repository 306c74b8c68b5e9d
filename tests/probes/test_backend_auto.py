"""``--backend auto`` chooses by probing the model (#25 part 2): in-house, then hf, then the bridge,
the first that loads and passes its load-time probe is kept; a load failure moves auto on, each
rejected backend is printed with its reason and recorded in run.json (``backend_rejected``); only
an explicit ``--backend X`` fails on X.

Two checkpoints as users met them, tiny and random:

* a Gemma 3 decoder (tied embeddings) saved with a tensor transformers ignores and the in-house
  loader refuses — a value head as TRL's ``AutoModelForCausalLMWithValueHead`` saves it
  (``v_head.summary.weight``); before, auto chose in-house by the family name and every command
  failed on its load error;
* an MPNet encoder (relative position bias, its output projection ``attention.attn.o``): no
  in-house family, and transformer-lens cannot wrap it; before, auto went to the bridge and
  failed with ``transformer-lens could not wrap 'mpnet'`` while ``--backend hf`` runs."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import tiny_model_dir, tiny_mpnet, tokenizer

from headscope.probes.errors import CheckpointError
from headscope.probes.models.loading import load_model
from headscope.reports.cli.app import main

TEXTS = ["The cat sat on the mat .", "A dog ran to the park .", "She gave him the book .", "It was warm today ."]


@pytest.fixture(scope="module")
def value_head_dir(tmp_path_factory):
    """A tiny tied gemma3_text folder whose safetensors also holds ``v_head.summary.weight``."""
    d = tiny_model_dir(tmp_path_factory.mktemp("vhead"), "gemma3_text")
    weights = d / "model.safetensors"
    state = load_file(weights)
    assert "lm_head.weight" not in state  # tied: one tensor, the embedding
    state["v_head.summary.weight"] = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    save_file(state, weights, metadata={"format": "pt"})
    return d


@pytest.fixture(scope="module")
def mpnet_dir(tmp_path_factory):
    """A tiny random MPNet encoder (``AutoConfig.for_model("mpnet")``) with a WordPiece tokenizer."""
    tok = tokenizer(True)
    model = tiny_mpnet(tok)
    d = tmp_path_factory.mktemp("mpnet") / "mpnet"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_auto_moves_past_an_in_house_load_failure_to_hf(value_head_dir, capsys):
    model = load_model(str(value_head_dir))
    err = capsys.readouterr().err
    assert model.backend == "hf"
    assert [r["backend"] for r in model.backend_rejected] == ["inhouse"]
    reason = model.backend_rejected[0]["reason"]
    assert "unexpected tensor 'v_head.summary.weight'" in reason
    assert "rejected" not in err  # the library prints nothing: the CLI prints the rejections, run.json records them
    assert (
        model.backend_choice.startswith("auto: hf (not in-house: ") and "v_head.summary.weight" in model.backend_choice
    )
    model.check_head_hooks()  # hf kept with its head hooks: pruning and patching can run


def test_explicit_inhouse_still_fails_on_its_load_error(value_head_dir):
    with pytest.raises(CheckpointError, match="unexpected tensor 'v_head.summary.weight'") as e:
        load_model(str(value_head_dir), "inhouse")
    assert "\n" not in str(e.value)


def test_roles_cli_runs_on_hf_and_run_json_lists_the_rejection(value_head_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["roles", str(value_head_dir), "--roles", "positional", "--text", str(text), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["backend"] == "hf"
    assert [r["backend"] for r in run["backend_rejected"]] == ["inhouse"]
    assert "v_head.summary.weight" in run["backend_rejected"][0]["reason"]
    assert any(line.startswith("backend auto: rejected inhouse (") for line in err.splitlines())
    rc = main(
        ["roles", str(value_head_dir), "--backend", "inhouse", "--roles", "positional", "--text", str(text)]
        + ["--out", str(tmp_path / "o2")]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert [line for line in err.splitlines() if line.startswith("headscope: error:")] == [
        line for line in err.splitlines() if "v_head.summary.weight" in line
    ]


def test_auto_takes_hf_for_a_family_neither_in_house_nor_bridge_covers(mpnet_dir, capsys):
    model = load_model(str(mpnet_dir))
    err = capsys.readouterr().err
    assert model.backend == "hf", model.backend_choice
    rejected = {r["backend"]: r["reason"] for r in model.backend_rejected}
    assert "hf" not in rejected and "model_type 'mpnet' is not covered" in rejected["inhouse"]
    assert "rejected" not in err  # printed by the CLI (test_roles_cli_prints_each_rejection_unless_quiet)
    explicit = load_model(str(mpnet_dir), "hf")
    batch = model.encode(TEXTS[:2])
    got, want = model.run(batch, ("pattern",)), explicit.run(batch, ("pattern",))
    for layer in range(2):
        assert torch.equal(got["pattern", layer], want["pattern", layer])


def test_roles_cli_prints_each_rejection_unless_quiet(value_head_dir, tmp_path, capsys):
    """The CLI prints each rejected backend beside its ``backend …`` line; ``--quiet`` prints none
    (run.json still lists them)."""
    text = tmp_path / "t.txt"
    text.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    args = ["roles", str(value_head_dir), "--roles", "positional", "--text", str(text)]
    assert main([*args, "--out", str(tmp_path / "loud")]) == 0
    reason = json.loads((tmp_path / "loud" / "run.json").read_text(encoding="utf-8"))["backend_rejected"][0]["reason"]
    assert f"backend auto: rejected inhouse ({reason})" in capsys.readouterr().err.splitlines()
    assert main([*args, "--out", str(tmp_path / "quiet"), "--quiet"]) == 0
    assert "rejected" not in capsys.readouterr().err
    run = json.loads((tmp_path / "quiet" / "run.json").read_text(encoding="utf-8"))
    assert [r["backend"] for r in run["backend_rejected"]] == ["inhouse"]


def test_shipped_minilm_still_runs_in_house_for_the_same_reason(capsys):
    model = load_model("minilm-l6")
    assert model.backend == "inhouse"
    assert model.backend_choice == "auto: inhouse (model_type 'bert' is covered in-house)"
    assert model.backend_rejected == []
    assert "rejected" not in capsys.readouterr().err


def test_roles_cli_runs_an_mpnet_encoder_on_auto(mpnet_dir, tmp_path, capsys):
    """The user's report: ``roles`` stopped with ``transformer-lens could not wrap 'mpnet'``."""
    text = tmp_path / "t.txt"
    text.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["roles", str(mpnet_dir), "--roles", "positional", "--text", str(text), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["backend"] == "hf" and "inhouse" in [r["backend"] for r in run["backend_rejected"]]


def test_the_in_house_probe_refuses_patterns_that_are_not_the_checkpoints(tmp_path):
    """The probe compares the in-house model with HF eager on the same folder: equal on a fresh
    load; a model whose weights no longer are the checkpoint's (a query projection scaled) is refused."""
    from headscope.probes.models.backends.inhouse import InHouseModel
    from headscope.probes.models.loading import _probe_patterns, resolve

    source = resolve(str(tiny_model_dir(tmp_path, "bert")))
    model = InHouseModel.from_source(source)
    assert _probe_patterns(model, source, torch.float32, False) is None
    with torch.no_grad():
        dict(model.module.named_parameters())["blocks.1.attn.q_proj.weight"].mul_(4.0)
    problem = _probe_patterns(model, source, torch.float32, False)
    assert problem is not None and problem.startswith("patterns differ from HF eager's in layer 1 by ")
