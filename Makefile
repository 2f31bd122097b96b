# Two entry points, each installing what it needs into .venv first (idempotent:
# the install reruns only when setup.py changes).
#   make run   - the main job: the synthetic study's quick variant
#   make test  - the test suite (without the end-to-end tests marked slow)
#   make test-slow - the end-to-end tests marked slow (.ci/run runs both)
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
WORKDIR ?= workdir/quick

.PHONY: run test test-slow bench

$(STAMP): setup.py
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[test,experiments,tfds]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/python -m experiments.synthetic --config=configs/synthetic.py:quick --workdir=$(WORKDIR)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n auto --maxprocesses=4 -m 'not slow' tests

test-slow: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n auto --maxprocesses=4 -m slow tests

bench: $(STAMP)
	$(VENV)/bin/python -m benchmarks.hamiltonian --feature_map=rff --out=benchmarks/results
	$(VENV)/bin/python -m benchmarks.hamiltonian --feature_map=favor --out=benchmarks/results
