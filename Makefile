# make test: create .venv if missing, install the project with its test extras, run the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-fast test-release test-all bench check clean test-oldest peers
REPORTS := reports

$(PY):
	$(PYTHON) -m venv $(VENV)

# Besides the project: for the torch bridge's tests, the CPU build of torch 2.13.0 (a local wheel on these
# machines; an unpinned torch pulls a CUDA build of several GB), FLA's pure-PyTorch references (fla-core needs
# only einops) and Triton 3.9.0, whose interpreter runs FLA's Triton kernels on the CPU
# (fla-gdn2-chunk[interpret=1]). --no-deps keeps pip from resolving fla-core's and torch's own requirements
# (a CUDA torch); their small pure-Python dependencies follow on the next line. sympy (autograd
# imports it) caps mpmath < 1.4; sympy 1.14 runs with the mpmath 1.4 installed here (pip warns only).
# ml_dtypes 0.6.0 (JAX asks for >= 0.5): 0.7.0's import takes 0.83 s here against 0.10 s, in every process that
# imports JAX -- a third of a console command's start-up, and the suite starts hundreds of them
# (docs/performance.md, "Start-up"). torch, sympy, fla-core and Triton install while the project does (none of them
# is a requirement of the project, and --no-deps installs nothing else: the two sets of files are disjoint): a fresh
# machine's set-up was two single-threaded installs of ~20 s each, one after the other; ml_dtypes after both, as
# the project's install brings the newest.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-deps torch==2.13.0 sympy==1.14.0 fla-core==0.6.0 triton==3.9.0 \
		> $(VENV)/third-party-install.log 2>&1 & third=$$!; \
	$(PY) -m pip install -q -e '.[test]'; ours=$$?; \
	wait $$third; theirs=$$?; cat $(VENV)/third-party-install.log; test $$ours -eq 0 && test $$theirs -eq 0
	$(PY) -m pip install -q --no-deps ml_dtypes==0.6.0
	$(PY) -m pip install -q filelock 'typing-extensions>=4.10' networkx jinja2 fsspec 'einops>=0.8'
	touch $(STAMP)

# The third-party kernels judged by name (docs/third-party.md), installed from PyPI, none of them committed:
# transformers (its pure-torch GDN and KDA fallbacks) into the venv; vLLM's and SGLang's wheels downloaded whole
# (--no-deps: their engines do not install here; kernels/third_party.py loads their Triton kernel files from the
# wheel); gdn2-pallas, atomic-ops and deltanet-tpu each in a folder of its own (gdn2-pallas and atomic-ops both
# ship a top-level atomic_ops; deltanet-tpu asks for Python >= 3.12 and runs on 3.11). GDN2_PEERS names the folder.
PEERS := $(CURDIR)/.peers
PEER_STAMP := .peers/.installed
$(PEER_STAMP): Makefile | $(STAMP)
	rm -rf .peers && mkdir -p .peers/wheels
	$(PY) -m pip install -q transformers==5.25.0
	$(PY) -m pip download -q --no-deps -d .peers/wheels vllm==0.33.0 sglang==0.5.23
	$(PY) -m pip install -q --no-deps --target .peers/gdn2-pallas gdn2-pallas==0.1.1
	$(PY) -m pip install -q --no-deps --target .peers/atomic-ops atomic-ops==0.2.0
	$(PY) -m pip install -q --no-deps --ignore-requires-python --target .peers/deltanet-tpu deltanet-tpu==0.3.0
	touch $(PEER_STAMP)
peers: $(PEER_STAMP)

# The suite: the conformance suite (property_tests/) and every package's own tests (*/tests/), in two groups
# (conftest.py): `make test` runs all but the release group, `make test-release` the release group (tests
# marked slow, the interpreter, multi-device and second-kernel runs); `make test-all` both; .ci/run runs both.
# The venv's pytest, not `python -m pytest`: the repository root must not be on sys.path, so a
# bare `import kernels` (instead of gdn2_oracle.kernels) fails here as it would when installed.
# JAX's persistent compilation cache is off in the test processes (GDN2_COMPILE_CACHE=off; tests that check the
# cache give it their own folder): with both workers writing and reading one shared folder, a worker twice died with
# a segfault inside JAX's cache read or write (jax/_src/compilation_cache.py) in this suite's fresh-clone runs.
# The commands the tests start share one: the console-script runs (ci.testing.console_env reads
# GDN2_TEST_COMPILE_CACHE; their reference and program caches stay fresh) and the plugin's pytest runs (which drop
# GDN2_ variables and so use $XDG_CACHE_HOME/gdn2-oracle/jax, the same folder). Measured side by side on this
# 2-core host: a `validate --cases smoke` run whose programs an earlier run compiled takes 6.8 s instead of 21-23 s
# (pairwise) and 7.5 s instead of 41 s (gdn-factorized); a cold run costs what it did with the cache off.
# A worker that dies all the same (as workers did inside XLA's CPU compiler once their compiled programs filled the
# process's memory mappings, vm.max_map_count; conftest.py now clears JAX's caches before that, ci/running/map_guard.py)
# has its test run once more on a fresh worker
# (pytest-rerunfailures' crash recovery; the summary shows it as R). Only a crashed worker is rerun: --only-rerun
# matches no assertion or error text, so a failing test fails at once, and a test that crashes twice fails.
# ci/crash_rerun.py makes the rerun certain: rerunfailures sends a test's rerun count without waiting, and a worker
# that died at once lost its rerun (seen on CI; 3 of 40 runs here under load, 0 of 96 with the plugin).
CRASH_RERUN := -p gdn2_oracle.ci.crash_rerun --reruns 1 --only-rerun '^$$never a test message$$'
# XLA compiles the test processes' programs at backend optimization level 0 (LLVM's optimizer off): the suite's
# programs are tiny and most of its time was their compilation (a family kernel's forward and VJP: 7.3 s -> 3.1 s a
# program, measured side by side); the results differ from the default build by float32 rounding only (measured on
# our family kernels' results: at most 1.4e-7 relative, one dg at a cancellation 6.6e-6), far inside the judge's
# tolerances, and every run a test compares (two calls, a cache's two runs) compiles alike. The judging commands
# (validate, domain, hunt) add the same flags (ci/running/xla_cpu.py FLAGS; a test keeps the two lists equal) in their
# own process unless GDN2_XLA_CPU=default, so the console runs the tests start compile alike too. The CPU backend's
# fusion emitters are off as well (XLA's older elemental emitter instead): a family kernel's forward and VJP
# compiles in 0.4 s instead of 1.5 s at level 0, and its results
# are bit-identical to level 0's (o, final state and the six gradients of gdn- and kda-factorized, measured);
# `validate --kernel gdn-factorized --cases golden`, cold: 49 s -> 28 s, side by side.
# And each program's LLVM module compiled whole, not split for parallel code generation (the cores are busy with the
# workers anyway): 12 family-kernel programs in 3.8-4.5 s instead of 4.8-5.1 s, half the memory mappings an
# executable holds (so the mapping guard clears JAX's caches half as often), results bit-identical
# (ci/running/xla_cpu.py).
TEST_XLA_FLAGS := --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1
# pytest-xdist: one worker a core (TEST_WORKERS=0: in this process, e.g. for pdb); work stealing, because
# a few subprocess tests take minutes while most take a second.
# The float64 references of fixed recipes go to .reference-cache/ and validate's exported kernel programs to
# .program-cache/ (both gitignored), not the user's ~/.cache; the judge's own tests (ci/tests/conftest.py) turn
# the reference cache off where they watch the oracle work. A command a test starts without the GDN2_ variables
# uses the default caches under XDG_CACHE_HOME: .test-cache-home/ (gitignored), never the user's home.
# ruff first: the lint rules of pyproject.toml [tool.ruff] are part of the suite.
TEST_WORKERS ?= auto
PYTEST := XDG_CACHE_HOME=$(CURDIR)/.test-cache-home \
	GDN2_COMPILE_CACHE=off GDN2_TEST_COMPILE_CACHE=$(CURDIR)/.test-cache-home/gdn2-oracle/jax \
	XLA_FLAGS="$(TEST_XLA_FLAGS) $(XLA_FLAGS)" \
	GDN2_REFERENCE_CACHE=$(CURDIR)/.reference-cache GDN2_PROGRAM_CACHE=$(CURDIR)/.program-cache GDN2_PEERS=$(PEERS) \
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal $(CRASH_RERUN)
# Before the suite: the package's bytecode (compileall) and pytest's assertion-rewritten copies of the plugin's modules
# (a collect-only run of the conformance suite), written once. Where PYTHONDONTWRITEBYTECODE is set (these machines
# set it) no process writes them, so every console command compiled the package's sources again and every pytest the
# tests start rewrote 127 plugin modules (ours and the other pytest plugins'): 2.1 s -> 1.3 s a pytest start-up,
# measured. The processes still read them, and
# Python and pytest check each one against its source's size and time, so an edited file is compiled again.
PRECOMPILE = PYTHONDONTWRITEBYTECODE= $(PY) -m compileall -q -j 0 oracle kernels golden ci property_tests \
	&& PYTHONDONTWRITEBYTECODE= XDG_CACHE_HOME=$(CURDIR)/.test-cache-home GDN2_COMPILE_CACHE=off \
	$(VENV)/bin/pytest -p no:cacheprovider --collect-only -q --pyargs gdn2_oracle.property_tests > /dev/null
test: $(STAMP) $(PEER_STAMP)
	$(VENV)/bin/ruff check .
	$(PRECOMPILE)
	$(PYTEST) -m "not release" $(PYTEST_ARGS)

# The loop before every commit: ruff, then the oracle's, goldens', kernels' and repository rules' tests and the
# conformance suite on the default kernels, in the Hypothesis dev profile; not the judge's end-to-end command runs
# (ci/tests) nor the plugin's own subprocess runs (property_tests/tests), which make test runs.
FAST := oracle/tests golden/tests kernels/tests property_tests ci/tests/repository --ignore=property_tests/tests
test-fast: $(STAMP) $(PEER_STAMP)
	$(VENV)/bin/ruff check .
	$(PRECOMPILE)
	$(PYTEST) -m "not release" --gdn2-profile dev $(FAST) $(PYTEST_ARGS)

test-release: $(STAMP) $(PEER_STAMP)
	$(PRECOMPILE)
	$(PYTEST) -m release $(PYTEST_ARGS)

# Both groups in one pytest run (what .ci/run runs): one start-up and one tail instead of two, and the release
# group's minutes-long tests (sorted first, conftest.py) overlap the short ones on the other worker.
test-all: $(STAMP) $(PEER_STAMP)
	$(VENV)/bin/ruff check .
	$(PRECOMPILE)
	$(PYTEST) $(PYTEST_ARGS)

# The main job: validate our kernels against the oracle and the goldens; check that the program cache (validate's
# default path) never changes a verdict: factory-made correct and wrong kernels validated twice in one cache, every
# wrong one rejected and every correct one passed both times (ci/cache_selfcheck.py); then a validated benchmark.
check: $(STAMP)
	mkdir -p $(REPORTS)
	$(VENV)/bin/gdn2-oracle validate --cases golden --json $(REPORTS)/validate.json
	$(VENV)/bin/gdn2-oracle validate --kernel gdn-factorized --kernel kda-factorized --cases golden \
		--json $(REPORTS)/validate-families.json
	$(PY) -m gdn2_oracle.ci.cache_selfcheck
	$(VENV)/bin/gdn2-oracle bench --kernel pairwise --kernel factorized --batch 1 --seq 1024 --heads 2 --dim 64 \
		--dtype float32 --repeats 5 --json $(REPORTS)/bench.json --plot $(REPORTS)/bench.png

# pytest-benchmark latency tests, timed (`make test` runs them once untimed), saved as JSON under .benchmarks/.
bench: $(STAMP)
	$(VENV)/bin/pytest ci/benchmarks --benchmark-only --benchmark-enable --benchmark-autosave $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .peers .pytest_cache .hypothesis .benchmarks .jax-cache .reference-cache .program-cache .test-cache-home .venv-oldest $(REPORTS)

# The dependency floors (pyproject.toml [project] dependencies), each installed at its floor: its own venv,
# the project (editable) with ci/oldest-constraints.txt (pip -c: the floors pinned ==; jaxlib follows jax), then
# the conformance suite as a user runs it (--pyargs, from an empty directory, CI=true; not the plugin's
# self-tests in property_tests/tests, which the wheel leaves out but this editable install has) and the golden tests and
# the matplotlib drawings (validate --dump/--plot) with the repository's own tests (-o addopts=: no
# pytest-benchmark here). docs/development.md#dependency-floors
OLDEST := .venv-oldest
OLDEST_CONSTRAINTS := ci/oldest-constraints.txt
OLDEST_STAMP := $(OLDEST)/.installed

$(OLDEST_STAMP): pyproject.toml $(OLDEST_CONSTRAINTS)
	rm -rf $(OLDEST)
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install -q --upgrade pip
	$(OLDEST)/bin/python -m pip install -q -e . -c $(OLDEST_CONSTRAINTS)
	touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP)
	$(OLDEST)/bin/python -m pip freeze | grep -i -x -F -f $(OLDEST_CONSTRAINTS)  # the pins, as installed
	export CI=true JAX_COMPILATION_CACHE_DIR=$(CURDIR)/.jax-cache GDN2_COMPILE_CACHE=$(CURDIR)/.jax-cache && \
		work=$$(mktemp -d) && cd $$work && \
		$(CURDIR)/$(OLDEST)/bin/pytest --pyargs gdn2_oracle.property_tests -p no:cacheprovider \
			--ignore=$(CURDIR)/property_tests/tests $(PYTEST_ARGS) && \
		cd $(CURDIR) && rm -rf $$work && \
		$(OLDEST)/bin/pytest -p no:cacheprovider -o addopts= golden/tests ci/tests/test_validate_dump_plot.py $(PYTEST_ARGS)
