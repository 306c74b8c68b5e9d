"""``headscope bench``: what capturing attention costs, path by path.

The modules, by idea:

- :mod:`.harness` — :func:`~.harness.run_bench`: warm-up, interleaved timed rounds, the result
- :mod:`.registry` — ``PATHS``: every path's name, description and function
- :mod:`.capture_paths`, :mod:`.pruning_paths`, :mod:`.patching_paths` — the paths, by kind
- :mod:`.state` — what the paths share (sentences, batches, models) and what a path returns
- :mod:`.config` — :class:`~.config.BenchConfig`
- :mod:`.machine`, :mod:`.counts` — devices, matmul peaks, bf16, RSS; FLOP and padding counts
- :mod:`.results`, :mod:`.targets` — the result frames and the targets they are held to
- :mod:`.memory` — ``--memory``: peak RSS of a small and a large corpus, in subprocesses
- :mod:`.stage_clock` — ``--report``: each stage of a default report timed (wall, CPU, peak RSS)
- :mod:`.gpu` — the GPU bench on a model with Llama-3.1-8B's shapes

The sentences come from :mod:`headscope.probes.corpora.bench_sentences`.
"""
