"""Session drivers (ci/running/drivers.py; docs/drivers.md): one judge for every state representation.

* a driver a user writes (the worked example of docs/drivers.md: a base state plus one delta per call) is judged
  like any kernel: PASS when right, FAIL when it drops a delta;
* our replay kernel (``replay-recurrent``: a checkpoint plus a ring, vLLM ReplaySSM's idea) passes every gdn session
  through its replay driver, for rings that flush every token, often and rarely, in float32 or bfloat16 storage;
* its six deliberate bugs each FAIL, with the diagnosis docs/drivers.md quotes.
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.ci.grading.grades import FAIL, PASS, PRECISION
from gdn2_oracle.ci.grading.serving import Session
from gdn2_oracle.ci.running import serving as running
from gdn2_oracle.ci.running.drivers import ReplayDriver
from gdn2_oracle.kernels import replay_decode
from gdn2_oracle.oracle import recurrence, serving_recipes

GDN_SESSIONS = [n for n, (fam, *_) in serving_recipes.FAMILY_RECIPES.items() if fam == "gdn"]


def _sessions(dtype="float32", names=GDN_SESSIONS):
    return [Session.from_script(serving_recipes.FAMILY_RECIPES[n][3](dtype)) for n in names]


# --- a driver written by a user: the worked example of docs/drivers.md ------------------------------------------

def step_deltas(q, k, v, g, beta, base, deltas, *, drop=False):
    """A made-up engine's kernel: one sequence's tokens from the state ``base + sum(deltas)`` ([HV, K, V]); returns
    ``(o [T, HV, V], the call's delta)`` (float32). ``drop``: a bug, the delta is lost."""
    G = v.shape[1] // q.shape[1]
    S0 = (base + sum(deltas)).astype(np.float32)
    S = S0.copy()
    o = np.zeros(v.shape, np.float32)
    buf = np.empty_like(S)
    K = q.shape[-1]
    for t in range(q.shape[0]):
        b = np.repeat(beta[t][:, None], K, axis=1).astype(np.float32)
        w = np.repeat(beta[t][:, None], v.shape[-1], axis=1).astype(np.float32)
        alpha = np.exp(np.repeat(g[t][:, None], K, axis=1)).astype(np.float32)
        kt = np.repeat(k[t], G, axis=0).astype(np.float32)
        recurrence.token_step(S, alpha, kt, b, v[t].astype(np.float32), w, buf)
        o[t] = recurrence.read_out(S, np.repeat(q[t], G, axis=0).astype(np.float32), K ** -0.5)
    return o, (np.zeros_like(S) if drop else S - S0)


class DeltaDriver:
    """docs/drivers.md's worked example, run here as written there."""

    name, family, state_dtype, replay_capacity = "deltas", "gdn", "float32", None

    def __init__(self, drop=False):
        self.drop = drop

    def start(self, session):
        self.chains = {s: (session.pool[s], []) for s in range(session.pool.shape[0])}
        return self.pool()

    def pool(self):
        return np.stack([(base + sum(ds)).astype(np.float32) for base, ds in self.chains.values()])

    def step(self, call, dtype):
        x = call.family_inputs("gdn")
        o = np.zeros(call.v.shape, np.float32)
        for s in call.plan(len(self.chains)).sequences:
            if not s.live:
                continue
            base, ds = self.chains[s.read]
            sl = (s.row, slice(s.start, s.start + s.length))
            o[sl], delta = step_deltas(*(x[n][sl] for n in ("q", "k", "v", "g", "beta")), base, ds, drop=self.drop)
            self.chains[s.read] = (base, ds + [delta])
        return o, self.pool()


def test_a_users_driver_is_judged_like_any_kernel():
    decode_sessions = [s for s in _sessions() if s.mode == "decode"]
    assert decode_sessions
    for session in decode_sessions:
        assert running.run_session(DeltaDriver(), session).passed, session.name
        report = running.run_session(DeltaDriver(drop=True), session)
        assert {v.name for v in report.verdicts if v.grade == FAIL} >= {"state"}, session.name


# --- our replay kernel -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("capacity", [1, 6, 16])
def test_replay_kernel_passes_every_gdn_session(capacity):
    """Rings of 1 (every token a flush), 6 (the smallest that holds two windows of 3: flushes and circular wraps in
    the long sessions) and 16; a window of 4 needs 8, so the 4-draft session runs with the rings that hold it. The
    backend holds as many replay slots as the session uses, and not one fewer (a kernel would clamp the slot id)."""
    fn = kernels.get(f"replay-recurrent[capacity={capacity}]")
    driver = running.driver(fn)
    assert isinstance(driver, ReplayDriver) and driver.replay_capacity == capacity
    for session in _sessions():
        window = max((c.state_indices.shape[1] for c in session.calls if c.state_indices.ndim == 2), default=0)
        if 2 * window > capacity:
            with pytest.raises(ValueError, match="capacity"):
                running.run_session(fn, session)
            continue
        d = running.driver(fn)
        report = running.run_session(d, session)
        assert report.passed and all(v.grade == PASS for v in report.verdicts), (session.name, str(report))
        # the backend holds exactly the replay slots the session used (drivers.replay_slots, its plans run ahead)
        assert d.held == d.slots.slots, (session.name, d.held, d.slots.slots)


def test_a_backend_holding_too_few_replay_slots_is_refused(monkeypatch):
    """Were the slot count run ahead ever short, the call that needs one more slot stops the session with the reason
    instead of letting the kernel clamp the slot id onto another sequence's slot."""
    from gdn2_oracle.ci.running import drivers

    session = next(s for s in _sessions() if drivers.replay_slots(s) > 2)
    monkeypatch.setattr(drivers, "replay_slots", lambda s: 2)
    with pytest.raises(RuntimeError, match=r"replay slots: the slot map uses \d+, the backend holds 2"):
        running.run_session(kernels.get("replay-recurrent"), session)


def test_bf16_storage_is_graded_by_its_stored_state_bound():
    fn = kernels.get("replay-recurrent[state_dtype='bfloat16']")
    grades = {}
    for dtype in ("float32", "bfloat16"):
        for session in _sessions(dtype):
            report = running.run_session(fn, session)
            grades[session.name] = report.grade
            assert report.grade in (PASS, PRECISION), (session.name, str(report))
    assert PRECISION in grades.values()  # float32 outputs read from bf16 caches: their cost is visible


# the diagnosis each mutant gets on the sessions that catch it (docs/drivers.md's table): a finding kind, and the
# phrase the replay finding (where the first wrong sequence's ring stood) must hold
MUTANT_DIAGNOSES = {
    "late_flush": ({"logic"}, "errors begin at a flush"),
    "cursor_all_drafts": ({"rejected-draft"}, "errors begin where the cursor moved"),  # reads a finite rejected draft
    "prefix_decay": ({"logic", "replay"}, "the replayed decay"),
    "key_per_value_head": ({"logic"}, "the key each value head reads"),
    "base_not_advanced": ({"logic"}, "errors begin where the cursor moved"),
    "null_block_live": ({"padding"}, None),
}


@pytest.mark.parametrize("mutant", replay_decode.MUTANTS)
def test_each_replay_bug_fails_with_its_diagnosis(mutant):
    fn = kernels.get(f"replay-recurrent[mutant={mutant!r},capacity=6]")
    kinds, phrase = MUTANT_DIAGNOSES[mutant]
    caught = []
    for session in _sessions():
        report = running.run_session(fn, session)
        if report.grade == FAIL:
            found = {f.kind: str(f) for f in report.diagnosis}
            assert set(found) & kinds, (session.name, found)
            assert phrase is None or phrase in found.get("replay", ""), (session.name, found)
            caught.append(session.name)
    assert caught, f"{mutant}: no session caught it"


# --- the figures: state traffic, and a 16-bit ring over 4,096 steps ------------------------------------------------

def test_state_traffic_counts():
    """The drivers' byte counts (ci/benchmarks/state_traffic.py): a ring of 1 moves what a pool moves (every token a
    flush), a ring of 16 writes one checkpoint and 15 entries every 16 tokens, and both kernels pass while counted."""
    from gdn2_oracle.ci.benchmarks import state_traffic

    H, HV, K, V = 1, 2, 16, 8
    sess = state_traffic.session(H, HV, K, V, 32)
    pool = state_traffic.measure(state_traffic.POOL_KERNEL, sess)
    ring1 = state_traffic.measure("replay-recurrent[capacity=1,cache_dtype='bfloat16']", sess)
    ring16 = state_traffic.measure("replay-recurrent[capacity=16,cache_dtype='bfloat16']", sess)
    state = HV * K * V * 4
    entry = HV * V * 2 + H * K * 2 + HV * 4
    assert pool == (PASS, state, state) and ring1 == (PASS, state, state)
    assert ring16[0] in (PASS, PRECISION)
    assert ring16[2] == (state + 15 * entry) / 16
    assert ring16[1] == state + entry * sum(range(16)) / 16


@pytest.mark.release
def test_a_bf16_ring_over_4096_steps(record_property):
    """docs/drivers.md's figure: 4,096 single-token calls at decay 0.99992, a ring of 16 with bf16 checkpoint and
    caches, against a bf16 pool: both PRECISION, within their stored-state bounds."""
    session = Session.from_script(serving_recipes.family_long_horizon("gdn"))
    figures = {}
    for spec in ("replay-recurrent", "replay-recurrent[state_dtype='bfloat16']", "gdn-decode[state_dtype='bfloat16']"):
        report = running.run_session(kernels.get(spec), session)
        o = next(v for v in report.verdicts if v.name == "o")
        figures[spec] = {"grade": report.grade, "err_ratio": o.err_ratio, "tol": o.tol_ratio, "bound": o.bound_ratio}
    record_property("bf16_ring_4096", figures)
    assert figures["replay-recurrent"]["grade"] == PASS
    for spec in ("replay-recurrent[state_dtype='bfloat16']", "gdn-decode[state_dtype='bfloat16']"):
        f = figures[spec]
        assert f["grade"] == PRECISION and f["tol"] < f["err_ratio"] <= f["bound"], (spec, f)
