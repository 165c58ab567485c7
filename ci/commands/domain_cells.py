"""One ``domain`` cell judged: a kernel on the problem of a :class:`Point` (or the call of a mode point, or a family
recipe) for one seed, against the float64 oracle; and the worst over a cell's seeds."""

from __future__ import annotations

import math

import numpy as np

from gdn2_oracle.oracle import RESULTS
from gdn2_oracle.oracle.call_modes import FLA_CHUNK
from gdn2_oracle.oracle.family_recipes import FamilyRecipe

from ..grading.families import FAMILY_RESULTS, FamilyCase
from ..grading.grades import FAIL, grade_rank
from ..grading.modes import ModeCase
from ..grading.references import reference_results
from ..grading.result import error_text
from ..running import families as family_running
from ..running import harness
from ..running import modes as mode_running
from .domain_points import SHAPE, ModePoint, Point, build, build_mode, decay_span


def evaluate(fn, point: Point, seed, shape=SHAPE, chunk=FLA_CHUNK):
    """One cell and seed: ``{"span", "results": {name: {...}} or None (not judged), "note", "diagnosis"}``."""
    problem, do, dfs = build(point, seed, shape)
    cell = {"span": decay_span(problem.g, chunk), "results": None, "note": "", "diagnosis": []}
    with np.errstate(all="ignore"):
        ref = reference_results(problem, do, dfs)
    if not all(np.all(np.isfinite(ref[n])) for n in RESULTS):
        cell["note"] = "float64 reference not finite"
        return cell
    try:
        with np.errstate(all="ignore"):
            report = harness.validate(fn, problem, do, dfs, dtype=point.dtype, ref=ref)
    except Exception as exc:  # noqa: BLE001 - a kernel that raises fails the cell
        cell["note"] = f"error: {error_text(exc)}"
        cell["results"] = {n: {"ratio": math.inf, "grade": FAIL} for n in RESULTS}
        return cell
    return _judged_cell(cell, report)


def _judged_cell(cell, report):
    """``cell`` with a judged report's per-result ratios, grades and diagnosis (a note instead when the
    working-precision baseline is not finite)."""
    if not all(math.isfinite(v.tol_ratio) and math.isfinite(v.tol_max) for v in report.verdicts):
        cell["note"] = "working-precision baseline not finite"
        return cell
    cell["results"] = {v.name: {"ratio": v.ratio, "grade": v.grade, "err_ratio": v.err_ratio,
                                "max_err": v.max_err, "tol_ratio": v.tol_ratio, "tol_max": v.tol_max}
                       for v in report.verdicts}
    cell["diagnosis"] = [str(f) for f in report.diagnosis]
    return cell


def evaluate_mode(fn, point: ModePoint, seed, chunk=FLA_CHUNK):
    """One mode cell and seed, judged by the modes judge (states at chunk starts at the kernel's chunk size): as
    :func:`evaluate`, over the results the call has (``ci.grading.modes.result_names``)."""
    call, do, dfs = build_mode(point, seed)
    dtype = point.recipe.precision
    case = ModeCase.of(call, do, dfs, dtype=dtype)
    kchunk = mode_running.kernel_chunk_size(fn)
    cell = {"span": decay_span(case.diagnosis_problem().g, chunk), "results": None, "note": "", "diagnosis": []}
    with np.errstate(all="ignore"):
        ref = case.reference(kchunk)
    if not all(np.all(np.isfinite(ref[n])) for n in case.names()):
        cell["note"] = "float64 reference not finite"
        return cell
    try:
        with np.errstate(all="ignore"):
            mode_running.check_representable(call, dtype)
            got = mode_running.mode_results(fn, call, do, dfs, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - a kernel that raises fails the cell
        cell["note"] = f"error: {error_text(exc)}"
        cell["results"] = {n: {"ratio": math.inf, "grade": FAIL} for n in case.names()}
        return cell
    with np.errstate(all="ignore"):
        report = case.judge(got, chunk_size=kchunk)
    return _judged_cell(cell, report)


def evaluate_family(fn, recipe: FamilyRecipe, chunk=FLA_CHUNK):
    """One family cell and seed: family kernel ``fn`` on the recipe's call (with the FLA keywords it sets), judged by
    the family judge over ``FAMILY_RESULTS``; as :func:`evaluate`."""
    case = FamilyCase.from_recipe("domain", recipe)
    fcall, do, dfs = case.data()
    cell = {"span": decay_span(case.diagnosis_problem().g, chunk), "results": None, "note": "", "diagnosis": []}
    with np.errstate(all="ignore"):
        ref = case.reference()
    if not all(np.all(np.isfinite(ref[n])) for n in FAMILY_RESULTS):
        cell["note"] = "float64 reference not finite"
        return cell
    try:
        with np.errstate(all="ignore"):
            family_running.check_representable(fcall, recipe.precision)
            got = family_running.family_results(fn, fcall, do, dfs, dtype=recipe.precision, flags=case.flags)
    except Exception as exc:  # noqa: BLE001 - a kernel that raises fails the cell
        cell["note"] = f"error: {error_text(exc)}"
        cell["results"] = {n: {"ratio": math.inf, "grade": FAIL} for n in FAMILY_RESULTS}
        return cell
    with np.errstate(all="ignore"):
        report = case.judge(got)
    return _judged_cell(cell, report)


def worst_of(cells):
    """The worst over a cell's seeds: max ratio and worst grade per result, max span, notes and diagnoses joined."""
    out = {"span": max(c["span"] for c in cells), "results": None,
           "note": "; ".join(sorted({c["note"] for c in cells if c["note"]})),
           "diagnosis": sorted({d for c in cells for d in c["diagnosis"]})}
    judged = [c["results"] for c in cells if c["results"] is not None]
    if judged:
        out["results"] = {n: max((r[n] for r in judged), key=lambda r: (grade_rank(r["grade"]), r["ratio"]))
                          for n in judged[0]}
    return out
