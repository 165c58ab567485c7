"""pytest-benchmark latency of forward + backward (all seven gradients) of each kernel at a CPU-sized shape.

The default run (``--benchmark-disable`` in addopts) executes each body once, untimed, so the
gate and the harness are tested; ``make bench`` times them. Every benchmark first validates its
kernel on the same problem against the float64 oracle with the gate of ``gdn2-oracle bench``
(``bench.validate_config``) and refuses to run (``pytest.fail`` with the failing verdicts) when
the kernel fails: a number is only recorded
for a kernel that is right. ``extra_info`` carries the provenance (device, JAX, kernel source hash,
validation verdicts), so the saved JSON (``--benchmark-json`` / ``--benchmark-autosave``) is
self-describing.
"""

from __future__ import annotations

import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.commands import bench
from gdn2_oracle.ci.commands.provenance import environment
from gdn2_oracle.ci.running.fingerprint import source_sha256

# CPU-sized: B, T, H, K, V (several chunks of the default chunk size, plus a tail).
SHAPE = (1, 320, 2, 64, 64)
SEED = 11
KERNELS = {
    "pairwise": {},
    "factorized": {},
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_forward_backward_latency(benchmark, name, dtype):
    cases = bench.Cases()  # the problem: bench.recipe(SHAPE, dtype, SEED)
    fn = kernels.get(name, **KERNELS[name])
    compiled = bench.Compiled(fn, *cases(SHAPE, dtype, SEED).data(), dtype)
    verdict = bench.validate_config(fn, SHAPE, dtype, SEED, cases, compiled)
    if not verdict["passed"]:
        pytest.fail(f"{name} ({dtype}) is not benchmarked: it failed validation against the float64 oracle:\n"
                    + "\n".join(verdict["failures"]), pytrace=False)
    env = environment()
    benchmark.extra_info.update(
        kernel=name, options=KERNELS[name], dtype=dtype, shape=dict(zip("BTHKV", SHAPE)),
        compile_s=compiled.compile_s, device_kind=env["device_kind"], jax_version=env["jax_version"],
        git=env["git"], source_sha256=source_sha256(fn)["sha256"], validated=True)
    compiled.call()  # warm-up
    benchmark.pedantic(compiled.call, rounds=5, iterations=1, warmup_rounds=1)
