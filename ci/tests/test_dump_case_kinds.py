"""``validate --dump`` through the console script on each case kind the dense tests leave out.

A training-call case and a family case (``ModeCase``) once crashed the dump with ``TypeError: 'NoneType' object is
not callable``: the dataclass field ``exact`` (a golden's stored results) hid the running floor's ``exact(fn)``
method. Each run here is one failing case of a deliberately wrong kernel: exit 1, the table printed, the case's
dump folder written (``verdicts.json``, ``reproduce.txt``, ``arrays.npz`` with the inputs, results and reference).
Dense and serving cases are dumped by ``test_validate_dump_plot.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from gdn2_oracle.ci.running.cases import CallCase, Runs
from gdn2_oracle.ci.testing import console

FAMILIES = "gdn2_oracle.kernels.testing_families"

# (kernel, case set, case, dtype): a generated family call, a generated training call, a family golden without a
# mode (its reproducer once named the GDN-2 corpus), a mode golden (its reference the golden's stored results)
KINDS = {
    "family": (f"{FAMILIES}:gdn_dt_bias_after_softplus", "quick", "gdn_gate_softplus", "float32"),
    "training-call": ("gdn2_oracle.kernels.testing_modes:leaky_state", "quick", "varlen_quick", "float32"),
    "family-golden": (f"{FAMILIES}:gdn_beta_write_only", "golden", "gdn_gva2_resets_beta_two_bf16", "bfloat16"),
    "mode-golden": ("gdn2_oracle.kernels.testing_modes:leaky_state", "golden", "mode_varlen_edges", "float32"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_validate_dump_of_a_failing_case_exits_1_with_a_table_and_its_folder(tmp_path, kind):
    kernel, case_set, case, dtype = KINDS[kind]
    root = tmp_path / "dump"
    proc = console(tmp_path, "validate", "--kernel", kernel, "--cases", case_set, "--case", case, "--dtype", dtype,
                   "--no-progress", "--dump", root, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    assert f"{kernel}: FAIL" in proc.stdout and "err_ratio" in proc.stdout, out
    assert f"dump: 1 case folder(s) not graded PASS in {root}" in proc.stdout, out
    [folder] = [p for p in root.rglob(case) if p.is_dir()]
    record = json.loads((folder / "verdicts.json").read_text())
    assert record["case"] == case and record["grade"] == "FAIL" and record["spec"] == kernel
    line = (folder / "reproduce.txt").read_text()
    assert "validate" in line and repr(case) in line, line  # the one-case validate run, never Case.golden
    with np.load(folder / "arrays.npz") as arrays:
        names = set(arrays.files)
    assert {"input_q", "got_o", "ref_o", "profile_o"} <= names, sorted(names)
    assert list(folder.glob("*_per_token.png")), sorted(p.name for p in folder.iterdir())


@dataclass(eq=False)
class _Hides:
    reference_for: object = None  # as ModeCase's field ``exact`` once hid the case method ``exact(fn)``


@pytest.mark.parametrize("bases, namespace", [
    ((Runs, _Hides), {}),  # a case kind over a dataclass with such a field (CallCase over ModeCase)
    ((CallCase,), {"__annotations__": {"reference_for": object}, "reference_for": None}),  # a field of its own
], ids=["inherited-field", "own-field"])
def test_a_case_field_that_would_hide_a_case_method_is_refused_when_the_class_is_defined(bases, namespace):
    with pytest.raises(TypeError, match=r"Hiding: field\(s\) \['reference_for'\] would hide"):
        type("Hiding", bases, dict(namespace))
