# Two commands a new machine needs (each bootstraps .venv on first use):
#   make report   the main job: a head-role and pruning report on the shipped MiniLM-L6
#   make test     the test suite
# Without make: python3 .ci/bootstrap.py && .venv/bin/headscope report
PY      := .venv/bin/python
MODEL   ?= minilm-l6
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: bootstrap report test test-fast bench lint

bootstrap:
	@python3 .ci/bootstrap.py

report: bootstrap
	.venv/bin/headscope report $(MODEL)

LINTED  := probes analyses reports data tests .ci

test: bootstrap
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m pytest -q -n 2 --doctest-modules probes analyses reports data tests

test-fast: bootstrap
	$(PY) -m pytest -q -m "not slow and not browser" tests

bench: bootstrap
	.venv/bin/headscope bench $(MODEL)

lint: bootstrap
	$(PY) -m ruff check --fix $(LINTED)
	$(PY) -m ruff format $(LINTED)
