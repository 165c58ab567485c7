"""What a kernel author sees in a first hour of ``validate``: the smoke tier, the time estimate said before any work,
and a header that names the dtypes and case counts actually run."""

from __future__ import annotations

from gdn2_oracle.oracle import call_modes

PLAIN_KERNEL = "gdn2_oracle.kernels.testing:correct"  # the dense contract only: accepts no mode
BASE = call_modes.BASE.name
PACKED = call_modes.names("training")[0]


def header(out):
    """The validate header line of a run's stdout."""
    return next(line for line in out.splitlines() if line.startswith("gdn2-oracle validate: "))


def test_header_names_the_dtypes_of_the_cases_run(cli):
    """One float32 mode case runs: the header says dtypes float32, not every dtype selected."""
    code, out, _ = cli("validate", "--kernel", "pairwise", "--modes", PACKED, "--cases", "quick", "--no-progress")
    assert code == 0, out
    line = header(out)
    assert "1 cases" in line and "dtypes float32;" in line and "bfloat16" not in line, line


def test_header_counts_the_cases_judged_per_kernel(cli):
    """A kernel taking no mode: ``1 of 2 cases judged for K (1 need a mode ...)``; one judged on all: no such line."""
    code, out, _ = cli("validate", "--kernel", f"{PLAIN_KERNEL},pairwise", "--modes", f"{BASE},{PACKED}",
                       "--cases", "quick", "--case", "gen_moderate_T100", "--case", f"{PACKED}_quick",
                       "--dtype", "float32", "--no-progress")
    assert code == 0, out
    assert f"  1 of 2 cases judged for {PLAIN_KERNEL} (1 need a mode its signature does not take)" in out, out
    assert "cases judged for pairwise" not in out, out
