"""The serving properties (``property_tests/test_serving.py``) catch every wrong decode kernel of
``kernels/testing_decode.py``, and say what is wrong.

Direct calls of the property functions (each returns ``[(label, Report)]``): for each mutant, the property that
catches it grades some run FAIL, with the expected diagnosis kind. A pytest run in a subprocess shows the same
through the plugin, as a kernel author would see it (``--gdn2-kernel module:attr`` naming a mutant instance).
"""

from __future__ import annotations

import pytest

from gdn2_oracle.ci.grading.grades import FAIL
from gdn2_oracle.ci.testing import pytest_run
from gdn2_oracle.kernels.testing_decode import MUTANTS, mutant
from gdn2_oracle.property_tests import test_serving as props

# (mutant, pool dtype) -> (the property that catches it, the diagnosis kind it gets)
CAUGHT_BY = {
    # starts from the last draft column: the NaN of a draft slot / rejected draft reaches the outputs
    ("rejected_committed", "float32"): ("check_accept_counts", "non-finite"),
    # starts from column a instead of a - 1: one rejected (NaN) draft committed
    ("accept_off_by_one", "float32"): ("check_accept_counts", "non-finite"),
    # reads pool[n]: O(1) error from the first token of the first call, nonzero padding outputs
    ("wrong_slot", "float32"): ("check_pool_gather_scatter", "logic"),
    # padding rows read and write slot 0: an unaddressed slot changes
    ("padding_writes_slot0", "float32"): ("check_pool_gather_scatter", "pool-bookkeeping"),
    # running state rounded to bf16 after every token, float32 pool: beyond the float32 bound everywhere
    ("bf16_in_loop", "float32"): ("check_prefill_continuation", "state-in-loop"),
    # the same with a bf16 pool: one rounding per token instead of one per store; the 256-token-chunk horizon
    # stalls the decay (a correct bf16 pool is PRECISION there)
    ("bf16_in_loop", "bfloat16"): ("check_long_horizon", "state-in-loop"),
}


def test_every_mutant_has_a_catching_property():
    assert {name for name, _ in CAUGHT_BY} == set(MUTANTS)


@pytest.mark.parametrize("name,state_dtype", sorted(CAUGHT_BY))
def test_mutant_is_caught(name, state_dtype, record_property):
    prop, kind = CAUGHT_BY[name, state_dtype]
    kernel = props.ServingKernel(f"{name}[state_dtype={state_dtype}]", mutant(name, state_dtype))
    checks = getattr(props, prop)(kernel)
    failed = [(label, r) for label, r in checks if r.grade == FAIL]
    found = sorted({f.kind for _, r in failed for f in r.diagnosis})
    record_property("serving_mutant", {"property": prop, "failed": [label for label, _ in failed], "kinds": found})
    assert failed, f"{name} ({state_dtype} pool) passed {prop}: " + "; ".join(f"{lab}: {r.grade}" for lab, r in checks)
    assert kind in found, f"{name}: diagnosed {found}, expected {kind!r}:\n" + "\n".join(
        f"{label}:\n{r.format()}" for label, r in failed[:2])


MODULE = """from gdn2_oracle.kernels.testing_decode import mutant
wrong_slot = mutant("wrong_slot")
padding_writes_slot0 = mutant("padding_writes_slot0")
"""


@pytest.mark.slow
def test_plugin_run_fails_the_mutants(tmp_path):
    """``pytest --pyargs gdn2_oracle.property_tests.test_serving --gdn2-kernel mod:attr``: the serving tests run on
    the selected serving kernels (not on ``decode``) and fail the wrong ones, in both input dtypes."""
    (tmp_path / "serving_mutants.py").write_text(MODULE)
    specs = "serving_mutants:wrong_slot,serving_mutants:padding_writes_slot0"
    code, out = pytest_run(tmp_path, "--pyargs", "gdn2_oracle.property_tests.test_serving", "--gdn2-kernel", specs,
                           "-k", "pool_gather_scatter", "-q")
    assert code == 1 and "4 failed" in out, out
    assert "test_pool_gather_scatter[serving_mutants:wrong_slot-float32]" in out, out
    assert "pool-bookkeeping" in out and "logic" in out, out
