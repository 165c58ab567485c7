"""Serving (decode) properties of any kernel that takes a state pool, graded by ``ci/grading/serving.py``.

The kernels: the selected ones (``--gdn2-kernel`` / ``GDN2_KERNEL``) that take a state pool (``state_pool``, or
FLA's ``initial_state`` + ``ssm_state_indices``: ``ci/running/serving.py``; a named kernel that takes none is
skipped with the reason), or, none named, ``decode``; tests take the
argument ``serving_kernel`` (this module's ``pytest_generate_tests``). Every run of calls is judged against the
float64 serving oracle chained on the exact pool (grades PASS / PRECISION / FAIL: a 16-bit pool is PRECISION
where its rounding once per store costs more than the float32 tolerance; docs/serving.md), and two ways of
running the same tokens must agree within a third of that bound (docs/DESIGN.md §4's agreement fraction):

* **chunked-prefill continuation**: one prefill == prefill then decode steps == prefill then the rest ==
  token by token, at every split point;
* **every accept count** 1..S with NaN-filled rejected drafts (the committed slot equals a prefill of the
  accepted prefix);
* **pool gather/scatter** with padding rows, an empty sequence, repeated calls; relabelling the slots changes
  nothing;
* **replay identity**: replaying the last L tokens from the kernel's own checkpoint gives its states again;
* **long horizon**: 4,096 tokens at per-step decay 0.99992, as single-token calls and as 256-token chunks.

The property functions (``check_*``) return ``[(label, Report)]`` so that ``tests/test_serving_mutants.py`` can
show which property catches each wrong kernel of ``kernels/testing_decode.py``, and so that a failure's reproducer
(``strategies.Rerun``: a ``python -c`` running the check on the kernel built from its name, ``kernel_named``, and
printing every report, ``show``) reruns exactly what failed; the message also gives the ``@example`` of the draw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gdn2_oracle import oracle
from gdn2_oracle.ci.grading import serving as judge
from gdn2_oracle.ci.grading.families import GDN2
from gdn2_oracle.ci.grading.serving import Session
from gdn2_oracle.ci.running.per_kernel import per_kernel
from gdn2_oracle.ci.running.serving import ServingRunner, accepts_serving, run_session
from gdn2_oracle.kernels.registry import SERVING_DEFAULT
from gdn2_oracle.oracle import serving as oracle_serving
from gdn2_oracle.oracle import serving_recipes as recipes
from gdn2_oracle.oracle.serving import DecodeCall
from gdn2_oracle.property_tests import grading, strategies
from gdn2_oracle.property_tests.plugin import kernel_names
from gdn2_oracle.property_tests.strategies import Rerun

# The plain contract's properties: a Gated DeltaNet or KDA kernel is skipped with the reason (conftest.py).
pytestmark = pytest.mark.gdn2_family(GDN2)

H, K, V = recipes.H, recipes.K, recipes.V
DTYPES = oracle.KERNEL_DTYPES
FALLBACK = SERVING_DEFAULT
# The registry's serving modes: calls chained on a pool, and speculative calls with draft slots and accepted counts.
CHAINED, SPECULATIVE = oracle_serving.DECODE_MODE, oracle_serving.SPECULATIVE_MODE
PREFILL_T = 6
DRAFTS = 4
REPLAY_L, REPLAY_CAPACITY = 12, 5


class ServingKernel(NamedTuple):
    """A serving kernel under test: its name as selected and its callable."""

    name: str
    fn: Callable

    @property
    def runner(self):
        return _runner(self.fn)


@per_kernel
def _runner(fn):
    return ServingRunner(fn)


def serving_kernels(config):
    """The selected kernels (built when pytest started: conftest.py): those that take a state pool run, a kernel named
    with ``--gdn2-kernel`` / ``GDN2_KERNEL`` that takes none is a skip with the reason; no kernel named: the defaults
    that take a pool, else ``decode``."""
    named = kernel_names(config)
    out = [k for k in config._gdn2_kernels if accepts_serving(k.fn) or k.name in named]
    if not named and not out:
        return [ServingKernel(FALLBACK, strategies.kernel_fn(FALLBACK))]
    return [ServingKernel(k.name, k.fn) for k in out]


show = strategies.show  # a failure's reproducer imports it from here, with the check and kernel_named


def kernel_named(name):
    """The :class:`ServingKernel` selected as ``name`` (``--gdn2-kernel``), built as pytest builds it
    (``strategies.selected_kernel``): what a failure's reproducer runs the check on."""
    return ServingKernel(name, strategies.selected_kernel(name)[0])


def no_pool(name):
    """The skip reason of a named kernel that takes no state pool."""
    return (f"kernel {name} takes no state pool (neither state_pool nor FLA's initial_state + ssm_state_indices): "
            "the serving properties are not run on it")


def pytest_generate_tests(metafunc):
    """Parametrize ``serving_kernel`` over :func:`serving_kernels` (ids = the names as selected); a kernel without a
    state pool is skipped with the reason, never passed on another kernel's behalf."""
    if "serving_kernel" in metafunc.fixturenames:
        ks = [pytest.param(k, id=k.name, marks=() if accepts_serving(k.fn) else
                           pytest.mark.skip(reason=no_pool(k.name))) for k in serving_kernels(metafunc.config)]
        metafunc.parametrize("serving_kernel", ks, scope="session")


# --- helpers ------------------------------------------------------------------------------------------------

def _run(kernel, session):
    """``(graded report, [(o, pool after)])`` of the kernel on a session."""
    return run_session(kernel.runner, session, keep=True)


def _errors(kernel, kept, *sessions):
    """The largest ``(e_rec, e_store)`` of some sessions, for the kernel's result dtypes (agreement bounds)."""
    o_dtype = judge.dtype_name(kept[0][0])
    return judge.largest_errors(*(judge.session_errors(s, o_dtype, kernel.runner.state_dtype) for s in sessions))


def _dtypes(kernel, kept):
    return {"o": judge.dtype_name(kept[0][0]), "state": kernel.runner.state_dtype}


def _split(xs, pattern):
    """The six inputs cut along T into pieces of the given lengths."""
    out, t = [], 0
    for n in pattern:
        out.append([x[:, t:t + n] for x in xs])
        t += n
    return out


def enforce_all(checks, what, rerun: Rerun | None = None):
    """Apply the suite's grade policy (FAIL fails, PRECISION warns) to every ``(label, report)``; the message ends
    with ``rerun``'s reproducer and ``@example`` line (:class:`strategies.Rerun`). Shared by the family properties
    (``test_family_serving.py``)."""
    tail = "" if rerun is None else "\n" + rerun.explain()
    for label, report in checks:
        grading.enforce(report, f"{what}, {label}:\n{report.format()}{tail}")


# --- 1. chunked-prefill continuation ------------------------------------------------------------------------------

def check_prefill_continuation(kernel, dtype="float32", seed=0, *, T=PREFILL_T, decay="moderate", gates="uniform"):
    """Two sequences (slots 3 and 1 of 5) of T tokens run as one prefill, token by token, and at every split point
    t as a t-token prefill followed by decode steps or by one prefill of the rest."""
    xs = recipes.tokens(2, T, dtype, seed, decay=decay, gates=gates)
    pool = recipes.pool_values(5, H, K, V, seed, nan_slots=(4,))
    slots = np.array([3, 1])
    patterns = {"one prefill": (T,), "token by token": (1,) * T}
    for t in range(1, T):
        for label, pattern in ((f"prefill {t} + {CHAINED} steps", (t,) + (1,) * (T - t)),
                               (f"prefill {t} + prefill {T - t}", (t, T - t))):
            if pattern not in patterns.values():
                patterns[label] = pattern
    ref = DecodeCall(*xs, state_indices=slots).apply(pool)
    ref = {"o": ref.o, "state": ref.pool[slots]}
    out, runs = [], {}
    for label, pattern in patterns.items():
        calls = [DecodeCall(*piece, state_indices=slots) for piece in _split(xs, pattern)]
        session = Session(f"prefill_{'_'.join(map(str, pattern))}", calls, pool, dtype=dtype)
        report, kept = _run(kernel, session)
        out.append((label, report))
        runs[label] = (session, kept, {"o": np.concatenate([o for o, _ in kept], axis=1), "state": kept[-1][1][slots]})
    base_session, base_kept, base = runs["one prefill"]
    for label, (session, kept, got) in runs.items():
        if label != "one prefill":
            out.append((f"{label} == one prefill", judge.agreement(
                "continuation", got, base, ref, _errors(kernel, kept, session, base_session),
                _dtypes(kernel, kept), kernel.runner.state_dtype)))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@given(seed=strategies.seeds, decay=st.sampled_from(oracle.DECAYS), gates=st.sampled_from(tuple(oracle.GATES)))
@example(seed=0, decay="moderate", gates="uniform")
@pytest.mark.gdn2_modes(CHAINED)
def test_prefill_continuation_at_every_split(serving_kernel, dtype, seed, decay, gates):
    enforce_all(check_prefill_continuation(serving_kernel, dtype, seed, decay=decay, gates=gates),
                f"{serving_kernel.name} {dtype} seed={seed} decay={decay} gates={gates}",
                Rerun(check_prefill_continuation, serving_kernel.name, dtype,
                      dict(seed=seed, decay=decay, gates=gates)))


# --- 2. every accept count ----------------------------------------------------------------------------------------

def check_accept_counts(kernel, dtype="float32", seed=0, *, S=DRAFTS):
    """For every a in 1..S: a draft call (S tokens, draft slots starting NaN, drafts after the accepted ones NaN)
    then a call told the accepted counts (row 0: a, row 1: S + 1 - a, row 2 padding); the committed slot must
    equal a prefill of the accepted tokens from the same pool."""
    idx = np.array([list(range(S)), list(range(S, 2 * S)), [-1] * S])
    draft_nan = [s for s in range(2 * S) if s % S]
    out = []
    for a in range(1, S + 1):
        acc = np.array([a, S + 1 - a, 1])
        pool = recipes.pool_values(2 * S + 2, H, K, V, seed + a, nan_slots=draft_nan + [2 * S + 1])
        first = recipes.tokens(3, S, dtype, seed + 10 * a)
        for x in first:
            x[0, acc[0]:] = np.nan
            x[1, acc[1]:] = np.nan
            x[2] = np.nan
        second = recipes.tokens(3, S, dtype, seed + 10 * a + 1)
        for x in second:
            x[2] = np.nan
        calls = [DecodeCall(*first, state_indices=idx, num_accepted_tokens=np.ones(3, np.int64)),
                 DecodeCall(*second, state_indices=idx, num_accepted_tokens=acc)]
        session = Session(f"accept_{a}", calls, pool, dtype=dtype, mode=SPECULATIVE)
        report, kept = _run(kernel, session)
        out.append((f"accept counts {acc[:2].tolist()}", report))
        # the committed slots after the draft call == a prefill of the accepted prefix (packed, [N] slots)
        cu = np.array([0, acc[0], acc[0] + acc[1]])
        packed = [np.concatenate([x[0:1, :acc[0]], x[1:2, :acc[1]]], axis=1) for x in first]
        prefill = Session(f"accept_{a}_prefill", [DecodeCall(*packed, state_indices=idx[:2, 0], cu_seqlens=cu)],
                          pool, dtype=dtype)
        p_report, p_kept = _run(kernel, prefill)
        out.append((f"prefill of the accepted tokens {acc[:2].tolist()}", p_report))
        committed = [int(idx[n, acc[n] - 1]) for n in range(2)]
        r = DecodeCall(*packed, state_indices=idx[:2, 0], cu_seqlens=cu).apply(pool)
        out.append((f"committed == prefill (accept {acc[:2].tolist()})", judge.agreement(
            "commit", {"state": kept[0][1][committed]}, {"state": p_kept[0][1][idx[:2, 0]]},
            {"state": r.pool[idx[:2, 0]]}, _errors(kernel, kept, session, prefill), _dtypes(kernel, kept),
            kernel.runner.state_dtype)))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@given(seed=strategies.seeds)
@example(seed=0)
@pytest.mark.gdn2_modes(SPECULATIVE)
def test_every_accept_count(serving_kernel, dtype, seed):
    enforce_all(check_accept_counts(serving_kernel, dtype, seed), f"{serving_kernel.name} {dtype} seed={seed}",
                Rerun(check_accept_counts, serving_kernel.name, dtype, dict(seed=seed)))


# --- 3. pool gather / scatter ---------------------------------------------------------------------------------------

def _relabel(session, perm):
    """The same session on a pool whose slot s is moved to perm[s] (indices mapped, -1 kept)."""
    def m(idx):
        idx = np.asarray(idx)
        return np.where(idx < 0, idx, perm[np.maximum(idx, 0)])

    pool = np.empty_like(session.pool)
    pool[perm] = session.pool
    calls = [DecodeCall(*c.inputs(), state_indices=m(c.state_indices), cu_seqlens=c.cu_seqlens,
                        num_accepted_tokens=c.num_accepted_tokens, scale=c.scale) for c in session.calls]
    return Session(session.name + "_relabelled", calls, pool, dtype=session.dtype, mode=session.mode)


def check_pool_gather_scatter(kernel, dtype="float32", seed=0):
    """The ``pool_gather_scatter`` recipe (padding rows fed NaN, an empty sequence, slots unrelated to sequence
    numbers, repeated calls), and the same with the slots relabelled: the same outputs and states."""
    session = Session.from_script(recipes.pool_gather_scatter(dtype, seed))
    perm = np.random.default_rng(seed).permutation(session.pool.shape[0])
    moved = _relabel(session, perm)
    report, kept = _run(kernel, session)
    m_report, m_kept = _run(kernel, moved)
    chain = list(session.chain())  # the float64 oracle's full results (scales of the agreement)
    final = chain[-1][1].pool
    live = np.array([s for s in range(final.shape[0]) if np.all(np.isfinite(final[s]))])

    def flat(kept, slots):
        return {"o": np.concatenate([np.asarray(o, np.float64).ravel() for o, _ in kept]),
                "state": np.asarray(kept[-1][1], np.float64)[slots]}

    exact = {"o": np.concatenate([r.o.ravel() for _, r, _ in chain]), "state": final[live]}
    return [("pool_gather_scatter", report), ("relabelled slots", m_report),
            ("relabelled == original", judge.agreement("relabelling", flat(m_kept, perm[live]), flat(kept, live),
                                                       exact, _errors(kernel, kept, session, moved),
                                                       _dtypes(kernel, kept), kernel.runner.state_dtype))]


@pytest.mark.parametrize("dtype", DTYPES)
@given(seed=strategies.seeds)
@example(seed=0)
@pytest.mark.gdn2_modes(CHAINED)
def test_pool_gather_scatter(serving_kernel, dtype, seed):
    enforce_all(check_pool_gather_scatter(serving_kernel, dtype, seed), f"{serving_kernel.name} {dtype} seed={seed}",
                Rerun(check_pool_gather_scatter, serving_kernel.name, dtype, dict(seed=seed)))


# --- 4. replay identity ----------------------------------------------------------------------------------------------

def check_replay(kernel, dtype="float32", seed=0, *, L=REPLAY_L, capacity=REPLAY_CAPACITY):
    """L single-token calls on slot 0; then, from the kernel's own state after L - capacity tokens (the
    checkpoint of a ring buffer of ``capacity`` tokens that has wrapped), one call replays the buffered tokens
    writing each state to its own slot: they must be the kernel's states again, and the oracle's replay."""
    xs = recipes.tokens(1, L, dtype, seed, decay="weak")
    pool = recipes.pool_values(capacity + 1, H, K, V, seed)
    steps = Session("replay_steps", [DecodeCall(*x, state_indices=np.zeros(1, np.int64)) for x in _split(xs, (1,) * L)],
                    pool, dtype=dtype)
    report, kept = _run(kernel, steps)
    # the oracle's replay identity: a wrapped ring buffer reconstructs the reference states bit for bit
    buf = oracle_serving.ReplayBuffer(pool[0], capacity)
    for t in range(L):
        buf.push(*(x[0, t] for x in xs[1:]))
    ref_states = [c.state[0] for c in steps.reference()]
    assert buf.start == L - capacity
    for t in range(buf.start, L + 1):
        want = pool[0] if t == 0 else ref_states[t - 1]
        assert np.array_equal(buf.state_at(t), want), f"oracle replay identity broken at token {t}"
    c = L - capacity
    checkpoint = np.asarray(kept[c - 1][1][0], np.float64) if c else pool[0]
    start = pool.copy()
    start[0] = checkpoint
    idx = np.arange(capacity)[None]
    replay = Session("replay", [DecodeCall(*(x[:, c:] for x in xs), state_indices=idx)], start, dtype=dtype)
    r_report, r_kept = _run(kernel, replay)
    replayed = {"state": np.asarray(r_kept[0][1])[:capacity]}
    stepped = {"state": np.stack([np.asarray(kept[t][1][0]) for t in range(c, L)])}
    exact = {"state": np.stack(ref_states[c:])}
    return [("token by token", report), ("replay from the checkpoint", r_report),
            ("replayed == stepped", judge.agreement("replay", replayed, stepped, exact,
                                                    _errors(kernel, kept, steps, replay), _dtypes(kernel, kept),
                                                    kernel.runner.state_dtype))]


@pytest.mark.parametrize("dtype", DTYPES)
@given(seed=strategies.seeds)
@example(seed=0)
@pytest.mark.gdn2_modes(CHAINED)
def test_replay_identity(serving_kernel, dtype, seed):
    enforce_all(check_replay(serving_kernel, dtype, seed), f"{serving_kernel.name} {dtype} seed={seed}",
                Rerun(check_replay, serving_kernel.name, dtype, dict(seed=seed)))


# --- 5. long horizon ------------------------------------------------------------------------------------------------

def check_long_horizon(kernel, dtype="float32", seed=0):
    """4,096 tokens at per-step decay 0.99992: single-token calls (uniform gates) and 256-token calls (one head
    only decaying), ``oracle/serving_recipes.py``."""
    return [(s.purpose, run_session(kernel.runner, Session.from_script(s)))
            for s in (recipes.long_horizon(dtype, seed), recipes.long_horizon_prefill(dtype, seed))]


@pytest.mark.gdn2_modes(CHAINED)
def test_long_horizon(serving_kernel, record_property):
    checks = check_long_horizon(serving_kernel)
    record_property("serving_long_horizon", {label: {v.name: v.err_ratio for v in r.verdicts if v.name in judge.GRADED}
                                             for label, r in checks})
    enforce_all(checks, f"{serving_kernel.name} float32", Rerun(check_long_horizon, serving_kernel.name, "float32", {}))
