"""Session drivers: a serving session mapped onto one kernel's API, and the states its representation encodes.

The suite describes a serving session once (``ci.grading.serving.Session``: sequences on a slot table, prefill
hand-offs, decode steps, speculative windows with accept counts, padding rows). A *driver* runs it on one kernel and
reports, after each call, the outputs and the pool of ``[K, V]`` states the kernel's representation encodes; the judge
(``SessionJudge``: grades, hard checks, diagnoses) is the same for every driver. The protocol (docs/drivers.md)::

    class MyDriver:
        name: str                    # for reports
        state_dtype: str             # what the kernel stores states in (float32, bfloat16, float16)
        replay_capacity: int | None  # None: the states are pool slots; else the rings of a replay representation
        replay_storage: tuple        # (optional, replay) (checkpoint dtype, cache dtype); default both state_dtype
        def start(self, session) -> pool            # [P, HV, K, V]: the pool the kernel starts from
        def step(self, call, dtype) -> (o, pool)    # one oracle.serving.DecodeCall; o [B, T, HV, V] in the
                                                    # kernel's output dtype; the pool its representation encodes

A pool driver hands over its pool in ``state_dtype``; a replay driver (``replay_capacity`` set) the pool it encodes
in float64 (``oracle.replay.fold`` of what it stores), and is graded against the replay representation's baselines.

* :class:`PoolDriver`: one state per slot (the suite's ``state_pool`` and FLA's ``ssm_state_indices``), through
  ``ci/running/serving.py``'s :class:`ServingRunner`;
* :class:`ReplayDriver`: a checkpoint plus a ring of recent tokens per sequence (vLLM's ReplaySSM), over a *backend*
  that runs one call's :class:`oracle.replay_slots.CallPlan` (``ci/running/replay_backends.py``). The slot map
  (``oracle/replay_slots.py``) turns the session's pool slots into replay slots, commits and loads.
"""

from __future__ import annotations

import numpy as np

from gdn2_oracle.oracle.replay_slots import SlotMap

from .replay_backends import Traffic

DRIVERS = ("pool", "replay")


class PoolDriver:
    """The pool convention: the kernel reads and writes the session's slots itself (``ServingRunner``)."""

    replay_capacity = None

    def __init__(self, runner):
        self.runner = runner
        self.name = getattr(runner.fn, "__name__", "kernel")
        self.state_dtype = runner.state_dtype
        self.family = runner.family
        self.pool = None
        self.traffic = Traffic()  # a sequence's slot read once a call, each slot it stores written

    def start(self, session):
        self.pool = self.runner.pool(session.initial_pool())
        return self.pool

    def step(self, call, dtype):
        o, new_pool = self.runner.step(call, self.pool, dtype)
        state_bytes = self.pool[0].nbytes
        for s in call.plan(self.pool.shape[0]).sequences:
            if s.live:
                self.traffic.read += state_bytes
                self.traffic.written += state_bytes * len(s.writes)
                self.traffic.tokens += s.length
        self.pool = new_pool
        return o, self.pool


def replay_slots(session):
    """The replay slots (the null slot included) the slot map uses over ``session``: its plans, run ahead on zero
    states (which slot a call reads or loads never depends on the values). A backend holds exactly these; sizing it
    by the bound, one fresh slot per sequence and call, made a 4,096-call session's every step copy 4,097 slots."""
    probe = SlotMap(session.initial_pool())
    zero = np.zeros(probe.pool.shape[1:])
    for call in session.calls:
        probe.plan(call, lambda p, ahead: zero)
        probe.finish(lambda p, ahead: zero)
    return probe.slots


class ReplayDriver:
    """A replay representation (module docstring) over ``backend``: ``capacity``, ``state_dtype``, ``family``,
    ``setup(slots, HV, H, K, V, window)``, ``run(plan, call, dtype) -> o`` and ``state(p, ahead)`` (float64 ``[HV, K,
    V]``: the state replay slot p encodes ``ahead`` tokens past its cursor)."""

    def __init__(self, backend, name=None):
        self.backend = backend
        self.name = name or getattr(backend, "name", "replay")
        self.state_dtype = backend.state_dtype
        self.replay_capacity = backend.capacity
        self.replay_storage = getattr(backend, "storage", None)  # (checkpoint dtype, cache dtype)
        self.family = backend.family
        self.slots = None
        self.held = 0  # replay slots the backend holds (start)

    @property
    def traffic(self):
        """The backend's :class:`ci.running.replay_backends.Traffic`, when it counts one (else None)."""
        return getattr(self.backend, "traffic", None)

    def start(self, session):
        self.slots = SlotMap(session.initial_pool())
        P, HV, K, V = self.slots.pool.shape
        calls = session.calls
        window = max((c.state_indices.shape[1] for c in calls if np.ndim(c.state_indices) == 2), default=0)
        self.held = replay_slots(session)
        self.backend.setup(self.held, HV, calls[0].q.shape[2], K, V, window)
        return self.slots.pool.copy()

    def step(self, call, dtype):
        plan = self.slots.plan(call, self.backend.state)
        if self.slots.slots > self.held:  # a kernel would clamp the slot id and read or write another slot
            raise RuntimeError(f"replay slots: the slot map uses {self.slots.slots}, the backend holds {self.held}")
        o = self.backend.run(plan, call, dtype)
        return o, self.slots.finish(self.backend.state)
