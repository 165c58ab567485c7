"""A bad option is one usage error before any work, never a kernel failure on every case.

Each run is the console script in a subprocess with its caches under ``tmp_path``: exit 2, one ``error:`` line on
stderr naming the option, no traceback, and nothing on stdout (no case was started). The kernel options are checked
where the kernel is built (``ci/commands/args.py: build``, shared by validate, bench, domain and hunt): a value the
factory refuses (a replay ring too long to allocate, a torch device this host lacks), an option a ``module:attr``
function cannot take, a ``module:attr`` that is not a kernel; the list options by their argparse types.
"""

from __future__ import annotations

import pytest

from gdn2_oracle.ci.testing import console

EXIT_USAGE = 2
ONE_CASE = ("--case", "kv_16x32", "--dtype", "float32")
CORRECT = "gdn2_oracle.kernels.testing:correct"

# (argv, what the error line names)
BAD = {
    "capacity": (["validate", "--kernel", "replay-recurrent[capacity=1000000000000]", "--case", "serving_gdn_pool_g2",
                  "--dtype", "float32"], "capacity"),
    "device-keyword": (["validate", "--kernel", f"{CORRECT}[device=tpu]", *ONE_CASE], "device"),
    "torch-device": (["validate", "--kernel", "torch:gdn2_oracle.kernels.testing_torch:recurrent[device=meta]",
                      *ONE_CASE], "device"),
    "not-a-kernel": (["validate", "--kernel", "os:system", *ONE_CASE], "--kernel"),
    "builtin": (["validate", "--kernel", "builtins:max", *ONE_CASE], "--kernel"),
    "jobs": (["validate", "--jobs", "100000", *ONE_CASE], "--jobs"),
    "dtype-empty-item": (["validate", "--dtype", "float32,", "--case", "kv_16x32"], "--dtype"),
    "bench-batch": (["bench", "--kernel", "pairwise", "--batch", "1,,2", "--seq", "16", "--heads", "1", "--dim", "8"],
                    "--batch"),
    "bench-not-a-kernel": (["bench", "--kernel", "os:system", "--batch", "1", "--seq", "16", "--heads", "1",
                            "--dim", "8"], "--kernel"),
    "bench-jobs": (["bench", "--kernel", "pairwise", "--jobs", "100000", "--batch", "1"], "--jobs"),
    "domain-device": (["domain", "--kernel", f"{CORRECT}[device=tpu]"], "device"),
    "hunt-not-a-kernel": (["hunt", "--kernel", "os:system"], "--kernel"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_option_is_one_usage_error_naming_it_before_any_case(tmp_path, name):
    argv, option = BAD[name]
    proc = console(tmp_path, *argv, "--no-progress", timeout=120)
    shown = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == EXIT_USAGE, shown
    assert "Traceback" not in proc.stderr, shown
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and option in errors[0], shown
    assert proc.stdout == "", shown  # no case started: nothing printed of a run
