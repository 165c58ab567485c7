"""The context-parallel kernels (kernels/context_parallel.py): 8-host-device checks in a subprocess, TPU lowering.

The sharded checks (cp_host_mesh_checks.py) need XLA_FLAGS=--xla_force_host_platform_device_count=8 before
JAX initialises, so they run in a fresh pytest process. The lowering tests export the sharded forward and
backward for a 2 x 4 TPU mesh (an AbstractMesh: no TPU needed) on this host.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

from gdn2_oracle import kernels
from gdn2_oracle.ci.running import harness
from gdn2_oracle.kernels import context_parallel as cp
from gdn2_oracle.oracle import make_problem, random_cotangents

HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
CHECKS = Path(__file__).with_name("cp_host_mesh_checks.py")


def run_on_host_devices(*pytest_args):
    """Run pytest in a fresh process that sees 8 host devices; return the CompletedProcess."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {HOST_DEVICES_FLAG}".strip(),
           "JAX_PLATFORMS": "cpu"}
    # -P: the repository root stays off sys.path (imports go through the installed package, as in make test)
    return subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
                          cwd=CHECKS.parents[2], env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_sharded_kernels_on_eight_host_devices():
    done = run_on_host_devices(str(CHECKS))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "25 passed" in done.stdout, done.stdout[-3000:]  # 6 checks + one a mesh shape dividing 8 (19)


def test_registered_lazily():
    assert {"cp-factorized", "cp-pairwise"} <= set(kernels.known())
    assert isinstance(kernels.get("cp-factorized[chunk_size=32]"), cp.ContextParallelKernel)


@pytest.mark.parametrize("options", [dict(chunk_size=8), dict(leaf=0), dict(split=64)])
def test_bad_options_name_the_argument(options):
    name = next(iter(options))
    with pytest.raises(ValueError, match=name):
        kernels.get("cp-factorized", **options)


def test_default_mesh_spans_every_device_and_matches_the_oracle():
    problem = make_problem(2, 21, 2, 8, 8, decay="resets", initial_state=True)
    do, dfs = random_cotangents(problem, seed=1)
    assert dict(cp.current_mesh().shape) == {cp.SEQ_AXIS: jax.device_count()}
    report = harness.validate(cp.cp_pairwise(16), problem, do, dfs)
    assert report.passed, report.format()


def test_explicit_mesh_is_refused_by_name():
    mesh = AbstractMesh((1,), (cp.SEQ_AXIS,), axis_types=(AxisType.Explicit,))
    x = jnp.zeros((1, 4, 1, 4), jnp.float32)
    with pytest.raises(ValueError, match="mesh"):
        cp.cp_pairwise(16, mesh=mesh)(x, x, x, x, x, x)


def _tpu_export(fn, mesh, B=2, T=40, H=2, K=8, V=8):
    """``jax.export`` of ``fn(q, k, v, g, b, w, h0, do, dS)`` for TPU on ``mesh``, inputs replicated."""
    def sd(*s):
        return jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))

    args = [sd(B, T, H, K)] * 2 + [sd(B, T, H, V), sd(B, T, H, K), sd(B, T, H, K), sd(B, T, H, V),
                                   sd(B, H, K, V), sd(B, T, H, V), sd(B, H, K, V)]
    return jax.export.export(jax.jit(fn), platforms=["tpu"])(*args)


@pytest.fixture(scope="module")
def tpu_mesh():
    return AbstractMesh((2, 4), (cp.BATCH_AXIS, cp.SEQ_AXIS), axis_types=(AxisType.Auto,) * 2)


def test_forward_lowers_for_a_tpu_mesh(tpu_mesh):
    kern = cp.cp_factorized(16, leaf=4, mesh=tpu_mesh)
    exp = _tpu_export(lambda q, k, v, g, b, w, h0, do, dS: kern(q, k, v, g, b, w, initial_state=h0), tpu_mesh)
    text = exp.mlir_module()
    assert exp.platforms == ("tpu",) and exp.nr_devices == 8
    assert "all_gather" in text  # the combine of the slices' transitions


def test_backward_lowers_for_a_tpu_mesh(tpu_mesh):
    kern = cp.cp_factorized(16, leaf=4, mesh=tpu_mesh)

    def fwd_bwd(q, k, v, g, b, w, h0, do, dS):
        out, pullback = jax.vjp(lambda *a: kern(*a[:6], initial_state=a[6]), q, k, v, g, b, w, h0)
        return out, pullback((do, dS))

    exp = _tpu_export(fwd_bwd, tpu_mesh)
    assert exp.nr_devices == 8 and len(exp.out_avals) == 9
    assert "reduce_scatter" in exp.mlir_module()  # all_gather's transpose: the combine run backwards
