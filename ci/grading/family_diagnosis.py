"""A family case's findings in its own terms (docs/DESIGN.md §4, "Diagnosis"): which value heads are off, and what a
final state that is the right one decayed further means.

:func:`refine` adds them to a non-PASS family report (``ci/grading/families.py``'s judgement; called where a family case
is judged with the kernel's results at hand: ``ci.running.cases.FamilyRunCase.graded``, ``hunt_families.judge``), from
the kernel's results, the float64 reference and, to test a hypothesis, the oracle run again on the case's inputs:

* ``value-heads`` (grouped value heads, ``G > 1``): per value head, whether ``o`` and the final state are within the
  case's tolerance; when some heads are off and others exact (:data:`HEAD_GAP` apart), they are named, and each
  alternative head map of :data:`HEAD_MAPS` is tried (the float64 oracle with q and k indexed by it): one that matches
  the kernel's ``o`` and final state within tolerance is said ("value head hv reads key head hv % H, not hv // G"),
  never guessed;
* ``tail``: a ``final-state`` finding (``o`` right, the final state off by an O(1) error or decayed further) on an
  unpacked call whose ``T`` is not a multiple of FLA's 64-token chunk is restated as "the final state only, when T is
  not a multiple of 64": the last, partial chunk, not a state "taken early" (the kernel-level line,
  ``patterns.tail_line``, adds whether the cases with ``T`` a multiple of 64 pass);
* ``extra-decay``: ``o`` right, the final state off, and the final state is the reference's scaled down per value
  head and key channel (a least-squares factor per row in ``[0, 1]``, the rest within tolerance): decay applied after
  the last token -- padding tokens whose log-decay still acts on the state (some row decayed by an O(1) factor).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gdn2_oracle.oracle import families
from gdn2_oracle.oracle.call_modes import FLA_CHUNK

from .finding import LOGIC_ERROR, Finding
from .grades import PASS
from .rule import rms

# Alternative maps from value head to key head tried against a kernel whose value heads are partly off: the
# phrase, and ``(HV, H) -> key head per value head`` (the right map is ``hv // G``).
HEAD_MAPS = {"hv % H": lambda HV, H: np.arange(HV) % H}
# A value head is off when its rms error over the result's rms scale exceeds the result's tolerance, exact when within
# it; the breakdown is said only when the best off head is at least HEAD_GAP times further over the tolerance than the
# worst exact one (a per-head fault, not rounding that lands a little over the tolerance in one head).
HEAD_GAP = 10.0
# The head axis of each result the per-head breakdown reads (o: [B, T, HV, V]; final state: [N, HV, ., .]).
HEAD_AXIS = {"o": 2, "final_state": 1}


def head_errors(got, ref, axis):
    """Per value head (``axis``): rms of ``got - ref`` over the whole reference's rms (the result's error scale)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = rms(ref) or 1.0
    diff = np.moveaxis(got - ref, axis, 0)
    return np.array([rms(d) / scale for d in diff])


def listed(heads):
    """``1, 2`` for a list of head indices."""
    return ", ".join(str(int(h)) for h in heads)


def off_heads(got, ref, verdicts):
    """``(off, exact)`` value heads, by the largest error / tolerance over the forward results whose verdict is not
    PASS; None when no such result has a head axis or the off heads are not :data:`HEAD_GAP` times further over the
    tolerance than the exact ones."""
    worst = None
    for name, axis in HEAD_AXIS.items():
        v = verdicts.get(name)
        if v is None or v.grade == PASS or name not in got or np.ndim(got[name]) <= axis:
            continue
        r = head_errors(got[name], ref[name], axis) / v.tol_ratio
        worst = r if worst is None else np.maximum(worst, r)
    if worst is None:
        return None
    off = worst > 1.0
    if not off.any() or off.all() or np.min(worst[off]) < HEAD_GAP * np.max(worst[~off]):
        return None
    return np.flatnonzero(off), np.flatnonzero(~off)


def head_map_matches(fcall, got, verdicts, key_heads):
    """``(matches, {result: err_ratio})``: the float64 oracle with value head ``hv`` reading key head
    ``key_heads[hv]`` against the kernel's ``o`` and final state, within each result's tolerance."""
    alt = dataclasses.replace(fcall, q=fcall.q[:, :, key_heads], k=fcall.k[:, :, key_heads])
    o, final = families.forward(alt)
    errs = {}
    for name, ref in (("o", o), ("final_state", final)):
        if name in got and name in verdicts:
            errs[name] = rms(np.asarray(got[name], np.float64) - ref) / (rms(ref) or 1.0)
    matches = bool(errs) and all(errs[n] <= verdicts[n].tol_ratio for n in errs)
    return matches, errs


def value_heads(case, got, ref, verdicts):
    """The ``value-heads`` finding of a case with grouped value heads whose value heads are partly off, or None."""
    fcall = case.call
    B, T, H, HV, K, V = fcall.shape
    if HV == H:
        return None
    split = off_heads(got, ref, verdicts)
    if split is None:
        return None
    off, exact = split
    lead = f"value heads {listed(off)} off, {listed(exact)} exact"
    for phrase, make in HEAD_MAPS.items():
        key_heads = make(HV, H)
        matches, errs = head_map_matches(fcall, got, verdicts, key_heads)
        if matches:
            shown = ", ".join(f"{n} {e:.2g}" for n, e in errs.items())
            return Finding("value-heads", f"{lead}: value head hv reads key head {phrase}, not hv // G (the oracle "
                                          f"with that head map matches the kernel: err_ratio {shown})",
                           results=tuple(errs), evidence={"off": off.tolist(), "exact": exact.tolist(),
                                                          "head_map": phrase, "G": HV // H, "H": H})
    return Finding("value-heads", f"{lead} (G = {HV // H} value heads per key head, H = {H}): something chosen per "
                                  "value head -- the key head it reads, its log-decay, beta or state -- is wrong for "
                                  f"some; no alternative head map ({', '.join(HEAD_MAPS)}) matches",
                   evidence={"off": off.tolist(), "exact": exact.tolist(), "G": HV // H, "H": H})


def decay_factors(got, ref):
    """``(factors, residual)``: per state row of the key axis (a value head and key channel) the least-squares factor
    ``c`` with ``got ~ c ref``, and the rms of what is left over the reference's rms; the key axis is whichever of the
    state's last two leaves less (``[K, V]`` or ``[V, K]`` layout); None when ``got`` is not finite."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if not ref.size or not np.all(np.isfinite(got)):
        return None
    fits = []
    for axis in (-1, -2):  # the V axis a key channel's row runs along
        den = np.sum(ref * ref, axis=axis, keepdims=True)
        c = np.where(den > 0, np.sum(got * ref, axis=axis, keepdims=True) / np.where(den > 0, den, 1.0), 1.0)
        fits.append((rms(got - c * ref) / (rms(ref) or 1.0), np.squeeze(c, axis)))
    residual, c = min(fits, key=lambda f: f[0])
    return c, residual


def extra_decay(case, got, ref, verdicts):
    """The ``extra-decay`` finding: ``o`` right, the final state off and equal to the reference's decayed further per
    row (factors in [0, 1], at least one at most ``1 - LOGIC_ERROR``: an O(1) decay, not rounding), or None."""
    v, o = verdicts.get("final_state"), verdicts.get("o")
    if v is None or v.grade == PASS or (o is not None and o.grade != PASS) or "final_state" not in got:
        return None
    fit = decay_factors(got["final_state"], ref["final_state"])
    if fit is None:
        return None
    c, residual = fit
    if residual > v.tol_ratio or np.min(c) < -v.tol_ratio or np.max(c) > 1 + v.tol_ratio or np.min(c) > 1 - LOGIC_ERROR:
        return None
    T = case.call.shape[1]
    return Finding("extra-decay", f"final_state is the right state decayed further: per value head and key channel by "
                                  f"factors {np.min(c):.3g} to {np.max(c):.3g} (what is left: err_ratio "
                                  f"{residual:.2g}): decay applied after the last token (T = {T}) -- padding "
                                  "tokens whose log-decay still acts on the state", results=("final_state",),
                   evidence={"factor_min": float(np.min(c)), "factor_max": float(np.max(c)),
                             "residual": float(residual), "T": int(T)})


def tail(case, finding, verdicts, decayed):
    """``finding`` (a ``final-state`` one) restated as a ``tail`` finding when the case's call is unpacked, its ``T``
    is not a multiple of :data:`FLA_CHUNK` and the final state is off by an O(1) error or decayed further
    (``decayed``: the :func:`extra_decay` finding); else ``finding`` itself."""
    fcall = case.call
    T = fcall.shape[1]
    v = verdicts.get("final_state")
    if finding.kind != "final-state" or fcall.cu_seqlens is not None or T % FLA_CHUNK == 0 or v is None:
        return finding
    if decayed is None and v.err_ratio < LOGIC_ERROR:
        return finding
    head = finding.text.split(": the state returned", 1)[0]
    return dataclasses.replace(finding, kind="tail", text=(
        f"{head}: the final state only, when T is not a multiple of {FLA_CHUNK} (T = {T}, a {T % FLA_CHUNK}-token "
        f"tail): what only the state sees of the last, partial {FLA_CHUNK}-token chunk -- padding tokens that still "
        "decay or write the state, a tail step skipped or repeated"),
        evidence={"T": int(T), "tail": int(T % FLA_CHUNK)})


def refine(case, got, report):
    """``report`` with the family findings of :func:`value_heads` (first: it names the cause) and
    :func:`extra_decay` (after the primary) added to its diagnosis, its primary restated by :func:`tail`; a PASS
    report unchanged."""
    if report.passed or not report.diagnosis:
        return report
    verdicts = {v.name: v for v in report.verdicts}
    ref = case.reference()
    heads = value_heads(case, got, ref, verdicts)
    decay = extra_decay(case, got, ref, verdicts)
    first = tail(case, report.diagnosis[0], verdicts, decay)
    found = [f for f in (heads, first, decay, *report.diagnosis[1:]) if f is not None]
    report.diagnosis = [dataclasses.replace(f, primary=i == 0) for i, f in enumerate(found)]
    return report
