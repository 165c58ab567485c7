"""``gdn2-oracle domain``: where a kernel stops being right -- error / tolerance over the regimes that decide it.

One-at-a-time sweeps around a base :class:`Point`: per-token log-decay strength on a log grid (and the
oracle's ``resets`` regime), reported with the within-chunk log-decay span it produces; erase- and
write-gate magnitude; q/k norm (normalised, or raw at several norms); initial state; sequence length;
each sweep in the dtypes its :class:`Axis` names. Problems are built here from seeds (never by a
kernel) and every cell is judged by the tolerance model against the float64 oracle: its value is the
worst error / tolerance (``Verdict.ratio``: the larger of the rms and max metrics' ratios) over its
seeds and its grade the worst grade. Output: heat maps (PNG), JSON and a one-paragraph summary stating
where each result leaves PASS along each sweep.

Training-call modes (``modes``; docs/modes.md): each selected mode the kernel accepts adds its sweeps of
:class:`ModePoint` s -- an :class:`oracle.mode_recipes.ModeRecipe` at the same small shape, plus an override
where the recipe has no field for the swept quantity -- judged by the modes judge (``ci/grading/modes.py``):
packed lengths around the chunk and the number of packed sequences (varlen), ``lower_bound`` and ``A_log``
(gate), the raw q/k row norm down to 0 (l2norm), the length (intermediate), the initial state in the
``[V, K]`` layout (state_v_first). A mode the kernel does not accept is named in the summary, not swept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.golden.processes import signalled
from gdn2_oracle.oracle import KERNEL_DTYPES, RESULTS
from gdn2_oracle.oracle.generate import log_decay, round_to
from gdn2_oracle.oracle import call_modes, mode_recipes
from gdn2_oracle.oracle.mode_recipes import MODES

from ..grading.diagnose import chunk_log_decay
from ..grading.grades import FAIL, PASS, PRECISION, grade_rank
from ..grading.modes import MODE_RESULTS, ModeCase, result_names
from ..grading.references import reference_results
from ..running import harness
from ..running import modes as mode_running
from ..running.watchdog import Watchdog
from . import args as cli_args
from .output import (EXIT, UsageError, interrupt_error, output_dir, progress, say_interrupted, stop_run, table,
                     timed_out, write_after_work, write_json)
from .provenance import environment

SCHEMA = "gdn2-oracle/domain/3"  # 2: + interrupted; 3: + modes, not_accepted_modes (and mode panels)
RESETS = "resets"  # the oracle's resets regime, as a value of the decay-strength sweep
SHAPE = (1, 2, 16, 16)  # (B, H, K, V): small and fixed, so a kernel compiles once per (T, dtype)
DEFAULT_CHUNK = 64  # the span is measured over chunks of the kernel's chunk_size, else of this many tokens


@dataclass(frozen=True)
class Point:
    """One regime: every input is drawn from a seed by :func:`build`.

    ``strength``: g = -strength * U(0.5, 1.5) per token and channel, or ``"resets"`` (the oracle's
    regime); ``erase``, ``write``: b = erase * U(0.9, 1), w = write * U(0.9, 1); ``qk``: ``"l2"``
    (unit-norm q, k) or a number r (raw: standard normal * r / sqrt(K), norm ~ r).
    """

    strength: float | str = 0.1
    erase: float = 1.0
    write: float = 1.0
    qk: str | float = "l2"
    T: int = 256
    initial_state: bool = True
    dtype: str = "float32"

    def __post_init__(self):
        if not (self.strength == RESETS or _nonnegative(self.strength)):
            raise ValueError(f"strength: expected a number >= 0 or {RESETS!r}, got {self.strength!r}")
        for name in ("erase", "write"):
            if not _nonnegative(getattr(self, name)):
                raise ValueError(f"{name}: expected a number >= 0, got {getattr(self, name)!r}")
        if not (self.qk == "l2" or (_nonnegative(self.qk) and self.qk > 0)):
            raise ValueError(f"qk: expected 'l2' or a positive norm, got {self.qk!r}")
        if isinstance(self.T, bool) or not isinstance(self.T, (int, np.integer)) or self.T < 1:
            raise ValueError(f"T: expected a positive integer, got {self.T!r}")
        if self.dtype not in KERNEL_DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} not one of {KERNEL_DTYPES}")

    def replace(self, **changes):
        """A new validated Point with some fields replaced."""
        return dataclasses.replace(self, **changes)


def _nonnegative(x):
    return not isinstance(x, (bool, str)) and isinstance(x, (int, float, np.number)) and math.isfinite(x) and x >= 0


def build(point: Point, seed=0, shape=SHAPE):
    """``(problem, do, dfinal_state)`` of a point: inputs rounded to its dtype, cotangents from the same seed."""
    B, H, K, V = shape
    ks, vs = (B, point.T, H, K), (B, point.T, H, V)
    rng = np.random.default_rng(seed)

    def query_key():
        x = rng.standard_normal(ks)
        return x / np.linalg.norm(x, axis=-1, keepdims=True) if point.qk == "l2" else x * (point.qk / np.sqrt(K))

    # Every draw happens whatever the point, so neighbouring points share their random numbers.
    q, k, v = query_key(), query_key(), rng.standard_normal(vs)
    jitter = rng.uniform(0.5, 1.5, ks)
    if point.strength == RESETS:
        g = log_decay(np.random.default_rng([seed, 1]), ks, RESETS)
    else:
        g = -point.strength * jitter
    b = point.erase * rng.uniform(0.9, 1.0, ks)
    w = point.write * rng.uniform(0.9, 1.0, vs)
    h0 = rng.standard_normal((B, H, K, V))
    dt = point.dtype
    problem = oracle.Problem(round_to(q, dt), round_to(k, dt), round_to(v, dt), np.minimum(round_to(g, dt), 0.0),
                             round_to(b, dt), round_to(w, dt),
                             initial_state=round_to(h0, "float32") if point.initial_state else None)
    return (problem, *oracle.random_cotangents(problem, seed, dt))


def decay_span(g, chunk):
    """The largest within-chunk log-decay span ``max |G|`` over chunks of ``chunk`` tokens, rows and channels."""
    return float(np.max(chunk_log_decay(g, chunk)))


# --- grids ------------------------------------------------------------------------------------

class Axis(NamedTuple):
    """A sweep of one :class:`Point` field over ``values``, run in each of ``dtypes``."""

    field: str
    label: str
    values: tuple
    dtypes: tuple = ("float32",)


# --- training-call modes: their sweeps are the registry's (oracle/call_modes.py) ------------------------

PLAIN = call_modes.BASE.name  # the plain dense call's sweeps (the Point axes)
MODE_T = call_modes.MODE_T  # the length of a mode call that is not packed
MODE_VALUES = call_modes.sweep_values()  # ``"mode.quantity"`` -> the swept values
UNORDERED = ("qk", "initial_state", *call_modes.UNORDERED_SWEEPS)  # no order to cross
ModePoint = mode_recipes.ModePoint


def build_mode(point: ModePoint, seed=0):
    """``(call, do, dfinal_state)`` of a mode point with data seed ``seed`` (the recipe's call, overridden)."""
    return point.build(seed)


def mode_points(sweep, values, shape, dtype):
    """The :class:`ModePoint` of each value of a mode sweep (``"mode.quantity"``) at (H, K, V) of ``shape``."""
    return mode_recipes.sweep_points(sweep, values, shape, dtype)


def mode_value_label(sweep, value):
    """How a mode sweep's value is printed."""
    return call_modes.SWEEPS[sweep].shown(value)


class Grid(NamedTuple):
    """Sweeps around ``base`` on problems of ``shape`` = (B, H, K, V), each cell over ``seeds`` seeds; the mode
    sweeps (:data:`MODE_VALUES`) in ``mode_dtypes`` at the same H, K, V."""

    name: str
    axes: tuple
    seeds: int = 1
    base: Point = Point()
    shape: tuple = SHAPE
    mode_values: dict = MODE_VALUES
    mode_dtypes: tuple = ("float32",)


def _strengths(per_decade):
    return tuple(float(f"{s:.3g}") for s in np.logspace(-4, 3, 7 * per_decade + 1)) + (RESETS,)


BOTH = tuple(KERNEL_DTYPES)
GRIDS = {
    "quick": Grid("quick", (
        Axis("strength", "log-decay strength s", _strengths(2), BOTH),
        Axis("erase", "erase gate b", (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)),
        Axis("write", "write gate w", (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)),
        Axis("qk", "q/k norm", ("l2", 0.5, 1.0, 1.5)),
        Axis("initial_state", "initial state", (False, True)),
        Axis("T", "length T", (1, 63, 65, 256, 1000, 1024)),
    ), seeds=1),
    "full": Grid("full", (
        Axis("strength", "log-decay strength s", _strengths(4), BOTH),
        Axis("erase", "erase gate b", tuple(np.round(np.arange(0, 2.01, 0.125), 3).tolist()), BOTH),
        Axis("write", "write gate w", (0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0), BOTH),
        Axis("qk", "q/k norm", ("l2", 0.25, 0.5, 0.75, 1.0, 1.25, 1.5), BOTH),
        Axis("initial_state", "initial state", (False, True), BOTH),
        Axis("T", "length T", (1, 2, 15, 17, 63, 64, 65, 127, 129, 255, 256, 257, 511, 513, 1000, 1024, 1025,
                               2048, 4100), BOTH),
    ), seeds=3, mode_dtypes=BOTH),
}


def value_label(field, value):
    """How a swept value is printed: ``raw x1.5``, ``on``/``off``, ``1e-04``."""
    if field == "qk":
        return "l2" if value == "l2" else f"raw x{value:g}"
    if field == "initial_state":
        return "on" if value else "off"
    if field == "strength" and value != RESETS:
        return f"{value:.0e}" if value < 0.01 or value >= 1000 else f"{value:g}"
    return str(value) if isinstance(value, str) else f"{value:g}"


# --- running ----------------------------------------------------------------------------------

def evaluate(fn, point: Point, seed, shape=SHAPE, chunk=DEFAULT_CHUNK):
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
        cell["note"] = f"error: {type(exc).__name__}: {exc}"
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


def evaluate_mode(fn, point: ModePoint, seed, chunk=DEFAULT_CHUNK):
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
        cell["note"] = f"error: {type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
        cell["results"] = {n: {"ratio": math.inf, "grade": FAIL} for n in case.names()}
        return cell
    with np.errstate(all="ignore"):
        report = case.judge(got, chunk_size=kchunk)
    return _judged_cell(cell, report)


def _worst(cells):
    """The worst over a cell's seeds: max ratio and worst grade per result, max span, notes and diagnoses joined."""
    out = {"span": max(c["span"] for c in cells), "results": None,
           "note": "; ".join(sorted({c["note"] for c in cells if c["note"]})),
           "diagnosis": sorted({d for c in cells for d in c["diagnosis"]})}
    judged = [c["results"] for c in cells if c["results"] is not None]
    if judged:
        out["results"] = {n: max((r[n] for r in judged), key=lambda r: (grade_rank(r["grade"]), r["ratio"]))
                          for n in judged[0]}
    return out


class Panel(NamedTuple):
    """One sweep in one dtype: ``field`` (a :class:`Point` field, or ``"mode.quantity"``), its ``mode`` (``dense``
    for the Point sweeps), the swept values with their labels and the point of each (Point or ModePoint)."""

    field: str
    label: str
    dtype: str
    mode: str
    values: tuple
    labels: tuple
    points: tuple


def panels(grid: Grid, modes=(PLAIN,)):
    """``[Panel]``: every sweep of the grid in each of its dtypes (``dense`` in ``modes``), then the sweeps of the
    other ``modes`` (:data:`MODE_VALUES`, in ``grid.mode_dtypes``)."""
    out = []
    fields = {f.name for f in dataclasses.fields(Point)}
    if PLAIN in modes:
        for axis in grid.axes:
            if axis.field not in fields or axis.field == "dtype":
                raise ValueError(f"grid: axis field {axis.field!r} is not a Point field to sweep")
            for dtype in axis.dtypes:
                out.append(Panel(axis.field, axis.label, dtype, PLAIN, tuple(axis.values),
                                 tuple(value_label(axis.field, v) for v in axis.values),
                                 tuple(grid.base.replace(**{axis.field: v, "dtype": dtype}) for v in axis.values)))
    for sweep, values in grid.mode_values.items():
        mode = call_modes.sweep_mode(sweep)
        if mode in modes:
            for dtype in grid.mode_dtypes:
                out.append(Panel(sweep, call_modes.sweep_label(sweep), dtype, mode, tuple(values),
                                 tuple(mode_value_label(sweep, v) for v in values),
                                 tuple(mode_points(sweep, values, grid.shape, dtype))))
    return out


def run_domain(fn, grid: Grid, *, kernel="kernel", seed=0, show_progress=True, modes=(PLAIN,), case_timeout=None,
               on_stop=None):
    """Sweep ``grid`` with kernel ``fn``: the domain report (panels of cells, boundaries, summary).

    ``modes``: ``dense`` (the Point sweeps) and training-call modes; a mode the kernel's signature does not accept
    is listed in ``not_accepted_modes`` and not swept. ``case_timeout`` (seconds; 0 or None: none) and
    ``on_stop(report)``: a watchdog (ci/running/watchdog.py) stops the sweep when a kernel call passes the limit (that
    cell FAIL, timed out) or hangs through Ctrl-C / SIGTERM; ``on_stop`` gets the cells finished so far, marked
    interrupted, and the process ends (exit 1, 130, 143).
    """
    modes = tuple(modes)
    chunk = int(getattr(fn, "chunk_size", None) or DEFAULT_CHUNK)
    accepted = mode_running.accepted_modes(fn)
    not_accepted = [m for m in modes if not call_modes.is_base(m) and m not in accepted]
    todo = panels(grid, [m for m in modes if m not in not_accepted])
    seeds = [seed + i for i in range(grid.seeds)]
    cache = {}
    start = time.perf_counter()
    total = sum(len(p.points) for p in todo) * len(seeds)
    bar = progress(total=total, desc=f"domain {kernel}", unit="cell") if show_progress else None
    out_panels, interrupted = [], False
    current = {}

    def report_of(done_panels, was_interrupted):
        was_interrupted = was_interrupted or signalled() is not None  # a signal whose exception was swallowed too
        if was_interrupted:  # a kernel call the interrupt broke off was not judged
            for p in done_panels:
                p["cells"] = [c for c in p["cells"] if not interrupt_error(c["note"])]
        report = DomainReport(kernel=kernel, grid=grid.name, seeds=seeds, chunk=chunk,
                              shape=dict(zip("BHKV", grid.shape)), base=dataclasses.asdict(grid.base),
                              results=list(RESULTS), panels=[p for p in done_panels if p["cells"]],
                              seconds=time.perf_counter() - start, environment=environment(),
                              interrupted=was_interrupted, modes=list(modes), not_accepted_modes=not_accepted)
        report.boundaries = boundaries(report)
        report.summary = summary(report)
        return report

    def stop(reason, where):  # from the watchdog's thread: the main thread is stuck in a kernel
        if reason == "timeout" and current:
            point = current["point_obj"]
            names = RESULTS if isinstance(point, Point) else result_names(build_mode(point)[0])
            current["panel"]["cells"].append({
                "value": current["value"], "label": current["label"], "point": current["point"], "span": math.nan,
                "results": {n: {"ratio": math.inf, "grade": FAIL} for n in names}, "note": timed_out(case_timeout),
                "diagnosis": []})
        report = report_of(out_panels, True)
        stop_run(reason, case_timeout, "domain cells", lambda: on_stop(report) if on_stop is not None else None)

    with bar or contextlib.nullcontext(), Watchdog(case_timeout, stop) as dog:
        try:
            for panel in todo:
                cells = []
                out = {"field": panel.field, "label": panel.label, "dtype": panel.dtype, "mode": panel.mode,
                       "cells": cells}
                out_panels.append(out)
                for value, label, point in zip(panel.values, panel.labels, panel.points):
                    on_point = isinstance(point, Point)
                    as_dict = dataclasses.asdict(point) if on_point else point.as_dict()
                    current.update(panel=out, value=value, label=label, point=as_dict, point_obj=point)
                    runs = []
                    for s in seeds:
                        if (point, s) not in cache:
                            with dog.case(f"{panel.label} {label} seed {s}"):
                                cache[point, s] = (evaluate(fn, point, s, grid.shape, chunk) if on_point
                                                   else evaluate_mode(fn, point, s, chunk))
                        runs.append(cache[point, s])
                        if bar is not None:
                            bar.update(1)
                    cells.append({"value": value, "label": label, "point": as_dict, **_worst(runs)})
                    current.clear()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep the cells finished so far, marked interrupted
            interrupted = True
    return report_of(out_panels, interrupted)


@dataclass
class DomainReport:
    """A domain map: per sweep (panel) its cells (plain JSON dicts), the boundaries found and the summary."""

    kernel: str
    grid: str
    seeds: list
    chunk: int
    shape: dict
    base: dict
    results: list
    panels: list
    seconds: float
    environment: dict
    interrupted: bool = False  # Ctrl-C: only the cells finished before it
    modes: list = dataclasses.field(default_factory=lambda: [PLAIN])  # the sweeps selected (--modes)
    not_accepted_modes: list = dataclasses.field(default_factory=list)  # selected, not in the kernel's signature
    boundaries: list = dataclasses.field(default_factory=list)
    summary: str = ""

    def to_json(self):
        """The JSON report (schema :data:`SCHEMA`)."""
        return {"schema": SCHEMA, **dataclasses.asdict(self)}


# --- boundaries and the summary ------------------------------------------------------------

def _pos(panel, cell):
    """How a cell's position is named in a sentence (a decay strength by the span it produced, then s)."""
    if panel["field"] == "strength" and cell["value"] != RESETS:
        return f"{cell['span']:.3g} (s = {cell['label']})"
    return cell["label"]


def _subject(panel, chunk):
    if panel["field"] == "strength":
        return f"the {chunk}-token log-decay span"
    return panel["label"]


def _runs(grades):
    """``[(grade, first index, last index)]`` of the runs of equal grades."""
    runs = []
    for i, g in enumerate(grades):
        if runs and runs[-1][0] == g:
            runs[-1] = (g, runs[-1][1], i)
        else:
            runs.append((g, i, i))
    return runs


def panel_results(panel):
    """The results a panel's cells were judged on, in report order (the nine dense ones; a mode call's may add
    ``intermediate_states``, ``dA_log``, ``ddt_bias``)."""
    have = {n for c in panel["cells"] if c["results"] is not None for n in c["results"]}
    return [n for n in MODE_RESULTS if n in have] if not call_modes.is_base(panel.get("mode", PLAIN)) else list(RESULTS)


def result_boundary(panel, name, chunk):
    """Where result ``name`` leaves PASS along a panel, as a predicate with ``{leaves}``/``{is}`` for the verb
    (None if it is PASS in every judged cell)."""
    cells = [c for c in panel["cells"] if c["results"] is not None and name in c["results"]]
    ordered = [c for c in cells if c["value"] != RESETS]
    grades = [c["results"][name]["grade"] for c in ordered]
    runs, subject = _runs(grades), _subject(panel, chunk)
    text = ""
    if len(runs) == 1 and runs[0][0] != PASS:
        text = f"{{is}} {runs[0][0]} at every {panel['label']} ({ordered[0]['label']}-{ordered[-1]['label']})"
    elif len(runs) > 1 and panel["field"] in UNORDERED:  # no order: name the cells
        bad = {}
        for c, g in zip(ordered, grades):
            if g != PASS:
                bad.setdefault(g, []).append(c["label"])
        text = f"{{is}} not PASS along {subject}: " + "; ".join(f"{g} at {', '.join(v)}" for g, v in bad.items())
    elif len(runs) > 1:
        g, _, j = runs[0]
        later = ", ".join(f"{h}{' again' if h == g == PASS else ''} from {_pos(panel, ordered[i])}"
                          for h, i, _ in runs[1:])
        if g == PASS:
            text = f"{{leaves}} PASS once {subject} exceeds ~{_pos(panel, ordered[j])}: {later}"
        elif j == 0:
            text = f"{{is}} {g} at {panel['label']} {_pos(panel, ordered[0])}, {later}"
        else:
            text = f"{{is}} {g} along {subject} up to {_pos(panel, ordered[j])}, {later}"
    resets = [c for c in cells if c["value"] == RESETS]
    if resets and resets[0]["results"][name]["grade"] != PASS:
        grade = resets[0]["results"][name]["grade"]
        text += f"; {grade} under resets" if text else f"{{is}} {grade} under resets"
    return text or None


def sentence(names, predicate, every=RESULTS):
    """``predicate`` (from :func:`result_boundary`) with its subject: every result (all of ``every``), or the named
    ones."""
    if list(names) == list(every):
        subject, plural = "every result", False
    else:
        subject, plural = ", ".join(f"`{n}`" for n in names), len(names) > 1
    return f"{subject} " + predicate.format(leaves="leave" if plural else "leaves", **{"is": "are" if plural else "is"})


def boundaries(report):
    """``[{"panel", "label", "dtype", "results", "text"}]``: the results sharing each boundary, per panel."""
    out = []
    for panel in report.panels:
        groups = {}
        every = panel_results(panel)
        for name in every:
            predicate = result_boundary(panel, name, report.chunk)
            if predicate:
                groups.setdefault(predicate, []).append(name)
        for predicate, names in groups.items():
            out.append({"panel": panel["field"], "label": panel["label"], "dtype": panel["dtype"],
                        "results": names, "every": len(names) == len(every),
                        "text": sentence(names, predicate, every)})
    return out


def _range_of(panel):
    values = [c["label"] for c in panel["cells"]]
    return f"{values[0]}-{values[-1]}" if len(values) > 2 else " and ".join(values)


def worst_cell(report):
    """``{ratio, result, label, value, dtype}`` of the largest finite error / tolerance of any judged cell."""
    found = [(float(r["ratio"]), name, p["label"], c["label"], p["dtype"]) for p in report.panels
             for c in p["cells"] if c["results"] is not None for name, r in c["results"].items()
             if math.isfinite(float(r["ratio"]))]
    if not found:
        return None
    return dict(zip(("ratio", "result", "label", "value", "dtype"), max(found)))


def summary(report):
    """One paragraph: the base point, then each boundary found, then the sweeps with none."""
    mapped = " mapped before the interrupt" if report.interrupted else ""
    base = Point(**report.base)
    shape = report.shape
    modes = getattr(report, "modes", [PLAIN])
    swept = [m for m in modes if not call_modes.is_base(m) and m not in report.not_accepted_modes]
    plain = (f"B={shape['B']}, H={shape['H']}, K={shape['K']}, V={shape['V']}; base: T={base.T}, log-decay strength "
             f"{value_label('strength', base.strength)}, erase ~{base.erase:g}, write ~{base.write:g}, "
             f"q/k {value_label('qk', base.qk)}, initial state {value_label('initial_state', base.initial_state)}")
    calls = (f"mode sweeps {', '.join(swept)}: FLA training calls at H={shape['H']}, K={shape['K']}, V={shape['V']}, "
             f"T={MODE_T} unless swept, initial state on, judged by the modes judge")
    parts = ([plain] if PLAIN in modes else []) + ([calls] if swept else [])
    text = (f"{report.kernel} ({report.grid} grid, {len(report.seeds)} seed(s) per cell; {'; '.join(parts)}, "
            "float32 unless stated):")
    said = [("in bfloat16, " if b["dtype"] == "bfloat16" else "") + b["text"] for b in report.boundaries]
    clean_text = (f"every result is PASS in every cell{mapped}." if judged_cells(report) else
                  "no cell was judged before the interrupt." if report.interrupted else
                  "no cell was judged (EMPTY: nothing is known about the kernel; not a pass).")
    text += " " + ("; ".join(said) + "." if said else clean_text)
    if report.not_accepted_modes:
        text += (f" Not swept: {', '.join(report.not_accepted_modes)} (the kernel's signature does not accept the "
                 "mode's keywords; not a failure).")
    if report.interrupted:
        text += " INTERRUPTED: only the cells finished before the interrupt are mapped."
    worst = worst_cell(report)
    if worst and not said:
        text = text[:-1] + (f" (worst error / tolerance {worst['ratio']:.2g}: `{worst['result']}` at {worst['label']} "
                            f"{worst['value']}, {worst['dtype']}).")
    clean = [p for p in report.panels if not any(b["panel"] == p["field"] and b["dtype"] == p["dtype"]
                                                    for b in report.boundaries)]
    if clean and said:
        dtypes = {}
        for p in clean:
            dtypes.setdefault((p["label"], _range_of(p)), []).append(p["dtype"])
        text += f" Every result is PASS{mapped} along " + ", ".join(
            f"{label} {span}{'' if d == ['float32'] else ' (' + ' and '.join(d) + ')'}"
            for (label, span), d in dtypes.items()) + "."
    na = sorted({f"{p['label']} {c['label']} ({p['dtype']}): {c['note']}" for p in report.panels
                 for c in p["cells"] if c["results"] is None})
    if na:
        text += " Not judged: " + "; ".join(na) + "."
    raised = {}
    for p in report.panels:
        for c in p["cells"]:
            if c["note"].startswith("error: "):
                raised.setdefault(c["note"].removeprefix("error: "), set()).add(f"{p['label']} ({p['dtype']})")
    for error, where in raised.items():
        text += f" The kernel raised {error!r} in cells of {', '.join(sorted(where))}."
    return text


# --- the heat maps ----------------------------------------------------------------------------

def _short(x):
    """Two significant digits, without an exponent from 10 to 1e6 (a tick label)."""
    return f"{float(f'{x:.2g}'):.0f}" if 10 <= x < 1e6 else f"{x:.2g}"


def _panel_image(ax, panel, names, cmap, norm, chunk):
    """Draw one sweep: rows = results, columns = swept values, colour = log10(error / tolerance)."""
    cells = panel["cells"]
    data = np.full((len(names), len(cells)), np.nan)
    for j, c in enumerate(cells):
        for i, n in enumerate(names):
            if c["results"] is not None and n in c["results"]:
                r = float(c["results"][n]["ratio"])  # inf (NaN/inf in a result, a raising kernel): "over"
                data[i, j] = norm.vmin if r <= 0 else 2 * norm.vmax if not math.isfinite(r) else np.log10(r)
    image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    for j, c in enumerate(cells):
        for i, n in enumerate(names):
            g = c["results"][n]["grade"] if c["results"] is not None and n in c["results"] else PASS
            if g != PASS:
                ax.text(j, i, "x" if g == FAIL else "~", ha="center", va="center", fontsize=9, color="white",
                        fontweight="bold")
    strength = panel["field"] == "strength"
    labels = [f"{c['label']}\n{_short(c['span'])}" if strength else c["label"] for c in cells]
    ax.set_xticks(range(len(cells)), labels, fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel(panel["label"] + (f"  /  {chunk}-token log-decay span" if strength else ""), fontsize=8)
    ax.set_title(f"{panel['label']} ({panel['dtype']})", fontsize=9)
    return image


def plot(report, path):
    """Heat maps (PNG): one panel per sweep, rows = results, colour = log10(error / tolerance), marks = grade."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    cmap = plt.get_cmap("RdYlGn_r").with_extremes(over="#3b0000", bad="#c8c8c8")
    norm = Normalize(vmin=-3, vmax=3)
    ps = report.panels
    if not ps:  # interrupted before the first cell, or no sweep the kernel accepts: a page that says so
        fig = plt.figure(figsize=(6, 1.5))
        fig.text(0.5, 0.5, f"{report.kernel}: no cell to map", ha="center", va="center")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return
    # Long sweeps take a whole row, short ones share a row two by two.
    rows = [[i, i] for i, p in enumerate(ps) if len(p["cells"]) > 8]
    short = [i for i, p in enumerate(ps) if len(p["cells"]) <= 8]
    rows += [[short[j], short[j + 1] if j + 1 < len(short) else "."] for j in range(0, len(short), 2)]
    width = max(12.0, 0.5 * max(len(p["cells"]) for p in ps))  # about half an inch per column
    fig, axes = plt.subplot_mosaic(rows, figsize=(width, 2.7 * len(rows) + 1.0), layout="constrained",
                                   empty_sentinel=".")
    images = [_panel_image(axes[i], p, panel_results(p), cmap, norm, report.chunk) for i, p in enumerate(ps)]
    fig.suptitle(f"{report.kernel}: error / tolerance ({report.grid} grid; x = {FAIL}, ~ = {PRECISION}, "
                 "grey = not judged)", fontsize=10)
    fig.colorbar(images[0], ax=list(axes.values()), orientation="horizontal", fraction=0.03, aspect=60,
                 extend="both", label="log10(error / tolerance)   (0 = at tolerance)")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(report, out_dir):
    """Write ``domain.json``, ``domain.png`` and ``summary.txt`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "domain.json", "png": out / "domain.png", "summary": out / "summary.txt"}
    write_json(paths["json"], report.to_json())
    plot(report, paths["png"])
    paths["summary"].write_text(report.summary + "\n", encoding="utf-8")
    return paths


def _where(boundary):
    """A boundary's sentence without its subject ("every result leaves PASS once ..." -> "once ...")."""
    text = boundary["text"]
    for verb in (" leaves PASS ", " leave PASS ", " is ", " are "):
        if verb in text:
            return text.split(verb, 1)[1]
    return text


def format_domain(report):
    """The text the CLI prints: a short table of where each result leaves PASS along each sweep, and the verdict
    (the full paragraph is summary.txt and the JSON's ``summary``)."""
    cells = sum(len(p["cells"]) for p in report.panels)
    lines = [f"gdn2-oracle domain: {report.kernel}, {report.grid} grid, {cells} cells x {len(report.seeds)} "
             f"seed(s) in {report.seconds:.0f} s", ""]
    rows = [[b["label"], b["dtype"], "all" if b.get("every", len(b["results"]) == len(RESULTS)) else
             ", ".join(b["results"]), _where(b)] for b in report.boundaries]
    clean = [f"{p['label']} ({p['dtype']})" for p in report.panels
             if not any(b["panel"] == p["field"] and b["dtype"] == p["dtype"] for b in report.boundaries)]
    if rows:
        lines.append(table(["sweep", "dtype", "results", "where they leave PASS"], rows))
    if clean:
        lines += ["", f"PASS everywhere{' mapped before the interrupt' if report.interrupted else ''} along: "
                  + ", ".join(clean)]
    if report.not_accepted_modes:
        lines += ["", f"not swept: {', '.join(report.not_accepted_modes)} (not accepted by the kernel's signature; "
                      "not a failure)"]
    failed = failed_cells(report)
    verdict = (f"FAIL in {failed} of {cells} cells" if failed else
               "no FAIL" if judged_cells(report) or report.interrupted else "EMPTY: no cell judged (not a pass)")
    lines += ["", f"domain: {verdict}{' (INTERRUPTED)' if report.interrupted else ''}"]
    return "\n".join(lines)


def add_parser(sub):
    """``gdn2-oracle domain``."""
    d = sub.add_parser("domain", help="heat maps of error / tolerance over decay, gates, q/k norms, length, dtype",
                       description="Sweep the regimes that decide correctness (log-decay strength and the within-chunk "
                                   "span it gives, resets, erase and write gates, q/k norms, initial state, length, "
                                   "dtype) and write heat maps (PNG), JSON and a summary of where each result leaves "
                                   "PASS.")
    cli_args.add_kernels(d, one=True)
    d.add_argument("--grid", choices=tuple(GRIDS), default="quick",
                   help="quick (default: under a minute for a pure-JAX kernel on CPU) or full (finer, 3 seeds per "
                        "cell, every sweep in both dtypes: a few minutes)")
    d.add_argument("--out", metavar="DIR", help="output directory (default domain-NAME): domain.png, domain.json, "
                                                "summary.txt")
    d.add_argument("--seed", type=cli_args.nonnegative, default=0, help="first data seed of every cell")
    d.add_argument("--modes", type=cli_args.call_modes, default=(PLAIN,), metavar="LIST",
                   help=f"sweeps to run, comma-separated among {call_modes.listed((PLAIN, *MODES))} or all (default "
                        f"{PLAIN}: the regime sweeps above; a training-call mode adds its own sweeps, judged by the "
                        f"modes judge, where the kernel accepts it; all: {PLAIN} and every mode the kernel accepts)")
    cli_args.add_case_timeout(d, "cell")
    cli_args.add_run_options(d, mesh_jobs=False)



def run(args):
    """Sweep, write the heat maps, JSON and summary, print the summary; the exit status."""
    [spec] = cli_args.specs(args.kernel)
    fn = cli_args.build(spec)
    if args.out is not None and not args.out.strip():
        raise UsageError("gdn2-oracle domain: error: --out: expected a directory, got an empty path")
    out = output_dir(args.out or "domain-" + re.sub(r"[^A-Za-z0-9_.=-]+", "_", spec.label()), option="--out")
    paths = {}

    def show_and_write(report):  # after the sweep, or when the watchdog stopped it (the cells finished so far)
        print(format_domain(report), flush=True)
        if write_after_work("--out", out, lambda: paths.update(write(report, out))):
            print(f"wrote: {paths['png']}, {paths['json']}, {paths['summary']}", flush=True)

    report = run_domain(fn, GRIDS[args.grid], kernel=spec.spec, seed=args.seed, show_progress=not args.no_progress,
                        modes=args.modes, case_timeout=args.case_timeout, on_stop=show_and_write)
    show_and_write(report)
    if report.interrupted:
        say_interrupted(sum(len(p["cells"]) for p in report.panels), "domain cell(s)", paths.get("json"))
        return EXIT["interrupted"]
    return EXIT["fail"] if failed_cells(report) else EXIT["pass"] if judged_cells(report) else EXIT["empty"]


def judged_cells(report):
    """How many cells were judged (have results)."""
    return sum(c["results"] is not None for p in report.panels for c in p["cells"])


def failed_cells(report):
    """How many judged cells have a result graded FAIL."""
    return sum(any(r["grade"] == FAIL for r in c["results"].values()) for p in report.panels for c in p["cells"]
               if c["results"] is not None)
