"""Packed sequences (``cu_seqlens``) in the context-parallel kernels (kernels/context_parallel.py).

The sharded checks (cp_varlen_host_checks.py: against the float64 oracle and the single-device packed kernel,
sequences over 3 devices and starting on device boundaries, ``validate --mesh seq=8 --modes varlen``) run on 8 host
devices in one fresh pytest process; here the signature, the argument checks and the one-device mesh.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle.ci.grading.modes import ModeCase
from gdn2_oracle.ci.running import modes as running
from gdn2_oracle.kernels import context_parallel as cp
from gdn2_oracle.oracle.mode_recipes import ModeRecipe

CHECKS = Path(__file__).with_name("cp_varlen_host_checks.py")


@pytest.mark.slow
def test_packed_sequences_on_eight_host_devices():
    # as test_context_parallel.py: 8 host devices before JAX starts; -P keeps the repository root off sys.path
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CHECKS)],
                          cwd=CHECKS.parents[2], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "7 passed" in done.stdout, done.stdout[-3000:]


def test_the_cp_kernels_take_part_in_varlen_only():
    for make in (cp.cp_factorized, cp.cp_pairwise):
        assert running.accepted_modes(make(16)) == ("varlen",)


def _inputs(B=1, T=12, H=2, K=4, V=4):
    x = jnp.zeros((B, T, H, K), jnp.float32)
    return (x, x, jnp.zeros((B, T, H, V), jnp.float32), x, x, jnp.zeros((B, T, H, V), jnp.float32))


@pytest.mark.parametrize(("B", "cu", "h0_rows", "name"), [
    (2, [0, 5, 12], 2, "cu_seqlens"),  # packed sequences need B == 1
    (1, [0, 5, 11], 2, "cu_seqlens"),  # must end at T
    (1, [0, 7, 5, 12], 3, "cu_seqlens"),  # non-decreasing
    (1, [0, 5, 12], 1, "initial_state"),  # one initial state a sequence: [N, H, K, V]
])
def test_bad_packed_call_names_the_argument(B, cu, h0_rows, name):
    with pytest.raises(ValueError, match=name):
        cp.cp_factorized(16, leaf=4)(*_inputs(B), initial_state=jnp.zeros((h0_rows, 2, 4, 4), jnp.float32),
                                     cu_seqlens=np.asarray(cu, np.int32))


def test_one_device_mesh_runs_the_packed_kernel():
    call, do, dfs = ModeRecipe(2, 8, 8, (0, 5, 17, 3, 0), decay="resets", initial_state=True, seed=4).build()
    case = ModeCase.of(call, do, dfs)
    report = case.judge(running.mode_results(cp.cp_pairwise(16), call, do, dfs))
    assert report.passed, report.format()
