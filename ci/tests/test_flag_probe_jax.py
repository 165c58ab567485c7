"""A plain JAX family kernel (``pkg.mod:fn[family=gdn]``) taking FLA's keywords through ``**kwargs`` is probed per
flag as a torch one is (ci/running/flag_probe.py, kernels/family_keywords.py): the flags it ignores are named and
their cases not run; declared ``flags=`` and a ``functools.wraps`` wrapper naming its keywords are not probed.

The kernels wrap our ``gdn-factorized`` (exact to the oracle), each counting its calls, in a module written to a
temporary folder as a user's would be.
"""

from __future__ import annotations

import json
import sys

import pytest

from gdn2_oracle.ci.running import families as family_running
from gdn2_oracle.ci.running import flag_probe
from gdn2_oracle.ci.testing import console
from gdn2_oracle.kernels import spec as spec_lib

MODULE = "flag_probe_jax_kernels"
SOURCE = '''
import functools

from gdn2_oracle.kernels.families import gdn_factorized

CORE = gdn_factorized(chunk_size=16)  # small chunks: the quickest programs to compile
NO_GATE = ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "cu_seqlens")
CALLS = [0]


def ignoring_gate(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kwargs):
    CALLS[0] += 1
    return CORE(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                **{n: x for n, x in kwargs.items() if n in NO_GATE})


def honouring(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kwargs):
    CALLS[0] += 1
    return CORE(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                **kwargs)


def named(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
          use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, use_gate_in_kernel=False, A_log=None,
          dt_bias=None, lower_bound=None, cu_seqlens=None):
    return honouring(**locals())


@functools.wraps(named)
def wrapped(*args, **kwargs):
    return named(*args, **kwargs)
'''
# the cases of the console run: the in-kernel gate's (set use_gate_in_kernel) and a plain one
GATE_CASE, PLAIN_CASE = "gdn_gate_softplus", "gdn_gva2_resets_beta_small"


def built(spec):
    """Kernel ``spec`` built as ``validate`` builds it: its ``family`` option taken out, the family read after."""
    build_spec, option = family_running.spec_family(spec_lib.KernelSpec.parse(spec))
    fn = build_spec.build()
    assert family_running.kernel_family(fn, option) == "gdn"
    return fn


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """The kernels' module, importable (its folder on ``sys.path``); yields ``(module, folder)``."""
    folder = tmp_path_factory.mktemp("kernels")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    try:
        yield __import__(MODULE), folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(MODULE, None)


def test_a_jax_kernel_ignoring_a_kwargs_flag_is_told_so(kernels):
    """``ignoring_gate`` drops ``use_gate_in_kernel``: the probe names it and the gate leaves its modes; the flags it
    passes on stay (``honouring``, which passes every keyword on, is judged in the ``validate`` run below)."""
    module, _ = kernels
    ignoring = built(f"{MODULE}:ignoring_gate[family=gdn]")
    assert "use_gate_in_kernel" in flag_probe.hidden_keywords(ignoring)
    notes = flag_probe.notes(ignoring)
    assert notes == ["kernel ignoring_gate ignores use_gate_in_kernel (probed: same output with and without it); "
                     "the cases that set it are not run"]
    assert "gate" not in family_running.accepted_family_modes(ignoring, "gdn")
    assert family_running.accepted_flags(ignoring) == list(family_running.FLAGS)
    calls = module.CALLS[0]
    flag_probe.notes(ignoring)
    assert module.CALLS[0] == calls  # probed once per kernel object and keyword


def test_declared_flags_and_a_wrapper_naming_its_keywords_are_not_probed(kernels):
    """``flags=use_qk_l2norm_in_kernel``: only that flag is taken, no probe call; a ``functools.wraps`` wrapper whose
    ``__wrapped__`` names every keyword hides none."""
    module, _ = kernels
    declared = built(f"{MODULE}:honouring[family=gdn,flags=use_qk_l2norm_in_kernel]")
    wrapped = built(f"{MODULE}:wrapped[family=gdn]")
    calls = module.CALLS[0]
    assert flag_probe.hidden_keywords(declared) == () and flag_probe.hidden_keywords(wrapped) == ()
    assert flag_probe.notes(declared) == [] and flag_probe.notes(wrapped) == []
    assert family_running.accepted_flags(declared) == ["use_qk_l2norm_in_kernel"]
    assert "gate" not in family_running.accepted_family_modes(declared, "gdn")
    assert family_running.accepted_flags(wrapped) == list(family_running.FLAGS)
    assert "gate" in family_running.accepted_family_modes(wrapped, "gdn")
    assert module.CALLS[0] == calls  # nothing was probed
    with pytest.raises(ValueError, match="flags"):
        spec_lib.get(f"{MODULE}:honouring[family=gdn,flags=use_gate]")


def test_validate_runs_no_case_of_a_flag_a_jax_kernel_ignores(kernels, tmp_path):
    """``validate`` of both kernels on a gate case and a plain one: the kernel ignoring the gate draws no FAIL, its
    note names the flag and the gate case is listed as not run; the kernel honouring it runs the gate case and
    PASSes."""
    _, folder = kernels
    specs = f"{MODULE}:ignoring_gate[family=gdn],{MODULE}:honouring[family=gdn]"
    proc = console(tmp_path, "validate", "--kernel", specs, "--cases", "smoke", "--dtype", "float32", "--case",
                   GATE_CASE, "--case", PLAIN_CASE, "--json", tmp_path / "report.json", "--no-progress",
                   PYTHONPATH=str(folder))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ignores use_gate_in_kernel (probed: same output with and without it)" in proc.stdout
    ignoring, honouring = json.loads((tmp_path / "report.json").read_text())["kernels"]
    assert ignoring["grade"] == "PASS" and [c["case"] for c in ignoring["cases"]] == [PLAIN_CASE]
    assert ignoring["not_accepted_cases"] == [GATE_CASE]
    assert honouring["grade"] == "PASS" and {c["case"] for c in honouring["cases"]} == {GATE_CASE, PLAIN_CASE}
    assert honouring["notes"] == [] and honouring["not_accepted_cases"] == []
