"""What a non-PASS judgement points at, from data the judgement already has (docs/DESIGN.md §4, "Diagnosis").

Per case (:func:`diagnose_case`, from a tolerance ``Report`` -- grades, bounds, per-token error profiles --
and the problem's log-decay and initial state): one diagnosis, the most specific true finding first (its
``primary`` is set), the other true ones after it as supporting evidence. Localisation reads the forward
results first (``o``, then the final state) and the gradients only when the forward is right, because a
gradient's errors spread backwards in time from the step that caused them:

* ``non-finite``: NaN or inf in a result (first bad token, in ``o`` where it has one);
* ``periodic``: ``o``'s errors start at a token and jump again every ``period`` tokens (a step repeated
  at every chunk or block);
* ``reset``: errors that begin at (or just after) a log-decay spike, a state reset;
* ``block-boundary``: every token before some position within tolerance, most after it over, with a jump
  at that position; or errors from the start that jump again where a chunk would start;
* ``one-off``: errors in a band of tokens only, every later token within tolerance again (one wrong step
  whose error fades with the decaying state);
* ``initial-state``: ``o`` wrong from the first token and fading, with an initial state; or only ``dh0``
  wrong;
* ``accumulating``: sub-O(1) errors that grow along the sequence, with no jump where they cross the tolerance;
* ``final-state``: ``o`` right at every token, the final state wrong;
* ``backward``: only gradients differ (the backward, or a forward step the forward output cannot resolve),
  with the gradient's period where its errors recur;
* ``exponent-cancellation``: a PRECISION grade, or errors that grow with the within-chunk cumulative
  log-decay ``|G|`` where the cumulative-sum baseline loses precision too; the chunk (16 ... 512 tokens)
  whose ``|G|`` the errors follow best is named, and a weak or negative correlation is said as such;
* ``logic``: O(1) relative error (``err_ratio >= LOGIC_ERROR``): a wrong formula, not rounding;
* ``systematic``: none of the above: an error beyond the bound with no token pattern.

Per kernel, across the cases of a run (:func:`diagnose_kernel`): the primary kinds with their cases, first
bad forward tokens, periods and chunks; "errors begin only at multiples of N tokens" when the failing cases'
onsets share such a stride; then ``pattern`` lines: a feature of the recipes (``regime``: decay, gates --
``b`` and ``w`` per channel or equal --, initial state, ``T`` against the chunk sizes, dtype, modes) that
splits the cases cleanly (every failing case has it, every case without it passes, enough cases on both
sides, not by chance): "fails only where b varies per channel"; the same for the forward alone when some
failing cases differ only in gradients. These are heuristics that name the likeliest cause; the grade is the
verdict.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from gdn2_oracle.oracle.chunked32 import CHUNK
from gdn2_oracle.oracle.generate import DECAYS, GATES, KERNEL_DTYPES

from .grades import FAIL, PASS, PRECISION

# err_ratio at or above this is an O(1) relative error: a logic error, not precision loss.
LOGIC_ERROR = 0.1
# Block boundary: at least this many clean tokens before the first bad one, and at least this
# fraction of the later tokens over the tolerance.
MIN_CLEAN_TOKENS = 16
MIN_BAD_FRACTION = 0.5
# Exponent cancellation in a FAIL result: the cumulative-sum baseline's bound at least this many times
# the tolerance, and the per-token error's rank correlation with |G| at least this.
CANCELLATION_LOSS = 4.0
CANCELLATION_CORRELATION = 0.5
# Below this rank correlation a PRECISION grade's errors do not follow |G| (said in the finding): measured
# 0.30-0.91 for a cumulative-sum-exponent kernel, -0.04-0.22 for a WY damping of 1e-3 under extreme decay.
WEAK_CORRELATION = 0.25
# The chunk sizes a kernel may use: |G| is formed over each, and the one the errors follow best is named.
CHUNKS = (16, 32, 64, 128, 256, 512)
# A jump in a per-token error profile: the median error over the next STEP_WINDOW tokens at least JUMP
# times the median over the previous STEP_WINDOW (windows of half the period for periods below 16).
JUMP = 3.0
STEP_WINDOW = 8
# A period is named from at least MIN_ONSETS onsets (the first bad token and its repeats), the period at
# least MIN_PERIOD tokens, when noise would give at most FALSE_PERIOD such periods (see find_period).
MIN_PERIOD = 8
MIN_ONSETS = 3
FALSE_PERIOD = 0.01
# A jump must also exceed this many standard deviations of a step of the profile's own token-to-token noise.
NOISE_SIGMAS = 3.0
# "Errors jump again at token t": a later jump of at least this factor where a chunk would start.
BIG_JUMP = 5.0
# Errors that grow along the sequence: rank correlation with the token index at least this, and the last
# quarter's median error at least JUMP times the first quarter's.
GROWTH_CORRELATION = 0.6
# A state reset: a token whose largest |g| is at least SPIKE times the median token's, and at least this.
SPIKE = 10.0
SPIKE_LOG_DECAY = 20.0
# A pattern across cases needs at least this many failing cases and this many passing cases without the
# feature, and the failing cases must be unlikely to share it by chance: with as many failures dealt at
# random among the cases, the chance that all land on cases with the feature at most PATTERN_CHANCE.
MIN_PATTERN_CASES = 3
PATTERN_CHANCE = 0.02
FORWARD = ("o", "final_state")


@dataclass(frozen=True)
class Finding:
    """One diagnosis: its kind, a sentence, and where it points.

    ``token``: the first bad token (forward results first); ``primary``: the case's (or kernel's) main
    finding, the others support it; ``results``: the results it is about; ``period``: tokens between the
    repeated onsets of a periodic error; ``chunk``: the chunk size whose ``|G|`` the errors follow best;
    ``evidence``: the numbers behind it (JSON-able)."""

    kind: str
    text: str
    token: int | None = None
    primary: bool = False
    results: tuple = ()
    period: int | None = None
    chunk: int | None = None
    evidence: dict = field(default_factory=dict)

    def __str__(self):
        return f"{self.kind}: {self.text}"

    def as_dict(self):
        d = asdict(self)
        d["results"] = list(self.results)
        return d


def chunk_log_decay(g, chunk=CHUNK):
    """Per token, the largest ``|G_t|`` over batch, heads and channels, ``G`` the cumulative log-decay
    within ``chunk``-token chunks (``g [B, T, H, K]``)."""
    g = np.asarray(g, np.float64)
    B, T, H, K = g.shape
    N = -(-T // chunk)
    G = np.cumsum(np.pad(g, ((0, 0), (0, N * chunk - T), (0, 0), (0, 0))).reshape(B, N, chunk, H, K), axis=2)
    return np.max(np.abs(G), axis=(0, 3, 4)).reshape(N * chunk)[:T]


def chunk_sizes(T):
    """The sizes of :data:`CHUNKS` that give distinct chunkings of ``T`` tokens (those below ``T`` and the
    smallest one that holds the whole sequence)."""
    below = [c for c in CHUNKS if c < T]
    return below + [c for c in CHUNKS if c >= T][:1]


def rank_correlation(x, y):
    """Spearman rank correlation of two equal-length sequences (ties share their mean rank; 0 when either is
    constant)."""
    def rank(a):
        a = np.asarray(a, np.float64)
        r = np.empty(len(a))
        r[np.argsort(a, kind="stable")] = np.arange(len(a))
        _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
        return (np.bincount(inv, weights=r) / counts)[inv]

    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(np.corrcoef(rank(x), rank(y))[0, 1])


def _names(vs):
    return ", ".join(v.name for v in vs)


def _power_of_two_stride(t):
    """The largest power of two (>= 16) dividing token index ``t``, or None."""
    p = t & -t if t > 0 else 0
    return p if p >= 16 else None


def _multiple(t):
    stride = _power_of_two_stride(t)
    return f" (a multiple of {stride})" if stride else ""


def first_bad_token(profile, tol):
    """``(t0, fraction)``: the first token over ``tol`` when every earlier one is within it, at least
    MIN_CLEAN_TOKENS precede it and at least MIN_BAD_FRACTION of the later ones are over; else None."""
    over = np.asarray(profile) > tol
    if not over.any():
        return None
    t0 = int(np.argmax(over))
    frac = float(np.mean(over[t0:]))
    return (t0, frac) if t0 >= MIN_CLEAN_TOKENS and frac >= MIN_BAD_FRACTION else None


# --- per-token profiles: jumps, periods ---------------------------------------------------------------------


def log_profile(profile, tol):
    """``log10(error / tolerance)`` per token (> 0: over), floored at -3 and capped at 12 (non-finite: 12)."""
    p = np.asarray(profile, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        lp = np.log10(np.maximum(p, 1e-3 * tol) / tol)
    return np.clip(np.where(np.isfinite(lp), lp, 12.0), -3.0, 12.0)


def step_scores(lp, w):
    """Per token ``t``: ``median(lp[t:t+w]) - median(lp[t-w:t])`` (the after-window shorter at the end;
    -inf for ``t < w``)."""
    T = len(lp)
    s = np.full(T, -np.inf)
    if T <= w:
        return s
    med = np.median(np.lib.stride_tricks.sliding_window_view(lp, w), axis=1)  # med[i]: lp[i:i+w]
    t = np.arange(w, T - w + 1)
    s[t] = med[t] - med[t - w]
    for t in range(max(w, T - w + 1), T):
        s[t] = np.median(lp[t:]) - med[t - w]
    return s


def jump_threshold(lp, w):
    """The least step (decades) that counts as a jump: JUMP, or NOISE_SIGMAS standard deviations of the
    difference of two ``w``-token medians of this profile's token-to-token noise where it is over the tolerance
    (robust: the median absolute difference of neighbouring bad tokens), whichever is larger."""
    pairs = (lp[1:] > 0) & (lp[:-1] > 0)
    if np.sum(pairs) < 2 * STEP_WINDOW:
        return np.log10(JUMP)
    sigma = 1.4826 * np.median(np.abs(np.diff(lp)[pairs])) / np.sqrt(2)
    return max(np.log10(JUMP), NOISE_SIGMAS * 1.2533 * sigma * np.sqrt(2 / w))


def _jumps(lp, w):
    """Tokens where the error jumps to over the tolerance. A step of at least JUMP (:func:`step_scores`) shows
    at the few tokens around it, as the windows overlap it; of each such run of tokens the jump is the one
    with the sharpest rise from the token before."""
    s = step_scores(lp, w)
    ahead = np.maximum(lp, np.append(lp[1:], lp[-1]))
    cand = (s >= jump_threshold(lp, w)) & (ahead > 0)
    rise = lp - np.concatenate([[lp[0]], lp[:-1]])
    jumps = np.zeros(len(lp), bool)
    t = 0
    while t < len(lp):
        if not cand[t]:
            t += 1
            continue
        end = t
        while end + 1 < len(lp) and cand[end + 1]:
            end += 1
        jumps[t + int(np.argmax(rise[t:end + 1]))] = True
        t = end + 1
    return jumps


def _events(lp, w, t0):
    """Tokens where errors begin: jumps (:func:`_jumps`), and where at most half the tokens from ``t0`` are over
    the tolerance, the first token of every run of bad tokens (an isolated bad token, as a gradient has at each
    token a step is skipped, is one; where most tokens are bad, a run starts after any one good token)."""
    over = lp > 0
    ev = _jumps(lp, w)
    if np.mean(over[t0:]) <= MIN_BAD_FRACTION:
        ev |= over & ~np.concatenate([[False], over[:-1]])
    return ev


def find_period(lp, t0):
    """``(period, onsets)``: the smallest period ``P`` such that errors begin (:func:`_events`, within one token)
    at every ``t0 + m P`` before the end -- at least MIN_ONSETS onsets, ``t0`` counted only when at least
    MIN_CLEAN_TOKENS clean tokens precede it -- and that so many onsets are not chance: with ``d`` the rate of
    events at the other tokens after ``t0``, ``candidates x d^(onsets after t0)`` (how many such periods noise
    would give) at most FALSE_PERIOD; or None."""
    T = len(lp)
    cache = {}
    need = MIN_ONSETS - 1 if t0 >= MIN_CLEAN_TOKENS else MIN_ONSETS
    periods = range(MIN_PERIOD, (T - 2 - t0) // need + 1)
    for P in periods:
        onsets = np.arange(t0 + P, T - 1, P)
        w = min(STEP_WINDOW, P // 2)
        if w not in cache:
            cache[w] = _events(lp, w, t0)
        ev = cache[w]
        if not (ev[onsets] | ev[np.maximum(onsets - 1, 0)] | ev[np.minimum(onsets + 1, T - 1)]).all():
            continue
        near = np.zeros(T, bool)
        for d in (-1, 0, 1):
            near[np.clip(np.concatenate([[t0], onsets]) + d, 0, T - 1)] = True
        rest = ~near[t0:]
        rate = (np.sum(ev[t0:][rest]) + 1) / (np.sum(rest) + 1)
        if len(periods) * rate ** len(onsets) > FALSE_PERIOD:
            continue
        return P, [t0] + [int(t) for t in onsets]
    return None


def _jump_again(lp, t0):
    """``(t, factor)``: the first jump after ``t0`` by at least BIG_JUMP (and :func:`jump_threshold`) at a multiple
    of 16 or of a larger power of two (where a chunk or block would start), or None."""
    s = step_scores(lp, STEP_WINDOW)
    big = max(np.log10(BIG_JUMP), jump_threshold(lp, STEP_WINDOW))
    for t in np.flatnonzero(_jumps(lp, STEP_WINDOW)):
        if t > t0 + 1 and _power_of_two_stride(int(t)) and s[t] >= big:
            return int(t), float(10 ** s[t])
    return None


def _onset_phrase(report, fails):
    """``(t0, phrase)``: ``o``'s first token over tolerance and a phrase saying so, or (None, "")."""
    o = next((v for v in fails if v.name == "o"), None)
    prof = report.profiles.get("o") if o is not None else None
    if prof is None or not len(prof):
        return None, ""
    over = np.asarray(prof) > o.tol_ratio
    if not over.any():
        return None, ""
    t0 = int(np.argmax(over))
    return t0, f"; o over tolerance from token {t0} ({np.mean(over[t0:]):.0%} of the tokens from there)"


# --- per case -------------------------------------------------------------------------------------------------


def _non_finite(report):
    bad = [v for v in report.verdicts if v.rule == "non-finite"]
    if not bad:
        return []
    firsts = {n: int(np.argmax(np.isinf(p))) for n, p in report.profiles.items() if np.isinf(p).any()}
    where = "o" if "o" in firsts else (min(firsts, key=firsts.get) if firsts else None)
    at = f" (first at token {firsts[where]} in {where})" if where else ""
    token = firsts[where] if where else None
    return [Finding("non-finite", f"NaN or inf in {_names(bad)}{at}: an overflow or 0 x inf, e.g. exp of a "
                                  "positive exponent (decay anchored away from the later token)",
                    token, results=tuple(v.name for v in bad), evidence={"first_non_finite": firsts})]


def _logic(bad, t0, onset):
    big = [v for v in bad if v.err_ratio >= LOGIC_ERROR]
    if not big:
        return []
    worst = max(big, key=lambda v: v.err_ratio)
    return [Finding("logic", f"O(1) relative error in {_names(big)} (err_ratio up to {worst.err_ratio:.2g} in "
                             f"{worst.name}){onset}: a logic error (wrong formula, dropped or clipped factor, wrong "
                             "sign), not rounding", t0, results=tuple(v.name for v in big))]


def _correlations(prof, g):
    """``{chunk: rank correlation of the per-token error with max |G| over chunk-token chunks}``."""
    return {c: rank_correlation(prof, chunk_log_decay(g, c)) for c in chunk_sizes(len(prof))}


def _cancellation(report, bad, problem):
    g = problem.g
    found = []
    for v in bad:
        loss = v.bound_ratio / v.tol_ratio if v.bound_ratio is not None else 1.0
        prof = report.profiles.get(v.name)
        rs = _correlations(prof, g) if prof is not None and len(prof) == np.shape(g)[1] else None
        best = max(rs.values()) if rs else None
        if v.grade == PRECISION or (loss >= CANCELLATION_LOSS and v.err_ratio < LOGIC_ERROR and best is not None
                                    and best >= CANCELLATION_CORRELATION):
            found.append((v, loss, rs))
    if not found:
        return []
    names = _names([v for v, _, _ in found])
    per = [rs for _, _, rs in found if rs]
    chunk, r, evidence = None, None, {}
    if per:
        score = {c: float(np.mean([rs[c] for rs in per])) for c in per[0]}
        chunk = max(score, key=lambda c: (score[c], c == CHUNK))
        r = score[chunk]
        others = ", ".join(f"{c}: {score[c]:.2f}" for c in score if c != chunk)
        others = f"; {others}" if others else ""
        span = float(np.max(chunk_log_decay(g, chunk)))
        evidence = {"correlation": {str(c): round(x, 3) for c, x in score.items()}, "max_G": span}
        sizes = f"{min(score)}-{max(score)}" if len(score) > 1 else f"{chunk}"
        if r >= CANCELLATION_CORRELATION:
            head = (f"{names}: errors grow with the within-chunk cumulative log-decay |G| and follow {chunk}-token "
                    f"chunks best (per-token error vs max |G|: rank correlation {r:.2f} over {chunk}-token chunks"
                    f"{others}; |G| up to {span:.3g}): the kernel's exponents behave like a chunk-{chunk} kernel's")
        elif r >= WEAK_CORRELATION:
            head = (f"{names}: errors follow the within-chunk cumulative log-decay |G| only loosely (rank "
                    f"correlation {r:.2f} at best, over {chunk}-token chunks{others})")
        else:
            sign = " (negative: the errors are smaller where |G| is larger)" if r < 0 else ""
            head = (f"{names}: errors do not follow the within-chunk cumulative log-decay |G| (rank correlation "
                    f"{r:.2f} at best over chunks of {sizes} tokens{sign})")
    else:
        head = f"{names}: over the tolerance within the precision-loss bound (no per-token profile to compare with |G|)"
    loss = max(x for _, x, _ in found)
    beyond = [v for v, _, _ in found if v.grade == FAIL]
    if beyond:
        tail = f"; {_names(beyond)} exceed(s) even the precision-loss bound, so cancellation alone does not explain it"
    elif r is None or r >= CANCELLATION_CORRELATION:
        tail = "; the algorithm is right, precision is lost of a known kind"
    elif r >= WEAK_CORRELATION:
        tail = "; within the precision-loss bound: precision lost of that kind is the likeliest cause"
    else:
        tail = ("; within the precision-loss bound, but without cancellation's |G| pattern: if other cases FAIL, "
                "suspect a systematic error")
    return [Finding("exponent-cancellation",
                    f"{head}; the float32 chunked algorithm with exponents formed as differences of float32 "
                    f"cumulative sums loses up to {loss:.3g}x the float32 recurrence's precision on this problem "
                    f"(docs/DESIGN.md §1, 'Decay exponents without cancellation'){tail}",
                    results=tuple(v.name for v, _, _ in found),
                    chunk=chunk if r is not None and r >= WEAK_CORRELATION else None, evidence=evidence)]


def _decay_spike(g, t):
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


def _localise_o(prof, tol, fwd, h0, o_err, g=None):
    """The localisation of ``o``'s errors (per-token profile ``prof``, err_ratio ``o_err``; ``g`` the problem's
    log-decay), or None."""
    lp = log_profile(prof, tol)
    over = lp > 0
    if not over.any():
        return None
    T = len(lp)
    t0 = int(np.argmax(over))
    t1 = int(T - 1 - np.argmax(over[::-1]))
    names = ", ".join(fwd)
    results = tuple(fwd)
    hit = find_period(lp, t0)
    if hit is not None:
        P, onsets = hit
        shown = ", ".join(map(str, onsets[:5])) + (", ..." if len(onsets) > 5 else "")
        return Finding("periodic", f"errors in {names} start at token {t0}{_multiple(t0)} and jump every {P} tokens "
                                   f"(at {shown}): a step repeated at every {P}-token chunk or block (what is carried "
                                   "into each one -- the state, saved states, gates -- or its first or last token)",
                       t0, results=results, period=P, evidence={"onsets": onsets})
    frac = float(np.mean(over[t0:]))
    spike = _decay_spike(g, t0)
    if spike is not None:
        at = f"token {t0}, where" if spike[0] == t0 else f"token {t0}, after token {spike[0]} where"
        return Finding("reset", f"errors in {names} start at {at} the log-decay spikes to {spike[1]:.3g} (a state "
                                f"reset; the median token's largest |g| is {spike[2]:.2g}), every earlier token within "
                                f"tolerance, {frac:.0%} of the later ones over it: what spans the reset (decay factors "
                                "or exponents across it, e.g. cumulative sums that lose their precision there, or a "
                                "factor that underflows)", t0, results=results,
                       evidence={"first_bad": t0, "reset": spike[0], "log_decay": spike[1]})
    w = STEP_WINDOW
    step = np.median(lp[t0:t0 + w]) - np.median(lp[max(0, t0 - w):t0]) if t0 > 0 else np.inf
    evidence = {"first_bad": t0, "last_bad": t1, "fraction_after": round(frac, 3)}
    if T - 1 - t1 >= max(MIN_CLEAN_TOKENS, T // 10):  # the errors fade: every later token within tolerance again
        if t0 == 0 and h0:
            return Finding("initial-state", f"errors in {names} from the first token (token 0), fading: every token "
                                            f"from {t1 + 1} on within tolerance, in a problem with an initial state: "
                                            "the initial state's path (h0 loaded, rounded, decayed or erased at the "
                                            "first token)", 0, results=results, evidence=evidence)
        return Finding("one-off", f"errors in {names} at tokens {t0}-{t1} only (every earlier and later token within "
                                  f"tolerance): one wrong step at token {t0}{_multiple(t0)} whose error fades with the "
                                  "decaying state (a skipped or doubled erase, decay or write there)", t0,
                       results=results, evidence=evidence)
    if t0 >= MIN_CLEAN_TOKENS and frac >= MIN_BAD_FRACTION and step >= np.log10(JUMP):
        return Finding("block-boundary", f"errors start at token {t0}{_multiple(t0)} in {names}: every earlier token "
                                         f"within tolerance, {frac:.0%} of the later ones over it: a block or tile "
                                         "boundary (check the state, saved states or grid index carried across it)",
                       t0, results=results, evidence=evidence)
    again = _jump_again(lp, t0)
    if again is not None:
        t1, factor = again
        stride = _power_of_two_stride(t1)
        return Finding("block-boundary", f"errors in {names} start at token {t0}{_multiple(t0)} and jump again at "
                                         f"token {t1} ({factor:.3g}x; a multiple of {stride}): a block or tile "
                                         f"boundary at token {t1} (check the state, saved states or grid index carried "
                                         "across it)",
                       t0, results=results, evidence={**evidence, "jump": t1, "factor": round(factor, 3)})
    tail = lp[t0:]
    if len(tail) >= MIN_CLEAN_TOKENS and o_err < LOGIC_ERROR:  # an O(1) error that grows: a logic error
        growth = rank_correlation(tail, np.arange(len(tail)))
        q = max(1, len(tail) // 4)
        if growth >= GROWTH_CORRELATION and np.median(tail[-q:]) - np.median(tail[:q]) >= np.log10(JUMP):
            return Finding("accumulating", f"errors in {names} grow along the sequence (rank correlation with the "
                                           f"token index {growth:.2f}), over tolerance from token {t0} with no jump "
                                           "there: an error that builds up token by token (a running sum, decay or "
                                           "state kept in too low a precision), not a boundary", t0,
                           results=results, evidence={**evidence, "growth": round(growth, 3)})
    return None


def _localise(report, fails, problem):
    """The localisation of a report's FAIL results: forward first, the gradients only when it is right."""
    by = {v.name: v for v in fails}
    h0 = getattr(problem, "initial_state", None) is not None
    fwd = [n for n in FORWARD if n in by]
    prof = report.profiles.get("o")
    if "o" in by and prof is not None and len(prof):
        found = _localise_o(prof, by["o"].tol_ratio, fwd, h0, by["o"].err_ratio, getattr(problem, "g", None))
        return [found] if found else []
    grads = [v for v in fails if v.name not in FORWARD]
    o = next((v for v in report.verdicts if v.name == "o"), None)
    o_ok = "within tolerance at every token" if o is None or o.grade == PASS else "within the precision-loss bound"
    if "final_state" in by:
        also = f" ({_names(grads)} differ too: the final state's cotangent flows into them)" if grads else ""
        bf16 = ("; or an error in every step that o, rounded to bfloat16, cannot resolve while the float32 state "
                "can" if getattr(report, "dtype", None) == "bfloat16" else "")
        return [Finding("final-state", f"o {o_ok}, final_state wrong{also}: the state returned is not the state "
                                       "after the last token (taken early, before the last token or chunk; not "
                                       f"written back; another layout or dtype){bf16}", None,
                        results=("final_state",) + tuple(v.name for v in grads))]
    if not grads or "o" in by:
        return []
    fwd_ok = "o and final_state " + ("within tolerance" if all(
        v.grade == PASS for v in report.verdicts if v.name in FORWARD) else "within the precision-loss bound")
    results = tuple(v.name for v in grads)
    if results == ("dh0",):
        return [Finding("initial-state", f"only dh0 differs ({fwd_ok}, the other gradients too): the state "
                                         "cotangent carried back to h0, or a forward step acting on h0 that the "
                                         "forward output cannot resolve (e.g. the first token's erase reading the "
                                         "decayed h0)", None, results=results)]
    where, period, onsets = "", None, []
    for v in grads:  # a gradient wrong at every chunk's first token, say, shows as periodic onsets
        prof = report.profiles.get(v.name)
        lp = log_profile(prof, v.tol_ratio) if prof is not None and len(prof) else None
        hit = find_period(lp, int(np.argmax(lp > 0))) if lp is not None and (lp > 0).any() else None
        if hit is not None:
            period, onsets = hit
            shown = ", ".join(map(str, onsets[:5])) + (", ..." if len(onsets) > 5 else "")
            where = f"; errors in {v.name} begin at tokens {shown} (every {period} tokens)"
            break
    return [Finding("backward", f"only gradients differ ({_names(grads)}; {fwd_ok}){where}: the backward, or a "
                                "forward step the forward output cannot resolve -- one acting on h0 or on a decayed "
                                "state (e.g. the first token's erase), or one whose gate is zero in this problem",
                    None, results=results, period=period, evidence={"onsets": onsets} if period else {})]


def diagnose_case(report, problem):
    """The findings of one non-PASS report (a tolerance ``Report`` with its profiles) on ``problem`` (anything
    with ``g`` and ``initial_state``): the most specific first, marked ``primary``."""
    finite_bad = [v for v in report.verdicts if v.grade != PASS and v.rule != "non-finite"]
    fails = [v for v in finite_bad if v.grade == FAIL]
    t0, onset = _onset_phrase(report, fails)
    local = _localise(report, fails, problem)
    cancel = _cancellation(report, finite_bad, problem)
    explains = bool(cancel) and {v.name for v in fails} <= set(cancel[0].results)
    found = _non_finite(report) + local + (cancel if explains else [])
    found += _logic(finite_bad, t0, onset) + ([] if explains else cancel)
    if not found and finite_bad:
        worst = max(finite_bad, key=lambda v: v.err_ratio / (v.bound_ratio or v.tol_ratio))
        over = worst.err_ratio / (worst.bound_ratio or worst.tol_ratio)
        found.append(Finding("systematic", f"{_names(finite_bad)} off by err_ratio up to {worst.err_ratio:.2g} "
                                           f"({over:.3g}x the precision-loss bound, {worst.name}) with no token "
                                           f"pattern{onset}: a systematic error (a perturbed constant, a damping), "
                                           "not rounding", t0, results=tuple(v.name for v in finite_bad)))
    return [replace(f, primary=i == 0) for i, f in enumerate(found)]


# --- across cases ---------------------------------------------------------------------------------------------


def _grade(c):
    """A case dict's grade: its own; else None for an input error (not judged), FAIL for a kernel error."""
    if "grade" in c:
        return c["grade"]
    return None if c.get("outcome") == "input-error" else (PASS if c.get("passed") else FAIL)


def _primary(c):
    found = c.get("diagnosis") or []
    return next((f for f in found if f.get("primary")), found[0] if found else None)


def _length(c):
    shape = c.get("shape")
    return int(shape[1]) if shape is not None and len(shape) >= 2 else None


def _modes(c):
    """The training-call modes of a case dict (``modes`` lists or a ``mode`` name, at the top or in ``regime``;
    none: the dense call)."""
    r = c.get("regime") or {}
    found = set()
    for m in (c.get("modes"), r.get("modes"), c.get("mode"), r.get("mode")):
        if isinstance(m, str):
            found.add(m)
        elif isinstance(m, (list, tuple)):
            found |= {str(x) for x in m}
    return found - {"dense"}


def _gate_varies(c, which):
    """Whether gate ``b`` (which=0) or ``w`` (which=1) varies across channels in a case's recipe (None: unknown)."""
    r = c.get("regime") or {}
    gates = r.get("gates")
    if gates not in GATES:
        return None
    return GATES[gates][which] in ("uniform", "uniform2") and r.get("reduction") is None


def _case_features(c, modes):
    """``{(family, label, complement, tiebreak): bool}``: the recipe features of one case dict that a pattern may
    name (a feature the case does not record is left out). Of two features of a family that hold for the same
    cases the one with the smaller ``tiebreak`` is named: the larger chunk in "T > C" and "T not a multiple of C"
    (the data has no case between the two), the smaller in "T <= C"."""
    r = c.get("regime") or {}
    out = {}

    def both(family, label, complement, value, tiebreak=0):
        out[(family, label, complement, tiebreak)] = value
        out[(family, complement, label, -tiebreak)] = not value

    if c.get("dtype") in KERNEL_DTYPES:
        both("dtype", "in bfloat16", "in float32", c["dtype"] == "bfloat16")
    if r.get("initial_state") is not None:
        both("h0", "with h0", "without h0", bool(r["initial_state"]))
    for which, gate in ((0, "b"), (1, "w")):
        varies = _gate_varies(c, which)
        if varies is not None:
            both(gate, f"where {gate} varies per channel", f"where {gate} is equal across channels", varies)
    if r.get("gates") in GATES:
        both("erase", "with the erase gate on (b != 0)", "with b = 0", GATES[r["gates"]][0] != "zero")
    if r.get("decay") in DECAYS:
        for d in DECAYS:
            out[("decay", f"under {d} decay", "under the other decays", 0)] = r["decay"] == d
        both("decay", "with decay (g != 0)", "without decay (g = 0)", r["decay"] != "none")
    T = _length(c)
    if T is not None:
        for C in CHUNKS:
            both("length", f"for T > {C}", f"with T <= {C}", T > C, -C)
            out[("tail", f"where T is not a multiple of {C}", f"where T is a multiple of {C}", -C)] = T % C != 0
    if modes:
        both("mode", "in a training-call mode", "in the dense call", bool(_modes(c)))
    for m in modes:
        both(f"mode {m}", f"in mode {m}", f"without mode {m}", m in _modes(c))
    return out


def _features(cases):
    """``[(family, label, complement, tiebreak, {case index: bool})]`` over the case dicts ``cases``."""
    modes = sorted(set().union(*(_modes(c) for c in cases))) if cases else []
    table = defaultdict(dict)
    for i, c in enumerate(cases):
        for key, value in _case_features(c, modes).items():
            table[key][i] = value
    return [(*key, vals) for key, vals in table.items()]


def _clean_splits(cases, bad, ok):
    """The features of :func:`_features` that split ``bad`` (case indices) from the rest cleanly: every bad
    case has the feature, every case without it is ``ok`` (indices), with enough cases on both sides and not
    by chance (PATTERN_CHANCE); the most specific per family (fewest cases with the feature), most specific
    first."""
    best = {}
    for family, label, complement, tiebreak, vals in _features(cases):
        if any(i not in vals for i in bad) or not all(vals[i] for i in bad):
            continue
        without = [i for i, v in vals.items() if not v]
        if len(bad) < MIN_PATTERN_CASES or len(without) < MIN_PATTERN_CASES or not all(i in ok for i in without):
            continue
        n_with = sum(vals.values())
        if math.comb(n_with, len(bad)) > PATTERN_CHANCE * math.comb(len(vals), len(bad)):
            continue
        if family not in best or (n_with, tiebreak) < best[family][:2]:
            best[family] = (n_with, tiebreak, label, complement, len(without))
    return [(n, label, complement, n_without) for n, _, label, complement, n_without in sorted(best.values(),
                                                                                           key=lambda b: (b[0], b[2]))]


def _pattern_lines(cases):
    """``pattern`` findings: what the failing cases share that every passing case lacks."""
    judged = [c for c in cases if _grade(c) is not None]
    bad = {i for i, c in enumerate(judged) if _grade(c) != PASS}
    ok = {i for i, c in enumerate(judged) if _grade(c) == PASS}
    verb, plural = (("fails", "fail") if all(_grade(judged[i]) == FAIL for i in bad)
                    else ("is off (FAIL or PRECISION)", "are off"))
    out = []
    splits = _clean_splits(judged, bad, ok)
    for n_with, label, complement, n_without in splits:
        out.append(Finding("pattern", f"{verb} only {label}: {len(bad)} of the {n_with} case(s) {label} {plural}, "
                                      f"every case {complement} ({n_without}) passes",
                           evidence={"feature": label, "off": len(bad), "with": n_with, "passing_without": n_without}))

    # The forward alone: cases whose forward is right may still differ in gradients (a bug the gradients see
    # everywhere while the forward sees it only under some recipes).
    def forward_bad(c):
        if c.get("outcome") == "error" or c.get("error"):
            return True
        vs = c.get("verdicts")
        return None if vs is None else any(v["name"] in FORWARD and v["grade"] != PASS for v in vs)

    fb = [forward_bad(judged[i]) for i in sorted(bad)]
    if None in fb or not any(fb) or all(fb):
        return out
    fwd_bad = {i for i, f in zip(sorted(bad), fb) if f}
    fwd_ok = {i for i, c in enumerate(judged) if i not in fwd_bad and forward_bad(c) is False}
    said = {s[1] for s in splits}
    grads = sorted({v["name"] for i in bad - fwd_bad for v in judged[i].get("verdicts") or []
                    if v["grade"] != PASS and v["name"] not in FORWARD})
    for n_with, label, complement, n_without in _clean_splits(judged, fwd_bad, fwd_ok):
        if label in said:
            continue
        out.append(Finding("pattern", f"the forward (o, final_state) fails only {label}: wrong in {len(fwd_bad)} of "
                                      f"the {n_with} case(s) {label}, right in every case {complement} ({n_without}); "
                                      f"the other {len(bad - fwd_bad)} off case(s) differ only in gradients "
                                      f"({', '.join(grads)})",
                           evidence={"feature": label, "forward_off": len(fwd_bad), "with": n_with,
                                     "forward_right_without": n_without, "gradients_only": len(bad - fwd_bad)}))
    return out


def diagnose_kernel(cases):
    """Findings across one kernel's cases (validate's case dicts: ``case``, ``grade``, ``dtype``, ``shape``,
    ``regime``, ``verdicts``, ``diagnosis``): per primary kind its cases, first bad forward tokens and periods
    (the most common kind first, marked primary), then the ``pattern`` lines."""
    bad = [c for c in cases if _grade(c) not in (PASS, None)]
    if not bad:
        return []
    by_kind = defaultdict(list)
    for c in bad:
        f = _primary(c)
        if f is not None:
            by_kind[f["kind"]].append((c, f))
    out = []
    for kind, hits in sorted(by_kind.items(), key=lambda kv: -len(kv[1])):
        names = sorted({c["case"] for c, _ in hits})
        shown = ", ".join(names[:6]) + (f", ... ({len(names)} cases)" if len(names) > 6 else "")
        found = [f for _, f in hits]
        tokens = sorted({f["token"] for f in found if f.get("token") is not None})
        periods = sorted({f["period"] for f in found if f.get("period")})
        chunks = [f["chunk"] for f in found if f.get("chunk")]
        results = list(dict.fromkeys(r for f in found for r in f.get("results") or ()))
        parts = []
        if tokens:
            parts.append(f"first bad token {tokens[0]}" if len(tokens) == 1 else
                         "first bad tokens " + ", ".join(map(str, tokens[:8])) + (", ..." if len(tokens) > 8 else ""))
        if periods:
            parts.append("errors recur every " + " or ".join(map(str, periods)) + " tokens")
        if chunks:
            counts = sorted(((chunks.count(c), c) for c in set(chunks)), reverse=True)
            others = ", ".join(f"{c}: {n}" for n, c in counts[1:])
            parts.append(f"errors follow {counts[0][1]}-token chunks best in {counts[0][0]} of {len(chunks)} case(s)"
                         + (f" (other chunks: {others})" if others else ""))
        if results:
            parts.append("in " + ", ".join(results))
        if kind in ("error", "input-error"):
            parts.append(found[0]["text"])
        out.append(Finding(kind, f"{len(names)} case(s): {shown}" + "".join(f"; {p}" for p in parts),
                           tokens[0] if tokens else None, results=tuple(results),
                           period=periods[0] if len(periods) == 1 else None,
                           chunk=max(set(chunks), key=chunks.count) if chunks else None))
    out += _onset_multiples(bad) + _pattern_lines(cases)
    return [replace(f, primary=i == 0) for i, f in enumerate(out)]


def _onset_multiples(bad):
    """A ``pattern`` finding when every token where the failing cases' errors begin (their primary findings'
    first bad tokens, jumps and periodic onsets), token 0 aside, is a multiple of one stride of at least 16
    tokens, seen in at least two cases."""
    onsets, where = set(), set()
    for c in bad:
        f = _primary(c)
        if f is None:
            continue
        ev = f.get("evidence") or {}
        ts = {t for t in [f.get("token"), ev.get("jump"), *(ev.get("onsets") or [])] if t}
        onsets |= ts
        if ts:
            where.add(c["case"])
    stride = math.gcd(*onsets) if onsets else 0
    if len(where) < 2 or stride < 16:
        return []
    shown = ", ".join(map(str, sorted(onsets)[:8])) + (", ..." if len(onsets) > 8 else "")
    return [Finding("pattern", f"errors begin only at multiples of {stride} tokens (at tokens {shown} in {len(where)} "
                               f"case(s), besides token 0): a {stride}-token chunk or block boundary",
                    period=stride, evidence={"stride": stride, "onsets": sorted(onsets), "cases": len(where)})]
