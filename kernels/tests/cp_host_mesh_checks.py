"""Context-parallel kernels on 8 host devices (run by test_context_parallel.py in a subprocess whose
XLA_FLAGS=--xla_force_host_platform_device_count=8 is set before JAX starts; not collected on its own).

Every case runs forward and all seven gradients through ``ci.running.harness`` (so gradients cross the hand-off)
and judges them twice: against the float64 oracle by the tolerance model, and against the unsharded chunked
kernel by the tight agreement bound (docs/DESIGN.md §4).
"""

from __future__ import annotations

import functools

import jax
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading import references, tolerance
from gdn2_oracle.ci.grading.tolerance import RESULTS
from gdn2_oracle.ci.running import harness
from gdn2_oracle.ci.running.mesh import build_mesh, using
from gdn2_oracle.oracle import make_problem, random_cotangents

DEVICES = 8
SHAPE = dict(B=2, H=4, K=8, V=8)


@functools.cache
def _kernel(spec):
    """One kernel object per spec, so the harness compiles once per shape and mesh."""
    return kernels.get(spec)


def _judge(cp_spec, plain_spec, mesh_spec, T, decay):
    """(oracle report, agreement report) of the sharded kernel on a mesh vs the oracle and the unsharded kernel."""
    problem = make_problem(T=T, decay=decay, initial_state=True, seed=T, **SHAPE)
    do, dfs = random_cotangents(problem, seed=1)
    ref = references.reference_results(problem, do, dfs)
    with using(build_mesh(mesh_spec)):
        sharded = harness.kernel_results(_kernel(cp_spec), problem, do, dfs)
    plain = harness.kernel_results(_kernel(plain_spec), problem, do, dfs)
    base = tolerance.baseline(problem, do, dfs, {n: tolerance.dtype_name(sharded[n]) for n in RESULTS})
    vs_oracle = tolerance.compare(problem, do, dfs, sharded, ref, dtype="float32", base=base)
    vs_plain = tolerance.agreement(problem, sharded, plain, ref, base, "float32", what=f"{cp_spec}~{plain_spec}")
    return vs_oracle, vs_plain


def test_eight_host_devices():
    assert jax.device_count() == DEVICES, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"


# cp-factorized on the meshes: slice boundaries inside chunks (T=37: 5 tokens a device, 3 padding).
@pytest.mark.parametrize(("mesh", "T", "decay"), [("seq=8", 37, "resets"), ("seq=4,data=2", 37, "extreme")])
def test_factorized_sharded_matches_oracle_and_unsharded(mesh, T, decay):
    vs_oracle, vs_plain = _judge("cp-factorized[chunk_size=16,leaf=4]", "factorized[chunk_size=16,leaf=4]",
                                 mesh, T, decay)
    assert vs_oracle.passed, vs_oracle.format()
    assert vs_plain.passed, vs_plain.format()


# The hand-off at other split points and meshes (cp-pairwise: the same machinery, cheaper to compile):
# T=9 on seq=8 (2 tokens a device: device 4 holds a single real token, devices 5-7 only identity padding),
# boundaries at chunk edges (T=64 on seq=2: 32 tokens = 2 chunks a device), and a mesh without a seq axis
# (batch and heads sharded, no hand-off).
@pytest.mark.parametrize(("mesh", "T", "decay"), [("seq=8", 9, "strong"), ("seq=2,heads=4", 64, "mixed"),
                                                  ("data=2,heads=4", 37, "moderate")])
def test_hand_off_at_any_split(mesh, T, decay):
    vs_oracle, vs_plain = _judge("cp-pairwise[chunk_size=16]", "pairwise[chunk_size=16]", mesh, T, decay)
    assert vs_oracle.passed, vs_oracle.format()
    assert vs_plain.passed, vs_plain.format()


def _dividing_meshes(devices=DEVICES):
    """Every mesh of axes seq, data, heads whose device count divides ``devices`` (axes of size 1 left out)."""
    sizes = [n for n in range(1, devices + 1) if devices % n == 0]
    specs = []
    for s in sizes:
        for d in sizes:
            for h in sizes:
                if devices % (s * d * h) == 0 and s * d * h > 1:
                    specs.append(",".join(f"{a}={n}" for a, n in (("seq", s), ("data", d), ("heads", h)) if n > 1))
    return specs


# Every mesh shape that divides the 8 devices (19 of them; B=2 and H=4 are padded where an axis does not
# divide them): the sharded kernel against the oracle and the unsharded kernel (cp-pairwise: the same
# machinery as cp-factorized, cheaper to compile). T=37: slice boundaries inside chunks, padding tokens.
@pytest.mark.parametrize("mesh", _dividing_meshes())
def test_every_mesh_that_divides_the_devices(mesh):
    vs_oracle, vs_plain = _judge("cp-pairwise[chunk_size=16]", "pairwise[chunk_size=16]", mesh, 37, "mixed")
    assert vs_oracle.passed, vs_oracle.format()
    assert vs_plain.passed, vs_plain.format()
