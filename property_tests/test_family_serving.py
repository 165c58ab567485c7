"""Serving properties of Gated DeltaNet and KDA kernels, whatever their state representation (docs/drivers.md).

A family serving kernel (a pool in FLA's ``ssm_state_indices`` convention, e.g. ``gdn-decode``, or replay states: a
checkpoint plus a ring of recent tokens, e.g. ``replay-recurrent``) runs each session through its driver
(``ci/running/drivers.py``) and is graded by the serving judge (docs/serving.md): every live token's output and the
state its representation encodes after every call against the float64 oracle, slots nobody writes bit-identical,
padding rows exact zeros.

* **the family sessions** of ``oracle/serving_recipes.py`` (grouped value heads, packed prefill chunks, empty and
  padding sequences, every accept count, long enough for rings to flush and wrap);
* **drawn steps**: a prefill chunk of p tokens continuing from two slots (the hand-off), then n single-token calls,
  on a pool whose slots are drawn; n crosses a replay ring's flush threshold exactly in the examples;
* **drawn windows**: verify windows of S drafts whose accepted counts are drawn call by call, rejected drafts fed
  NaN (they must never change a committed state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gdn2_oracle import oracle
from gdn2_oracle.ci.grading.families import GDN2
from gdn2_oracle.ci.grading.serving import Session
from gdn2_oracle.ci.running.serving import accepts_serving, run_session, serving_family
from gdn2_oracle.kernels.registry import FAMILY_SERVING_DEFAULTS
from gdn2_oracle.oracle import serving as oracle_serving
from gdn2_oracle.oracle import serving_recipes as recipes
from gdn2_oracle.oracle.serving import DecodeCall
from gdn2_oracle.property_tests import strategies
from gdn2_oracle.property_tests.plugin import kernel_names
from gdn2_oracle.property_tests.strategies import Rerun
from gdn2_oracle.property_tests.test_serving import enforce_all

FAMILIES = ("gdn", "kda")
pytestmark = pytest.mark.gdn2_family(*FAMILIES)

H, K, V = recipes.H, recipes.K, recipes.V
DTYPES = oracle.KERNEL_DTYPES
CHAINED, WINDOWS = oracle_serving.DECODE_MODE, oracle_serving.SPECULATIVE_MODE
G = 2  # value heads per key head in the drawn sessions


FALLBACK = FAMILY_SERVING_DEFAULTS  # a pool and a replay representation, when no kernel is named


class FamilyServingKernel(NamedTuple):
    """A serving kernel under test: its name as selected, its callable and its family."""

    name: str
    fn: Callable
    family: str


show = strategies.show  # a failure's reproducer imports it from here, with the check and kernel_named


def kernel_named(name):
    """The :class:`FamilyServingKernel` selected as ``name`` (``--gdn2-kernel``), built as pytest builds it, with its
    family (``strategies.selected_kernel``): what a failure's reproducer runs the check on."""
    return FamilyServingKernel(name, *strategies.selected_kernel(name))


def family_serving_kernels(config):
    """The selected kernels that take a state (pool or replay); none named and none of another family than GDN-2
    selected: :data:`FALLBACK` (a named kernel of another family is skipped by the ``gdn2_family`` marker, with the
    reason)."""
    out = [FamilyServingKernel(k.name, k.fn, config._gdn2_families.get(k.name, GDN2))
           for k in config._gdn2_kernels if accepts_serving(k.fn)]
    if not kernel_names(config) and not any(k.family in FAMILIES for k in out):
        out = [FamilyServingKernel(n, fn, serving_family(fn)) for n in FALLBACK for fn in [strategies.kernel_fn(n)]]
        for k in out:  # the family the gdn2_family marker reads (conftest.py)
            config._gdn2_families.setdefault(k.name, k.family)
    return out


def pytest_generate_tests(metafunc):
    """Parametrize ``serving_kernel`` over :func:`family_serving_kernels` (ids = the names as selected)."""
    if "serving_kernel" in metafunc.fixturenames:
        config = metafunc.config
        ks = [pytest.param(k, id=k.name) for k in family_serving_kernels(config)]
        if not ks:  # every named kernel takes no state: each a skip with the reason, never an empty run
            ks = [pytest.param(FamilyServingKernel(k.name, k.fn, config._gdn2_families.get(k.name, GDN2)), id=k.name,
                               marks=pytest.mark.skip(reason=f"kernel {k.name} takes no state (no pool: FLA's "
                                                             "ssm_state_indices; no replay states): the serving "
                                                             "properties are not run on it"))
                  for k in config._gdn2_kernels]
        metafunc.parametrize("serving_kernel", ks, scope="session")


def _family(kernel):
    return kernel.family


def check_family_sessions(kernel, dtype="float32"):
    """The family sessions of ``oracle/serving_recipes.py`` in the kernel's family: ``(session name, report)`` of
    each, run as it is consumed (a generator: the test stops at the first failure)."""
    for script in recipes.family_sessions((_family(kernel),), (dtype,)):
        session = Session.from_script(script)
        yield session.name, run_session(kernel.fn, session)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.gdn2_modes(CHAINED, WINDOWS)
def test_family_sessions(serving_kernel, dtype):
    enforce_all(check_family_sessions(serving_kernel, dtype), f"{serving_kernel.name} {dtype}",
                Rerun(check_family_sessions, serving_kernel.name, dtype, {}))


def steps_session(family, dtype, seed, prefill, steps):
    """A prefill chunk of ``prefill`` tokens for two sequences (and a NaN padding sequence) continuing from drawn
    slots of a 5-slot pool (one slot NaN, never read), then ``steps`` single-token calls of the same sequences."""
    rng = np.random.default_rng(seed)
    slots = [int(s) for s in rng.permutation(4)[:2]]
    xs = recipes.family_tokens(1, 2 * prefill + 1, dtype, seed, family, G)
    for x in xs:
        x[0, 2 * prefill:] = np.nan
    cu = np.array([0, prefill, 2 * prefill, 2 * prefill + 1], np.int64)
    calls = [DecodeCall(*xs, state_indices=np.array(slots + [-1]), cu_seqlens=cu)]
    for c in range(steps):
        xs = recipes.family_tokens(2, 1, dtype, seed + 1 + c, family, G)
        calls.append(DecodeCall(*xs, state_indices=np.array(slots)))
    pool = recipes.pool_values(5, G * H, K, V, seed, nan_slots=(4,))
    return Session(f"steps_p{prefill}_n{steps}", calls, pool, dtype=dtype, mode=CHAINED, family=family)


def check_drawn_steps(kernel, dtype="float32", seed=0, prefill=1, steps=1):
    """:func:`steps_session` in the kernel's family: ``[(session name, report)]``."""
    session = steps_session(_family(kernel), dtype, seed, prefill, steps)
    return [(session.name, run_session(kernel.fn, session))]


@pytest.mark.parametrize("dtype", DTYPES)
@given(seed=strategies.seeds, prefill=st.integers(1, 6), steps=st.integers(1, 40))
@example(seed=0, prefill=1, steps=14)  # a ring of 16 (replay-recurrent's default) flushes at the last token
@example(seed=1, prefill=3, steps=15)
@example(seed=2, prefill=2, steps=33)
@pytest.mark.gdn2_modes(CHAINED)
def test_drawn_steps(serving_kernel, dtype, seed, prefill, steps):
    enforce_all(check_drawn_steps(serving_kernel, dtype, seed, prefill, steps), f"{serving_kernel.name} {dtype}",
                Rerun(check_drawn_steps, serving_kernel.name, dtype, dict(seed=seed, prefill=prefill, steps=steps)))


def windows_session(family, dtype, seed, S, accepted):
    """Verify windows of ``S`` drafts for two rows (and a padding row) on draft slots; window c is told the accepted
    count of window c - 1 (``accepted[c]``, row 1 the mirror count), drafts past the next window's count NaN."""
    counts = [(1, 1)] + [(a, S + 1 - a) for a in accepted]
    idx = np.array([list(range(S)), list(range(S, 2 * S)), [-1] * S])
    calls = []
    for c in range(len(counts)):
        xs = recipes.family_tokens(3, S, dtype, seed + c, family, G)
        nxt = counts[c + 1] if c + 1 < len(counts) else (S, S)
        for x in xs:
            x[0, nxt[0]:] = np.nan
            x[1, nxt[1]:] = np.nan
            x[2] = np.nan
        calls.append(DecodeCall(*xs, state_indices=idx, num_accepted_tokens=np.array(list(counts[c]) + [1])))
    nan = [s for s in range(2 * S) if s % S] + [2 * S]
    pool = recipes.pool_values(2 * S + 1, G * H, K, V, seed, nan_slots=nan)
    return Session(f"windows_s{S}_{'_'.join(map(str, accepted))}", calls, pool, dtype=dtype, mode=WINDOWS,
                   family=family)


@st.composite
def window_draws(draw):
    S = draw(st.integers(1, 3))
    return S, draw(st.lists(st.integers(1, S), min_size=1, max_size=10))


def check_drawn_windows(kernel, dtype="float32", seed=0, drawn=(1, (1,))):
    """:func:`windows_session` of ``drawn = (S, accepted)`` in the kernel's family: ``[(session name, report)]``."""
    S, accepted = drawn
    session = windows_session(_family(kernel), dtype, seed, S, accepted)
    return [(session.name, run_session(kernel.fn, session))]


@pytest.mark.parametrize("dtype", DTYPES)
@given(seed=strategies.seeds, drawn=window_draws())
@example(seed=0, drawn=(3, [3, 2, 1, 3, 3, 1, 2, 2, 3]))
@pytest.mark.gdn2_modes(WINDOWS)
def test_drawn_windows(serving_kernel, dtype, seed, drawn):
    enforce_all(check_drawn_windows(serving_kernel, dtype, seed, drawn), f"{serving_kernel.name} {dtype}",
                Rerun(check_drawn_windows, serving_kernel.name, dtype, dict(seed=seed, drawn=drawn)))
