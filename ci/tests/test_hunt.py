"""``gdn2-oracle hunt``: finds a planted narrow failure that ``validate --cases quick`` misses, shrinks it
and prints a working reproducer; exits 0 on a correct kernel.

The planted bug (``kernels.testing:narrow``): the final state is off by 1e-2 only when K != V, the
length is in ``NARROW_LENGTHS`` and some erase gate exceeds ``NARROW_ERASE``.
"""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest

from gdn2_oracle.ci.commands import hunt
from gdn2_oracle.ci.commands.validate import build_cases
from gdn2_oracle.ci.grading.grades import FAIL, PASS
from gdn2_oracle.ci.running import harness
from gdn2_oracle.kernels import testing

WRONG = "gdn2_oracle.kernels.testing"
NARROW = f"{WRONG}:narrow"



def _fires(problem):
    """Whether the planted bug of ``testing.narrow`` fires on a problem."""
    _, T, _, K, V = problem.shape
    lo, hi = testing.NARROW_LENGTHS
    return K != V and lo <= T <= hi and bool(np.any(problem.b > testing.NARROW_ERASE))


def test_the_quick_set_misses_the_planted_bug():
    trials = build_cases("quick", modes=("dense",))  # the dense contract: what hunt searches
    assert len(trials) > 40
    assert not any(_fires(t.data()[0]) for t in trials)


@pytest.mark.slow
def test_hunt_finds_the_planted_narrow_failure_within_its_default_budget(cli):
    code, out, _ = cli("hunt", "--kernel", NARROW, "--seed", "0", "--no-progress")
    assert code == 1, out
    assert "hunt: FAIL found" in out and f"budget {hunt.DEFAULT_BUDGET}" in out
    first = int(re.search(r"first at recipe (\d+)", out).group(1))
    assert first <= hunt.DEFAULT_BUDGET
    line = next(x for x in out.splitlines() if x.startswith("reproduce: "))
    source = re.fullmatch(r'reproduce: python -c "(.*)"', line).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(source, {})  # noqa: S102 - the printed one-liner, run in-process
    assert re.search(r"^final_state .* FAIL", printed.getvalue(), re.M), printed.getvalue()
    pin = next(x for x in out.splitlines() if x.startswith("pin it:    @example(spec=Recipe("))
    recipe = eval(pin.removeprefix("pin it:    @example(spec=")[:-1], {"Recipe": hunt.strategies.Recipe})  # noqa: S307 - the printed pin
    problem, do, dfs = recipe.build()
    assert _fires(problem)
    assert recipe.seed == 0 and recipe.cot_seed == 0 and recipe.decay == "none"  # shrunk
    report = harness.validate(testing.narrow, problem, do, dfs, dtype=recipe.dtype)
    assert report["final_state"].grade == FAIL and report["o"].grade == PASS


def test_hunt_on_a_correct_kernel_exits_0_with_the_worst_ratio(cli):
    code, out, _ = cli("hunt", "--kernel", f"{WRONG}:correct", "--budget", "4", "--seed", "1",
                       "--result", "dh0", "--no-progress")
    assert code == 0, out
    assert "hunt: no FAIL found" in out and "targeting result dh0" in out
    worst = re.search(r"worst error / tolerance reached: (\S+) \((\w+), (\w+)\)", out)
    assert worst and worst.group(2) == "dh0" and worst.group(3) == PASS
    assert 0 < float(worst.group(1)) <= 1


def test_hunt_on_a_raising_kernel_exits_1_with_the_error(cli):
    code, out, _ = cli("hunt", "--kernel", f"{WRONG}:broken", "--budget", "3", "--seed", "0", "--no-progress")
    assert code == 1
    assert "error: RuntimeError: this kernel always fails" in out and "reproduce: python -c" in out


@pytest.mark.parametrize("kwargs, field", [(dict(budget=0), "budget"), (dict(result="o2"), "result"),
                                           (dict(shapes="some"), "shapes")])
def test_hunt_rejects_bad_arguments(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        hunt.hunt(testing.correct, "correct", hunt.HuntOptions(**kwargs))


@pytest.mark.parametrize("argv, needle", [
    (["hunt"], "--kernel"),
    (["hunt", "--kernel", "pairwise", "--budget", "0"], "positive integer"),
    (["hunt", "--kernel", "pairwise", "--result", "dx"], "invalid choice"),
])
def test_hunt_usage_errors_exit_2(cli, argv, needle):
    code, _, err = cli(*argv)
    assert code == 2 and needle in err


def test_an_interrupted_hunt_prints_its_seed_and_the_worst_so_far(cli, monkeypatch):
    calls, validate = [], harness.validate

    def interrupted_on_the_sixth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return validate(*args, **kwargs)

    monkeypatch.setattr(harness, "validate", interrupted_on_the_sixth)
    code, out, err = cli("hunt", "--kernel", "pairwise[chunk_size=16]", "--seed", "7", "--budget", "50",
                         "--no-progress")
    assert code == 130, out + err
    assert "seed 7" in err and "INTERRUPTED after 6 recipes" in out and "--seed 7" in out, out + err
    assert "worst error / tolerance reached" in out


def test_hunt_refuses_a_negative_seed(cli):
    code, _, err = cli("hunt", "--kernel", "pairwise", "--seed", "-1")
    assert code == 2 and "expected an integer >= 0" in err


# --- training-call modes: hunt --modes ---------------------------------------------------------------------------


@pytest.fixture
def few_call_structures(monkeypatch):
    """Draw gated calls of one length, one row, one lower_bound, float32: every call structure (and compile) is
    decided by A_log and dt_bias alone, so the search stays cheap."""
    monkeypatch.setattr(hunt.strategies, "MODE_DENSE_LENGTHS", (8,))
    monkeypatch.setattr(hunt.strategies, "BATCHES", (1,))
    monkeypatch.setattr(hunt.strategies, "LOWER_BOUNDS", (-5.0,))
    monkeypatch.setattr(hunt.strategies, "DTYPES", ("float32",))


def test_hunt_modes_on_a_correct_kernel_exits_0(cli, few_call_structures):
    code, out, _ = cli("hunt", "--kernel", "pairwise", "--modes", "gate", "--budget", "3", "--seed", "2",
                       "--no-progress")
    assert code == 0, out
    assert "modes gate" in out and "hunt: no FAIL found" in out
    worst = re.search(r"worst error / tolerance reached: (\S+) \((\w+), (\w+)\) on (ModeRecipe\(.*\))", out)
    assert worst and worst.group(3) == PASS and "gate='" in worst.group(4), out  # a gated call


def test_hunt_modes_finds_shrinks_and_reproduces_a_mutants_fail(cli, few_call_structures):
    """lower_bound_outside (exp(A_log) scales the bounded gate's result, not its argument): found, shrunk to a
    ModeRecipe, and the printed one-liner rebuilds the call and shows the FAIL."""
    kernel = "gdn2_oracle.kernels.testing_modes:lower_bound_outside"
    code, out, _ = cli("hunt", "--kernel", kernel, "--modes", "gate", "--budget", "20", "--seed", "0", "--no-progress")
    assert code == 1 and "hunt: FAIL found" in out, out
    shrunk = re.search(r"shrunk to (ModeRecipe\(.*\))", out).group(1)
    recipe = eval(shrunk, {"ModeRecipe": hunt.ModeRecipe})  # noqa: S307 - the printed recipe
    assert recipe.gate == "bounded" and recipe.A_log and recipe.seed == 0 and recipe.modes == ("gate",)
    assert f"rerun:     gdn2-oracle hunt --kernel {kernel} --modes gate --budget 20 --seed 0" in out
    assert f"pin it:    @example(recipe={recipe.call_source()})" in out
    line = next(x for x in out.splitlines() if x.startswith("reproduce: "))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(re.fullmatch(r'reproduce: python -c "(.*)"', line).group(1), {})  # noqa: S102 - the printed one-liner
    assert re.search(r"^\w+ .* FAIL", printed.getvalue(), re.M), printed.getvalue()


def test_hunt_names_the_modes_a_kernel_does_not_accept(cli):
    code, out, _ = cli("hunt", "--kernel", f"{WRONG}:correct", "--modes", "varlen", "--budget", "2", "--seed", "0",
                       "--no-progress")
    assert code == 4 and "not drawn: varlen" in out and "0 recipes run" in out, out  # judged nothing: EMPTY
