"""Packed sequences (``cu_seqlens``) in the context-parallel kernels on 8 host devices (run by test_cp_varlen.py in
a subprocess whose XLA_FLAGS=--xla_force_host_platform_device_count=8 is set before JAX starts; not collected on
its own).

Every case runs forward, final states and all seven gradients (``dh0`` included) through ``ci.running.modes`` and
judges them twice: against the float64 oracle (``oracle.modes``) by the mode judge's tolerance model, and against
the single-device chunked kernel's packed path (kernels/varlen.py) by the tight agreement bound.
"""

from __future__ import annotations

import functools
import json

import jax
import numpy as np
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.modes import ModeCase
from gdn2_oracle.ci.running import modes as running
from gdn2_oracle.ci.running.mesh import build_mesh, using
from gdn2_oracle.oracle.mode_recipes import ModeRecipe

DEVICES = 8
# T = 196 on seq=8: 25 tokens a device (4 padding); the 63-token sequence spans devices 0-2, the 65-token one 5-7.
EDGES = (0, 1, 63, 64, 65, 3)
# T = 200 on seq=8: sequences start exactly on the device boundaries 25 (after an empty one there), 75 and 100;
# the 50-token one covers devices 1-2 exactly, the 63-token one spans devices 5-7.
AT_BOUNDARIES = (25, 0, 50, 25, 37, 63)


@functools.cache
def _kernel(spec):
    """One kernel object per spec, so each compiles once per call shape."""
    return kernels.get(spec)


def _judge(cp_spec, plain_spec, mesh_spec, lengths, initial_state, decay, seed):
    """(oracle report, agreement report) of the sharded kernel on a packed call vs the oracle and the unsharded one."""
    call, do, dfs = ModeRecipe(2, 8, 8, lengths, decay=decay, initial_state=initial_state, seed=seed).build()
    case = ModeCase.of(call, do, dfs)
    with using(build_mesh(mesh_spec)):
        sharded = running.mode_results(_kernel(cp_spec), call, do, dfs)
    plain = running.mode_results(_kernel(plain_spec), call, do, dfs)
    assert set(sharded) == set(case.names()) and "dh0" in sharded
    return case.judge(sharded), case.agreement(sharded, plain, what=f"{cp_spec}~{plain_spec}")


def test_eight_host_devices():
    assert jax.device_count() == DEVICES, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"


@pytest.mark.parametrize(("lengths", "initial_state", "decay"), [
    (EDGES, True, "moderate"), (AT_BOUNDARIES, True, "strong"), (AT_BOUNDARIES, False, "moderate")])
def test_factorized_packed_matches_oracle_and_unsharded(lengths, initial_state, decay):
    vs_oracle, vs_plain = _judge("cp-factorized[chunk_size=16,leaf=4]", "factorized[chunk_size=16,leaf=4]",
                                 "seq=8", lengths, initial_state, decay, seed=sum(lengths) + initial_state)
    assert vs_oracle.passed, vs_oracle.format()
    assert vs_plain.passed, vs_plain.format()


def test_pairwise_packed_with_heads_sharded():
    # seq=4: 49 tokens a device, sequences spanning devices 0-1, 1-2 and 2-3; an empty sequence at T
    vs_oracle, vs_plain = _judge("cp-pairwise[chunk_size=16]", "pairwise[chunk_size=16]", "seq=4,heads=2",
                                 EDGES + (0,), True, "resets", seed=3)
    assert vs_oracle.passed, vs_oracle.format()
    assert vs_plain.passed, vs_plain.format()


def test_traced_offsets_without_initial_states():
    # mode_results always passes initial states (zeros when the call has none): here None, and cu_seqlens traced
    call, do, dfs = ModeRecipe(2, 8, 8, AT_BOUNDARIES, seed=5).build()
    args = [np.asarray(x, np.float32) for x in call.inputs()]
    cu = np.asarray(call.cu_seqlens, np.int32)
    kern = _kernel("cp-factorized[chunk_size=16,leaf=4]")
    with using(build_mesh("seq=8")):
        got = jax.jit(lambda c: kern(*args, cu_seqlens=c))(cu)
    plain = _kernel("factorized[chunk_size=16,leaf=4]")(*args, cu_seqlens=cu)
    names = ("o", "final_state")
    report = ModeCase.of(call, do, dfs).agreement(*({n: np.asarray(x) for n, x in zip(names, r)} for r in (got, plain)),
                                                  names=names)
    assert report.passed, report.format()


def test_validate_judges_cp_factorized_on_packed_sequences(cli, tmp_path):
    report = tmp_path / "validate.json"
    code, out, err = cli("validate", "--kernel", "cp-factorized", "--mesh", "seq=8", "--modes", "varlen",
                         "--dtype", "float32", "--no-progress", "--json", report)
    assert code == 0, out + err
    (k,) = json.loads(report.read_text())["kernels"]
    assert k["passed"] and k["n_cases"] >= 1 and k["modes"]["judged"] == ["varlen"], out
