# make test: create .venv if missing, install the project with its test extras, run the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test bench check clean
REPORTS := reports

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# The whole suite: the conformance suite (property_tests/) and every package's own tests (*/tests/).
# The venv's pytest, not `python -m pytest`: the repository root must not be on sys.path, so a
# bare `import kernels` (instead of gdn2_oracle.kernels) fails here as it would when installed.
test: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The main job: validate our kernels against the oracle and the goldens, then a validated benchmark.
check: $(STAMP)
	mkdir -p $(REPORTS)
	$(VENV)/bin/gdn2-oracle validate --cases golden --json $(REPORTS)/validate.json
	$(VENV)/bin/gdn2-oracle bench --kernel pairwise --kernel factorized --batch 1 --seq 1024 --heads 2 --dim 64 \
		--dtype float32 --repeats 5 --json $(REPORTS)/bench.json --plot $(REPORTS)/bench.png

# pytest-benchmark latency tests, timed (`make test` runs them once untimed), saved as JSON under .benchmarks/.
bench: $(STAMP)
	$(VENV)/bin/pytest ci/benchmarks --benchmark-only --benchmark-enable --benchmark-autosave $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks $(REPORTS)
