"""Judging a hand-off session: which side is off, the prefill's state, the hand-off into storage, or the decode.

A hand-off session (``oracle/handoff_recipes.py``; docs/DESIGN.md §2, "Hand-off sessions") is judged in three parts,
besides the decode judge's own verdicts (``ci/grading/serving.py``: the decode calls from the handed state):

* ``prefill`` (graded): the prefill kernel's final states against the oracle's (float64, token by token), with the
  tolerance of §4 over the float32 recurrence's own error (``e_rec``);
* ``hand-off`` (hard, bit for bit): the states the decode kernel starts from, at the slots written, against the
  prefill's float32 states rounded once to the storage dtype (:func:`transfer_verdict`);
* ``request`` (graded): the decode outputs of the whole request against the float64 oracle run from the exact
  prefill, with the hand-off's own baseline: the float32 prefill's states rounded once to the storage dtype, then the
  float32 decode chain with that storage (:func:`request_verdict`).

The diagnosis (:func:`prefill_findings`, :func:`transfer_findings`, :func:`fork_findings`) names the side and the
cause: a state handed over transposed, rounded twice, one prefill chunk early or in another sequence's slot; a fork
that writes into a shared slot; else the side whose verdict failed. NumPy and the oracle only.
"""

from __future__ import annotations

import math

import numpy as np

from gdn2_oracle.oracle.serving import round_state

from .finding import Finding
from .grades import Verdict
from .rule import ABS_FLOOR, grade, tolerance

PREFILL, TRANSFER, REQUEST = "prefill", "hand-off", "request"
BF16_ROUNDING = 2.0 ** -8  # a bfloat16 rounding, relative: the error of a state rounded once or twice is within it


def errors(got, ref):
    """§4's ``(err_ratio, max_err)`` of ``got`` against ``ref`` (rms and largest error over the reference's rms and
    largest value, floored at ``ABS_FLOOR``); inf when ``got`` is not finite."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"got: shape {got.shape}, expected {ref.shape}")
    if not np.all(np.isfinite(got)):
        return math.inf, math.inf
    d = got - ref
    s_rms = max(math.sqrt(float(np.mean(np.square(ref)))), ABS_FLOOR)
    s_max = max(float(np.max(np.abs(ref))), ABS_FLOOR)
    return math.sqrt(float(np.mean(np.square(d)))) / s_rms, float(np.max(np.abs(d))) / s_max


def _tol(e_rec, dtype="float32"):
    return tuple(tolerance(e, dtype) for e in e_rec)


def prefill_verdict(got, exact, float32):
    """The graded verdict ``prefill``: the prefill kernel's final states ``got`` ``[N, HV, K, V]`` against the oracle's
    ``exact`` (float64), tolerance over the float32 recurrence's ``float32`` states."""
    return grade(PREFILL, errors(got, exact), _tol(errors(float32, exact)), rule="recurrence",
                 non_finite_note="NaN or inf in the prefill's final state")


def transfer_verdict(stored, expected, slots):
    """The hard verdict ``hand-off``: the stored states at ``slots`` (the pool the decode kernel starts from, ``[K, V]``
    view) bit-identical to ``expected`` (the prefill's states rounded once to the storage dtype)."""
    stored, expected = np.asarray(stored, np.float64), np.asarray(expected, np.float64)
    bad = [int(s) for s in slots if not np.array_equal(stored[s], expected[s], equal_nan=True)]
    note = f"slots {bad} differ from the prefill's states rounded once" if bad else ""
    return Verdict(TRANSFER, len(bad) / max(len(slots), 1), float(bool(bad)), 0.0, 0.0, "bit-identical", not bad,
                   note)


def request_verdict(got_o, ref_o, base_o, o_dtype):
    """The graded verdict ``request``: the decode outputs ``got_o`` (judged tokens of every call, concatenated) against
    the float64 oracle of the whole request ``ref_o``, tolerance over the hand-off baseline's ``base_o``."""
    return grade(REQUEST, errors(got_o, ref_o), _tol(errors(base_o, ref_o), o_dtype), rule="hand-off baseline",
                 non_finite_note="NaN or inf in the continuation's outputs")


def _within(got, ref, tol):
    e = errors(got, ref)
    return e[0] <= tol[0] and e[1] <= tol[1]


def prefill_findings(verdict, got, exact, early, lengths, chunk, storage):
    """What a ``prefill`` verdict not PASS points at (the prefill side, or the layout or dtype it hands over in):
    ``got`` the prefill's states, ``exact`` the oracle's, ``early`` the oracle's one prefill chunk early."""
    if verdict.passed:
        return []
    tol = (verdict.tol_ratio, verdict.tol_max)
    got = np.asarray(got, np.float64)
    ev = {"err_ratio": verdict.err_ratio, "max_err": verdict.max_err}
    if _within(np.swapaxes(got, -1, -2), exact, tol):
        return [Finding("hand-off-layout", "the prefill's final state arrives transposed: [V, K] read as [K, V] "
                        "(hand-off side: the prefill hands over [N, HV, V, K] where FLA's layout is [N, HV, K, V])",
                        results=(PREFILL,), evidence=ev)]
    if _within(got, early, tol):
        ends = [chunk * ((t - 1) // chunk) for t in lengths]
        return [Finding("hand-off-chunk", f"the continuation starts from the state one prefill chunk early: the "
                        f"prefill's final states are the oracle's after {ends} of {list(lengths)} tokens (prefill "
                        f"side: the last {chunk}-token chunk is not in the state it hands over)", results=(PREFILL,),
                        evidence=ev)]
    N = got.shape[0]
    if N > 1 and _within(got[::-1], exact, tol):
        return [Finding("hand-off-slot", "each sequence's final state arrives in another sequence's slot (hand-off "
                        "side: the states are handed over in reverse sequence order)", results=(PREFILL,),
                        evidence=ev)]
    if np.array_equal(round_state(got, "bfloat16"), got) and errors(got, exact)[0] <= BF16_ROUNDING:
        twice = f" and the {storage} pool rounds it again: rounded twice" if storage == "bfloat16" else ""
        return [Finding("hand-off-dtype", f"the prefill's final state arrives already rounded to bfloat16 (a float32 "
                        f"state expected){twice} (hand-off side: err_ratio {verdict.err_ratio:.3g} against the "
                        "oracle, one bfloat16 rounding or more)", results=(PREFILL,), evidence=ev)]
    return [Finding("prefill-state", f"the prefill's final state is off (err_ratio {verdict.err_ratio:.3g}, "
                    f"tolerance {verdict.tol_ratio:.3g}): prefill side; the decoding was judged from the state it "
                    "handed over", results=(PREFILL,), evidence=ev)]


def transfer_findings(verdict, stored, expected, slots):
    """What a ``hand-off`` verdict not PASS points at: per differing slot, the transposed state, another slot's state
    or a state rounded more than once."""
    if verdict.passed:
        return []
    out = []
    for s in slots:
        a, b = np.asarray(stored[s], np.float64), np.asarray(expected[s], np.float64)
        if np.array_equal(a, b):
            continue
        other = [int(t) for t in slots if t != s and np.array_equal(a, expected[t])]
        if np.array_equal(np.swapaxes(a, -1, -2), b):
            cause = "transposed: [V, K] stored as [K, V]"
        elif other:
            cause = f"the state of slot {other[0]} (wrong slot)"
        else:
            cause = f"not the prefill's state rounded once (err_ratio {errors(a, b)[0]:.3g}: rounded twice?)"
        out.append(Finding("hand-off-store", f"hand-off side: slot {s} holds {cause}", results=(TRANSFER,)))
    return out


def fork_findings(changed, plans):
    """Forks that write into a shared slot: of the decode judge's ``changed`` ``[(call, [slots])]`` (slots that changed
    though the call writes none of them), those a live sequence of that call read without writing (``plans``: the
    calls' ``oracle.serving.Plan``)."""
    out = []
    for i, slots in changed:
        shared = {s.read: s for s in plans[i].sequences if s.live and s.read not in {w for _, w in s.writes}}
        for slot in slots:
            if slot in shared:
                s = shared[slot]
                writes = sorted({w for _, w in s.writes})
                out.append(Finding("fork-write", f"a fork writes into the shared slot {slot}: sequence {s.n} of call "
                                   f"{i} reads it and writes slot(s) {writes}, yet slot {slot} changed (it must stay "
                                   "bit-identical until its own sequence writes it; decoding side)",
                                   results=("untouched",)))
    return out
