# make test: create .venv if missing, install the project with its test extras, run the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest property_tests $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m pytest property_tests --benchmark-only --benchmark-enable -p no:randomly $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks
