"""What a kernel author sees in a first hour of ``validate``: the smoke tier, the time estimate said before any work,
and a header that names the dtypes and case counts actually run."""

from __future__ import annotations

from gdn2_oracle.oracle import call_modes

PLAIN_KERNEL = "gdn2_oracle.kernels.testing:correct"  # the dense contract only: accepts no mode
BASE = call_modes.BASE.name
PACKED = call_modes.names("training")[0]


def header(out):
    """The validate header line of a run's stdout."""
    return next(line for line in out.splitlines() if line.startswith("gdn2-oracle validate: ") and "; device " in line)


def test_header_names_the_dtypes_of_the_cases_run(cli):
    """One float32 mode case runs: the header says dtypes float32, not every dtype selected."""
    code, out, _ = cli("validate", "--kernel", "pairwise", "--modes", PACKED, "--cases", "quick", "--no-progress")
    assert code == 0, out
    line = header(out)
    assert "1 cases" in line and "dtypes float32;" in line and "bfloat16" not in line, line


def test_header_counts_the_cases_judged_per_kernel(cli):
    """A kernel taking no mode: ``1 of 2 cases judged for K (1 need a mode ...)``; one judged on all: no such line."""
    code, out, _ = cli("validate", "--kernel", f"{PLAIN_KERNEL},pairwise", "--modes", f"{BASE},{PACKED}",
                       "--cases", "quick", "--case", "gen_moderate_T130", "--case", f"{PACKED}_quick",
                       "--dtype", "float32", "--no-progress")
    assert code == 0, out
    assert f"  1 of 2 cases judged for {PLAIN_KERNEL} (1 need a mode its signature does not take)" in out, out
    assert "cases judged for pairwise" not in out, out


def test_the_smoke_set_is_a_small_part_of_the_quick_set():
    """Smoke: quick's cases only, far fewer, both dtypes, the training-call and serving cases of quick kept."""
    from gdn2_oracle.ci.commands import validate

    smoke = validate.build_cases("smoke", families=validate.FAMILIES)
    quick = {c.name for c in validate.build_cases("quick", families=validate.FAMILIES)}
    names = [c.name for c in smoke]
    assert set(names) <= quick and 10 <= len(names) <= len(quick) // 4, names
    assert {c.dtype for c in smoke} == {"float32", "bfloat16"}
    assert {m for c in smoke for m in c.modes} >= {PACKED, *call_modes.names("serving")}
    assert set(validate.SMOKE) <= quick  # every name listed is a case of the quick set (no silent typo)


def test_validate_cases_smoke_runs_says_its_estimate_first_and_catches_a_wrong_kernel(cli):
    """``--cases smoke`` is a case set of the CLI; the first line says the cases, kernels and an estimate."""
    code, out, _ = cli("validate", "--kernel", "gdn2_oracle.kernels.testing:broken", "--cases", "smoke",
                       "--case", "scale_custom", "--dtype", "float32", "--no-progress")
    first = out.splitlines()[0]
    assert code == 1 and "FAIL" in out, out
    assert first.startswith("gdn2-oracle validate: starting 1 cases x 1 kernel(s) (set 'smoke'): 1 kernel calls, "
                            "1 programs to compile; about ")
    assert "on this machine cold" in first and "warm compilation cache" in first, first


def test_the_estimate_never_fails_a_run():
    """A run the estimate cannot read gives no line, not an exception."""
    from gdn2_oracle.ci.commands import validate

    assert validate.estimate_line(object()) is None


def test_an_unknown_case_set_is_a_usage_error(cli):
    code, _, err = cli("validate", "--kernel", "pairwise", "--cases", "smok")
    assert code == 2 and "smoke" in err and "quick" in err, err
