"""A pool session's slots mapped onto replay slots with cursors (the replay drivers' bookkeeping).

A scripted session (``oracle.serving.SessionScript``) names *pool slots*: a call reads a sequence's state from a slot
and writes states to slots (the final one, or one per draft token). A replay representation (``oracle/replay.py``,
vLLM's ReplaySSM) keeps one *replay slot* per sequence instead, with a committed cursor and the drafts of its last
verify window after it. :class:`SlotMap` translates, call by call (docs/DESIGN.md §2, "Replay states"):

* a pool slot is *placed* at ``(replay slot p, position)``: the state after ``position`` committed-or-draft tokens
  of p; a sequence that reads a placed slot continues on p, first committing the drafts up to it (a speculative
  read of ``idx[n, a - 1]`` commits ``a`` tokens of the last window);
* a slot that is not placed, or whose position p no longer encodes (behind the cursor, a superseded draft), or whose
  p another sequence of the same call already continues on (a shared prefix), or whose p ran the other kind of call
  (decode tokens / verify windows: an engine runs a request on one path), is *loaded* into a fresh replay slot:
  its state becomes that slot's checkpoint with an empty ring (a prefill's hand-off);
* padding rows and empty sequences get :data:`NULL_SLOT` (vLLM: slot ids at or below the null block id are
  padding); replay slots start at 1;
* after the call, the pool the representation encodes (:meth:`SlotMap.finish`): the written slots and every placed
  slot of a replay slot the call did not run are encoded again from the representation, so a kernel that changes
  another sequence's storage changes that pool slot (the judge's untouched check); the rest keep their last value.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

NULL_SLOT = 0


class Row(NamedTuple):
    """One sequence of a call on the replay representation: its tokens and the replay slot it runs on."""

    n: int
    row: int  # batch row of its tokens
    start: int
    length: int
    slot: int  # replay slot, NULL_SLOT for padding rows and empty sequences
    window: bool  # a verify window (drafts after the cursor), else tokens committed as they run


class CallPlan(NamedTuple):
    """What a replay kernel does for one call: ``commits ((slot, accepted), ...)`` of earlier windows, ``loads
    ((slot, state [HV, K, V]), ...)`` of fresh slots, then the ``rows`` (:class:`Row`) of the call."""

    commits: tuple
    loads: tuple
    rows: tuple

    @property
    def slots(self):
        """Replay slots the rows run on (live rows only)."""
        return sorted({r.slot for r in self.rows if r.slot != NULL_SLOT})


class SlotMap:
    """The translation of one session, from its initial pool ``[P, HV, K, V]`` (float64)."""

    def __init__(self, pool):
        self.pool = np.array(pool, np.float64)
        self.placed = {}  # pool slot -> (replay slot, position)
        self.committed = {}  # replay slot -> position of its committed cursor (tokens since its load)
        self.window = {}  # replay slot -> drafts of its last verify window
        self.kind = {}  # replay slot -> whether it runs verify windows (speculative) or decode tokens
        self.next_slot = NULL_SLOT + 1
        self._pending = None

    @property
    def slots(self):
        """Replay slots used so far plus the null slot: the size a representation needs."""
        return self.next_slot

    def _ahead(self, where):
        """``where = (p, position)``'s distance past p's cursor when p still encodes it (0: the cursor, 1..window:
        a draft of the last window), else None."""
        p, pos = where
        ahead = pos - self.committed[p]
        return ahead if 0 <= ahead <= self.window[p] else None

    def plan(self, call, state):
        """The :class:`CallPlan` of ``call`` (an ``oracle.serving.DecodeCall``). ``state(p, ahead)``: the state
        replay slot p encodes ``ahead`` tokens past its cursor (float64 ``[HV, K, V]``), for slots loaded from one."""
        if self._pending is not None:
            raise ValueError("plan: the previous call was not finished (SlotMap.finish)")
        p_plan = call.plan(self.pool.shape[0])
        commits, loads, rows, used, writes = [], [], [], set(), []
        for s in p_plan.sequences:
            if not s.live:
                rows.append(Row(s.n, s.row, s.start, s.length, NULL_SLOT, p_plan.speculative))
                continue
            where = self.placed.get(s.read)
            ahead = None if where is None else self._ahead(where)
            if ahead is None or where[0] in used or self.kind[where[0]] != p_plan.speculative:
                S = self.pool[s.read] if ahead is None else state(where[0], ahead)
                p = self.next_slot
                self.next_slot += 1
                loads.append((p, np.array(S, np.float64)))
                self.committed[p], self.window[p] = 0, 0
            else:
                p = where[0]
                if ahead:
                    commits.append((p, ahead))
                    self.committed[p] += ahead
                self.window[p] = 0
            used.add(p)
            self.kind[p] = p_plan.speculative
            rows.append(Row(s.n, s.row, s.start, s.length, p, p_plan.speculative))
            if p_plan.speculative:
                self.window[p] = s.length
                writes += [(slot, (p, self.committed[p] + i + 1)) for i, slot in s.writes]
            else:
                self.committed[p] += s.length
                writes += [(slot, (p, self.committed[p])) for _, slot in s.writes]
        self._pending = (p_plan, writes, used)
        return CallPlan(tuple(commits), tuple(loads), tuple(rows))

    def finish(self, state):
        """The pool the representation encodes after the planned call (``state`` as in :meth:`plan`), ``[P, HV,
        K, V]`` float64; a slot the representation no longer encodes keeps its last value."""
        if self._pending is None:
            raise ValueError("finish: no call was planned")
        p_plan, writes, used = self._pending
        self._pending = None
        for slot, where in writes:  # within a row later writes win
            self.placed[slot] = where
        written = {slot for slot, _ in writes}
        for slot, where in self.placed.items():
            if slot in written or where[0] not in used:
                ahead = self._ahead(where)
                if ahead is not None:
                    self.pool[slot] = state(where[0], ahead)
        return self.pool.copy()
