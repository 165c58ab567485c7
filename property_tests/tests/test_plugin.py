"""The ``gdn2_oracle`` pytest plugin: present once installed, silent unless asked, and its options work.

Each test runs pytest in a subprocess from a temporary directory outside the repository, as a
kernel author would from their own repository.
"""

from __future__ import annotations

import pytest

from gdn2_oracle.ci.testing import pytest_run

WRONG = "gdn2_oracle.kernels.testing:perturbed"
ONE_GOLDEN = ["-k", "test_kernel_matches_golden and len_1"]


def test_options_are_registered(tmp_path):
    code, out = pytest_run(tmp_path, "--help")
    assert code == 0, out
    for option in ("--gdn2-kernel", "--gdn2-profile", "--gdn2-xfails"):
        assert option in out, f"{option} missing from pytest --help"


def test_plugin_adds_nothing_to_an_unrelated_run(tmp_path):
    (tmp_path / "test_other.py").write_text(
        "import sys\n\n"
        "def test_nothing_of_ours_loaded(request):\n"
        "    assert 'jax' not in sys.modules\n"
        "    assert not [m for m in sys.modules if m.startswith('gdn2_oracle.') and not m.endswith('plugin')\n"
        "                and m != 'gdn2_oracle.property_tests']\n"
        "    assert not [f for f in request.fixturenames if 'gdn2' in f or f == 'kernel']\n")
    code, out = pytest_run(tmp_path, "-q")
    assert code == 0 and "1 passed" in out, out
    assert "gdn2:" not in out  # no report header either
    code, out = pytest_run(tmp_path, "--fixtures", "-q")
    assert code == 0 and "gdn2" not in out.lower(), out


@pytest.mark.slow
def test_gdn2_kernel_selects_the_kernel_and_a_wrong_one_fails(tmp_path):
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests", "--gdn2-kernel", WRONG, *ONE_GOLDEN)
    assert code == 1 and "1 failed" in out and WRONG in out, out
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests", "--gdn2-kernel", "pairwise",
                           "--gdn2-profile", "dev", *ONE_GOLDEN)
    assert code == 0 and "1 passed" in out and "hypothesis profile 'dev'" in out, out


@pytest.mark.slow
def test_gdn2_xfails_reports_listed_tests_as_xfail(tmp_path):
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("# known failures of this kernel\ntest_kernel_matches_golden  # output scaled by 1e-3\n")
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests", "--gdn2-kernel", WRONG,
                           "--gdn2-xfails", str(xfails), *ONE_GOLDEN, "-rx")
    assert code == 0 and "1 xfailed" in out and "listed in --gdn2-xfails" in out, out


def test_gdn2_xfails_missing_file_is_a_usage_error(tmp_path):
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests", "--gdn2-xfails",
                           str(tmp_path / "nope.txt"), "--collect-only", "-q")
    assert code == 4 and "--gdn2-xfails" in out and "nope.txt" in out, out


def test_gdn2_kernel_lists_split_at_commas_outside_brackets(tmp_path):
    """``GDN2_KERNEL='factorized[chunk_size=32,leaf=8],pairwise'`` (or the option) is two kernels, not three
    broken names; an unbalanced bracket is a usage error."""
    specs = "factorized[chunk_size=32,leaf=8],pairwise"
    for how, env in ((["--gdn2-kernel", specs], None), ([], {"GDN2_KERNEL": specs})):
        code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests", *how, *ONE_GOLDEN,
                               "--collect-only", "-q", env=env)
        ids = sorted(line.split("::", 1)[1] for line in out.splitlines() if "::" in line)
        assert code == 0 and ids == ["test_kernel_matches_golden[factorized[chunk_size=32,leaf=8]-len_1]",
                                     "test_kernel_matches_golden[pairwise-len_1]"], out
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests", "--collect-only", "-q",
                           env={"GDN2_KERNEL": "factorized[chunk_size=32"})
    assert code == 4 and "unbalanced" in out, out


def test_an_xfails_entry_that_matches_no_test_is_warned_by_name(tmp_path):
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("test_kernel_matches_golden\ntest_kernel_matches_goldn  # misspelt\n")
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests", "--gdn2-xfails", str(xfails),
                           "--collect-only", "-q", *ONE_GOLDEN)
    assert code == 0 and "no test matches 'test_kernel_matches_goldn'" in out, out
    assert "no test matches 'test_kernel_matches_golden'" not in out


def test_an_unimportable_kernel_is_one_line_naming_the_module_and_pythonpath(tmp_path):
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests", "--gdn2-kernel", "mypkg.gdn:kernel",
                           "--collect-only", "-q")
    assert code == 4, out
    errors = [line for line in out.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and "cannot import module 'mypkg.gdn'" in errors[0] and "PYTHONPATH" in errors[0], out
    assert "Traceback" not in out


def test_gdn2_modes_selects_serving_properties_too(tmp_path):
    """``--gdn2-modes speculative`` keeps the serving suite's speculative property only; a training mode none."""
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_serving", "--gdn2-modes",
                           "speculative", "--collect-only", "-q")
    ids = [line for line in out.splitlines() if "::" in line]
    assert code == 0 and ids and all("test_every_accept_count" in i for i in ids), out
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_serving", "--gdn2-modes", "varlen",
                           "--collect-only", "-q")
    assert code == 5 and "9 deselected" in out, out


def test_the_suite_keeps_its_compiled_programs_in_the_compile_cache(tmp_path, monkeypatch):
    """The suite's programs go to JAX's persistent cache, as the CLI's do, so a warm CI run reads what a cold one
    compiled; JAX's own cache directory, where set, wins; --gdn2-no-compile-cache writes nothing."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    home, own, run = tmp_path / "home", tmp_path / "own", tmp_path / "run"
    run.mkdir()
    ours = home / "gdn2-oracle" / "jax"
    # every program kept, whatever its compile time on this machine (the default floor is 0.2 s)
    args = ("--pyargs", "gdn2_oracle.property_tests", "--gdn2-kernel", "pairwise", "-k",
            "test_kernel_matches_golden and decay_resets")
    # (where JAX's own directory wins, JAX's own floor applies too: 1 s by default, which a program compiling in about a
    # second crossed or not from run to run)
    keep = {"GDN2_COMPILE_CACHE_MIN_SECONDS": "0", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}

    def entries(directory):
        return sorted(p.name for p in directory.iterdir()) if directory.exists() else []

    code, out = pytest_run(run, *args, env={"XDG_CACHE_HOME": str(home), "JAX_COMPILATION_CACHE_DIR": str(own), **keep})
    assert code == 0 and "1 passed" in out, out
    assert entries(own) and not entries(ours), out
    code, out = pytest_run(run, *args, "--gdn2-no-compile-cache", env={"XDG_CACHE_HOME": str(home), **keep})
    assert code == 0 and "1 passed" in out and "compile cache off" in out, out
    assert not entries(ours)
    code, out = pytest_run(run, *args, env={"XDG_CACHE_HOME": str(home), **keep})
    assert code == 0 and "1 passed" in out, out
    assert entries(ours)


def test_an_empty_gdn2_kernel_is_a_usage_error(tmp_path):
    """``--gdn2-kernel ''`` is a usage error naming the option, as ``validate --kernel ''`` is; not the default."""
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests", "--gdn2-kernel", "",
                           "--collect-only", "-q")
    assert code == 4 and "--gdn2-kernel ''" in out and "empty kernel name" in out, out


def test_serving_properties_skip_a_named_kernel_without_a_pool_with_the_reason(tmp_path):
    """A kernel named without a state pool: the serving tests are skipped saying so, not passed on ``decode``; a run of
    those alone judged the kernel on nothing: EMPTY (exit 5)."""
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_serving", "--gdn2-kernel",
                           "pairwise", "-q", "-rs")
    assert code == 5 and "9 skipped" in out and "passed" not in out and "EMPTY for pairwise" in out, out
    assert "kernel pairwise takes no state pool (neither state_pool nor FLA's initial_state + ssm_state_indices)" in out
    assert "[decode" not in out


def test_the_modes_spec_option_deselects_the_modes_it_leaves_out(tmp_path):
    """``--gdn2-kernel 'pairwise[modes=dense]'``: the training-call mode properties (test_modes.py) are deselected
    for that kernel, as validate leaves their cases out; without the option they are collected."""
    def collected(spec):
        code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_modes", "--gdn2-kernel", spec,
                               "--collect-only", "-q")
        return code, [line for line in out.splitlines() if "::test_" in line], out

    code, items, out = collected("pairwise")
    assert code == 0 and items, out
    n = len(items)
    code, items, out = collected("pairwise[modes=dense]")
    assert not items and f"({n} deselected)" in out, out
