"""The Pallas kernels (XLA interpreter) against a representative subset of the golden corpus.

Interpret mode is slow on a CPU, so the subset covers what differs for these kernels: the TPU
lane width (K = V = 128), a single token, bfloat16, resets, several chunks with a tail, mixed
per-channel decay and K != V with negative erase gates.
"""

from __future__ import annotations

import functools

import pytest

from gdn2_oracle import golden, kernels
from gdn2_oracle.ci.running import harness

PALLAS_CASES = ["tpu128_len1", "tpu128_moderate", "tpu128_bf16_strong", "decay_resets",
                "len_c64_x3_tail_extreme", "decay_mixed", "kv_8x64_negative"]


@functools.cache
def _pallas(name):
    return kernels.get(name, interpret="xla")


@pytest.mark.slow
@pytest.mark.parametrize("name", PALLAS_CASES)
@pytest.mark.parametrize("kernel_name", ["pallas-pairwise", "pallas-factorized"])
def test_pallas_kernel_matches_golden(kernel_name, name):
    gd = golden.load(name)
    dtype = "bfloat16" if gd.precision == "bfloat16" else "float32"
    report = harness.validate(_pallas(kernel_name), gd.problem(), *gd.cotangents(), dtype=dtype, ref=gd.reference())
    assert report.passed, f"{kernel_name} (XLA interpreter) on golden {name!r} ({dtype}):\n{report.format()}"
