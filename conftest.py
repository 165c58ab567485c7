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

from gdn2_oracle.ci.running import map_guard

# A test run started in the background by a script (``cmd &`` without job control) inherits SIGINT ignored, and
# so would every process a test starts: the tests that send Ctrl-C to a command would see it ignored. Ctrl-C is
# the default here, as in a terminal (a Python handler, unlike SIG_IGN, is not inherited across exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Mark the release group (tests marked slow and those :data:`RELEASE` matches) before ``-m`` selects; then, once
    every other plugin has selected, deal the tests out to the workers (:func:`dealt`)."""
    for item in items:
        if item.get_closest_marker("slow") or any(fnmatch(item.nodeid, p) for p in RELEASE):
            item.add_marker(pytest.mark.release)
    yield
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    items[:] = dealt(items, workers)


def dealt(items, workers):
    """The tests in the order that gives each of ``workers`` workers its share of the heavy modules first.

    pytest-xdist's ``worksteal`` hands worker i the i-th of ``workers`` contiguous, equal slices of the collection
    and then lets an idle worker take half of a busy one's queue from its end. A heavy module (one with a test of the
    release group: minutes-long runs, interpreters, many processes) placed first in the collection all went to the
    first worker, which then ran them one after another: in a fresh-clone ``.ci/run`` the family plugin runs started
    24 minutes in and ended the run alone. So the heavy modules are split between the slices, the most release
    tests first, each to the slice with the fewest so far, and each slice begins with its heavy modules; the other
    modules fill the slices in collection order. A module's tests stay together (for its fixtures). One worker: the
    heavy modules first, as they were."""
    modules = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    weight = {path: sum(1 for i in tests if i.get_closest_marker("release")) for path, tests in modules.items()}
    heavy = sorted((p for p in modules if weight[p]), key=lambda p: -weight[p])
    light = [t for p, tests in modules.items() if not weight[p] for t in tests]
    if workers <= 1:
        return [t for p in heavy for t in modules[p]] + light
    shares, load = [[] for _ in range(workers)], [0] * workers
    for p in heavy:
        i = load.index(min(load))
        shares[i] += modules[p]
        load[i] += weight[p]
    out, size = [], len(items) // workers  # worksteal's slices: len // workers each, the last one the remainder
    for i, share in enumerate(shares):
        fill = len(light) if i == workers - 1 else max(0, size - len(share))
        out += share + light[:fill]
        light = light[fill:]
    return out


def pytest_runtest_teardown(item):
    """After each test: a worker that has compiled a few hundred programs clears JAX's caches before it reaches the
    kernel's limit on memory mappings, where XLA's compiler crashes (ci/running/map_guard.py)."""
    map_guard.relieve()
