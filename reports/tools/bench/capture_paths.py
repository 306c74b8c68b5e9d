"""The capture paths: forwards and pattern captures, HF, transformer-lens and in-house.

Every function is a bench path ``(bench: BenchState) -> Prepared`` (registered in
:data:`~headscope.reports.tools.bench.registry.PATHS`, which says what each runs); all time
the same batches (``bench.ids``) except the two from raw text (``capture_stream``,
``roles``), which start from ``bench.sentences``.
"""

from __future__ import annotations

import dataclasses

import torch

from headscope.reports.tools.bench.state import BenchState, PathSkipped, Prepared

__all__ = [
    "bench_loss_gate_grads",
    "bf16_forward",
    "capture_patterns",
    "capture_stream",
    "gate_grad",
    "hf_eager_attentions",
    "hf_sdpa",
    "inhouse_forward",
    "roles",
    "tl_cache_full",
    "tl_cache_patterns",
]


def hf_sdpa(bench: BenchState) -> Prepared:
    hf = bench.model("hf_sdpa").hf

    def step(ids, mask):
        with torch.inference_mode():
            hf(input_ids=ids, attention_mask=mask)

    return Prepared(*bench.over_batches(step), bench.fwd_gflop, "")


def hf_eager_attentions(bench: BenchState) -> Prepared:
    hf = bench.model("hf_eager").hf

    def step(ids, mask):
        with torch.inference_mode():
            hf(input_ids=ids, attention_mask=mask, output_attentions=True)

    return Prepared(*bench.over_batches(step), bench.fwd_gflop, "")


def _run_with_cache(bench: BenchState, names_filter, note: str) -> Prepared:
    bridge = bench.model("bridge").bridge

    def step(ids, mask):
        with torch.inference_mode():
            _, cache = bridge.run_with_cache(ids, attention_mask=mask, names_filter=names_filter)
            del cache

    return Prepared(*bench.over_batches(step), bench.fwd_gflop, note)


def tl_cache_full(bench: BenchState) -> Prepared:
    return _run_with_cache(bench, None, "")


def tl_cache_patterns(bench: BenchState) -> Prepared:
    return _run_with_cache(bench, lambda name: name.endswith("attn.hook_pattern"), "names_filter: *.attn.hook_pattern")


def capture_patterns(bench: BenchState) -> Prepared:
    model = bench.model("inhouse")
    batches = [
        dataclasses.replace(b, input_ids=ids, attention_mask=mask) for b, (ids, mask) in zip(bench.batches, bench.ids)
    ]

    def one_pass():
        for b in batches:
            model.run(b, ["pattern"])

    return Prepared(
        one_pass,
        lambda: model.run(batches[0], ["pattern"]),
        bench.fwd_gflop,
        f"{bench.spec.n_layers} layers x {bench.spec.n_heads} heads",
    )


def inhouse_forward(bench: BenchState) -> Prepared:
    network = bench.model("inhouse").network

    def step(ids, mask):
        with torch.inference_mode():
            network(ids, mask)

    return Prepared(*bench.over_batches(step), bench.fwd_gflop, "")


def bench_loss_gate_grads(network, gates, ids, mask, causal: bool) -> tuple[torch.Tensor, ...]:
    """``gate_grad``'s timed step: the bench's loss (next-token CE on a decoder, mean squared
    hidden state on an encoder) and its gradient with respect to each layer's ``gate [head]``,
    only the paths to the gates (no weight gradients)."""
    for g in gates:
        g.requires_grad_(True)
    try:
        with torch.enable_grad():
            out = network(ids, mask)
            if causal:
                logits = out[:, :-1].float()
                target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100
                )
            else:
                loss = (out.float() ** 2 * mask[..., None]).sum() / mask.sum()
            return torch.autograd.grad(loss, gates)
    finally:
        for g in gates:
            g.requires_grad_(False)


def gate_grad(bench: BenchState) -> Prepared:
    model = bench.model("inhouse")
    network, causal = model.network, bench.spec.causal

    def step(ids, mask):
        bench_loss_gate_grads(network, model.gates, ids, mask, causal)

    loss = "next-token CE" if causal else "mean squared hidden state"
    return Prepared(
        *bench.over_batches(step),
        2 * bench.fwd_gflop,
        f"loss: {loss}; backward to the gates only (counted 2x forward)",
    )


def bf16_forward(bench: BenchState) -> Prepared:
    ok, why = bench.bf16
    if not ok:
        raise PathSkipped(f"no native bf16 here ({why})")
    network = bench.model("inhouse_bf16").network

    def step(ids, mask):
        with torch.inference_mode():
            network(ids, mask)

    return Prepared(*bench.over_batches(step), bench.fwd_gflop, why)


def capture_stream(bench: BenchState) -> Prepared:
    model = bench.model("inhouse")
    from headscope.probes.capture import stream

    n = bench.cfg.batch_size

    def one_pass():
        stream(model, list(bench.sentences), [], batch_size=n)

    def warm():
        stream(model, list(bench.sentences[:n]), [], batch_size=n)

    return Prepared(one_pass, warm, bench.fwd_gflop, "from text: tokenise, align words, bucket, capture")


def roles(bench: BenchState) -> Prepared:
    from headscope.analyses.roles import pipeline as roles_pipeline
    from headscope.analyses.roles.config import RolesConfig

    model = bench.model("inhouse")
    groups = tuple(roles_pipeline.TEXT_GROUPS)
    rcfg = RolesConfig(batch_size=bench.cfg.batch_size)

    def run(sentences):
        roles_pipeline.head_roles(model, text=list(sentences), roles=groups, cfg=rcfg, examples=False)

    return Prepared(
        lambda: run(bench.sentences),
        lambda: run(bench.sentences[: bench.cfg.batch_size]),
        bench.fwd_gflop,
        f"groups: {', '.join(groups)}; includes tokenising, bootstrap and permutation tests",
    )
