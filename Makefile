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

test: $(STAMP)
	$(PY) -m pytest property_tests $(PYTEST_ARGS)

# The main job: validate our kernels against the oracle and the goldens, then a validated benchmark.
check: $(STAMP)
	mkdir -p $(REPORTS)
	$(VENV)/bin/gdn2-oracle validate --cases golden --json $(REPORTS)/validate.json
	$(VENV)/bin/gdn2-oracle bench --kernel pairwise --kernel factorized --batch 1 --seq 1024 --heads 2 --dim 64 \
		--dtype float32 --repeats 5 --json $(REPORTS)/bench.json --plot $(REPORTS)/bench.png

# pytest-benchmark latency tests, timed (`make test` runs them once untimed), saved as JSON under .benchmarks/.
bench: $(STAMP)
	$(PY) -m pytest property_tests --benchmark-only --benchmark-enable --benchmark-autosave $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks $(REPORTS)
