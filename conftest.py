"""The repository's two test groups (not installed; the conformance suite a user runs is not affected).

``make test`` runs every test outside the **release** group; ``make test-release`` runs the release group, and
``.ci/run`` runs both, so nothing is checked less often than on every change that lands. The release group is
every test marked ``slow`` and the tests matched by :data:`RELEASE`: the heaviest interpreter runs (FLA's Triton
kernels, Pallas in interpret mode), multi-device and multi-process runs, and the second kernel of checks that run
per kernel (``factorized``, where ``pairwise`` keeps the check in ``make test``). Chosen from the durations of a
cold ``make test`` (``pytest --durations``; docs/performance.md); a pattern is ``fnmatch``-ed on the node id.
"""

import signal
from fnmatch import fnmatch

import pytest

from gdn2_oracle.ci.running import collector, map_guard

# A test run started in the background by a script (``cmd &`` without job control) inherits SIGINT ignored, and
# so would every process a test starts: the tests that send Ctrl-C to a command would see it ignored. Ctrl-C is
# the default here, as in a terminal (a Python handler, unlike SIG_IGN, is not inherited across exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite's own test processes trace kernels as the judging commands do: the same garbage-collector setting
# (ci/running/collector.py), whatever subset of the tests is collected.
collector.raise_threshold()

RELEASE = (
    # interpreters: FLA's Triton kernels on the CPU, Pallas TPU kernels in interpret mode
    "kernels/tests/test_fla_interpret.py::*",
    "kernels/tests/test_fla_family_peers.py::test_interpreted_*",
    "kernels/tests/test_engine_peers.py::test_interpreted_*",
    "kernels/tests/test_torch_modes.py::test_interpreted_fla_chunk*",
    "kernels/tests/test_pallas.py::*",
    "kernels/tests/test_pallas_golden.py::*",
    "kernels/tests/test_pallas_lowering.py::*",
    "kernels/tests/test_extreme_log_decay.py::*[[]pallas-*",
    "ci/tests/test_serving_judge.py::test_flas_fused_recurrent_kernel_under_the_interpreter*",
    "kernels/tests/test_pallas_packages.py::test_atomic_ops_*",
    "kernels/tests/test_pallas_packages.py::test_gdn2_pallas_*",
    "kernels/tests/test_pallas_packages.py::test_deltanet_tpu_*",
    "kernels/tests/test_torch_bridge.py::test_interpret_on_a_torch_spec_is_tritons_interpreter_*",
    "ci/tests/test_transformers_kernels.py::test_transformers_*",
    # several processes or devices
    "ci/tests/test_multihost.py::*",
    "ci/tests/test_mesh.py::*",
    # per-kernel checks: factorized here, pairwise in make test
    "kernels/tests/test_kernel_modes.py::*[[]factorized*",
    "property_tests/test_conformance.py::test_matches_oracle[[]factorized*",
    "property_tests/test_conformance.py::test_chunk_and_split_invariance[[]factorized*",
    "property_tests/test_conformance_golden.py::*[[]factorized-*",
    "property_tests/test_modes.py::*[[]factorized-*",
    # long figures and sweeps
    "ci/tests/test_serving_judge.py::test_long_horizon_figure",
    "ci/tests/test_cli.py::test_bench_tile_sweep*",
    "ci/tests/repository/test_readme_commands.py::test_gdn2_oracle_command_runs[[]docs/*",
    "ci/tests/test_families_validate.py::test_correct_family_kernels_pass_the_quick_set",
    "ci/tests/test_sglang_replayssm.py::test_validate_passes_sglangs_replayssm_by_name",
    "ci/tests/test_sglang_replayssm.py::test_a_commit_of_one_token_too_many_fails_with_a_diagnosis",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "release: the release group (make test-release; conftest.py says which)")


# The modules whose tests take the most time, heaviest first (the tests' own seconds in a fresh-clone .ci/run,
# 2026-12-07: 300, 209, 180, 106, 92). Listed in the slow modules' front: pytest-xdist's worksteal hands the first
# worker the front half of the list and lets the other steal from the end of it, so the module at the end of the slow
# block (the family mutants, alphabetically last, with two 2-minute plugin runs) started 20 minutes into the run and
# ended it on one worker alone.
HEAVIEST = (
    "property_tests/tests/test_family_mutants.py",
    "ci/tests/test_program_cache_staleness.py",
    "ci/tests/test_families_validate.py",
    "ci/tests/test_process_boundary.py",
    "ci/tests/test_signals.py",
)


def pytest_collection_modifyitems(config, items):
    """Mark the release group: tests marked slow and those :data:`RELEASE` matches. Then the modules with a test
    marked slow go first, the :data:`HEAVIEST` in front of them (otherwise in collection order, a module's tests
    together for its fixtures): a run on several workers starts its minutes-long tests while the short ones can still
    fill the other workers, instead of ending on one of them alone."""
    for item in items:
        if item.get_closest_marker("slow") or any(fnmatch(item.nodeid, p) for p in RELEASE):
            item.add_marker(pytest.mark.release)
    slow_modules = {item.path for item in items if item.get_closest_marker("slow")}

    def place(item):
        module = item.nodeid.split("::", 1)[0]
        return (HEAVIEST.index(module) if module in HEAVIEST else len(HEAVIEST)) + (item.path not in slow_modules)

    items.sort(key=place)


def pytest_runtest_teardown(item):
    """After each test: a worker that has compiled a few hundred programs clears JAX's caches before it reaches the
    kernel's limit on memory mappings, where XLA's compiler crashes (ci/running/map_guard.py)."""
    map_guard.relieve()
