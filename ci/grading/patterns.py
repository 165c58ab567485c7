"""What a kernel's cases share: findings across the :class:`CaseResult` s of one run (docs/DESIGN.md §4, "Diagnosis").

Per primary kind its cases, first bad forward tokens, periods and chunks; "errors begin only at multiples of N
tokens" when the failing cases' onsets share such a stride; then ``pattern`` lines: a feature of the recipes
(``regime``: decay, gates -- ``b`` and ``w`` per channel or equal --, initial state, ``T`` against the chunk sizes,
dtype, modes) that splits the cases cleanly (every failing case has it, every case without it passes, enough cases
on both sides, not by chance); the same for the forward alone when some failing cases differ only in gradients.
:func:`one_chunk` restates the cases' exponent-cancellation findings on one chunk size per kernel.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from gdn2_oracle.oracle import call_modes
from gdn2_oracle.oracle.call_modes import FLA_CHUNK
from gdn2_oracle.oracle.generate import DECAYS, GATES, KERNEL_DTYPES

from .finding import Finding
from .grades import FAIL, PASS, PRECISION
from .localisers import FORWARD, WEAK_CORRELATION, best_chunk, cancellation_text, score_at
from .profiles import CHUNKS
from .result import ERROR, INPUT_ERROR, CaseResult

# A pattern across cases needs at least this many failing cases and this many passing cases without the
# feature, and the failing cases must be unlikely to share it by chance: with as many failures dealt at
# random among the cases, the chance that all land on cases with the feature at most PATTERN_CHANCE.
MIN_PATTERN_CASES = 3
PATTERN_CHANCE = 0.02


def primary(r):
    """A result's primary finding (a dict), else its first, else None."""
    found = r.diagnosis_dicts()
    return next((f for f in found if f.get("primary")), found[0] if found else None)


def length(r):
    """The sequence length ``T`` of a result's case (its shape's second axis), or None."""
    shape = r.case.get("shape")
    return int(shape[1]) if shape is not None and len(shape) >= 2 else None


def gate_varies(r, which):
    """Whether gate ``b`` (which=0) or ``w`` (which=1) varies across channels in a case's recipe (None: unknown)."""
    regime = r.case.get("regime") or {}
    gates = regime.get("gates")
    if gates not in GATES:
        return None
    return GATES[gates][which] in ("uniform", "uniform2") and regime.get("reduction") is None


def case_features(r, modes):
    """``{(family, label, complement, tiebreak): bool}``: the recipe features of one result's case that a pattern
    may name (a feature the case does not record is left out). Of two features of a family that hold for the same
    cases the one with the smaller ``tiebreak`` is named: the larger chunk in "T > C" and "T not a multiple of C"
    (the data has no case between the two), the smaller in "T <= C"."""
    c = r.case
    regime = c.get("regime") or {}
    out = {}

    def both(family, label, complement, value, tiebreak=0):
        out[(family, label, complement, tiebreak)] = value
        out[(family, complement, label, -tiebreak)] = not value

    if c.get("dtype") in KERNEL_DTYPES:
        both("dtype", "in bfloat16", "in float32", c["dtype"] == "bfloat16")
    if regime.get("initial_state") is not None:
        both("h0", "with h0", "without h0", bool(regime["initial_state"]))
    for which, vector in ((0, "b"), (1, "w")):
        varies = gate_varies(r, which)
        if varies is not None:
            both(vector, f"where {vector} varies per channel", f"where {vector} is equal across channels", varies)
    if regime.get("gates") in GATES:
        both("erase", "with the erase gate on (b != 0)", "with b = 0", GATES[regime["gates"]][0] != "zero")
    if regime.get("decay") in DECAYS:
        for d in DECAYS:
            out[("decay", f"under {d} decay", "under the other decays", 0)] = regime["decay"] == d
        both("decay", "with decay (g != 0)", "without decay (g = 0)", regime["decay"] != "none")
    T = length(r)
    if T is not None:
        for C in CHUNKS:
            both("length", f"for T > {C}", f"with T <= {C}", T > C, -C)
            out[("tail", f"where T is not a multiple of {C}", f"where T is a multiple of {C}", -C)] = T % C != 0
    if modes:
        both("mode", "in a training-call mode", f"in the {call_modes.BASE.name} call", bool(r.modes))
    for m in modes:
        both(f"mode {m}", f"in mode {m}", f"without mode {m}", m in r.modes)
    return out


def features(results):
    """``[(family, label, complement, tiebreak, {result index: bool})]`` over ``results``."""
    modes = sorted(set().union(*(r.modes for r in results))) if results else []
    table = defaultdict(dict)
    for i, r in enumerate(results):
        for key, value in case_features(r, modes).items():
            table[key][i] = value
    return [(*key, vals) for key, vals in table.items()]


def clean_splits(results, bad, ok):
    """The features of :func:`features` that split ``bad`` (result indices) from the rest cleanly: every bad
    result has the feature, every one without it is ``ok`` (indices), with enough cases on both sides and not
    by chance (PATTERN_CHANCE); the most specific per family (fewest cases with the feature), most specific
    first: ``[(cases with it, label, complement, [indices without it])]``."""
    best = {}
    for family, label, complement, tiebreak, vals in features(results):
        if any(i not in vals for i in bad) or not all(vals[i] for i in bad):
            continue
        without = [i for i, v in vals.items() if not v]
        if len(bad) < MIN_PATTERN_CASES or len(without) < MIN_PATTERN_CASES or not all(i in ok for i in without):
            continue
        n_with = sum(vals.values())
        if math.comb(n_with, len(bad)) > PATTERN_CHANCE * math.comb(len(vals), len(bad)):
            continue
        if family not in best or (n_with, tiebreak) < best[family][:2]:
            best[family] = (n_with, tiebreak, label, complement, without)
    return [(n, label, complement, without) for n, _, label, complement, without in sorted(best.values(),
                                                                                       key=lambda b: (b[0], b[2]))]


def forward_bad(r):
    """Whether a result's forward (``o``, ``final_state``) is off: a kernel error is; None when it has no verdicts."""
    if r.outcome == ERROR or r.error:
        return True
    if not r.verdicts:
        return None
    return any(v.name in FORWARD and v.grade != PASS for v in r.verdicts)


def off_and_ok(judged):
    """``(bad, ok, verb, plural)``: the cases a pattern splits off (result indices) and those it counts as right --
    the FAIL cases against the rest (a PRECISION case, within the precision-loss bound, never hides a pattern of the
    failures), or, when nothing FAILs, the PRECISION cases against the PASS ones."""
    fails = {i for i, r in enumerate(judged) if r.grade == FAIL}
    if fails:
        return fails, set(range(len(judged))) - fails, "fails", "fail"
    return ({i for i, r in enumerate(judged) if r.grade != PASS}, {i for i, r in enumerate(judged) if r.grade == PASS},
            "is off (FAIL or PRECISION)", "are off")


def passing_phrase(judged, indices):
    """``passes``, or ``passes or is PRECISION`` when one of the cases ``indices`` is within the precision-loss
    bound."""
    return "passes or is PRECISION" if any(judged[i].grade == PRECISION for i in indices) else "passes"


def pattern_lines(results):
    """``pattern`` findings: what the failing cases share that every other case lacks (:func:`off_and_ok`)."""
    judged = [r for r in results if r.grade is not None]
    bad, ok, verb, plural = off_and_ok(judged)
    out = []
    splits = clean_splits(judged, bad, ok)
    for n_with, label, complement, without in splits:
        out.append(Finding("pattern", f"{verb} only {label}: {len(bad)} of the {n_with} case(s) {label} {plural}, "
                                      f"every case {complement} ({len(without)}) {passing_phrase(judged, without)}",
                           evidence={"feature": label, "off": len(bad), "with": n_with,
                                     "passing_without": len(without)}))

    # The forward alone: cases whose forward is right may still differ in gradients (a bug the gradients see
    # everywhere while the forward sees it only under some recipes).
    fb = [forward_bad(judged[i]) for i in sorted(bad)]
    if None in fb or not any(fb) or all(fb):
        return out
    fwd_bad = {i for i, f in zip(sorted(bad), fb) if f}
    fwd_ok = {i for i, r in enumerate(judged) if i not in fwd_bad and forward_bad(r) is False}
    said = {s[1] for s in splits}
    grads = sorted({v.name for i in bad - fwd_bad for v in judged[i].verdicts
                    if v.grade != PASS and v.name not in FORWARD})
    for n_with, label, complement, without in clean_splits(judged, fwd_bad, fwd_ok):
        if label in said:
            continue
        n_without = len(without)
        out.append(Finding("pattern", f"the forward (o, final_state) fails only {label}: wrong in {len(fwd_bad)} of "
                                      f"the {n_with} case(s) {label}, right in every case {complement} ({n_without}); "
                                      f"the other {len(bad - fwd_bad)} off case(s) differ only in gradients "
                                      f"({', '.join(grads)})",
                           evidence={"feature": label, "forward_off": len(fwd_bad), "with": n_with,
                                     "forward_right_without": n_without, "gradients_only": len(bad - fwd_bad)}))
    return out


BF16_SUFFIX = "_bf16"  # a bfloat16 case's name: its float32 twin's (the same recipe) with this suffix


def bfloat16_line(results, said=()):
    """"fails only in bfloat16" when every FAIL case is a bfloat16 one, every float32 case judged passes (or is
    PRECISION) and at least one failing case's float32 twin (its name without :data:`BF16_SUFFIX`: the same recipe)
    is among them -- the evidence the cross-case split (:func:`pattern_lines`, ``said``) needs more cases for."""
    judged = [r for r in results if r.grade is not None]
    fails = [r for r in judged if r.grade == FAIL]
    f32 = {r.name: r for r in judged if r.case.get("dtype") == "float32"}
    if (not fails or any(r.case.get("dtype") != "bfloat16" for r in fails) or not f32
            or any(r.grade == FAIL for r in f32.values()) or any("in bfloat16" in f.text for f in said)):
        return []
    twins = [r.name for r in fails if r.name.endswith(BF16_SUFFIX) and r.name[:-len(BF16_SUFFIX)] in f32]
    if not twins:
        return []
    n_bf16 = sum(r.case.get("dtype") == "bfloat16" for r in judged)
    shown = ", ".join(twins[:4]) + (", ..." if len(twins) > 4 else "")
    f32_list = list(f32.values())
    return [Finding("pattern", f"fails only in bfloat16: {len(fails)} of the {n_bf16} bfloat16 case(s) fail, every "
                               f"float32 case ({len(f32)}) {passing_phrase(f32_list, range(len(f32_list)))}, among "
                               f"them the float32 twins (the same recipe) of {shown}: something kept in the input "
                               "dtype -- a state, a cumulative log-decay, an accumulation -- or rounding only bfloat16 "
                               "inputs reach", evidence={"feature": "in bfloat16", "off": len(fails),
                                                         "twins": twins, "float32": len(f32)})]


def tail_line(results):
    """"the final state only, when T is not a multiple of 64" when every FAIL case's primary finding is ``tail``
    (``ci.grading.family_diagnosis.tail``), with whether the cases judged at ``T`` a multiple of 64 pass."""
    judged = [r for r in results if r.grade is not None]
    fails = [r for r in judged if r.grade == FAIL]
    if not fails or any((primary(r) or {}).get("kind") != "tail" for r in fails):
        return []
    whole = [r for r in judged if length(r) is not None and length(r) % FLA_CHUNK == 0]
    lengths = ", ".join(map(str, sorted({length(r) for r in fails})))
    if whole:
        lead = f"every case with T a multiple of {FLA_CHUNK} ({len(whole)}) {passing_phrase(whole, range(len(whole)))}"
    else:
        lead = f"no case with T a multiple of {FLA_CHUNK} was judged to compare"
    return [Finding("pattern", f"the final state only, when T is not a multiple of {FLA_CHUNK}: {len(fails)} case(s) "
                               f"(T = {lengths}) off in final_state with o exact; {lead}: the last, partial "
                               f"{FLA_CHUNK}-token chunk (padding tokens that decay or write the state)",
                    evidence={"feature": f"T not a multiple of {FLA_CHUNK}", "off": len(fails),
                              "whole_chunk_cases": len(whole)})]


def onset_multiples(bad):
    """A ``pattern`` finding when every token where the failing cases' errors begin (their primary findings'
    first bad tokens, jumps and periodic onsets), token 0 aside, is a multiple of one stride of at least 16
    tokens, seen in at least two cases."""
    onsets, where = set(), set()
    for r in bad:
        f = primary(r)
        if f is None:
            continue
        ev = f.get("evidence") or {}
        ts = {t for t in [f.get("token"), ev.get("jump"), *(ev.get("onsets") or [])] if t}
        onsets |= ts
        if ts:
            where.add(r.name)
    stride = math.gcd(*onsets) if onsets else 0
    if len(where) < 2 or stride < 16:
        return []
    shown = ", ".join(map(str, sorted(onsets)[:8])) + (", ..." if len(onsets) > 8 else "")
    return [Finding("pattern", f"errors begin only at multiples of {stride} tokens (at tokens {shown} in {len(where)} "
                               f"case(s), besides token 0): a {stride}-token chunk or block boundary",
                    period=stride, evidence={"stride": stride, "onsets": sorted(onsets), "cases": len(where)})]


def kind_summary(kind, hits):
    """One kernel-level finding for the cases ``hits`` (``[(result, primary finding dict)]``) whose primary is
    ``kind``: their names, first bad tokens, periods, chunks and results."""
    case_names = sorted({r.name for r, _ in hits})
    shown = ", ".join(case_names[:6]) + (f", ... ({len(case_names)} cases)" if len(case_names) > 6 else "")
    found = [f for _, f in hits]
    tokens = sorted({f["token"] for f in found if f.get("token") is not None})
    periods = sorted({f["period"] for f in found if f.get("period")})
    chunks = [f["chunk"] for f in found if f.get("chunk")]
    results = list(dict.fromkeys(x for f in found for x in f.get("results") or ()))
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
    maps = {(f.get("evidence") or {}).get("head_map") for f in found}
    if kind == "value-heads" and len(maps) == 1 and None not in maps:
        parts.append(f"in every one value head hv reads key head {maps.pop()}, not hv // G")
    if kind in (ERROR, INPUT_ERROR):
        parts.append(found[0]["text"])
    return Finding(kind, f"{len(case_names)} case(s): {shown}" + "".join(f"; {p}" for p in parts),
                   tokens[0] if tokens else None, results=tuple(results),
                   period=periods[0] if len(periods) == 1 else None,
                   chunk=max(set(chunks), key=chunks.count) if chunks else None)


CANCELLATION = "exponent-cancellation"


def _scores(case):
    """``(finding index, {chunk: correlation})`` of a case record's exponent-cancellation finding, or None."""
    for i, f in enumerate(case.get("diagnosis") or []):
        corr = (f.get("evidence") or {}).get("correlation")
        if f.get("kind") == CANCELLATION and corr:
            return i, {int(c): x for c, x in corr.items()}
    return None


def one_chunk(cases):
    """One chunk size for a kernel: its case records (JSON dicts, as ``validate`` keeps them) with their
    exponent-cancellation findings restated on the chunk whose ``|G|`` their errors follow best on average over
    those cases (:func:`localisers.score_at` for a case too short to tell two sizes apart), so that one kernel is
    never said to behave like a chunk-32 kernel in one case and a chunk-256 one in the next. Fewer than two such
    cases: unchanged. Returns the new records (the others as they are) and the chunk, or None."""
    scored = [(n, *x) for n, c in enumerate(cases) if (x := _scores(c)) is not None]
    if len(scored) < 2:
        return list(cases), None
    sizes = sorted({c for _, _, score in scored for c in score})
    mean = {c: sum(score_at(score, c) for _, _, score in scored) / len(scored) for c in sizes}
    chunk = best_chunk(mean)
    if mean[chunk] < WEAK_CORRELATION:
        return list(cases), None
    out = list(cases)
    for n, i, _ in scored:
        found = list(out[n]["diagnosis"])
        old = found[i]
        new = cancellation_text(old["evidence"], chunk, pooled=(len(scored), mean[chunk])).as_dict()
        found[i] = {**old, "text": new["text"], "chunk": new["chunk"]}
        out[n] = {**out[n], "diagnosis": found}
    return out, chunk


def diagnose_kernel(results):
    """Findings across one kernel's case results (:class:`CaseResult`, or their JSON records): per primary kind
    its cases, first bad forward tokens and periods (the most common kind first, marked primary), then the
    ``pattern`` lines."""
    results = [r if isinstance(r, CaseResult) else CaseResult.from_dict(r) for r in results]
    bad = [r for r in results if r.grade not in (PASS, None)]
    if not bad:
        return []
    by_kind = defaultdict(list)
    for r in bad:
        f = primary(r)
        if f is not None:
            by_kind[f["kind"]].append((r, f))
    out = [kind_summary(kind, hits) for kind, hits in sorted(by_kind.items(), key=lambda kv: -len(kv[1]))]
    lines = pattern_lines(results)
    out += onset_multiples(bad) + tail_line(results) + lines + bfloat16_line(results, lines)
    return [replace(f, primary=i == 0) for i, f in enumerate(out)]
