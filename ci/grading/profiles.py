"""Per-token error profiles: where errors begin, jump and recur (docs/DESIGN.md §4, "Diagnosis").

A profile is one result's error per token (or per call) over its scale (``tolerance.token_profile``: ``inf`` at a
token with a non-finite value); ``tol`` its tolerance. A token is *bad* when its error is over ``tol`` or not finite
(:func:`bad_tokens`, the one rule; NaN is bad). The rest reads a profile in decades over the tolerance
(:func:`log_profile`): steps between windows, jumps, periods; and the within-chunk cumulative log-decay ``|G|``
that cancellation errors follow.
"""

from __future__ import annotations

import numpy as np

from gdn2_oracle.oracle.call_modes import FLA_CHUNK

# A bad token preceded by at least this many clean tokens starts a block of errors; of the later tokens at least
# this fraction must be bad.
MIN_CLEAN_TOKENS = 16
MIN_BAD_FRACTION = 0.5
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


def bad_tokens(profile, tol):
    """Per token: its error over ``tol``, or not finite (NaN and inf are bad)."""
    p = np.asarray(profile, np.float64)
    return ~(np.isfinite(p) & (p <= tol))


def first_bad(profile, tol):
    """The first bad token (:func:`bad_tokens`) of a profile, or None; ``tol = inf``: the first non-finite one."""
    bad = bad_tokens(profile, tol)
    return int(np.argmax(bad)) if bad.any() else None


def chunk_log_decay(g, chunk=FLA_CHUNK):
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


def power_of_two_stride(t):
    """The largest power of two (>= 16) dividing token index ``t``, or None."""
    p = t & -t if t > 0 else 0
    return p if p >= 16 else None


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


def jumps(lp, w):
    """Tokens where the error jumps to over the tolerance. A step of at least JUMP (:func:`step_scores`) shows
    at the few tokens around it, as the windows overlap it; of each such run of tokens the jump is the one
    with the sharpest rise from the token before."""
    s = step_scores(lp, w)
    ahead = np.maximum(lp, np.append(lp[1:], lp[-1]))
    cand = (s >= jump_threshold(lp, w)) & (ahead > 0)
    rise = lp - np.concatenate([[lp[0]], lp[:-1]])
    out = np.zeros(len(lp), bool)
    t = 0
    while t < len(lp):
        if not cand[t]:
            t += 1
            continue
        end = t
        while end + 1 < len(lp) and cand[end + 1]:
            end += 1
        out[t + int(np.argmax(rise[t:end + 1]))] = True
        t = end + 1
    return out


def onsets(lp, w, t0):
    """Tokens where errors begin: jumps (:func:`jumps`), and where at most half the tokens from ``t0`` are over
    the tolerance, the first token of every run of bad tokens (an isolated bad token, as a gradient has at each
    token a step is skipped, is one; where most tokens are bad, a run starts after any one good token)."""
    over = lp > 0
    ev = jumps(lp, w)
    if np.mean(over[t0:]) <= MIN_BAD_FRACTION:
        ev |= over & ~np.concatenate([[False], over[:-1]])
    return ev


def find_period(lp, t0):
    """``(period, onsets)``: the smallest period ``P`` such that errors begin (:func:`onsets`, within one token)
    at every ``t0 + m P`` before the end -- at least MIN_ONSETS onsets, ``t0`` counted only when at least
    MIN_CLEAN_TOKENS clean tokens precede it -- and that so many onsets are not chance: with ``d`` the rate of
    events at the other tokens after ``t0``, ``candidates x d^(onsets after t0)`` (how many such periods noise
    would give) at most FALSE_PERIOD; or None."""
    T = len(lp)
    cache = {}
    need = MIN_ONSETS - 1 if t0 >= MIN_CLEAN_TOKENS else MIN_ONSETS
    periods = range(MIN_PERIOD, (T - 2 - t0) // need + 1)
    for P in periods:
        at = np.arange(t0 + P, T - 1, P)
        w = min(STEP_WINDOW, P // 2)
        if w not in cache:
            cache[w] = onsets(lp, w, t0)
        ev = cache[w]
        if not (ev[at] | ev[np.maximum(at - 1, 0)] | ev[np.minimum(at + 1, T - 1)]).all():
            continue
        near = np.zeros(T, bool)
        for d in (-1, 0, 1):
            near[np.clip(np.concatenate([[t0], at]) + d, 0, T - 1)] = True
        rest = ~near[t0:]
        rate = (np.sum(ev[t0:][rest]) + 1) / (np.sum(rest) + 1)
        if len(periods) * rate ** len(at) > FALSE_PERIOD:
            continue
        return P, [t0] + [int(t) for t in at]
    return None


def jump_again(lp, t0):
    """``(t, factor)``: the first jump after ``t0`` by at least BIG_JUMP (and :func:`jump_threshold`) at a multiple
    of 16 or of a larger power of two (where a chunk or block would start), or None."""
    s = step_scores(lp, STEP_WINDOW)
    big = max(np.log10(BIG_JUMP), jump_threshold(lp, STEP_WINDOW))
    for t in np.flatnonzero(jumps(lp, STEP_WINDOW)):
        if t > t0 + 1 and power_of_two_stride(int(t)) and s[t] >= big:
            return int(t), float(10 ** s[t])
    return None
