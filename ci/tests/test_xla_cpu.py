"""The judging commands compile with XLA's quick-compiling CPU settings unless the user chose otherwise
(ci/running/xla_cpu.py): the flags added, the user's own kept, the opt-out, the report's record, and a bad value."""

import json

import pytest

from gdn2_oracle.ci.running import xla_cpu
from gdn2_oracle.ci.testing import console

LEVEL, EMITTERS, SPLIT = xla_cpu.FLAGS


@pytest.mark.parametrize("command", xla_cpu.JUDGING)
def test_a_judging_command_adds_the_quick_compile_flags(monkeypatch, command):
    monkeypatch.delenv(xla_cpu.ENV, raising=False)
    assert xla_cpu.flags_to_add("", command) == [LEVEL, EMITTERS, SPLIT]
    assert xla_cpu.flags_to_add("--xla_force_host_platform_device_count=8", command) == [LEVEL, EMITTERS, SPLIT]


@pytest.mark.parametrize("command", ["bench", "golden", "cost", None])
def test_a_command_that_does_not_judge_compiles_as_the_users_jax(monkeypatch, command):
    monkeypatch.delenv(xla_cpu.ENV, raising=False)
    assert xla_cpu.flags_to_add("", command) == []


def test_a_flag_the_user_set_is_left_as_set_and_default_turns_them_off(monkeypatch):
    monkeypatch.delenv(xla_cpu.ENV, raising=False)
    assert xla_cpu.flags_to_add("--xla_backend_optimization_level=2", "validate") == [EMITTERS, SPLIT]
    assert xla_cpu.flags_to_add("--xla_cpu_use_fusion_emitters=true --xla_backend_optimization_level=3 "
                                "--xla_cpu_parallel_codegen_split_count=4", "hunt") == []
    monkeypatch.setenv(xla_cpu.ENV, "default")
    assert xla_cpu.flags_to_add("", "validate") == []
    monkeypatch.setenv(xla_cpu.ENV, "fastest")
    with pytest.raises(ValueError, match=xla_cpu.ENV):
        xla_cpu.flags_to_add("", "validate")


def test_apply_extends_the_users_xla_flags(monkeypatch):
    monkeypatch.delenv(xla_cpu.ENV, raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nowhere")
    assert xla_cpu.apply("domain") == [LEVEL, EMITTERS, SPLIT]
    assert xla_cpu.in_force() == f"--xla_dump_to=/nowhere {LEVEL} {EMITTERS} {SPLIT}"


def test_validate_through_the_console_script_records_the_flags_it_compiled_with(tmp_path):
    """Cold console runs of one case: by default the report's environment and the header carry the three flags and
    the case passes; with GDN2_XLA_CPU=default none is added and the grade is the same; a bad value is a usage
    error naming the variable, before any work."""
    argv = ("validate", "--kernel", "factorized", "--case", "len_1", "--dtype", "float32", "--no-progress")
    grades = {}
    for mode, flags in (("quick-compile", " ".join(xla_cpu.FLAGS)), ("default", "")):
        report = tmp_path / f"{mode}.json"
        run = console(tmp_path, *argv, "--json", report, GDN2_XLA_CPU=mode)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out
        data = json.loads(report.read_text())
        assert data["environment"]["xla_flags"] == flags, data["environment"]
        assert (f"XLA_FLAGS {flags}" in out) == bool(flags), out
        [k] = data["kernels"]
        grades[mode] = [(c["case"], c["grade"]) for c in k["cases"]]
    assert grades["quick-compile"] == grades["default"] == [("len_1", "PASS")], grades
    run = console(tmp_path, *argv, GDN2_XLA_CPU="fastest")
    assert run.returncode == 2 and "GDN2_XLA_CPU" in run.stderr and "PASS" not in run.stdout, run.stderr


def test_the_test_processes_compile_with_the_same_flags():
    """The Makefile's TEST_XLA_FLAGS are the judging commands' flags (one list in two places, kept equal here), so a
    test process and the console runs it starts compile alike."""
    from pathlib import Path

    makefile = Path(__file__).resolve().parents[2] / "Makefile"
    line = next(ln for ln in makefile.read_text().splitlines() if ln.startswith("TEST_XLA_FLAGS :="))
    assert line.split(":=", 1)[1].split() == list(xla_cpu.FLAGS), line
