"""Every failure kind of the conformance suite prints a reproducer that reruns *the failing call*, and the
``@example`` line that pins it: the state carry (``test_state_carry``: the split call with the carried state, not
one call on the whole problem) and the serving properties (``test_serving.py``, ``test_family_serving.py``).

A wrong kernel fails the property; its failure message carries the reproducer, which is run as a user would run it
(``bash -c`` of the printed line, from another folder, the venv's ``python`` first on ``PATH``, no ``PYTHONPATH``
of ours) and must print the failing grade. The properties run on one explicit example each (:func:`failure`); a
plugin run (``pytest --pyargs ... --gdn2-kernel module:attr``) shows the same message as a kernel author sees it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from gdn2_oracle import kernels
from gdn2_oracle.ci.testing import pytest_run
from gdn2_oracle.oracle import Recipe
from gdn2_oracle.property_tests import strategies
from gdn2_oracle.property_tests import test_conformance as conformance
from gdn2_oracle.property_tests import test_family_serving as family_serving
from gdn2_oracle.property_tests import test_serving as serving
from gdn2_oracle.property_tests.strategies import CARRY_CONFIG

# Kernels a kernel author would keep in their own repository (found through PYTHONPATH: the reproducer must say so).
MODULE = '''from gdn2_oracle import kernels
from gdn2_oracle.kernels.testing import without_initial_state
from gdn2_oracle.kernels.testing_decode import mutant

# right on a whole call from a zero state; drops the state it is given (the carried one too)
drops_state = without_initial_state(kernels.get("pairwise"))
# reads pool[n] instead of pool[idx[n]]
wrong_slot = mutant("wrong_slot")
'''
CARRY_MUTANT = "repro_mutants:drops_state"
SERVING_MUTANT = "repro_mutants:wrong_slot"
# no initial state: the whole call is right, the second piece of a split starts from zeros instead of the carry
CARRY_RECIPE = Recipe(*CARRY_CONFIG.shape, decay="weak", gates="uniform", qk="raw", initial_state=False,
                      precision=CARRY_CONFIG.dtype, seed=7, cot_seed=8)
SPLIT = 63
REPRO_TIMEOUT = 300


@pytest.fixture
def authors_repo(tmp_path, monkeypatch):
    """A folder holding ``repro_mutants.py``, on this process's ``sys.path`` (as ``PYTHONPATH=.`` puts it)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "repro_mutants.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(repo))
    yield repo
    sys.modules.pop("repro_mutants", None)


def failure(test, **arguments):
    """The failure message of a suite test (``@given``) run on ``arguments`` as its one explicit example (its body
    runs inside Hypothesis, as under pytest: ``note`` needs that); fails if the test passes."""
    @settings(phases=[Phase.explicit], database=None, deadline=None)
    @example(**arguments)
    @given(**{name: st.just(value) for name, value in arguments.items()})
    def once(**drawn):
        test.hypothesis.inner_test(**drawn)

    with pytest.raises(pytest.fail.Exception) as info:
        once()
    return str(info.value)


def reproducer(message):
    """The ``reproduce:`` command of a failure message (a pytest run's output may show the message twice: under
    ``CI`` pytest's short test summary prints it whole)."""
    found = list(dict.fromkeys(re.findall(r"^reproduce: (.+)$", message, re.MULTILINE)))
    assert len(found) == 1, message
    return found[0]


def run_reproducer(command, where):
    """``(exit status, stdout + stderr)`` of ``bash -c command`` run from ``where`` with the venv's ``python`` first on
    ``PATH``, without ``PYTHONPATH`` (what the line does not say itself it does not get) nor this session's
    ``PYTEST_*`` / ``GDN2_*`` environment but its ``GDN2_REFERENCE_CACHE``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"
           and (not k.startswith(("PYTEST_", "GDN2_")) or k == "GDN2_REFERENCE_CACHE")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    where.mkdir(exist_ok=True)
    proc = subprocess.run(["bash", "-c", command], cwd=where, env=env, capture_output=True, text=True,
                          timeout=REPRO_TIMEOUT)
    return proc.returncode, proc.stdout + proc.stderr


# --- state carry ------------------------------------------------------------------------------------------------


def test_carry_reproducer_reruns_the_split_call(authors_repo, tmp_path):
    """A kernel that drops the carried state fails ``test_state_carry``; the message's reproducer reruns the split
    call (``validate_carried`` at the split), with the PYTHONPATH of the author's module, and prints FAIL; the pin line
    is the ``@example`` and names the split's test id."""
    kernel = strategies.Kernel(CARRY_MUTANT, kernels.get(CARRY_MUTANT))
    message = failure(conformance.test_state_carry, kernel=kernel, t=SPLIT, spec=CARRY_RECIPE)
    command = reproducer(message)
    assert command.startswith(f"PYTHONPATH={authors_repo} python -c "), command
    assert f"validate_carried(kernels.get({CARRY_MUTANT!r}), p, do, dfs, {SPLIT}, dtype='float32')" in command
    assert f"pin it:    {strategies.example(CARRY_RECIPE)}" in message, message
    assert f"test_state_carry[{CARRY_MUTANT}-split{SPLIT}]" in message, message
    code, out = run_reproducer(command, tmp_path / "elsewhere")
    assert code == 0, out
    assert f"[0,{SPLIT}) + [{SPLIT},{CARRY_CONFIG.T}) with carried state vs the float64 oracle: FAIL" in out, out


def test_carry_reproducer_of_a_correct_kernel_passes():
    """The same split call of a correct kernel: the reproducer's judgement is the test's (PASS both ways)."""
    from gdn2_oracle.ci.running import harness

    report, agrees = harness.validate_carried(kernels.get("pairwise"), *CARRY_RECIPE.build(), SPLIT,
                                              dtype=CARRY_RECIPE.dtype)
    assert report.passed and agrees.passed, report.format() + "\n" + agrees.format()


@pytest.mark.slow
def test_plugin_run_prints_the_carry_reproducer(authors_repo, tmp_path):
    """``pytest --pyargs gdn2_oracle.property_tests.test_conformance --gdn2-kernel repro_mutants:drops_state``: the
    state carry fails with the split call's reproducer (not the one-call ``validate`` one) and its pin line."""
    code, out = pytest_run(authors_repo, "--pyargs", "gdn2_oracle.property_tests.test_conformance", "--gdn2-kernel",
                           CARRY_MUTANT, "--gdn2-profile", "dev", "-k", f"test_state_carry and split{SPLIT}", "-q",
                           env={"PYTHONPATH": str(authors_repo)})
    assert code == 1 and "1 failed" in out, out
    command = reproducer(out)
    assert "validate_carried(" in command and f", {SPLIT}, dtype=" in command, command
    assert f"on test_state_carry (it failed as test_state_carry[{CARRY_MUTANT}-split{SPLIT}]" in out, out
    code, printed = run_reproducer(command, tmp_path / "elsewhere")
    assert code == 0 and ": FAIL" in printed, printed


# --- serving ------------------------------------------------------------------------------------------------------


def test_serving_reproducer_reruns_the_check(authors_repo, tmp_path):
    """A kernel reading the wrong slot fails ``test_pool_gather_scatter``; the message carries the check's one-liner
    (kernel built from its name, PYTHONPATH of the author's module) and the ``@example`` of the draw; the one-liner
    prints FAIL."""
    kernel = serving.kernel_named(SERVING_MUTANT)
    message = failure(serving.test_pool_gather_scatter, serving_kernel=kernel, dtype="float32", seed=5)
    command = reproducer(message)
    assert command == (f"PYTHONPATH={authors_repo} python -c \"from gdn2_oracle.property_tests.test_serving import "
                       "check_pool_gather_scatter, kernel_named, show; show(check_pool_gather_scatter("
                       f"kernel_named({SERVING_MUTANT!r}), 'float32', seed=5))\""), command
    assert "pin it:    @example(seed=5)" in message, message
    code, out = run_reproducer(command, tmp_path / "elsewhere")
    assert code == 0, out
    assert "pool_gather_scatter: FAIL" in out, out


def test_serving_reproducer_pins_every_draw():
    """The drawn decay and gates are in the reproducer and the ``@example`` line (the prefill continuation)."""
    rerun = strategies.Rerun(serving.check_prefill_continuation, "decode", "bfloat16",
                             dict(seed=3, decay="strong", gates="zero"))
    assert rerun.command().endswith("show(check_prefill_continuation(kernel_named('decode'), 'bfloat16', seed=3, "
                                    "decay='strong', gates='zero'))\"")
    assert "pin it:    @example(seed=3, decay='strong', gates='zero')" in rerun.explain()


# (family kernel spec, drawn prefill, drawn steps): reads key head hv % H (GVA); a replay ring of 6 tokens that
# flushes one token late (its spec holds quotes: the one-liner must carry them through the shell)
FAMILY_MUTANTS = [("gdn2_oracle.kernels.testing_decode:gdn_gva_modulo", 2, 3),
                  ("replay-recurrent[capacity=6,mutant='late_flush']", 1, 14)]


@pytest.mark.parametrize("name,prefill,steps", FAMILY_MUTANTS, ids=["gva_modulo", "late_flush"])
def test_family_serving_reproducer_reruns_the_check(tmp_path, name, prefill, steps):
    """A wrong family kernel fails ``test_drawn_steps``; its one-liner (the family file's check and ``kernel_named``,
    the family read from the kernel) prints FAIL; the pin line has every draw."""
    kernel = family_serving.kernel_named(name)
    assert kernel.family == "gdn"
    message = failure(family_serving.test_drawn_steps, serving_kernel=kernel, dtype="float32", seed=0, prefill=prefill,
                      steps=steps)
    command = reproducer(message)
    assert command.startswith("python -c \"from gdn2_oracle.property_tests.test_family_serving import "
                              "check_drawn_steps, kernel_named, show; "), command
    assert f"pin it:    @example(seed=0, prefill={prefill}, steps={steps})" in message, message
    code, out = run_reproducer(command, tmp_path / "elsewhere")
    assert code == 0, out
    assert f"steps_p{prefill}_n{steps}: FAIL" in out, out


@pytest.mark.slow
def test_plugin_run_prints_the_serving_reproducer(authors_repo, tmp_path):
    """``pytest --pyargs gdn2_oracle.property_tests.test_serving --gdn2-kernel repro_mutants:wrong_slot``: the failing
    explicit example ``seed=0`` prints its reproducer and ``@example(seed=0)``; the reproducer prints FAIL."""
    code, out = pytest_run(authors_repo, "--pyargs", "gdn2_oracle.property_tests.test_serving", "--gdn2-kernel",
                           SERVING_MUTANT, "-k", "test_pool_gather_scatter and float32",
                           "-q", env={"PYTHONPATH": str(authors_repo)})
    assert code == 1 and "1 failed" in out, out
    assert "pin it:    @example(seed=0)" in out, out
    commands = re.findall(r"^reproduce: (.+)$", out, re.MULTILINE)
    assert commands and all(c.startswith(f"PYTHONPATH={authors_repo} python -c ") for c in commands), out
    code, printed = run_reproducer(next(c for c in commands if "check_pool_gather_scatter" in c),
                                   tmp_path / "elsewhere")
    assert code == 0 and ": FAIL" in printed, printed
