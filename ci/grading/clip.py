"""The exponent-clip finding (docs/DESIGN.md §4, "Diagnosis"): a kernel that clips its within-chunk decay exponents
(``exp(max(G_r - G_s, -X))``, a guard against underflow) is wrong only where some pair's exponent is below ``-X``;
its results then match the float64 chunked algorithm with the same clip (``oracle.chunked32``'s ``clip``). The clip
``X`` is fitted from the oracle alone: the kernel's error ``~ e^-X`` and the clipped algorithm's ``~ e^-X0`` along the
same pairs give ``X = X0 + log(err(X0) / err(kernel))``, iterated; the finding holds where the kernel's error against
the clipped algorithm is at most ``1 / CLIP_GAIN`` of its error against the oracle.
"""

from __future__ import annotations

import math

import numpy as np

from .finding import Finding
from .rule import cosine

# The kernel's error against the clipped algorithm at most 1 / CLIP_GAIN of its error against the oracle: the clip
# explains that result (a clip fitted to within ~0.1 of the kernel's own leaves ~10 % of its effect).
CLIP_GAIN = 10.0
# The chunk sizes tried (distinct chunkings of the case's T only), and the fitting steps per chunk size.
CLIP_CHUNKS = (64, 128, 256)
CLIP_STEPS = 8
# The clipped algorithm's error, at one end of the bracket, points the kernel's way at least this much (cosine in the
# worst FAIL result), else no fit is tried, nor after two clips in a row below it: a damping's or a wrong formula's
# error does not (clipped mutant: 0.89-1.0 at every clip tried; damped solve: -0.02-0.001).
CLIP_COSINE = 0.5
# The fit stops where the clipped algorithm's error is within this log-ratio of the kernel's; above MAX_EXPONENT a
# clip changes nothing in float64 (e^-MAX_EXPONENT underflows).
CLIP_TOLERANCE = 0.02
MAX_EXPONENT = 700.0


def exponent_span(g, chunk):
    """The largest ``-(G_r - G_s)`` over pairs ``s <= r`` within one ``chunk``-token chunk of the log-decay ``g``
    ``[B, T, H, K]`` (``G`` its within-chunk cumulative sum): the deepest exponent a clip could touch."""
    g = np.asarray(g, np.float64)
    B, T = g.shape[:2]
    n = -(-T // chunk)
    padded = np.concatenate([g, np.zeros((B, n * chunk - T, *g.shape[2:]))], axis=1)
    G = np.cumsum(padded.reshape(B, n, chunk, *g.shape[2:]), axis=2)
    high = np.maximum.accumulate(G, axis=2)  # max over s <= r of G_s
    return float(np.max(high - G)) if G.size else 0.0


def clip_errors(scaled, got, base):
    """``{name: (err_ratio of got against base, err_ratio of base against the reference, cosine between their
    errors)}`` over the results of the clipped algorithm ``base`` (``scaled``: ``rule._Scaled``-like, its ``ref`` and
    ``error(name, x, ref=None)``)."""
    out = {}
    for n in base:
        if n in got and base[n] is not None and got[n] is not None:
            ref = np.asarray(scaled.ref[n], np.float64)
            out[n] = (scaled.error(n, got[n], base[n])[0], scaled.error(n, base[n])[0],
                      cosine(np.asarray(got[n], np.float64) - ref, np.asarray(base[n], np.float64) - ref))
    return out


def fit_clip(clipped, key, err, span, chunk):
    """``(X, errors)``: the clip ``X`` whose clipped algorithm (``clipped(X, chunk)``, :func:`clip_errors`' form)
    has result ``key``'s error ``err`` against the oracle, and that algorithm's errors; None when even the smallest
    clip tried changes ``key`` less than that. ``X`` is bracketed by doubling from 1 (the clipped algorithm's error
    falls as ``X`` grows) up to ``span`` (or ``MAX_EXPONENT``), then refined by the log-linear step, bisecting
    where the step leaves the bracket."""
    top = min(span, MAX_EXPONENT)

    def own(X):
        errors = clipped(X, chunk)
        e = errors.get(key, (0.0, 0.0, 0.0))[1]
        return (e if math.isfinite(e) else np.inf), errors

    lo, X, below, astray = None, 1.0, None, 0
    while True:
        e, errors = own(X)
        astray = astray + 1 if errors.get(key, (0, 0, 0.0))[2] < CLIP_COSINE else 0
        if astray == 2:  # two clips in a row point elsewhere: not a clip (a damping costs two evaluations)
            return None
        if e <= err or X >= top:
            break
        lo, X, below = X, min(2 * X, top), errors
    # bracketed, and the clipped algorithm's error points the kernel's way at one end (a damping's does not)
    if lo is None or e > err or max(errors[key][2], below[key][2]) < CLIP_COSINE:
        return None
    hi = X
    for _ in range(CLIP_STEPS):
        if e <= 0:
            X = (lo + hi) / 2
        else:
            step = X + math.log(e / err)
            X = step if lo < step < hi else (lo + hi) / 2
        e, errors = own(X)
        if e > err:
            lo = X
        else:
            hi = X
        if e > 0 and abs(math.log(e / err)) < CLIP_TOLERANCE:
            break
    return X, errors


def exponent_clip(ev):
    """The kernel's FAIL results match the float64 chunked algorithm with its within-chunk decay exponents clipped at
    ``-X`` (fitted, :func:`fit_clip`) to ``1 / CLIP_GAIN`` of their error against the oracle: an exponent clip."""
    clipped = getattr(ev, "clipped", None)
    g = getattr(ev.problem, "g", None)
    if clipped is None or g is None or not ev.fails or np.ndim(g) != 4:
        return None
    key = max(ev.fails, key=lambda v: v.err_ratio / v.tol_ratio)
    T = np.shape(g)[1]
    best = None
    for chunk in sorted({min(c, T) for c in CLIP_CHUNKS}):
        span = exponent_span(g, chunk)
        fit = fit_clip(clipped, key.name, key.err_ratio, span, chunk) if span > 0 else None
        if fit is None:
            continue
        X, errors = fit
        gain = {v.name: errors[v.name][0] / v.err_ratio for v in ev.fails if v.name in errors}
        if best is None or gain.get(key.name, np.inf) < best[2].get(key.name, np.inf):
            best = (chunk, X, gain)
        if gain.get(key.name, np.inf) <= 1 / CLIP_GAIN:  # the smallest chunk that explains it: a larger one clips more
            break
    if best is None or best[2].get(key.name, np.inf) > 1 / CLIP_GAIN:
        return None
    chunk, X, gain = best
    explained = [n for n, r in gain.items() if r <= 1 / CLIP_GAIN]
    rest = [v.name for v in ev.fails if v.name not in explained]
    where = f"{chunk}-token chunks" if chunk < T else f"one chunk of the {T} tokens"
    tail = f"; {', '.join(rest)} not explained by it" if rest else ""
    verb = "matches" if len(explained) == 1 else "match"
    return Finding("exponent-clip",
                   f"{', '.join(explained)} {verb} the float64 chunked algorithm ({where}) with every within-chunk "
                   f"decay exponent G_r - G_s clipped at -{X:.3g} (exp(max(G_r - G_s, -{X:.3g}))) to "
                   f"{max(gain[n] for n in explained):.2g}x their error against the oracle: the kernel clips its "
                   f"decay exponents, so pairs decayed by more than e^-{X:.3g} keep e^-{X:.3g} (the case's deepest "
                   f"within-chunk exponent is -{exponent_span(g, chunk):.3g}){tail}",
                   results=tuple(explained), chunk=chunk if chunk < T else None,
                   evidence={"clip": round(float(X), 4), "chunk": int(chunk),
                             "gain": {n: float(f"{r:.3g}") for n, r in gain.items()}})
