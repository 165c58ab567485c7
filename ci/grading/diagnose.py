"""What a non-PASS judgement points at, from data the judgement already has (docs/DESIGN.md §4, "Diagnosis").

Per case (:func:`diagnose_case`, from a tolerance ``Report`` -- grades, bounds, per-token
error profiles -- and the problem's log-decay):

* ``non-finite``: NaN or inf in a result (first bad token);
* ``logic``: O(1) relative error (``err_ratio >= LOGIC_ERROR``): a wrong formula, not rounding;
* ``exponent-cancellation``: a PRECISION grade, or errors that grow with the within-chunk cumulative
  log-decay ``|G|`` where the cumulative-sum baseline loses precision too;
* ``block-boundary``: every token before some position within tolerance, most after it over (the
  first bad token is printed);
* ``backward``: forward output and final state within tolerance, a gradient wrong;
* ``initial-state``: only ``dh0`` wrong in a problem with an initial state;
* ``systematic``: none of the above: an error beyond the bound spread over the tokens.

Per kernel, across the cases of a run (:func:`diagnose_kernel`): the per-case kinds with their cases,
and ``bfloat16`` / ``initial-state`` when only bf16 cases, or only cases with an initial state, fail.
These are heuristics that name the likeliest cause; the grade is the verdict.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

import numpy as np

from gdn2_oracle.oracle.chunked32 import CHUNK

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
FORWARD = ("o", "final_state")


@dataclass(frozen=True)
class Finding:
    """One diagnosis: its kind, a sentence, and the first bad token where that applies."""

    kind: str
    text: str
    token: int | None = None

    def __str__(self):
        return f"{self.kind}: {self.text}"

    def as_dict(self):
        return asdict(self)


def chunk_log_decay(g, chunk=CHUNK):
    """Per token, the largest ``|G_t|`` over batch, heads and channels, ``G`` the cumulative log-decay
    within ``chunk``-token chunks (``g [B, T, H, K]``)."""
    g = np.asarray(g, np.float64)
    B, T, H, K = g.shape
    N = -(-T // chunk)
    G = np.cumsum(np.pad(g, ((0, 0), (0, N * chunk - T), (0, 0), (0, 0))).reshape(B, N, chunk, H, K), axis=2)
    return np.max(np.abs(G), axis=(0, 3, 4)).reshape(N * chunk)[:T]


def rank_correlation(x, y):
    """Spearman rank correlation of two equal-length sequences (0 when either is constant)."""
    def rank(a):
        return np.argsort(np.argsort(np.asarray(a, np.float64), kind="stable"), kind="stable")

    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(np.corrcoef(rank(x), rank(y))[0, 1])


def _names(vs):
    return ", ".join(v.name for v in vs)


def _power_of_two_stride(t):
    """The largest power of two (>= 16) dividing token index ``t``, or None."""
    p = t & -t if t > 0 else 0
    return p if p >= 16 else None


def first_bad_token(profile, tol):
    """``(t0, fraction)``: the first token over ``tol`` when every earlier one is within it, at least
    MIN_CLEAN_TOKENS precede it and at least MIN_BAD_FRACTION of the later ones are over; else None."""
    over = np.asarray(profile) > tol
    if not over.any():
        return None
    t0 = int(np.argmax(over))
    frac = float(np.mean(over[t0:]))
    return (t0, frac) if t0 >= MIN_CLEAN_TOKENS and frac >= MIN_BAD_FRACTION else None


def _non_finite(report):
    bad = [v for v in report.verdicts if v.rule == "non-finite"]
    if not bad:
        return []
    firsts = [int(np.argmax(np.isinf(p))) for n, p in report.profiles.items() if np.isinf(p).any()]
    at = f" (first at token {min(firsts)})" if firsts else ""
    return [Finding("non-finite", f"NaN or inf in {_names(bad)}{at}: an overflow or 0 x inf, e.g. exp of a "
                                  "positive exponent (decay anchored away from the later token)",
                    min(firsts) if firsts else None)]


def _logic(bad):
    big = [v for v in bad if v.err_ratio >= LOGIC_ERROR]
    if not big:
        return []
    worst = max(big, key=lambda v: v.err_ratio)
    return [Finding("logic", f"O(1) relative error in {_names(big)} (err_ratio up to {worst.err_ratio:.2g} in "
                             f"{worst.name}): a logic error (wrong formula, dropped or clipped factor, wrong sign), "
                             "not rounding")]


def _cancellation(report, bad, problem):
    G = chunk_log_decay(problem.g)
    found = []
    for v in bad:
        loss = v.bound_ratio / v.tol_ratio if v.bound_ratio is not None else 1.0
        prof = report.profiles.get(v.name)
        r = rank_correlation(prof, G) if prof is not None else None
        if v.grade == PRECISION or (loss >= CANCELLATION_LOSS and v.err_ratio < LOGIC_ERROR and r is not None
                                    and r >= CANCELLATION_CORRELATION):
            found.append((v, loss, r))
    if not found:
        return []
    rs = [r for _, _, r in found if r is not None]
    corr = (f"; per-token error vs max |G| (64-token chunks, up to {np.max(G):.3g}): rank correlation "
            f"{max(rs):.2f}") if rs else ""
    if rs and max(rs) < WEAK_CORRELATION:
        corr += " (weak: the errors do not follow |G|; if other cases FAIL, suspect a systematic error)"
    beyond = [v for v, _, _ in found if v.grade == FAIL]
    tail = (f"; {_names(beyond)} exceed(s) even the precision-loss bound, so cancellation alone does not explain it"
            if beyond else "; the algorithm is right, precision is lost of a known kind")
    loss = max(x for _, x, _ in found)
    return [Finding("exponent-cancellation",
                    f"{_names([v for v, _, _ in found])}: errors grow with the within-chunk cumulative log-decay "
                    f"|G|{corr}; the float32 chunked algorithm with exponents formed as differences of float32 "
                    f"cumulative sums loses up to {loss:.3g}x the float32 recurrence's precision here "
                    f"(docs/DESIGN.md §1, 'Decay exponents without cancellation'){tail}")]


def _boundary(report, bad):
    hits = []
    for v in bad:
        prof = report.profiles.get(v.name)
        if v.grade == FAIL and prof is not None:
            hit = first_bad_token(prof, v.tol_ratio)
            if hit:
                hits.append((hit[0], hit[1], v.name))
    if not hits:
        return []
    t0 = min(t for t, _, _ in hits)
    names = ", ".join(n for t, _, n in hits if t == t0)
    frac = max(f for t, f, _ in hits if t == t0)
    stride = _power_of_two_stride(t0)
    at = f" (a multiple of {stride})" if stride else ""
    return [Finding("block-boundary", f"errors start at token {t0}{at} in {names}: every earlier token within "
                                      f"tolerance, {frac:.0%} of the later ones over it: a block or tile boundary "
                                      "(check the state, saved states or grid index carried across it)", t0)]


def _backward(report, bad, problem):
    forward_ok = all(report[n].grade == PASS for n in FORWARD)
    grads = [v for v in bad if v.name not in FORWARD and v.grade == FAIL]
    if not (forward_ok and grads):
        return []
    if [v.name for v in grads] == ["dh0"] and problem.initial_state is not None:
        return [Finding("initial-state", "only dh0 is wrong (forward and the other gradients within tolerance): "
                                         "the initial state's gradient, the state cotangent carried out of the "
                                         "first chunk")]
    return [Finding("backward", f"forward (o, final_state) within tolerance, {_names(grads)} wrong: a backward bug")]


def diagnose_case(report, problem):
    """The findings of one non-PASS report (a tolerance ``Report`` with its profiles) on ``problem``."""
    finite_bad = [v for v in report.verdicts if v.grade != PASS and v.rule != "non-finite"]
    boundary = _boundary(report, finite_bad)  # explains an O(1) error after it: no separate logic finding then
    found = _non_finite(report) + boundary + (_logic(finite_bad) if not boundary else [])
    found += _cancellation(report, finite_bad, problem) + _backward(report, finite_bad, problem)
    if not found and finite_bad:
        worst = max(finite_bad, key=lambda v: v.err_ratio / (v.bound_ratio or v.tol_ratio))
        over = worst.err_ratio / (worst.bound_ratio or worst.tol_ratio)
        found.append(Finding("systematic", f"{_names(finite_bad)} off by err_ratio up to {worst.err_ratio:.2g} "
                                           f"({over:.3g}x the precision-loss bound, {worst.name}) with no token "
                                           "pattern: a systematic error (a perturbed constant, a damping), "
                                           "not rounding"))
    return found


def diagnose_kernel(cases):
    """Findings across one kernel's cases (validate's case dicts: ``grade``, ``dtype``, ``regime``, ``diagnosis``)."""
    bad = [c for c in cases if c.get("grade", PASS) not in (PASS, None)]
    if not bad:
        return []
    out = []
    by_kind = defaultdict(list)
    for c in bad:
        for f in c.get("diagnosis") or []:
            by_kind[f["kind"]].append((c, f))
    for kind, hits in by_kind.items():
        names = sorted({c["case"] for c, _ in hits})
        shown = ", ".join(names[:6]) + (f", ... ({len(names)} cases)" if len(names) > 6 else "")
        tokens = [f["token"] for _, f in hits if f.get("token") is not None]
        at = f"; first bad token {min(tokens)}" if tokens else ""
        first = f": {hits[0][1]['text']}" if kind in ("error", "input-error") else ""
        out.append(Finding(kind, f"{len(names)} case(s): {shown}{at}{first}", min(tokens) if tokens else None))
    cases = [c for c in cases if c.get("grade", PASS) is not None]  # judged (or raised), not input errors
    f32 = [c for c in cases if c["dtype"] == "float32"]
    if all(c["dtype"] == "bfloat16" for c in bad) and f32 and all(c["grade"] == PASS for c in f32):
        out.append(Finding("bfloat16", f"only bfloat16 cases are off ({len(bad)}), every float32 case ({len(f32)}) "
                                       "passes: the bf16 path (upcast at load, result rounding, matmul precision)"))
    def h0(c):
        return bool((c.get("regime") or {}).get("initial_state"))

    without = [c for c in cases if not h0(c)]
    if all(h0(c) for c in bad) and without and all(c["grade"] == PASS for c in without):
        out.append(Finding("initial-state", f"only cases with an initial state are off ({len(bad)}), every case "
                                            f"without one ({len(without)}) passes: the initial state's path"))
    return out
