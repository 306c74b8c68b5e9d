"""Non-Llama GGUF checkpoints end to end: tiny random Qwen2, Gemma 2 and Gemma 3 models (and a
Llama control) written as real GGUF files (:mod:`gguf_writer`), read back by transformers with
their weights intact, dequantised into headscope's cache with ``architectures`` named, carded
from metadata, loaded by the ``hf`` and ``bridge`` backends (and ``inhouse`` where it covers the
family) with attention patterns equal to the source model's, and run through ``headscope roles``.

Figures asserted: weights read back exactly (max abs diff 0, float32 files); patterns ≤ 1e-5 and
logits ≤ 1e-4 against the source model (eager), on a padded batch. The dequantised folders go to
a temporary ``HEADSCOPE_CACHE``, never the user's."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch

gguf = pytest.importorskip("gguf")

from gguf_writer import FAMILIES, write_tiny_gguf  # noqa: E402

from headscope.probes.errors import CheckpointError, ModelIncompatibleError  # noqa: E402
from headscope.probes.models.gguf import GGUF_ARCHITECTURES, gguf_as_hf_dir, gguf_meta_config  # noqa: E402
from headscope.probes.models.gguf import metadata as arch_mod  # noqa: E402

ALL = sorted(FAMILIES)  # gemma2, gemma3, llama, qwen2
SLIDING = {"llama": [], "qwen2": [], "gemma2": [0], "gemma3": [0, 1]}  # sliding layers (window 5)
# backends each family loads with: every one of them (the in-house stack covers all four)
BACKENDS = [(f, b) for f in ALL for b in ("hf", "bridge", "inhouse")]
# ``headscope roles`` runs: the default backend (auto: in-house) for each, the bridge for one
ROLES_RUNS = [(f, "auto") for f in ALL] + [("qwen2", "bridge")]
ROLE_GROUPS = "positional,special,coreference"  # a few groups, both corpora kinds (texts and words)


class Tiny:
    """The session's tiny GGUF files, their source models and loaded backends, built on first
    use; ``cache`` is the HEADSCOPE_CACHE every load goes through."""

    def __init__(self, root):
        self.root = root
        self.cache = root / "cache"
        self._files: dict = {}
        self._models: dict = {}

    @contextlib.contextmanager
    def env(self):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("HEADSCOPE_CACHE", str(self.cache))
            yield

    def file(self, family: str):
        """``(path, source HF model)`` of ``family``'s tiny GGUF."""
        if family not in self._files:
            self._files[family] = write_tiny_gguf(self.root / f"tiny-{family}.gguf", family)
        return self._files[family]

    def model(self, family: str, backend: str):
        from headscope.probes.models.loading import load_model

        key = (family, backend)
        if key not in self._models:
            path, _ = self.file(family)
            with self.env():
                self._models[key] = load_model(str(path), backend)
        return self._models[key]

    def source(self, family: str):
        """The source model as an ``hf`` backend (eager patterns), with the GGUF's tokenizer."""
        from headscope.probes.models.backends.hf import HFReference

        _, src = self.file(family)
        hf = self.model(family, "hf")
        return HFReference(src, hf.tokenizer, hf.spec, vocab_size=src.config.vocab_size)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    return Tiny(tmp_path_factory.mktemp("tiny-gguf"))


def _worst_pattern_diff(a, b, n_layers, mask) -> float:
    worst = 0.0
    for layer in range(n_layers):
        d = (a["pattern", layer] - b["pattern", layer]).abs().amax(dim=(1, 3))  # [batch, query]
        worst = max(worst, d[mask].max().item())  # real query rows only
    return worst


# ----------------------------------------------------------------------------- the files themselves


@pytest.mark.parametrize("family", ALL)
def test_transformers_reads_the_weights_back_exactly(tiny, family):
    """The writer is right: transformers' GGUF loader (its q/k un-permutation for llama, its
    ``norm - 1`` for gemma) gives back every tensor of the source model, bit for bit."""
    from transformers import AutoModelForCausalLM

    path, src = tiny.file(family)
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    assert type(hf) is type(src)
    a, b = src.state_dict(), hf.state_dict()
    assert set(a) == set(b)
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0.0
    assert hf.config.architectures is None  # what transformers leaves; the cached config names it


@pytest.mark.parametrize("family", ALL)
def test_cached_config_names_its_class(tiny, family):
    path, src = tiny.file(family)
    with tiny.env():
        folder = gguf_as_hf_dir(path)
    assert folder.parent.parent == tiny.cache
    cfg = json.loads((folder / "config.json").read_text())
    arch = FAMILIES[family].gguf_arch
    assert cfg["architectures"] == [GGUF_ARCHITECTURES[arch][1]] == [type(src).__name__]
    assert cfg["model_type"] == GGUF_ARCHITECTURES[arch][0]


@pytest.mark.parametrize("family", ALL)
def test_card_from_metadata(tiny, family):
    from headscope.probes.models.card import model_card

    path, src = tiny.file(family)
    c = model_card(str(path))
    assert (c["layers"], c["heads"], c["kv_heads"], c["d_head"], c["attention"]) == (2, 4, 2, 16, "GQA")
    assert c["sliding_layer_indices"] == SLIDING[family]
    assert c["total_params"] == sum(p.numel() for p in src.parameters())


def test_cli_card_of_a_qwen2_gguf(tiny):
    path, _ = tiny.file("qwen2")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HEADSCOPE_CACHE=str(tiny.root / "card-cache"))
    out = subprocess.run(
        [sys.executable, "-m", "headscope.reports.cli", "card", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "(qwen2, decoder)" in out.stdout
    assert "4 per layer, 8 in all; d_head 16" in out.stdout
    assert "GQA, 2 KV heads shared by groups of 2 query heads" in out.stdout
    assert not (tiny.root / "card-cache").exists()  # metadata only: nothing dequantised


# ----------------------------------------------------------------------------- backends


@pytest.mark.parametrize(("family", "backend"), BACKENDS)
def test_patterns_match_the_source_model(tiny, family, backend, sentences):
    model = tiny.model(family, backend)
    ref = tiny.source(family)
    assert (model.spec.n_layers, model.spec.n_heads, model.spec.n_kv_heads) == (2, 4, 2)
    batch = model.encode(sentences)
    mask = batch.attention_mask.bool()
    assert not mask.all()  # really padded
    a, r = model.run(batch, ["pattern"]), ref.run(batch, ["pattern"])
    assert _worst_pattern_diff(a, r, 2, mask) <= 1e-5
    assert (a["output", None] - r["output", None])[mask].abs().max().item() <= 1e-4
    q = torch.arange(batch.shape[1])
    far = (q[:, None] - q[None, :]) >= 5  # the longest sentence has 20 tokens and more
    for layer in SLIDING[family]:  # the window (5) is applied: no weight on keys 5 or more back
        for row, n in enumerate(batch.lengths):  # real tokens only
            assert a["pattern", layer][row, :, :n, :n][..., far[:n, :n]].abs().sum().item() == 0.0


@pytest.mark.parametrize("family", ALL)
def test_bridge_agrees_with_hf(tiny, family, sentences):
    hf, bridge = tiny.model(family, "hf"), tiny.model(family, "bridge")
    batch = hf.encode(sentences)
    a, b = hf.run(batch, ["pattern"]), bridge.run(batch, ["pattern"])
    assert _worst_pattern_diff(a, b, 2, batch.attention_mask.bool()) <= 1e-5


def test_a_cache_without_architectures_is_filled_in(tiny):
    """A folder cached before headscope named the class: the next load names it (the bridge
    could not wrap the model otherwise)."""
    path, _ = tiny.file("qwen2")
    with tiny.env():
        folder = gguf_as_hf_dir(path)
        cfg_file = folder / "config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg_file.write_text(json.dumps({k: v for k, v in cfg.items() if k != "architectures"}))
        assert gguf_as_hf_dir(path) == folder
    assert json.loads(cfg_file.read_text()) == cfg


# ----------------------------------------------------------------------------- sizes, every architecture


def _bad_qwen2(tmp_path):
    from test_gguf_card import BASE, write_gguf

    return write_gguf(
        tmp_path / "bad.gguf", "qwen2", tensors=True, **BASE, attention__head_count=4, attention__head_count_kv=3
    )


def test_sizes_are_checked_before_dequantising(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(
        CheckpointError, match=r"qwen2\.attention\.head_count_kv=3 does not divide qwen2\.attention\.head_count=4"
    ):
        gguf_as_hf_dir(_bad_qwen2(tmp_path))
    assert not (tmp_path / "cache").exists()


def test_an_architecture_only_transformers_knows_is_checked_through_its_reader(tiny, tmp_path, monkeypatch):
    """An architecture headscope's GGUF table lacks (one transformers added since) still gets its
    sizes checked: from transformers' own reader of the metadata."""
    monkeypatch.delitem(arch_mod.GGUF_ARCHITECTURES, "qwen2")
    path, _ = tiny.file("qwen2")
    cfg = gguf_meta_config(path)
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == ("qwen2", 2, 2)
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(CheckpointError, match="num_key_value_heads=3 does not divide"):
        gguf_as_hf_dir(_bad_qwen2(tmp_path))
    assert not (tmp_path / "cache").exists()


def test_an_architecture_nobody_reads_is_refused_by_name(tmp_path, monkeypatch):
    from test_gguf_card import BASE, write_gguf

    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelIncompatibleError, match="GGUF architecture 'rwkv6' is not one transformers reads"):
        gguf_as_hf_dir(write_gguf(tmp_path / "r.gguf", "rwkv6", tensors=True, **BASE))


# ----------------------------------------------------------------------------- headscope roles


@pytest.mark.parametrize(("family", "backend"), ROLES_RUNS)
def test_roles_runs_on_the_gguf(tiny, family, backend, tmp_path, capsys):
    from headscope.analyses.roles.pipeline import default_coref, default_text
    from headscope.reports.cli.app import main

    path, _ = tiny.file(family)
    out = tmp_path / "roles"
    # the smallest run: the first lines of the shipped texts and coreference items
    text, coref = tmp_path / "text.txt", tmp_path / "coref.jsonl"
    text.write_text("".join(open(default_text(), encoding="utf-8").readlines()[:24]), encoding="utf-8")
    coref.write_text("".join(open(default_coref(), encoding="utf-8").readlines()[:40]), encoding="utf-8")
    argv = ["roles", str(path), "--backend", backend, "--out", str(out), "--roles", ROLE_GROUPS, "--quiet"]
    with tiny.env():
        rc = main([*argv, "--text", str(text), "--coref", str(coref)])
    assert rc == 0, capsys.readouterr().err
    for table in ("roles", "head_stats", "roles_by_head", "coref_pairs"):
        assert (out / f"{table}.csv").is_file()
    run = json.loads((out / "run.json").read_text())
    assert run["backend"] == ("inhouse" if backend == "auto" else backend) and run["roles"] == ROLE_GROUPS.split(",")
    assert run["backend_choice"].startswith("auto: inhouse (" if backend == "auto" else backend)
    assert run["n_items"] == {"positional": 24, "special": 24, "coreference": 40}
    import pandas as pd

    roles = pd.read_csv(out / "roles.csv")
    assert set(zip(roles["layer"], roles["head"])) == {(l, h) for l in range(2) for h in range(4)}


def test_report_on_a_non_llama_gguf(tiny, tmp_path):
    """``report FILE.gguf`` (default backend) on a Gemma 3 file: card from the GGUF, roles and
    quick pruning for every head, the HTML report."""
    from headscope.analyses.pruning.study import PruneConfig
    from headscope.analyses.roles.pipeline import default_text
    from headscope.reports.pipeline import build_report

    path, _ = tiny.file("gemma3")
    text = tmp_path / "text.txt"
    text.write_text("".join(open(default_text(), encoding="utf-8").readlines()[:16]), encoding="utf-8")
    out = tmp_path / "report"
    with tiny.env():
        build_report(
            str(path),
            out_dir=out,
            quiet=True,
            role_groups=("positional", "special"),
            role_inputs={"text": str(text)},
            prune_config=PruneConfig(
                quick=True, n_items=6, ablation_modes=("zero",), studies=("ablation", "importance")
            ),
        )
    run = json.loads((out / "run.json").read_text())
    assert run["backend"] == "inhouse" and run["card"]["layers"] == 2 and run["card"]["heads"] == 4
    assert run["card"]["kv_heads"] == 2
    import pandas as pd

    imp = pd.read_csv(out / "tables" / "prune_importance.csv")
    assert len(imp) == 8 and (imp["value"] > 0).all()
    assert (out / "report.html").stat().st_size > 10_000
