# Two commands a new machine needs (each bootstraps .venv on first use):
#   make report   the main job: a head-role and pruning report on the shipped MiniLM-L6
#   make test     the test suite
# Without make: python3 .ci/bootstrap.py && .venv/bin/headscope report
PY      := .venv/bin/python
MODEL   ?= minilm-l6
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: circuit-ranks circuit-variants circuit-bench
.PHONY: schemas bootstrap report test test-fast docs readme-picture bench estimates figures context sweep weights-families qk validate circuits eap-reference lint gpu-check gpu-wheels

bootstrap:
	@python3 .ci/bootstrap.py

report: bootstrap
	.venv/bin/headscope report $(MODEL)

LINTED  := probes analyses reports data tests .ci docs setup.py

test: bootstrap
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m pytest -q -n 2 --durations=25 --doctest-modules probes analyses reports data tests

test-fast: bootstrap
	$(PY) -m pytest -q -m "not slow and not browser" tests

# The documentation site (docs/, Sphinx) into docs/_build/html: warnings are errors (a broken cross-reference,
# a public object without a docstring, a tutorial cell that fails), offline (intersphinx inventories written
# from the installed packages by docs/_ext/offline_inventories.py), the tutorials executed on the shipped models
docs: bootstrap
	rm -rf docs/_build/html docs/jupyter_execute
	OMP_NUM_THREADS=2 $(PY) -m sphinx -W --keep-going -n -E -q -b html docs docs/_build/html

# The README's picture (docs/_static/report.png, committed): the top of MiniLM-L6's report.html in headless Chromium
readme-picture: bootstrap
	test -f runs/report-minilm-l6/report.html || .venv/bin/headscope report minilm-l6 --quiet
	$(PY) docs/readme_picture.py runs/report-minilm-l6/report.html docs/_static/report.png

# The columns and dtypes of every registered stage's frames (data/schemas/report_tables.json), which
# load_run checks a report's tables against without importing the stages; a test fails while it is stale
schemas: bootstrap
	$(PY) -m headscope.reports.tools.stage_tables

bench: bootstrap
	.venv/bin/headscope bench $(MODEL)

# Every registered stage's memory estimate against its measured peak (issue #38) on MiniLM-L6, SmolLM2-135M and
# random-weight shapes (long vocabulary, d_head 256), two batch sizes, fp32 and bf16, then the default reports of
# MiniLM-L6 and SmolLM2 on one thread (each stage's memory and seconds; the time factors are fitted on them), into
# data/figures/estimates.json (~40 min on 2 cores); tests/test_estimates_calibration.py holds each stage to the bands
estimates: bootstrap
	nice -n 10 $(PY) -m headscope.reports.tools.bench.estimates --out data/figures/estimates.json --page docs/guide/estimates.md --replan-time

# The README's figures, regenerated: patching on SmolLM2 (~15 min on 2 cores) into data/figures/patching.json,
# attribution and AtP* vs activation patching on every task of MiniLM-L6 and SmolLM2 (~1 h) into atp.json,
# the default report's on MiniLM-L6 and SmolLM2 (a report of each; FIGURES_FLAGS="--from DIR" reads finished
# DIR/<model>-report folders instead) into data/figures/report_*.json, and its weights section into weights_*.json;
# headscope kv smollm2-135m --quick (~10 min of one core) into kv_smollm2.json;
# tests/test_readme_figures.py fails while
# the README quotes other values
figures: bootstrap
	$(PY) -m headscope.reports.tools.experiments.patching_figures
	$(PY) -m headscope.reports.tools.experiments.atp_figures
	$(PY) -m headscope.reports.tools.experiments.report_figures $(FIGURES_FLAGS)
	$(PY) -m headscope.reports.tools.experiments.weights_figures $(FIGURES_FLAGS)
	$(PY) -m headscope.reports.tools.experiments.kv_figures

# The contextualisation verdicts (#41's claims 1, 4 and 5: self-similarity by depth, saturation at the model's
# scale vs scale 1, attention distance by depth) on MiniLM-L6 and SmolLM2, full sense set, into
# data/figures/context_*.json (~1 and ~5 min on a loaded 2-core machine); tests/test_readme_figures.py fails while
# docs/guide/context.md quotes other values
context: bootstrap
	nice -n 10 $(PY) -m headscope.reports.tools.experiments.context_figures

# Every command checked on a tiny random model of each text family of the installed transformers (one core, ~6-10 s
# of CPU a family, 40-90 s of wall time on a loaded 2-core machine: run it in parts there) into data/sweep/sweep.csv and sweep.md, and the supported-models
# table of docs/guide/models.md rendered from it; tests/test_sweep_readme.py fails while they differ. SWEEP_FLAGS="--families a,b
# --update" reruns some families and keeps the other rows
sweep: bootstrap
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/headscope sweep --out data/sweep --page docs/guide/models.md $(SWEEP_FLAGS)

# Why SmolLM2's induction head L18H6 attends where it does: its score difference at the induction position split
# exactly over (query component, key component) pairs, 32 induction items (seed 0), one core, into
# data/figures/qk_smollm2.json; tests/analyses/qk/test_qk_figures.py fails while docs/guide/qk.md quotes other values
qk: bootstrap
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 $(PY) -m headscope.reports.tools.experiments.qk_figures

# SmolLM2-135M's function-vector heads (6 tasks x 8 prompts, every head; and the default 5) and the function vector
# of its top 10 heads added to zero-shot prompts (~6 min of one core) into data/figures/function_vectors_smollm2.json;
# docs/guide/roles.md quotes it (tests/analyses/roles/test_function_vector_figures.py)
.PHONY: function-vectors
function-vectors: bootstrap
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 $(PY) -m headscope.reports.tools.experiments.function_vectors

# SmolLM2-135M's successor heads by the effective OV circuit (weights) and on text, in-house and hf backends
# (~1 min of one core) into data/figures/successor_ov_smollm2.json; docs/guide/roles.md quotes it
# (tests/analyses/roles/test_successor_ov.py)
.PHONY: successor-ov
successor-ov: bootstrap
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 $(PY) -m headscope.reports.tools.experiments.successor_ov

# The peak memory of reading a non-in-house hf folder one layer at a time (a 24-layer random OLMo 2, ~1 minute on one
# core) into data/figures/hf_lazy_weights.json; docs/guide/weights.md quotes it (tests/test_readme_figures.py)
.PHONY: hf-lazy-peak
hf-lazy-peak: bootstrap
	OMP_NUM_THREADS=1 $(PY) -m headscope.reports.tools.experiments.hf_lazy_peak

# The hf per-head weights checked against the forward on each text family's tiny random model (a few minutes on one
# core) into data/figures/hf_weights_families.json; docs/guide/weights.md quotes its counts (tests/probes/test_hf_weights.py)
weights-families: bootstrap
	OMP_NUM_THREADS=1 nice -n 10 $(PY) -m headscope.reports.tools.experiments.hf_weights_families

# docs/guide/models.md's table (and data/sweep/sweep.md) rendered again from the committed data/sweep/sweep.csv and
# data/figures/hf_weights_families.json (its per-head weights column), nothing run
.PHONY: sweep-table
sweep-table: bootstrap
	.venv/bin/headscope sweep --render --out data/sweep --page docs/guide/models.md

# SmolLM2-135M's induction (16 items), IOI (16) and greater-than (8) circuits by EAP-IG (5 steps) at MIB's budgets
# beside 5 random circuits each (~15-20 min of one core for induction, ~4 and ~2 min for the others) into
# data/figures/circuits_smollm2*.json; docs/guide/circuits.md quotes them (tests/analyses/circuits/edges/test_circuits_figures.py)
circuits: bootstrap
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 $(PY) -m headscope.reports.tools.experiments.circuits_figures --task induction
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 $(PY) -m headscope.reports.tools.experiments.circuits_figures --task ioi
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 $(PY) -m headscope.reports.tools.experiments.circuits_figures --task greater_than --n-items 8

# EAP-IG scores of SmolLM2-135M's induction edges (8 items, 5 steps) against the exact single-edge effects of the top 200
# (~10 min of two cores) into data/figures/circuits_smollm2_ranks.json; docs/guide/circuits.md quotes it
# (tests/analyses/circuits/edges/test_circuit_ranks.py)
circuit-ranks: bootstrap
	OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 nice -n 10 $(PY) -m headscope.reports.tools.experiments.circuit_ranks

# SmolLM2-135M's induction faithfulness with the edges ranked by signed score and scored with 20 steps, beside
# |score| at 5 steps (8 items, budgets 0.02-0.5, 5 random circuits each; ~10 min of one core) into
# data/figures/circuits_smollm2_variants.json; docs/guide/circuits.md quotes it (test_circuits_figures.py)
circuit-variants: bootstrap
	OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 nice -n 10 $(PY) -m headscope.reports.tools.experiments.circuit_variants

# EAP-IG's price in the bench, run twice (one thread, ~3 min each) into data/figures/bench_smollm2_eap_ig.json;
# docs/guide/circuits.md quotes it (tests/reports/tools/bench/test_bench_circuits.py checks the target)
circuit-bench: bootstrap
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/headscope bench smollm2-135m --repeats 5 --paths eap_ig eap_ig_forward_backward --json > /tmp/headscope-eap-bench-1.json
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/headscope bench smollm2-135m --repeats 5 --paths eap_ig eap_ig_forward_backward --json > /tmp/headscope-eap-bench-2.json
	$(PY) -m headscope.reports.tools.bench.circuit_paths --record data/figures/bench_smollm2_eap_ig.json /tmp/headscope-eap-bench-1.json /tmp/headscope-eap-bench-2.json

# The EAP-IG reference implementation's EAP and EAP-IG edge scores (github.com/hannamw/EAP-IG at 795f5607, vendored,
# on transformer-lens's bridge) for a random 2-layer GPT-2 (~20 s) into data/figures/eap_reference.json
# (tests/analyses/circuits/edges/test_eap_reference.py checks headscope's scores against them)
eap-reference: bootstrap
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 $(PY) -m headscope.reports.tools.experiments.eap_reference

# On a machine with one CUDA GPU (no install needed there; see .ci/gpu-check): the gpu tests and the
# GPU bench on a model with Llama-3.1-8B's shapes. GPU_CHECK_FLAGS=--dry-run runs it on the CPU.
gpu-check:
	.ci/gpu-check $(GPU_CHECK_FLAGS)

# Wheels a bare CUDA PyTorch image lacks, fetched here into the ignored .whl/ for .ci/gpu-check
gpu-wheels:
	python3 -m pip download --no-deps --only-binary=:all: -d .whl conllu

# headscope's verdicts against compiled truth (issue #44): every tracr program at both settings, compiled once
# (cached under ~/.cache/headscope/tracr; ~5 min on 2 cores the first time), into data/figures/validate_tracr.json;
# tests/analyses/test_validate_tracr_figures.py reads it and docs/guide/compiled.md quotes it
validate: bootstrap
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/headscope validate tracr --out runs/validate-tracr --quiet
	cp runs/validate-tracr/validate.json data/figures/validate_tracr.json

lint: bootstrap
	$(PY) -m ruff check --fix $(LINTED)
	$(PY) -m ruff format $(LINTED)

# The IOI roles on SmolLM2 (name movers, negative name movers, S-inhibition by path patching; ~5 min on one core)
# and the new roles' top heads beside them, into data/figures/ioi_smollm2.json; tests/analyses/roles/test_ioi_figures.py
# fails while docs/guide/roles.md quotes other values
.PHONY: ioi-roles
ioi-roles: bootstrap
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 $(PY) -m headscope.reports.tools.experiments.ioi_figures

# The example of docs/guide/checkpoints.md: headscope report on two MiniLM checkpoints (one with two heads' W_O
# zeroed) and a random model of another size (~4 min on one core) into data/figures/checkpoints_minilm.json and
# docs/_static/checkpoints_*.png; tests/reports/test_checkpoints.py checks the page quotes it
.PHONY: checkpoints
checkpoints: bootstrap
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 $(PY) -m headscope.reports.tools.experiments.checkpoint_figures

# The bench's Ray rows (issue #45): the roles stage's text groups on SmolLM2 in one process, on one Ray worker and
# over two, one thread each (Ray's overhead and the 2-worker speed-up as targets of one run, and whether every
# table equals the single run), into data/figures/ray_bench.json
.PHONY: ray-bench
ray-bench: bootstrap
	OMP_NUM_THREADS=1 .venv/bin/headscope bench smollm2-135m --paths roles_stage roles_ray1 roles_ray2 --sentences 64 --batch 8 --repeats 2 --json > data/figures/ray_bench.json
