"""Function-vector heads (headscope.analyses.roles.function_vector): the planted function-vector head
is found and nothing else is; a random-weight model gets no verdict; the last-position re-run the
role patches through equals the full forward; the project's tasks in SmolLM2's tokenizer; SmolLM2's
in-context accuracy and leading heads on a few prompts; an encoder gives no rows and says why."""

from __future__ import annotations

import pytest
import torch

from headscope.analyses.roles.base import REGISTRY, RoleContext, register
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.function_vector import (
    ROLE_DEF,
    _group_data,
    derangement,
    patched_probs,
    probe_items,
    task_groups,
    task_table,
)
from headscope.analyses.roles.icl_tasks import TASKS, prompt_text, task_pairs
from headscope.analyses.roles.pipeline import run_role
from headscope.probes.models.inhouse.last_position import last_position_logits, prefix_run
from headscope.probes.models.inhouse.planted import (
    FV_TEMPLATE,
    WORD_CLASSES,
    planted_model,
    writing_function_vector,
)

ROLE = "function-vector"
NOUNS = WORD_CLASSES["noun"]
PAIRS = list(zip(NOUNS, NOUNS[1:] + NOUNS[:1]))
OPTIONS = {"tasks": {"next-noun": PAIRS}, "template": FV_TEMPLATE, "n_demos": 4, "n_prompts": 12}
CFG = RolesConfig(n_boot=200, n_perm=500, batch_size=8)


@pytest.fixture(scope="module", autouse=True)
def registered():
    if ROLE not in REGISTRY:
        register(ROLE_DEF)
    yield


@pytest.fixture(scope="module")
def planted_out():
    return run_role(ROLE, writing_function_vector(planted_model(), PAIRS), None, CFG, **OPTIONS)


def _stat(out, metric):
    s = out.stats[out.stats.metric == f"{ROLE}:{metric}"].set_index(["layer", "head"])
    return s.value


def test_the_planted_function_vector_head_is_found(planted_out):
    f = planted_out.frame.set_index(["layer", "head"])
    assert set(f.index[f.verdict]) == {(1, 2)} and len(f) == 8 and planted_out.n_items == 12
    assert f.score[(1, 2)] > 0.99 and f.baseline[(1, 2)] < 0.01  # its mean output brings the answer back
    assert (f.drop((1, 2)).margin.abs() < 1e-6).all()  # no other head writes anything that matters
    assert _stat(planted_out, "cie")[(1, 2)] > 0.99 and _stat(planted_out, "cie:next-noun")[(1, 2)] > 0.99
    task = planted_out.extra["tasks"]["next-noun"]
    # in context the planted model does the task; with the labels shuffled it cannot
    assert task["icl_accuracy"] == 1.0 and task["shuffled_accuracy"] == 0.0 and task["kept"] == 10


def test_no_head_of_a_random_weight_model_is_labelled():
    model = planted_model()
    model.module.init_weights(std=0.3, seed=3)
    out = run_role(ROLE, model, None, CFG, **OPTIONS)
    assert len(out.frame) == 8 and not out.frame.verdict.any()
    assert out.frame.margin.abs().max() < 0.1


def test_shuffled_prompts_keep_no_label_and_hold_out_the_scored_answers():
    model = planted_model()
    ctx = RoleContext(model, CFG, options=OPTIONS)
    items = probe_items(ctx)
    tok = model.tokenizer
    pair_of = dict(PAIRS)

    def demos(ids):
        words = tok.convert_ids_to_tokens(list(ids))[1:]  # [BOS] x y , x y , ... x_q
        return [(words[i], words[i + 1]) for i in range(0, len(words) - 1, 3)], words[-1]

    mean_pairs = {p for it in items for p in demos(it.mean_ids)[0]}
    assert mean_pairs <= set(PAIRS) and len(mean_pairs) == 5  # clean: the mean prompts' half
    for it in items:
        shown, query = demos(it.ids)
        assert len(shown) == 4 and all(pair_of[x] != y for x, y in shown)  # a derangement of the labels
        assert tok.convert_ids_to_tokens(it.answer) == pair_of[query]
        assert (query, pair_of[query]) not in mean_pairs  # the held-out pair is in no mean prompt
    assert sorted(derangement(5, torch.Generator().manual_seed(1))) == list(range(5))
    assert all(i != p for i, p in enumerate(derangement(7, torch.Generator().manual_seed(2))))


def test_patches_in_one_rerun_equal_patches_a_few_at_a_time_and_tasks_group_to_the_batch():
    """The mean and control patches of every head go through one re-run per layer (replicas), split
    into calls of at most ``max_rows`` rows: one row per call gives the same probabilities."""
    model = writing_function_vector(planted_model(), PAIRS)
    items = probe_items(RoleContext(model, CFG, options=OPTIONS))[:4]
    mean, control, _, runs = _group_data(model, items, 4)
    answers = torch.tensor([it.answer for it in items])
    one = patched_probs(model, runs[0], answers, [mean, control], (0, 1))
    many = patched_probs(model, runs[0], answers, [mean, control], (0, 1), max_rows=1)
    assert one.shape == (2, 4, 2, 4)
    torch.testing.assert_close(one, many, atol=1e-6, rtol=0)
    assert (one[0, :, 1, 2] > 0.99).all() and (one[1, :, 1, 2] < 0.01).all()  # (1, 2): the mean brings it back
    tasks = [it.task for it in items]
    assert task_groups(items, 4) == [["next-noun"]] and tasks == ["next-noun"] * 4
    fake = [type("I", (), {"task": t})() for t in "aaabbcccc"]
    assert task_groups(fake, 5) == [["a", "b"], ["c"]] and task_groups(fake, 2) == [["a"], ["b"], ["c"]]


def test_the_last_position_rerun_equals_the_full_forward(smollm):
    """Patching one head's output at the last position: re-running that position alone from the layer
    on (the role's path) gives the full forward's logits, to float32 rounding."""
    texts = [prompt_text(TASKS["antonym"][:3], "up"), prompt_text(TASKS["antonym"][5:9], "fast")]
    b = smollm.encode(texts=texts)
    run = prefix_run(smollm.network, b.input_ids, b.attention_mask)
    torch.testing.assert_close(last_position_logits(smollm.network, run, 0), run.logits, atol=2e-4, rtol=0)
    value = torch.randn(smollm.spec.d_head, generator=torch.Generator().manual_seed(0))
    layer, head = 14, 1

    def patch(z):
        z = z.clone()
        z[2:, head] = value  # replica 1 of rows 0, 1 (rows 2, 3)
        return z

    got = last_position_logits(smollm.network, run, layer, patch, replicas=2)
    for row in range(2):
        last = int(run.last[row])

        def hook(z, last=last):
            z = z.clone()
            z[:, head, last] = value
            return z

        with torch.inference_mode(), smollm.head_hooks({layer: hook}):
            ref = smollm.network(b.input_ids[row : row + 1], b.attention_mask[row : row + 1])[0, last]
        torch.testing.assert_close(got[2 + row], ref.float(), atol=2e-4, rtol=0)
        torch.testing.assert_close(got[row], run.logits[row], atol=2e-4, rtol=0)
        assert (got[2 + row] - got[row]).abs().max() > 1e-2  # the patch changed something


def test_the_project_tasks_in_smollm2s_tokenizer_count_what_they_drop(smollm):
    kept = {n: task_pairs(smollm.tokenizer, n, p) for n, p in TASKS.items()}
    assert {n: len(t.pairs) for n, t in kept.items()} == {
        "antonym": 50,
        "country-capital": 54,
        "capitalise": 50,
        "next-letter": 50,
        "english-french": 44,
        "present-past": 48,
    }
    assert dict(kept["english-french"].dropped) == {"answer first token shared": 6}
    assert kept["english-french"].multi_token == 35 and kept["antonym"].multi_token == 0
    table = task_table(RoleContext(smollm, CFG))
    assert all(t["runs"] for t in table.values())


def test_smollm2_does_antonyms_in_context_and_its_leading_heads(smollm):
    """Two scored prompts of one task (seed 0), the heads of three layers: SmolLM2 answers every clean
    prompt, and the head whose mean output raises the answer most is among the antonym leaders of the
    full study (L14H1, L20H0, L20H5, L21H1)."""
    cfg = RolesConfig(n_boot=50, n_perm=50, batch_size=8)
    out = run_role(ROLE, smollm, None, cfg, tasks={"antonym": TASKS["antonym"]}, n_prompts=2, layers=(14, 20, 21))
    task = out.extra["tasks"]["antonym"]
    assert task["icl_accuracy"] == 1.0 and task["prompts"] == 2
    cie = _stat(out, "cie").sort_values(ascending=False)
    assert cie.index[0] in {(14, 1), (20, 0), (20, 5), (21, 1)}
    assert len(out.frame) == 3 * 9 and not out.frame.verdict.any()
    assert dict(out.skipped) == {}  # every antonym pair scores in SmolLM2's tokenizer


def test_an_encoder_gives_no_rows_and_says_why(minilm):
    out = run_role(ROLE, minilm, None, RolesConfig(n_boot=10, n_perm=10))
    assert out.frame.empty and "no unembedding" in out.extra["notes"][0]


def test_empty_or_unscorable_items_are_refused():
    model = planted_model()
    with pytest.raises(ValueError, match="non-empty list of ICLItem"):
        run_role(ROLE, model, [], CFG)
    with pytest.raises(ValueError, match="no task has 10 pairs"):
        run_role(ROLE, model, None, CFG, tasks={"x": [("cat", "zebra")] * 3 + PAIRS[:4]}, n_demos=4)
    out = run_role(ROLE, model, None, CFG)  # the shipped tasks: no English word in the planted vocabulary
    assert out.frame.empty and out.extra["notes"] == [
        f"{ROLE}: no task has 22 pairs this tokenizer can score (two halves of n_demos + 1)"
    ]
    table = task_table(RoleContext(model, CFG, options={"tasks": {"x": [("cat", "zebra"), ("yak", "dog")]}}))
    assert table["x"]["dropped"] == {"answer unknown": 1, "input unknown": 1} and not table["x"]["runs"]
    out = run_role(ROLE, planted_model(), None, CFG, **{**OPTIONS, "tasks": {"t": PAIRS + [("cat", "zebra")]}})
    assert dict(out.skipped) == {"pairs of t: answer unknown": 1}  # counted, in skipped.json
    with pytest.raises(ValueError, match="at least 2"):
        run_role(ROLE, model, None, CFG, n_prompts=1)
