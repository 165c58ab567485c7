"""Hand-off sessions through the plugin: a prefill kernel's final states handed into a decode kernel's storage.

``pytest --pyargs gdn2_oracle.property_tests --gdn2-kernel DECODE --gdn2-prefill PREFILL`` runs the sessions of
``oracle/handoff_recipes.py`` (pool, fork, installed; each in both pool layouts where DECODE's signature takes FLA's
``[V, K]`` keyword; float32 and bfloat16 inputs) for every pair of a selected decode kernel (one that takes a state
pool or replay states) and a ``--gdn2-prefill`` kernel, judged as ``validate --prefill PREFILL`` judges them
(``ci/running/handoff_sessions.py``, ``ci/grading/handoff_judge.py``; docs/DESIGN.md §2, "Hand-off sessions"). A
FAIL shows the verdict table, the diagnosis (which side is off, and why) and the validate command that reproduces it.

Without ``--gdn2-prefill`` each selected kernel gets one skipped test whose reason names the option; a kernel that
takes no state is skipped (every selected kernel without one: each a skip with the reason) as the serving properties
do; a pair whose kernels are not of one family among ``gdn`` and ``kda`` is skipped with the reason.
"""

from __future__ import annotations

import shlex

import pytest

from gdn2_oracle import oracle
from gdn2_oracle.ci.running import handoff_sessions
from gdn2_oracle.ci.running.serving import accepts_serving, layout_flags
from gdn2_oracle.oracle import handoff_recipes as recipes
from gdn2_oracle.property_tests import grading

MODE = handoff_sessions.MODE  # the registry's mode of these sessions
pytestmark = pytest.mark.gdn2_modes(MODE)
DTYPES = oracle.KERNEL_DTYPES


def _skip(kernel, reason):
    return pytest.param(kernel, None, id=kernel.name, marks=pytest.mark.skip(reason=reason))


def _other_family(family, prefill_family, kernel, prefill):
    """The skip reason when a ``family`` kernel cannot continue a ``prefill_family`` prefill's sessions, else None."""
    if family not in recipes.FAMILIES:
        return (f"kernel {kernel.name!r} is a {family} family kernel: the {MODE} sessions are written in FLA's "
                f"families ({', '.join(recipes.FAMILIES)})")
    if prefill_family != family:
        return (f"prefill kernel {prefill.name!r} is a {prefill_family} family kernel and {kernel.name!r} a {family} "
                "one: a session hands a state over within one family")
    return None


def session_params(config):
    """``(decode kernel, case)`` params: every session of each selected decode kernel with each prefill kernel, or
    one skip per kernel with the reason (no prefill named, no kernel taking a state, another family)."""
    kernels, prefills = config._gdn2_kernels, config._gdn2_prefills
    if not prefills:
        return [_skip(k, f"no prefill kernel: --gdn2-prefill NAME (or env GDN2_PREFILL) names the training-call "
                         f"kernel whose final states the {MODE} sessions hand to {k.name!r}") for k in kernels]
    decoders = [k for k in kernels if accepts_serving(k.fn)]
    if not decoders:
        return [_skip(k, f"kernel {k.name!r} takes no state (no pool, no replay states): the {MODE} sessions are not "
                         "run on it") for k in kernels]
    out = []
    for k in decoders:
        for p in prefills:
            family = config._gdn2_families.get(k.name)
            why = _other_family(family, config._gdn2_prefill_families.get(p.name), k, p)
            if why:
                out.append(_skip(k, why))
                continue
            cases = handoff_sessions.cases((p.fn, p.name), (MODE,), DTYPES, family=family)
            out += [pytest.param(k, c, id=f"{k.name}-{p.name}-{c.name}-{c.dtype}") for c in cases
                    if not c.v_first or layout_flags(k.fn)]
    return out


def pytest_generate_tests(metafunc):
    """Parametrize ``serving_kernel, case`` over :func:`session_params`."""
    if "case" in metafunc.fixturenames and "serving_kernel" in metafunc.fixturenames:
        metafunc.parametrize("serving_kernel, case", session_params(metafunc.config), scope="session")


def reproduction(decode_name, case):
    """The one-line validate command that runs ``case``'s sessions (its dtype) on ``decode_name``."""
    return shlex.join(["gdn2-oracle", "validate", "--kernel", decode_name, "--prefill", case.prefill_name,
                       "--modes", MODE, "--dtype", case.dtype])


def test_prefilled_session(serving_kernel, case):
    run = handoff_sessions.HandoffRun(case.prefill, serving_kernel.fn, case.script, v_first=case.v_first)
    grading.enforce(run.report, f"{case.name} ({case.dtype}), prefill {case.prefill_name} -> "
                                f"{serving_kernel.name}:\n{run.report.format()}\nreproduce (case {case.name}): "
                                f"{reproduction(serving_kernel.name, case)}")
