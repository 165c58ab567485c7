"""What a non-PASS serving session points at (docs/DESIGN.md §4, "Diagnosis"; docs/serving.md).

:data:`SERVING_LOCALISERS` is the ordered list of a session's diagnoses: each reads the :class:`ServingEvidence`
of a :class:`serving.SessionJudge`'s report and returns a :class:`Finding` or None; every one that holds is kept,
in list order; when none holds and a graded result is off, :func:`systematic` says so. A new diagnosis is a
function added to the list, its priority its position there. Heuristics: the grade is the verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from gdn2_oracle.oracle import replay

from .finding import LOGIC_ERROR, Finding
from .grades import FAIL, PASS, PRECISION
from .profiles import first_bad
from .rule import MULTIPLE

FLOAT16_MAX = float(np.finfo(np.float16).max)
# A FAIL below this err_ratio is compared with a running state rounded to 16 bits after every token.
IN_LOOP_MAX = 1.0
# The 16-bit formats a state kept inside the token loop may be rounded to, tried in this order.
LOOP_DTYPES = ("bfloat16", "float16")


def largest(d):
    """The largest ``|d|`` (0 when empty, inf when some value is not finite)."""
    d = np.asarray(d, np.float64)
    return 0.0 if d.size == 0 else (float(np.max(np.abs(d))) if np.all(np.isfinite(d)) else math.inf)


def sequence_errors(rc, o, pool_after):
    """One call's errors where they live: ``{"o": {n: (largest |error| over live sequence n's judged outputs, at
    its first token)}, "state": {slot: largest |error| of the state written there}}`` (absolute; inf: not finite),
    of the kernel's ``o`` and pool after the call against the judge's reference call ``rc``."""
    got = np.asarray(o, np.float64)[rc.judged]
    per_seq = {}
    for seq in rc.plan.sequences:
        if not seq.live:
            continue
        mask = np.zeros(rc.judged.shape, bool)
        mask[seq.row, seq.start:seq.start + seq.length] = True
        sel = mask[rc.judged]
        d = got[sel] - rc.o[sel]
        first = d[:1] if rc.judged[seq.row, seq.start] else d[:0]
        per_seq[seq.n] = (largest(d), largest(first))
    after = np.asarray(pool_after, np.float64)
    state = {int(slot): largest(after[slot] - ref) for slot, ref in zip(rc.state_slots, rc.state)}
    return {"o": per_seq, "state": state}


@dataclass
class ServingEvidence:
    """What the serving localisers read: the ``judge`` (its pool checks, per-result metrics, first-token errors,
    session and dtypes), its ``report``, and the baselines ``rec`` (float32 pool) and ``store`` (the pool's dtype
    once per store), ``{result: (err_ratio, max_err)}``."""

    judge: object
    report: object
    rec: dict
    store: dict

    @cached_property
    def bad(self):
        """The graded results (those the judge keeps metrics of) off their tolerance."""
        return [v for v in self.report.verdicts if v.name in self.judge.metrics and v.grade != PASS]

    @cached_property
    def nonfinite(self):
        return [v for v in self.bad if v.rule == "non-finite"]

    @cached_property
    def finite(self):
        return [v for v in self.bad if v.rule != "non-finite"]

    @cached_property
    def first_nonfinite_call(self):
        """The first call with a non-finite value in a result, or None."""
        return min((self.judge.metrics[v.name].first_bad for v in self.nonfinite), default=None)

    @cached_property
    def first_over(self):
        """The first call over tolerance of any finite off result, or None."""
        firsts = (first_bad(self.report.profiles[v.name], v.tol_ratio) for v in self.finite)
        return min((x for x in firsts if x is not None), default=None)

    @cached_property
    def output_overflows(self):
        """``o`` non-finite in a float16 output buffer that the outputs' magnitude overflows."""
        j = self.judge
        return (j.o_dtype == "float16" and any(v.name == "o" for v in self.nonfinite)
                and j.session.peak_output() > FLOAT16_MAX)

    def threshold(self, name):
        """The absolute error over which one value of result ``name`` is wrong: its max_err tolerance times its scale
        (inf when the result passes)."""
        v = next((v for v in self.report.verdicts if v.name == name), None)
        if v is None or v.grade == PASS:
            return math.inf
        return v.tol_max * self.judge.metrics[name].scales[1]

    @cached_property
    def first_wrong(self):
        """``(call, sequences, slots, errors)``: the first call with a live sequence's output or a written slot's
        state over its tolerance (:func:`sequence_errors`), those sequences and slots; None without per-sequence
        errors or when none is over."""
        per = getattr(self.judge, "per_sequence", None) or []
        t_o, t_s = self.threshold("o"), self.threshold("state")
        for i, errs in enumerate(per):
            seqs = [n for n, (big, _) in errs["o"].items() if not big <= t_o]
            slots = [slot for slot, big in errs["state"].items() if not big <= t_s]
            if seqs or slots:
                return i, seqs, slots, errs
        return None

    @cached_property
    def in_loop(self):
        """``(dtype, hits, loop baseline)`` when every moderate FAIL (err_ratio below IN_LOOP_MAX) is of the size of
        a running state rounded to ``dtype`` after every token (within MULTIPLE of that baseline either way), else
        None."""
        moderate = [v for v in self.finite if v.grade == FAIL and v.err_ratio < IN_LOOP_MAX]
        if not moderate:
            return None
        j = self.judge
        o_dtype = j.o_dtype or j.session.dtype
        for dt in LOOP_DTYPES:
            loop = j.session.baseline(f"loop:{dt}", o_dtype, j.state_dtype)
            hits = [v for v in moderate if v.err_ratio <= MULTIPLE[dt] * loop[v.name][0]
                    and v.err_ratio >= loop[v.name][0] / MULTIPLE[dt]]
            if len(hits) == len(moderate):
                return dt, hits, loop
        return None


def names(vs):
    """The verdicts' result names, comma-separated."""
    return ", ".join(v.name for v in vs)


def has_drafts(call):
    """Whether a call's ``state_indices`` has a draft axis (``[N, S]``: accept counts and draft slots)."""
    return np.ndim(call.state_indices) == 2


def accept_count(call, n):
    """Sequence ``n``'s accept count ``a_n`` in a call with draft slots (1 when the call gives none)."""
    acc = call.num_accepted_tokens
    return 1 if acc is None else int(np.asarray(acc)[n])


def seq_phrase(call, plan, n, first_off):
    """Sequence ``n`` of a call: its slots and, with draft slots, its accept count and the slot it must start
    from; whether its first token is already off."""
    seq = plan.sequences[n]
    if has_drafts(call):
        a = accept_count(call, n)
        head = (f"sequence {n} (accept count a_{n} = {a}: must start from slot idx[{n}, {a - 1}] = {seq.read}, of "
                f"draft slots {', '.join(map(str, np.asarray(call.state_indices)[n]))})")
    else:
        head = f"sequence {n} (reads slot {seq.read}, writes slot(s) {', '.join(str(s) for _, s in seq.writes)})"
    return head + (", off from its first token" if first_off else ", its first token right")


def where_first_wrong(ev):
    """``"; first wrong at call i: ..."``: the first wrong call's first wrong sequence (its slots, accept count),
    the other sequences and the slots whose state is off, or ""."""
    hit = ev.first_wrong
    if hit is None:
        return ""
    i, seqs, slots, errs = hit
    call, plan = ev.judge.session.calls[i], ev.judge.ref[i].plan
    off_first = [n for n in seqs if not errs["o"][n][1] <= ev.threshold("o")]
    out = f"; first wrong at call {i}"
    if seqs:
        out += ": o of " + seq_phrase(call, plan, seqs[0], seqs[0] in off_first)
    if len(seqs) > 1:
        counts = (f" (accept counts {', '.join(str(accept_count(call, n)) for n in seqs[1:])})"
                  if has_drafts(call) else "")
        out += f"; also sequence(s) {', '.join(map(str, seqs[1:]))}{counts}"
    if slots:
        shown = ", ".join(map(str, slots[:8])) + (", ..." if len(slots) > 8 else "")
        out += f"; the state written to {len(slots)} slot(s) off ({shown})"
    if has_drafts(call) and off_first:
        out += (": a sequence off from its first token started from a wrong state -- the slot it reads must be "
                "idx[n, a_n - 1] (the last accepted draft's), not idx[n, a_n] nor the last draft column")
    return out


def pool_bookkeeping(ev):
    """A call changed slots no live sequence writes."""
    if not ev.judge.changed:
        return None
    i, slots = ev.judge.changed[0]
    return Finding("pool-bookkeeping", f"call {i} changed slot(s) {slots} that no live sequence writes (a padding "
                                       "row, an unaddressed slot, or a write to the wrong slot)", i)


def padding(ev):
    """A call output nonzero values for padding rows or tokens of no live sequence."""
    if not ev.judge.nonzero:
        return None
    i, n = ev.judge.nonzero[0]
    return Finding("padding", f"call {i} output {n} nonzero value(s) for padding rows or tokens of no live sequence "
                              "(they must be exact zeros)", i)


def output_overflow(ev):
    """``o`` inf because the float16 output buffer overflows, the state right."""
    if not ev.nonfinite or not ev.output_overflows:
        return None
    first, peak = ev.first_nonfinite_call, ev.judge.session.peak_output()
    return Finding("output-overflow", f"o is inf from call {first}: the float16 output buffer overflows (|o| "
                                      f"reaches {peak:.3g} > {FLOAT16_MAX:g}, float16's largest finite value) "
                                      "although the float32 state is right; keep o in float32 or bfloat16, or scale "
                                      "it", first)


def non_finite(ev):
    """NaN or inf in a graded result (not an output overflow)."""
    if not ev.nonfinite or ev.output_overflows:
        return None
    first = ev.first_nonfinite_call
    return Finding("non-finite", f"NaN or inf in {names(ev.nonfinite)} from call {first}: a NaN read from a slot "
                                 "it should not read (a rejected draft's state, a padding row's tokens) or an "
                                 f"overflow{where_first_wrong(ev)}", first)


def state_in_loop(ev):
    """Moderate FAILs of the size of a state rounded to 16 bits after every token: rounded inside the token loop."""
    if ev.in_loop is None:
        return None
    dt, hits, loop = ev.in_loop
    sd = ev.judge.state_dtype
    return Finding("state-in-loop", f"{names(hits)} beyond the stored-state bound, of the size of a running state "
                                    f"rounded to {dt} after every token (err_ratio {hits[0].err_ratio:.2g}, that "
                                    f"baseline's {loop[hits[0].name][0]:.2g}; one rounding per store of a {sd} pool: "
                                    f"{ev.store[hits[0].name][0]:.2g}): the state is kept in {dt} inside the token "
                                    "loop, not only rounded where it is stored")


def logic(ev):
    """An O(1) FAIL (not a state rounded in the loop), placed by whether the first bad call starts right."""
    in_loop = {v.name for v in ev.in_loop[1]} if ev.in_loop else set()
    big = [v for v in ev.finite if v.grade == FAIL and v.err_ratio >= LOGIC_ERROR and v.name not in in_loop]
    if not big:
        return None
    at, first_token = ev.first_over, ev.judge.first_token
    where = ""
    if at is not None and first_token[at] >= LOGIC_ERROR:
        where = (f"; from call {at}, whose first token of some sequence is already off (error "
                 f"{first_token[at]:.2g} of its largest output): the state it starts from is wrong "
                 "(the slot read, or the accepted count: idx[n, a_n - 1])")
    elif at is not None:
        where = (f"; from call {at}, whose sequences start right (first tokens within "
                 f"{first_token[at]:.2g}): the update or the slot written")
    worst = max(big, key=lambda v: v.err_ratio)
    return Finding("logic", f"O(1) relative error in {names(big)} (err_ratio up to {worst.err_ratio:.2g}){where}"
                            f"{where_first_wrong(ev)}", at)


def stored_state(ev):
    """PRECISION results: precision lost to a 16-bit pool, with a warning when it is O(1) (the decay stalls)."""
    precision = [v for v in ev.finite if v.grade == PRECISION]
    if not precision:
        return None
    sd, store = ev.judge.state_dtype, ev.store
    worst = max(v.err_ratio for v in precision)
    stall = "" if worst < LOGIC_ERROR else (
        f"; WARNING: an O(1) error (err_ratio {worst:.2g}) that every correct kernel with this pool has: the "
        f"{sd} pool cannot hold this state across these calls (a per-call decay closer to 1 than half an ulp "
        f"of {sd} is rounded away at every store and the decay stalls): store the state in float32")
    return Finding("stored-state", f"{names(precision)} over the float32-storage tolerance, within {MULTIPLE[sd]:g} x "
                                   f"the error of storing the state in {sd} once per store (e_store: o "
                                   f"{store['o'][0]:.2g}, state {store['state'][0]:.2g}): precision lost to the "
                                   f"pool's {sd} format, as expected of it (docs/serving.md)" + stall)


# A session's diagnoses, in this order: every one that holds is kept.
def replay_ring(ev):
    """A replay kernel's FAIL placed on its rings (``oracle.replay.trace``): what the first wrong sequence's ring
    did at the first wrong call -- a load, a flush (the ring folded into the checkpoint), a commit of accepted
    drafts -- and which part of a replay kernel that points at."""
    L = getattr(ev.judge, "replay_capacity", None)
    hit = ev.first_wrong
    if L is None or hit is None or not any(v.grade == FAIL for v in ev.bad):
        return None
    i, seqs, _, _ = hit
    rings = replay.trace(ev.judge.session, int(L))
    events = rings[i]
    if not events:
        return None
    n = seqs[0] if seqs and seqs[0] in events else next(iter(events))
    p, before, flushed, committed, window = events[n]
    prev = rings[i - 1].get(n) if i else None
    facts = ["its first call after a load (the session's state written as its checkpoint)" if before < 0 else
             f"{before} committed ring entries before the call"]
    if committed:
        facts.append(f"{committed} accepted draft(s) of its last window committed first")
    if flushed:
        facts.append("its ring folded into the checkpoint during the call (a flush)")
    if prev is not None and prev[2]:
        facts.append("a flush in the call before")
    if window and committed:
        hint = (f"errors begin where the cursor moved: a commit of {committed} accepted draft(s)"
                f"{', then a flush' if flushed else ''} -- how write_pos moves by the accepted count (not by the "
                "drafts), and the circular base after a flush")
    elif flushed or (prev is not None and prev[2]):
        hint = (f"errors begin at a flush: when the ring is folded into the checkpoint (a token finding L - 1 = "
                f"{L - 1} entries; a window that would not fit twice) and what the next token reads from it")
    elif before < 0 or i == 0:
        hint = ("errors from the first tokens, before any flush or commit: the replayed decay (entry j by "
                "exp(total - prefix_j)) or the key each value head reads (hv // G)")
    else:
        hint = "errors in the ring's steady state: the entries written or read back"
    return Finding("replay", f"replay states (rings of {L}): first wrong at call {i}, sequence {n} on replay slot {p}: "
                             f"{'; '.join(facts)}: {hint}", i)


SERVING_LOCALISERS = [pool_bookkeeping, padding, output_overflow, non_finite, state_in_loop, logic, replay_ring,
                      stored_state]


def systematic(ev):
    """None of :data:`SERVING_LOCALISERS` holds but a graded result is off: an error with no known cause."""
    if not ev.finite:
        return None
    worst = max(ev.finite, key=lambda v: v.err_ratio / (v.bound_ratio or v.tol_ratio))
    at = ev.first_over
    over = worst.err_ratio / (worst.bound_ratio or worst.tol_ratio)
    where = "" if at is None else f", first over tolerance at call {at}"
    return Finding("systematic", f"{names(ev.finite)} off by err_ratio up to {worst.err_ratio:.2g} ({over:.3g}x the "
                                 f"bound){where}: not the rounding of the stored state{where_first_wrong(ev)}", at)


def diagnose(judge, report, rec, store):
    """What a non-PASS serving report points at: the findings of :data:`SERVING_LOCALISERS` that hold, else
    :func:`systematic`; the first marked ``primary``."""
    ev = ServingEvidence(judge, report, rec, store)
    found = [f for f in (loc(ev) for loc in SERVING_LOCALISERS) if f is not None]
    found = found or [f for f in (systematic(ev),) if f is not None]
    return [replace(f, primary=i == 0) for i, f in enumerate(found)]


# --- rejected drafts: findings of the runs with other values in them (ci/running/serving.py: SessionRun) ----------

WINDOW_NAN_TEXT = ("rejected draft NaN reaches accepted outputs through the window's arithmetic (0 * NaN); with finite "
                   "rejected drafts the accepted outputs are exact")


def _first_moved(judge, other, i):
    """``(sequence, token offset or None, slot or None)``: where call ``i``'s judged results first differ between two
    judges' runs (``o`` first, then the states)."""
    rc = judge.ref[i]
    a, b = judge.judged["o"][i], other.judged["o"][i]
    with np.errstate(invalid="ignore"):
        moved = np.flatnonzero(np.any((a != b) & ~(np.isnan(a) & np.isnan(b)), axis=(1, 2)))
    if moved.size:
        row, t = (int(x) for x in np.argwhere(rc.judged)[moved[0]])
        seq = next(s for s in rc.plan.sequences if s.live and s.row == row and s.start <= t < s.start + s.length)
        return seq, t - seq.start, None
    a, b = judge.judged["state"][i], other.judged["state"][i]
    with np.errstate(invalid="ignore"):
        moved = np.flatnonzero(np.any((a != b) & ~(np.isnan(a) & np.isnan(b)), axis=(1, 2, 3)))
    slot = int(rc.state_slots[moved[0]]) if moved.size else None
    seq = next((s for s in rc.plan.sequences if s.live and any(w == slot for _, w in s.writes)), None)
    return seq, None, slot


def _drafts_of(session, i, seq):
    """The rejected draft tokens (offsets in their sequence) of call ``i``'s sequences that share a slot with
    ``seq``'s reads and writes, as ``"call i sequence n tokens [..]"`` phrases."""
    slots = {seq.read} | {w for _, w in seq.writes}
    masks, out = session.rejected(), []
    for j in (i - 1, i):
        if j < 0:
            continue
        for s in session.calls[j].plan(session.pool.shape[0]).sequences:
            if not s.live or (j < i and not slots & ({s.read} | {w for _, w in s.writes})) or (j == i and s != seq):
                continue
            toks = np.flatnonzero(masks[j][s.row, s.start:s.start + s.length])
            if toks.size:
                out.append(f"call {j} sequence {s.n} token(s) {', '.join(map(str, toks))}")
    return out


def rejected_draft(judge, other, verdict, what):
    """The accepted results of two runs (``judge``, ``other``) whose rejected drafts hold other finite values differ:
    a rejected draft is read. Names the first moved sequence and the rejected drafts it could have read."""
    i = next(n for n, (x, y) in enumerate(zip(judge.judged["o"], other.judged["o"]))
             if not np.array_equal(x, y, equal_nan=True)
             or not np.array_equal(judge.judged["state"][n], other.judged["state"][n], equal_nan=True))
    seq, t, slot = _first_moved(judge, other, i)
    where = f"call {i}"
    if seq is not None:
        where += f", sequence {seq.n}" + (f" token {t}" if t is not None else f": the state it wrote to slot {slot}")
    drafts = _drafts_of(judge.session, i, seq) if seq is not None else []
    named = "; the rejected drafts it may read: " + "; ".join(drafts) if drafts else ""
    return Finding("rejected-draft", f"accepted results move with the finite values of rejected draft tokens ({what}: "
                                     f"err_ratio {verdict.err_ratio:.2g}, max_err {verdict.max_err:.2g}), first at "
                                     f"{where}{named}: a rejected draft is read -- its inputs inside the window, or "
                                     "the state it wrote (the slot a sequence reads must be idx[n, a_n - 1], the last "
                                     "accepted one's)", i)


def window_nan(first_call, strict):
    """A NaN draft reaches accepted results only through a window's arithmetic (the finite-drafts runs agree)."""
    graded = "graded FAIL: strict" if strict else "graded on the finite drafts; strict fails it"
    return Finding("window-nan", f"{WINDOW_NAN_TEXT} (NaN from call {first_call}; {graded})", first_call)
