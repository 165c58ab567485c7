"""What one non-PASS case points at: the localisers of a tolerance ``Report`` (docs/DESIGN.md §4, "Diagnosis").

:data:`LOCALISERS` is the ordered list of the per-case diagnoses, most specific first: each reads the case's
:class:`CaseEvidence` and returns a :class:`Finding` or None; every one that holds is kept, in list order, and
the first is the primary. When none holds, :func:`systematic` says so. ``o``'s per-token profile has one shape,
so of :data:`O_PROFILE_LOCALISERS` (over :class:`OProfile`) only the first that holds is kept. A new diagnosis
is a function added to one of the two lists, its priority its position there.

The forward results are read first (``o``, then the final state) and the gradients only when the forward is
right, because a gradient's errors spread backwards in time from the step that caused them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from gdn2_oracle.oracle.call_modes import FLA_CHUNK

from .clip import exponent_clip
from .finding import LOGIC_ERROR, Finding
from .grades import FAIL, PASS, PRECISION
from .profiles import (
    CHUNKS,
    JUMP,
    MIN_BAD_FRACTION,
    MIN_CLEAN_TOKENS,
    STEP_WINDOW,
    bad_tokens,
    chunk_log_decay,
    chunk_sizes,
    find_period,
    first_bad,
    jump_again,
    log_profile,
    power_of_two_stride,
    rank_correlation,
)

# Exponent cancellation in a FAIL result: the cumulative-sum baseline's bound at least this many times
# the tolerance, and the per-token error's rank correlation with |G| at least this.
CANCELLATION_LOSS = 4.0
CANCELLATION_CORRELATION = 0.5
# Below this rank correlation a PRECISION grade's errors do not follow |G| (said in the finding): measured
# 0.30-0.91 for a cumulative-sum-exponent kernel, -0.04-0.22 for a WY damping of 1e-3 under extreme decay.
WEAK_CORRELATION = 0.25
# Errors that grow along the sequence: rank correlation with the token index at least this, and the last
# quarter's median error at least JUMP times the first quarter's.
GROWTH_CORRELATION = 0.6
# A state reset: a token whose largest |g| is at least SPIKE times the median token's, and at least this.
SPIKE = 10.0
SPIKE_LOG_DECAY = 20.0
FORWARD = ("o", "final_state")
# Operand rounding: the kernel's error in its first FAIL result (forward first) points the way a rounded-operand
# baseline's does (cosine at least OPERAND_COSINE: the same rounding sites give the same rounding errors), and every
# FAIL result's error is within OPERAND_MARGIN (either way) of that baseline's. Measured on o over six decays: 0.66-1.0
# against the baseline rounded like the kernel, 0.18-0.48 against the other one, -0.03-0.04 for a chunk solve damped
# by 2e-3 (whose errors are as large); sizes 0.9-1.5x (ci/tests/test_diagnose.py's kernels).
OPERAND_COSINE = 0.5
OPERAND_MARGIN = 2.0
# What each rounded-operand baseline (rule.OPERAND_BASELINES) rounds, in a finding's words.
OPERAND_WORDS = {"bfloat16": "every product's operands (its chunk solve's included)",
                 "bfloat16_solve": "its chunk solve's operands (T, A and the right-hand sides of A Ebar, A (w v))"}


def names(vs):
    """The verdicts' result names, comma-separated."""
    return ", ".join(v.name for v in vs)


def multiple_phrase(t):
    """`` (a multiple of N)`` for the largest power-of-two stride N >= 16 dividing token ``t``, else ``""``."""
    stride = power_of_two_stride(t)
    return f" (a multiple of {stride})" if stride else ""


def decay_spike(g, t):
    """``(token, g_min, typical)`` when token ``t``'s or the one before it's largest ``|g|`` is a spike (a state
    reset: at least SPIKE times the median token's and at least SPIKE_LOG_DECAY), else None."""
    if g is None or np.ndim(g) != 4 or not 0 < t < np.shape(g)[1]:
        return None
    gmax = np.max(np.abs(np.asarray(g, np.float64)), axis=(0, 2, 3))
    typical = float(np.median(gmax))
    for s in (t, t - 1):
        if gmax[s] >= max(SPIKE * typical, SPIKE_LOG_DECAY):
            return s, -float(gmax[s]), typical
    return None


def correlations(prof, g):
    """``{chunk: rank correlation of the per-token error with max |G| over chunk-token chunks}``."""
    return {c: rank_correlation(prof, chunk_log_decay(g, c)) for c in chunk_sizes(len(prof))}


def sequence_spans(cu_seqlens):
    """``[(n, start, end)]``: the non-empty sequences of a packed call's ``cu_seqlens`` (tokens ``start:end``)."""
    cu = np.asarray(cu_seqlens).ravel().astype(int)
    return [(n, int(a), int(b)) for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])) if b > a]


def sequence_of(spans, t):
    """``(n, start)`` of the sequence of ``spans`` holding token ``t``, or None."""
    return next(((n, a) for n, a, b in spans if a <= t < b), None)


def listed(xs, most=6):
    """``xs`` comma-separated, at most ``most`` of them then ``...``."""
    xs = list(xs)
    return ", ".join(map(str, xs[:most])) + (", ..." if len(xs) > most else "")


def edge_chunk(failing_starts, right_starts):
    """The largest chunk size of :data:`CHUNKS` on whose edges every right sequence after token 0 starts and no
    failing one does (a kernel that resets its state only at its chunks' starts), or None."""
    if not right_starts:
        return None
    fits = [C for C in CHUNKS if all(t % C == 0 for t in right_starts) and all(t % C for t in failing_starts)]
    return max(fits, default=None)


# --- the evidence -----------------------------------------------------------------------------------------------


@dataclass
class OProfile:
    """``o``'s per-token error profile ``prof`` over its tolerance ``tol`` (a FAIL ``o`` with err_ratio ``o_err``),
    the failing forward results ``fwd``, whether the problem has an initial state ``h0``, its log-decay ``g``."""

    prof: object
    tol: float
    fwd: tuple
    h0: bool
    o_err: float
    g: object = None

    @cached_property
    def lp(self):
        """The profile in decades over the tolerance (:func:`profiles.log_profile`)."""
        return log_profile(self.prof, self.tol)

    @cached_property
    def bad(self):
        """Per token: over the tolerance or not finite."""
        return bad_tokens(self.prof, self.tol)

    @property
    def t0(self):
        """The first bad token."""
        return int(np.argmax(self.bad))

    @property
    def t1(self):
        """The last bad token."""
        return int(len(self.bad) - 1 - np.argmax(self.bad[::-1]))

    @property
    def frac(self):
        """The fraction of bad tokens from the first bad one on."""
        return float(np.mean(self.bad[self.t0:]))

    @property
    def names(self):
        return ", ".join(self.fwd)

    @property
    def evidence(self):
        """The first and last bad tokens and the bad fraction after the first."""
        return {"first_bad": self.t0, "last_bad": self.t1, "fraction_after": round(self.frac, 3)}

    @property
    def fades(self):
        """Every token after the last bad one within tolerance, at least MIN_CLEAN_TOKENS (or a tenth) of them."""
        T = len(self.bad)
        return T - 1 - self.t1 >= max(MIN_CLEAN_TOKENS, T // 10)


@dataclass
class CaseEvidence:
    """What the localisers read of one non-PASS case: the tolerance ``report`` (verdicts, per-token profiles,
    dtype) and the ``problem`` (its log-decay ``g`` and ``initial_state``)."""

    report: object
    problem: object
    operands: object = None  # () -> the rounded-operand baselines' errors and cosines (rule.Yardstick.operand_errors)
    clipped: object = None  # (clip, chunk) -> the kernel's errors against the clipped algorithm (clip.clip_errors)

    @cached_property
    def operand_errors(self):
        """``{operands: {name: (err_ratio, cosine)}}`` of the rounded-operand baselines (``rule.Yardstick``), formed
        only for a case whose FAIL results are all finite and small (rounding never gives an O(1) error); None
        otherwise."""
        if self.operands is None or not self.fails or any(v.err_ratio >= LOGIC_ERROR for v in self.fails):
            return None
        return self.operands() or None

    @cached_property
    def finite_bad(self):
        """The non-PASS verdicts with finite errors."""
        return [v for v in self.report.verdicts if v.grade != PASS and v.rule != "non-finite"]

    @cached_property
    def fails(self):
        """The FAIL verdicts with finite errors."""
        return [v for v in self.finite_bad if v.grade == FAIL]

    @cached_property
    def failing(self):
        """``{name: verdict}`` of :attr:`fails`."""
        return {v.name: v for v in self.fails}

    @cached_property
    def gradients(self):
        """The failing gradients (not forward results)."""
        return [v for v in self.fails if v.name not in FORWARD]

    @property
    def gradients_only(self):
        """Some gradients FAIL and neither forward result does."""
        return bool(self.gradients) and not any(n in self.failing for n in FORWARD)

    @cached_property
    def onset(self):
        """``(t0, phrase)``: a FAIL ``o``'s first bad token and a phrase saying so (in a packed call, which sequence's
        token it is), or ``(None, "")``."""
        o = self.o_profile
        if o is None or not o.bad.any():
            return None, ""
        where = ""
        if self.spans is not None and (seq := sequence_of(self.spans, o.t0)) is not None:
            n, a = seq
            where = f", {'the first token' if o.t0 == a else f'token {o.t0 - a}'} of sequence {n}"
        return o.t0, f"; o over tolerance from token {o.t0}{where} ({o.frac:.0%} of the tokens from there)"

    @cached_property
    def spans(self):
        """A packed call's non-empty sequences (:func:`sequence_spans`), or None (not packed)."""
        cu = getattr(self.problem, "cu_seqlens", None)
        return None if cu is None else sequence_spans(cu)

    @cached_property
    def packed(self):
        """``(result, [(n, start, end, first bad token or None)])``: a packed call's sequences and where the errors of
        its first FAIL per-token result (``o`` first) begin in each; None when not packed or no such profile."""
        if self.spans is None:
            return None
        profiled = [v for v in self.fails if len(self.report.profiles.get(v.name, ())) == self.spans[-1][2]]
        v = next((v for v in profiled if v.name == "o"), profiled[0] if profiled else None)
        if v is None or not self.spans:
            return None
        bad = bad_tokens(self.report.profiles[v.name], v.tol_ratio)
        return v.name, [(n, a, b, a + int(np.argmax(bad[a:b])) if bad[a:b].any() else None) for n, a, b in self.spans]

    @property
    def starts_explain(self):
        """In a packed call ``o`` fails and in every failing sequence its errors begin at the sequence's first
        token."""
        p = self.packed
        return (p is not None and p[0] == "o" and any(f is not None for *_, f in p[1])
                and all(f in (None, a) for _, a, _, f in p[1]))

    @cached_property
    def o_profile(self):
        """:class:`OProfile` of a FAIL ``o`` that has a per-token profile, else None."""
        o = self.failing.get("o")
        prof = self.report.profiles.get("o")
        if o is None or prof is None or not len(prof):
            return None
        return OProfile(prof, o.tol_ratio, tuple(n for n in FORWARD if n in self.failing),
                        getattr(self.problem, "initial_state", None) is not None, o.err_ratio,
                        getattr(self.problem, "g", None))

    @cached_property
    def cancellation(self):
        """The exponent-cancellation finding of the results it fits (:func:`cancellation_finding`), or None."""
        return cancellation_finding(self.report, self.finite_bad, self.problem.g)

    @property
    def cancellation_explains(self):
        """Exponent cancellation covers every FAIL result."""
        c = self.cancellation
        return c is not None and set(self.failing) <= set(c.results)


# --- o's profile: the first that holds --------------------------------------------------------------------------


def periodic(o):
    """Errors that start at a token and jump again every ``period`` tokens: a step repeated at every chunk."""
    hit = find_period(o.lp, o.t0)
    if hit is None:
        return None
    P, onsets = hit
    shown = ", ".join(map(str, onsets[:5])) + (", ..." if len(onsets) > 5 else "")
    return Finding("periodic", f"errors in {o.names} start at token {o.t0}{multiple_phrase(o.t0)} and jump every {P} "
                               f"tokens (at {shown}): a step repeated at every {P}-token chunk or block (what is "
                               "carried into each one -- the state, saved states, gates -- or its first or last "
                               "token)", o.t0, results=o.fwd, period=P, evidence={"onsets": onsets})


def reset(o):
    """Errors that begin at (or just after) a log-decay spike: a state reset."""
    spike = decay_spike(o.g, o.t0)
    if spike is None:
        return None
    t0 = o.t0
    at = f"token {t0}, where" if spike[0] == t0 else f"token {t0}, after token {spike[0]} where"
    return Finding("reset", f"errors in {o.names} start at {at} the log-decay spikes to {spike[1]:.3g} (a state "
                            f"reset; the median token's largest |g| is {spike[2]:.2g}), every earlier token within "
                            f"tolerance, {o.frac:.0%} of the later ones over it: what spans the reset (decay factors "
                            "or exponents across it, e.g. cumulative sums that lose their precision there, or a "
                            "factor that underflows)", t0, results=o.fwd,
                   evidence={"first_bad": t0, "reset": spike[0], "log_decay": spike[1]})


def initial_state_fading(o):
    """Errors from token 0 that fade, in a problem with an initial state: the initial state's path."""
    if not (o.fades and o.t0 == 0 and o.h0):
        return None
    return Finding("initial-state", f"errors in {o.names} from the first token (token 0), fading: every token "
                                    f"from {o.t1 + 1} on within tolerance, in a problem with an initial state: "
                                    "the initial state's path (h0 loaded, rounded, decayed or erased at the "
                                    "first token)", 0, results=o.fwd, evidence=o.evidence)


def one_off(o):
    """Errors in a band of tokens only, every later token within tolerance again: one wrong step."""
    if not o.fades:
        return None
    return Finding("one-off", f"errors in {o.names} at tokens {o.t0}-{o.t1} only (every earlier and later token "
                              f"within tolerance): one wrong step at token {o.t0}{multiple_phrase(o.t0)} whose error "
                              "fades with the decaying state (a skipped or doubled erase, decay or write there)", o.t0,
                   results=o.fwd, evidence=o.evidence)


def block_boundary(o):
    """Every token before some position within tolerance, most after it over, with a jump there."""
    t0, lp, w = o.t0, o.lp, STEP_WINDOW
    step = np.median(lp[t0:t0 + w]) - np.median(lp[max(0, t0 - w):t0]) if t0 > 0 else np.inf
    if not (t0 >= MIN_CLEAN_TOKENS and o.frac >= MIN_BAD_FRACTION and step >= np.log10(JUMP)):
        return None
    return Finding("block-boundary", f"errors start at token {t0}{multiple_phrase(t0)} in {o.names}: every earlier "
                                     f"token within tolerance, {o.frac:.0%} of the later ones over it: a block or "
                                     "tile boundary (check the state, saved states or grid index carried across it)",
                   t0, results=o.fwd, evidence=o.evidence)


def jump_again_boundary(o):
    """Errors from the start that jump again where a chunk would start: a block boundary there."""
    again = jump_again(o.lp, o.t0)
    if again is None:
        return None
    t1, factor = again
    stride = power_of_two_stride(t1)
    return Finding("block-boundary", f"errors in {o.names} start at token {o.t0}{multiple_phrase(o.t0)} and jump "
                                     f"again at token {t1} ({factor:.3g}x; a multiple of {stride}): a block or tile "
                                     f"boundary at token {t1} (check the state, saved states or grid index carried "
                                     "across it)",
                   o.t0, results=o.fwd, evidence={**o.evidence, "jump": t1, "factor": round(factor, 3)})


def accumulating(o):
    """Sub-O(1) errors that grow along the sequence, with no jump where they cross the tolerance."""
    tail = o.lp[o.t0:]
    if len(tail) < MIN_CLEAN_TOKENS or o.o_err >= LOGIC_ERROR:  # an O(1) error that grows: a logic error
        return None
    growth = rank_correlation(tail, np.arange(len(tail)))
    q = max(1, len(tail) // 4)
    if growth < GROWTH_CORRELATION or np.median(tail[-q:]) - np.median(tail[:q]) < np.log10(JUMP):
        return None
    return Finding("accumulating", f"errors in {o.names} grow along the sequence (rank correlation with the "
                                   f"token index {growth:.2f}), over tolerance from token {o.t0} with no jump "
                                   "there: an error that builds up token by token (a running sum, decay or "
                                   "state kept in too low a precision), not a boundary", o.t0,
                   results=o.fwd, evidence={**o.evidence, "growth": round(growth, 3)})


# The shapes of o's profile, most specific first: the first that holds localises o.
O_PROFILE_LOCALISERS = [periodic, reset, initial_state_fading, one_off, block_boundary, jump_again_boundary,
                        accumulating]


# --- per case: every one that holds -----------------------------------------------------------------------------


def non_finite(ev):
    """NaN or inf in a result, at its first non-finite token (in ``o`` where it has one)."""
    bad = [v for v in ev.report.verdicts if v.rule == "non-finite"]
    if not bad:
        return None
    firsts = {n: t for n, p in ev.report.profiles.items() if (t := first_bad(p, np.inf)) is not None}
    where = "o" if "o" in firsts else (min(firsts, key=firsts.get) if firsts else None)
    at = f" (first at token {firsts[where]} in {where})" if where else ""
    token = firsts[where] if where else None
    return Finding("non-finite", f"NaN or inf in {names(bad)}{at}: an overflow or 0 x inf, e.g. exp of a "
                                 "positive exponent (decay anchored away from the later token)",
                   token, results=tuple(v.name for v in bad), evidence={"first_non_finite": firsts})


def sequences_finding(ev):
    """A packed call's failing sequences, whether their errors begin at a sequence start, and the likely cause."""
    name, seqs = ev.packed
    failing = [s for s in seqs if s[3] is not None]
    right = [s for s in seqs if s[3] is None]
    n_all = len(np.ravel(ev.problem.cu_seqlens)) - 1
    which = (f"{name} over tolerance in {len(failing)} of the {len(seqs)} non-empty sequence(s) of this packed call "
             f"(cu_seqlens, {n_all} sequences): sequence(s) {listed(n for n, *_ in failing)} (tokens "
             f"{listed(a if b == a + 1 else f'{a}-{b - 1}' for _, a, b, _ in failing)})"
             + (f"; sequence(s) {listed(n for n, *_ in right)} right" if right else "; no sequence right"))
    evidence = {"sequences": n_all, "failing": [n for n, *_ in failing], "right": [n for n, *_ in right],
                "first_bad": [f for *_, f in failing], "starts": [a for _, a, _, f in failing]}
    token = failing[0][3]
    if name not in FORWARD:
        return Finding("packed", f"{which} (a gradient: its errors spread backwards from the step that caused them, "
                                 "so where they begin is not read)", token, results=(name,), evidence=evidence)
    if not ev.starts_explain:
        late = [(n, a, f) for n, a, _, f in failing if f != a]
        shown = listed(f"sequence {n} at token {f} ({f - a} after its start)" for n, a, f in late)
        return Finding("packed", f"{which}; errors begin inside sequences, not at a sequence start: {shown}",
                       token, results=(name,), evidence=evidence)
    starts = [a for _, a, _, _ in failing]
    C = edge_chunk(starts, [a for _, a, _, _ in right if a > 0])
    inside = (f", at sequence starts inside a {C}-token chunk (the sequences starting on a chunk edge, at token(s) "
              f"{listed(a for _, a, _, _ in right if a > 0)}, are right)") if C else ""
    h0 = ", or the wrong row of h0 read" if getattr(ev.problem, "initial_state", None) is not None else ""
    return Finding("sequence-start", f"{which}; in every failing sequence the errors begin at its first token (a "
                                     f"sequence start: token(s) {listed(starts)}): the state a sequence starts from "
                                     "is wrong -- not reset at a sequence start (the previous sequence's state "
                                     f"carried across cu_seqlens){inside}{h0}", token, results=(name,),
                   evidence={**evidence, **({"chunk": C} if C else {})})


def packed_forward(ev):
    """A packed call whose ``o`` fails: its failing sequences (:func:`sequences_finding`)."""
    return sequences_finding(ev) if ev.packed is not None and ev.packed[0] == "o" else None


def packed_gradients(ev):
    """A packed call whose ``o`` does not fail: the sequences of its first failing gradient."""
    return sequences_finding(ev) if ev.packed is not None and ev.packed[0] != "o" else None


def o_localisation(ev):
    """A FAIL ``o``'s errors localised by its profile: the first of :data:`O_PROFILE_LOCALISERS` that holds (not
    when a packed call's errors begin at sequence starts: their onsets are those starts)."""
    o = ev.o_profile
    if o is None or not o.bad.any() or ev.starts_explain:
        return None
    return next((f for f in (loc(o) for loc in O_PROFILE_LOCALISERS) if f is not None), None)


def final_state(ev):
    """``o`` right (or not localised by a profile), the final state wrong."""
    if ev.o_profile is not None or "final_state" not in ev.failing:
        return None
    grads = ev.gradients
    o = next((v for v in ev.report.verdicts if v.name == "o"), None)
    o_ok = "within tolerance at every token" if o is None or o.grade == PASS else "within the precision-loss bound"
    also = f" ({names(grads)} differ too: the final state's cotangent flows into them)" if grads else ""
    bf16 = ("; or an error in every step that o, rounded to bfloat16, cannot resolve while the float32 state "
            "can" if getattr(ev.report, "dtype", None) == "bfloat16" else "")
    return Finding("final-state", f"o {o_ok}, final_state wrong{also}: the state returned is not the state "
                                  "after the last token (taken early, before the last token or chunk; not "
                                  f"written back; another layout or dtype){bf16}", None,
                   results=("final_state",) + tuple(v.name for v in grads))


def _forward_right(ev):
    """How right the forward is when only gradients fail: within tolerance, or within the precision-loss bound."""
    return "o and final_state " + ("within tolerance" if all(
        v.grade == PASS for v in ev.report.verdicts if v.name in FORWARD) else "within the precision-loss bound")


def off_besides(ev, results):
    """The verdicts over tolerance (not PASS, as the case's grade line counts them) outside ``results``."""
    return [v for v in ev.report.verdicts if v.grade != PASS and v.name not in results]


def only_phrase(ev, results, what, plural=False):
    """``(lead, detail)`` for "only ``what`` differs" said of the FAIL ``results``, consistent with the grade line:
    when other results are over tolerance too (PRECISION), "only ... exceed(s) the precision-loss bound" and how
    many of the results are over tolerance (``plural``: ``what`` takes a plural verb)."""
    others = off_besides(ev, results)
    if not others:
        return f"only {what} differ{'' if plural else 's'}", None
    n_off, n = len(others) + len(results), len(ev.report.verdicts)
    return (f"only {what} exceed{'' if plural else 's'} the precision-loss bound",
            f"{n_off}/{n} results over tolerance, {names(others)} within that bound: PRECISION")


def initial_state_gradient(ev):
    """Only ``dh0`` wrong: the state cotangent carried back to h0, or a forward step on h0."""
    if not ev.gradients_only or tuple(v.name for v in ev.gradients) != ("dh0",):
        return None
    lead, detail = only_phrase(ev, ("dh0",), "dh0")
    detail = detail or f"{_forward_right(ev)}, the other gradients too"
    return Finding("initial-state", f"{lead} ({detail}): the state cotangent carried back to h0, or a forward step "
                                    "acting on h0 that the forward output cannot resolve (e.g. the first token's "
                                    "erase reading the decayed h0)", None, results=("dh0",))


def backward(ev):
    """Only gradients wrong (not dh0 alone), with the gradient's period where its errors recur."""
    grads = ev.gradients
    results = tuple(v.name for v in grads)
    if not ev.gradients_only or results == ("dh0",):
        return None
    where, period, onsets = "", None, []
    for v in grads:  # a gradient wrong at every chunk's first token, say, shows as periodic onsets
        prof = ev.report.profiles.get(v.name)
        t0 = first_bad(prof, v.tol_ratio) if prof is not None and len(prof) else None
        hit = find_period(log_profile(prof, v.tol_ratio), t0) if t0 is not None else None
        if hit is not None:
            period, onsets = hit
            shown = ", ".join(map(str, onsets[:5])) + (", ..." if len(onsets) > 5 else "")
            where = f"; errors in {v.name} begin at tokens {shown} (every {period} tokens)"
            break
    lead, detail = only_phrase(ev, results, "gradients", plural=True)
    detail = f"{names(grads)}; " + (detail or _forward_right(ev))
    return Finding("backward", f"{lead} ({detail}){where}: the backward, or a forward step the forward output "
                               "cannot resolve -- one acting on h0 or on a decayed state (e.g. the first token's "
                               "erase), or one whose erase or write gate is zero in this problem", None,
                   results=results, period=period, evidence={"onsets": onsets} if period else {})


def cancellation_finding(report, bad, g):
    """``exponent-cancellation`` for the results of ``bad`` graded PRECISION, or FAIL with a large cumulative-sum
    bound, a small error and errors that follow the within-chunk ``|G|``; the chunk they follow best; or None."""
    found = []
    for v in bad:
        loss = v.bound_ratio / v.tol_ratio if v.bound_ratio is not None else 1.0
        prof = report.profiles.get(v.name)
        rs = correlations(prof, g) if prof is not None and len(prof) == np.shape(g)[1] else None
        best = max(rs.values()) if rs else None
        if v.grade == PRECISION or (loss >= CANCELLATION_LOSS and v.err_ratio < LOGIC_ERROR and best is not None
                                    and best >= CANCELLATION_CORRELATION):
            found.append((v, loss, rs))
    if not found:
        return None
    evidence = {"results": [v.name for v, _, _ in found], "loss": max(x for _, x, _ in found),
                "beyond": [v.name for v, _, _ in found if v.grade == FAIL]}
    per = [rs for _, _, rs in found if rs]
    if per:
        score = {c: float(np.mean([rs[c] for rs in per])) for c in per[0]}
        evidence["correlation"] = {str(c): round(x, 3) for c, x in score.items()}
        evidence["max_G"] = {str(c): float(np.max(chunk_log_decay(g, c))) for c in score}
    return cancellation_text(evidence)


def best_chunk(score):
    """The chunk of ``score`` (``{chunk: correlation}``) with the highest correlation (ties: FLA's chunk)."""
    return max(score, key=lambda c: (score[c], c == FLA_CHUNK))


def score_at(score, chunk):
    """A case's correlation for ``chunk`` (``score``: ``{chunk: correlation}`` over :func:`chunk_sizes` of its
    length): a chunk the case has no entry for chunks it as the largest size it has below it does not exist, so
    as the smallest one above it (or its largest, the whole sequence)."""
    if chunk in score:
        return score[chunk]
    above = [c for c in score if c > chunk]
    return score[min(above)] if above else score[max(score)]


def cancellation_text(evidence, chunk=None, pooled=None):
    """The ``exponent-cancellation`` finding of :func:`cancellation_finding`'s ``evidence`` naming ``chunk`` (default
    the case's best); ``pooled``: ``(cases, mean correlation)`` when ``chunk`` is the kernel's, chosen across its
    cases (``patterns.one_chunk``)."""
    which = ", ".join(evidence["results"])
    r = None
    if "correlation" in evidence:
        score = {int(c): x for c, x in evidence["correlation"].items()}
        chunk = best_chunk(score) if chunk is None else chunk
        r = score_at(score, chunk)
        others = ", ".join(f"{c}: {score[c]:.2f}" for c in score if c != chunk)
        others = f"; {others}" if others else ""
        span = evidence["max_G"].get(str(chunk), max(evidence["max_G"].values()))
        sizes = f"{min(score)}-{max(score)}" if len(score) > 1 else f"{chunk}"
        if pooled:
            n, mean = pooled
            kernels = f"{chunk}-token chunks, the kernel's chunk across its {n} cases with such errors"
            basis = (f"{chunk}-token chunks (the kernel's chunk across its {n} cases with such errors, mean rank "
                     f"correlation {mean:.2f}; this case: rank correlation {r:.2f} over {chunk}-token chunks{others}")
        else:
            basis = f"{chunk}-token chunks best (per-token error vs max |G|: rank correlation {r:.2f} over " \
                    f"{chunk}-token chunks{others}"
        if r >= CANCELLATION_CORRELATION:
            head = (f"{which}: errors grow with the within-chunk cumulative log-decay |G| and follow {basis}; |G| up "
                    f"to {span:.3g}): the kernel's exponents behave like a chunk-{chunk} kernel's")
        elif r >= WEAK_CORRELATION:
            head = (f"{which}: errors follow the within-chunk cumulative log-decay |G| only loosely (rank "
                    f"correlation {r:.2f}" + (f" over {kernels}" if pooled else
                                              f" at best, over {chunk}-token chunks{others}") + ")")
        else:
            sign = " (negative: the errors are smaller where |G| is larger)" if r < 0 else ""
            head = (f"{which}: errors do not follow the within-chunk cumulative log-decay |G| (rank correlation "
                    + (f"{r:.2f} over {kernels}{sign})" if pooled else
                       f"{r:.2f} at best over chunks of {sizes} tokens{sign})"))
    else:
        head = f"{which}: over the tolerance within the precision-loss bound (no per-token profile to compare with |G|)"
    if evidence["beyond"]:
        tail = (f"; {', '.join(evidence['beyond'])} exceed(s) even the precision-loss bound, so cancellation alone "
                "does not explain it")
    elif r is None or r >= CANCELLATION_CORRELATION:
        tail = "; the algorithm is right, precision is lost of a known kind"
    elif r >= WEAK_CORRELATION:
        tail = "; within the precision-loss bound: precision lost of that kind is the likeliest cause"
    else:
        tail = ("; within the precision-loss bound, but without cancellation's |G| pattern: if other cases FAIL, "
                "suspect a systematic error")
    return Finding("exponent-cancellation",
                   f"{head}; the float32 chunked algorithm with exponents formed as differences of float32 "
                   f"cumulative sums loses up to {evidence['loss']:.3g}x the float32 recurrence's precision on this "
                   f"problem (docs/DESIGN.md §1, 'Decay exponents without cancellation'){tail}",
                   results=tuple(evidence["results"]),
                   chunk=chunk if r is not None and r >= WEAK_CORRELATION else None, evidence=evidence)


def operand_match(ev):
    """``(operands, {name: size ratio}, cosine, key result)`` of the rounded-operand baseline whose error points most
    the kernel's way in its first FAIL result (forward first), or None."""
    e16 = ev.operand_errors
    if not e16:
        return None
    key = next((v for v in ev.fails if v.name in FORWARD), ev.fails[0])
    best = max(e16, key=lambda ops: e16[ops].get(key.name, (0.0, -1.0))[1])
    errors = e16[best]
    if any(v.name not in errors or not np.isfinite(errors[v.name][0]) for v in ev.fails):
        return None
    ratio = {v.name: v.err_ratio / errors[v.name][0] if errors[v.name][0] > 0 else np.inf for v in ev.fails}
    return best, ratio, errors[key.name][1], key


def operand_rounding(ev):
    """The kernel's errors point the way a baseline rounded alike does (cosine >= :data:`OPERAND_COSINE` in its first
    FAIL result) and are that baseline's size (within :data:`OPERAND_MARGIN`): a chunk solve or matmul computed from
    16-bit operands, not a damping (the diagnosis compares with a baseline rounded the same way)."""
    match = operand_match(ev)
    if match is None:
        return None
    ops, ratio, cos, key = match
    if cos < OPERAND_COSINE or not all(1 / OPERAND_MARGIN <= r <= OPERAND_MARGIN for r in ratio.values()):
        return None
    t0, onset = ev.onset
    worst = max(ev.fails, key=lambda v: v.err_ratio / v.tol_ratio)
    lo, hi = min(ratio.values()), max(ratio.values())
    span = f"{lo:.2g}x" if np.isclose(lo, hi, rtol=0.05) else f"{lo:.2g}-{hi:.2g}x"
    return Finding("operand-rounding", f"{names(ev.fails)} off by err_ratio up to {worst.err_ratio:.2g} "
                                       f"({worst.err_ratio / worst.tol_ratio:.3g}x the tolerance, {worst.name}): "
                                       f"{span} the error of the float32 chunked algorithm with {OPERAND_WORDS[ops]} "
                                       f"rounded to bfloat16 on the same inputs, and pointing its way ({key.name}'s "
                                       f"error and that baseline's: cosine {cos:.2f}){onset}: rounding in a 16-bit "
                                       "operand -- computed from bfloat16 operands (a precision option such as "
                                       "precision='bf16') -- not a damping or a perturbed constant; a "
                                       f"{ev.report.dtype} call is judged against float32 arithmetic",
                   t0, results=tuple(v.name for v in ev.fails),
                   evidence={"operands": ops, "operand_cosine": round(float(cos), 3),
                             "operand_ratio": {n: round(float(r), 3) for n, r in ratio.items()}})


def explained_cancellation(ev):
    """Exponent cancellation when it covers every FAIL result (then it outranks a logic error)."""
    return ev.cancellation if ev.cancellation_explains else None


def logic(ev):
    """O(1) relative error (``err_ratio >= LOGIC_ERROR``): a wrong formula, not rounding."""
    big = [v for v in ev.finite_bad if v.err_ratio >= LOGIC_ERROR]
    if not big:
        return None
    t0, onset = ev.onset
    worst = max(big, key=lambda v: v.err_ratio)
    return Finding("logic", f"O(1) relative error in {names(big)} (err_ratio up to {worst.err_ratio:.2g} in "
                            f"{worst.name}){onset}: a logic error (wrong formula, dropped or clipped factor, wrong "
                            "sign), not rounding", t0, results=tuple(v.name for v in big))


def unexplained_cancellation(ev):
    """Exponent cancellation of some results when other FAIL results are not explained by it."""
    return None if ev.cancellation_explains else ev.cancellation


# The per-case diagnoses, most specific first: every one that holds is kept, in this order.
LOCALISERS = [non_finite, exponent_clip, operand_rounding, packed_forward, o_localisation, final_state,
              initial_state_gradient, backward, packed_gradients, explained_cancellation, logic,
              unexplained_cancellation]


def systematic(ev):
    """None of :data:`LOCALISERS` holds: an error beyond the bound with no token pattern."""
    bad = ev.finite_bad
    if not bad:
        return None
    t0, onset = ev.onset
    worst = max(bad, key=lambda v: v.err_ratio / (v.bound_ratio or v.tol_ratio))
    over = worst.err_ratio / (worst.bound_ratio or worst.tol_ratio)
    match = operand_match(ev)
    beyond = ""
    if match is not None:
        ops, ratio, cos, key = match
        beyond = (f"; against the chunked algorithm with {OPERAND_WORDS[ops]} in bfloat16, the closest rounding: "
                  f"{ratio[worst.name]:.3g}x its error, cosine {cos:.2f} in {key.name}: not operand rounding")
    return Finding("systematic", f"{names(bad)} off by err_ratio up to {worst.err_ratio:.2g} ({over:.3g}x the "
                                 f"precision-loss bound, {worst.name}) with no token pattern{onset}: a "
                                 f"systematic error (a perturbed constant, a damping), not rounding{beyond}", t0,
                   results=tuple(v.name for v in bad))


def diagnose_case(report, problem, operands=None, clipped=None):
    """The findings of one non-PASS report (a tolerance ``Report`` with its profiles) on ``problem`` (anything
    with ``g`` and ``initial_state``): those of :data:`LOCALISERS` that hold, else :func:`systematic`, the first
    marked ``primary``; ``operands``: a function returning the rounded-operand baselines' errors and cosines
    (``rule.Yardstick.operand_errors``; None: operand rounding is not considered); ``clipped``: a function of a clip
    and a chunk size returning the kernel's errors against the clipped algorithm (:func:`clip.clip_errors`; None: an
    exponent clip is not considered)."""
    ev = CaseEvidence(report, problem, operands, clipped)
    found = [f for f in (loc(ev) for loc in LOCALISERS) if f is not None]
    if not found:
        found = [f for f in (systematic(ev),) if f is not None]
    return [replace(f, primary=i == 0) for i, f in enumerate(found)]
