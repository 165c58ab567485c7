"""``gdn2-oracle domain``: where a kernel stops being right -- error / tolerance over the regimes that decide it.

One-at-a-time sweeps around a base :class:`Point`: per-token log-decay strength on a log grid (and the
oracle's ``resets`` regime), reported with the within-chunk log-decay span it produces; erase- and
write-gate magnitude; q/k norm (normalised, or raw at several norms); initial state; sequence length;
each sweep in the dtypes its :class:`Axis` names. Problems are built from seeds (never by a kernel;
domain_points.py) and every cell is judged by the tolerance model against the float64 oracle: its value is the
worst error / tolerance (``Verdict.ratio``: the larger of the rms and max metrics' ratios) over its
seeds and its grade the worst grade. Output: heat maps (PNG), JSON and a one-paragraph summary stating
where each result leaves PASS along each sweep.

Training-call modes (``modes``; docs/modes.md): each selected mode the kernel accepts adds its sweeps of
:class:`ModePoint` s -- an :class:`oracle.mode_recipes.ModeRecipe` at the same small shape, plus an override
where the recipe has no field for the swept quantity -- judged by the modes judge (``ci/grading/modes.py``):
packed lengths around the chunk and the number of packed sequences (varlen), ``lower_bound`` and ``A_log``
(gate), the raw q/k row norm down to 0 (l2norm), the length (intermediate), the initial state in the
``[V, K]`` layout (state_v_first). A mode the kernel does not accept is named in the summary, not swept.

Family kernels (KDA, Gated DeltaNet in FLA's signature; ``family``): their own map instead (domain_families.py),
decay regime x beta regime per group size G = HV / H and dtype, each cell an
:class:`oracle.family_recipes.FamilyRecipe` judged by the family judge (``ci/grading/families.py``).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from pathlib import Path

from gdn2_oracle.oracle import RESULTS, call_modes
from gdn2_oracle.oracle.family_recipes import FamilyRecipe
from gdn2_oracle.oracle.mode_recipes import MODES

from ..grading.families import FAMILY_RESULTS, GDN2
from ..grading.grades import FAIL
from ..grading.modes import result_names
from ..running import families as family_running
from ..running import modes as mode_running
from . import args as cli_args
from .domain_cells import evaluate, evaluate_family, evaluate_mode, worst_of
from .domain_families import BETA_COLUMNS, FAMILY_GRIDS, FamilyGrid, family_panels
from .domain_plot import plot
from .domain_points import (
    BOTH,
    GRIDS,
    MODE_T,
    MODE_VALUES,
    PLAIN,
    RESETS,
    SHAPE,
    UNORDERED,
    Axis,
    Grid,
    ModePoint,
    Panel,
    Point,
    build,
    build_mode,
    decay_span,
    mode_points,
    mode_value_label,
    panels,
    value_label,
)
from .domain_report import (
    SCHEMA,
    DomainReport,
    boundaries,
    failed_cells,
    format_domain,
    judged_cells,
    panel_results,
    result_boundary,
    sentence,
    summary,
    worst_cell,
)
from .family_options import family_modes, kernel_and_family
from .loop import RunLoop, needs_matplotlib
from .output import (
    EXIT,
    UsageError,
    interrupt_error,
    output_dir,
    say_interrupted,
    timed_out,
    write_after_work,
    write_json,
)
from .provenance import environment

# The names of the parts (points, cells, report, plot) are this command's too: one import for a user or a test.
__all__ = ["evaluate", "evaluate_family", "evaluate_mode", "worst_of", "BETA_COLUMNS", "FAMILY_GRIDS", "FamilyGrid",
           "family_panels", "plot", "Axis", "BOTH", "GRIDS", "Grid", "MODE_T",
           "MODE_VALUES", "ModePoint", "PLAIN", "Panel", "Point", "RESETS", "SHAPE", "UNORDERED", "build",
           "build_mode", "decay_span", "mode_points", "mode_value_label", "panels", "value_label", "DomainReport",
           "SCHEMA", "boundaries", "failed_cells", "format_domain", "judged_cells", "panel_results", "result_boundary",
           "sentence", "summary", "worst_cell", "DomainOptions", "run_domain", "write", "add_parser", "run", "MODES"]


@dataclasses.dataclass(frozen=True)
class DomainOptions:
    """How a domain sweep runs (defaults: data seed 0, the dense sweeps, no time limit, a progress bar).

    ``kernel``: the kernel's spec, as the report names it; ``seed``: the first data seed of every cell; ``modes``:
    ``dense`` (the Point sweeps) and training-call modes; ``case_timeout``: the seconds one kernel call may take (0 or
    None: no limit); ``family``: the kernel's family (``ci.running.families.kernel_family``): ``gdn2``, or ``gdn`` /
    ``kda`` for a family kernel, mapped on a :class:`FamilyGrid` (``modes`` only ``dense``)."""

    kernel: str = "kernel"
    seed: int = 0
    modes: tuple = (PLAIN,)
    case_timeout: float | None = None
    show_progress: bool = True
    family: str = GDN2


def run_domain(fn, grid: Grid | FamilyGrid, options=DomainOptions(), *, on_stop=None):
    """Sweep ``grid`` with kernel ``fn`` as ``options`` (:class:`DomainOptions`) say: the domain report (panels of
    cells, boundaries, summary).

    A mode of ``options.modes`` the kernel's signature does not accept is listed in ``not_accepted_modes`` and not
    swept. A family kernel (``options.family``) is mapped on ``grid``, a :class:`FamilyGrid`; a beta column setting
    an FLA keyword its signature does not take is not swept (``not_accepted_flags``). ``on_stop(report, reason)``: a
    watchdog (ci/running/watchdog.py) stops the sweep when a kernel call passes ``options.case_timeout`` (that cell
    FAIL, timed out) or hangs through Ctrl-C / SIGTERM; ``on_stop`` gets the cells finished so far, marked
    interrupted, and the process ends (exit 1, 130, 143).
    """
    run = DomainRun(fn, grid, options)
    loop = RunLoop(run.report, "domain cells", total=sum(len(p.points) for p in run.todo) * len(run.seeds),
                   desc=f"domain {options.kernel}", unit_name="cell", show_progress=options.show_progress,
                   case_timeout=options.case_timeout, on_timeout=run.timed_out, on_stop=on_stop,
                   timeout_interrupts=True)
    return loop.run(lambda: run.sweep(loop))  # Ctrl-C or SIGTERM: the cells finished so far, marked interrupted


class DomainRun:
    """One domain sweep: the panels to sweep, the seeds of each cell, the panels finished so far, the cells' runs."""

    def __init__(self, fn, grid, options):
        self.fn, self.grid, self.options = fn, grid, options
        self.modes = tuple(options.modes)
        self.chunk = int(getattr(fn, "chunk_size", None) or call_modes.FLA_CHUNK)  # decay spans: the kernel's chunks
        self.family, self.not_accepted_flags = options.family, []
        if (self.family == GDN2) == isinstance(grid, FamilyGrid):
            raise ValueError(f"grid: a {self.family} kernel is mapped on a "
                             f"{'Grid' if self.family == GDN2 else 'FamilyGrid'}, got {type(grid).__name__}")
        if self.family == GDN2:
            accepted = mode_running.accepted_modes(fn)
            self.not_accepted = [m for m in self.modes if not call_modes.is_base(m) and m not in accepted]
            self.todo = panels(grid, [m for m in self.modes if m not in self.not_accepted])
        else:
            if self.modes != (PLAIN,):
                raise ValueError(f"modes: a family kernel is mapped on its family calls only ({PLAIN}), got "
                                 f"{self.modes!r}")
            self.not_accepted = []
            self.todo, self.not_accepted_flags = family_panels(grid, self.family, PLAIN,
                                                               family_running.accepted_flags(fn), options.seed)
        self.seeds = [options.seed + i for i in range(grid.seeds)]
        self.cache, self.out_panels = {}, []
        self.start = time.perf_counter()

    def report(self, interrupted):
        """The :class:`DomainReport` of the cells so far (a cell whose kernel call the interrupt broke off dropped)."""
        if interrupted:  # a kernel call the interrupt broke off was not judged
            for p in self.out_panels:
                p["cells"] = [c for c in p["cells"] if not interrupt_error(c["note"])]
        grid, family = self.grid, self.family != GDN2
        report = DomainReport(kernel=self.options.kernel, grid=grid.name, seeds=self.seeds, chunk=self.chunk,
                              shape=grid.shape_dict() if family else dict(zip("BHKV", grid.shape)),
                              base=grid.base(self.family) if family else dataclasses.asdict(grid.base),
                              results=list(FAMILY_RESULTS if family else RESULTS),
                              panels=[p for p in self.out_panels if p["cells"]],
                              seconds=time.perf_counter() - self.start, environment=environment(),
                              interrupted=interrupted, modes=list(self.modes), not_accepted_modes=self.not_accepted,
                              family=self.family, not_accepted_flags=self.not_accepted_flags)
        report.boundaries = boundaries(report)
        report.summary = summary(report)
        return report

    def timed_out(self, unit):
        """The watchdog stopped this cell's kernel call: the cell, every result FAIL."""
        point = unit["point_obj"]
        names = (RESULTS if isinstance(point, Point) else FAMILY_RESULTS if isinstance(point, FamilyRecipe)
                 else result_names(build_mode(point)[0]))
        unit["panel"]["cells"].append({
            "value": unit["value"], "label": unit["label"], "point": unit["point"], "span": math.nan,
            "results": {n: {"ratio": math.inf, "grade": FAIL} for n in names},
            "note": timed_out(self.options.case_timeout), "diagnosis": []})

    def sweep(self, loop):
        """Sweep every panel, each cell's seed a unit of ``loop``."""
        for panel in self.todo:
            out = {"field": panel.field, "label": panel.label, "dtype": panel.dtype, "mode": panel.mode, "cells": []}
            if self.family != GDN2:
                out["family"] = self.family
            self.out_panels.append(out)
            for value, label, point in zip(panel.values, panel.labels, panel.points):
                out["cells"].append(self.cell(loop, out, value, label, point))

    def cell(self, loop, out, value, label, point):
        """One cell of panel ``out``: ``point`` judged on each seed (a point swept twice is run once), the worst."""
        as_dict = (dataclasses.asdict(point) if isinstance(point, Point) else point.fields()
                   if isinstance(point, FamilyRecipe) else point.as_dict())
        runs = []
        for s in self.seeds:
            if (point, s) not in self.cache:
                with loop.unit(f"{out['label']} {label} seed {s}", panel=out, value=value, label=label,
                               point=as_dict, point_obj=point):
                    self.cache[point, s] = self.judge_point(point, s)
            runs.append(self.cache[point, s])
            loop.advance()
        return {"value": value, "label": label, "point": as_dict, **worst_of(runs)}

    def judge_point(self, point, seed):
        """The kernel on ``point`` with data ``seed``: a :class:`Point` by the tolerance model, a mode point by the
        modes judge, a family recipe by the family judge."""
        if isinstance(point, Point):
            return evaluate(self.fn, point, seed, self.grid.shape, self.chunk)
        if isinstance(point, FamilyRecipe):
            return evaluate_family(self.fn, point.replace(seed=seed), self.chunk)
        return evaluate_mode(self.fn, point, seed, self.chunk)


def write(report, out_dir):
    """Write ``domain.json``, ``domain.png`` and ``summary.txt`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "domain.json", "png": out / "domain.png", "summary": out / "summary.txt"}
    write_json(paths["json"], report.to_json())
    plot(report, paths["png"])
    paths["summary"].write_text(report.summary + "\n", encoding="utf-8")
    return paths


def add_parser(sub):
    """``gdn2-oracle domain``."""
    d = sub.add_parser("domain", help="heat maps of error / tolerance over decay, gates, q/k norms, length, dtype "
                                      "(a KDA / Gated DeltaNet kernel: decay x beta regime x G)",
                       description="Sweep the regimes that decide correctness (log-decay strength and the within-chunk "
                                   "span it gives, resets, erase and write gates, q/k norms, initial state, length, "
                                   "dtype) and write heat maps (PNG), JSON and a summary of where each result leaves "
                                   "PASS. A KDA or Gated DeltaNet kernel in FLA's signature (family=kda|gdn) is mapped "
                                   "over decay regime x beta regime, per group size G of value heads per key head.")
    cli_args.add_kernels(d, one=True)
    d.add_argument("--grid", choices=tuple(GRIDS), default="quick",
                   help="quick (default: under a minute for a pure-JAX kernel on CPU) or full (finer, 3 seeds per "
                        "cell, every sweep in both dtypes: a few minutes)")
    d.add_argument("--out", metavar="DIR", help="output directory (default domain-NAME): domain.png, domain.json, "
                                                "summary.txt")
    cli_args.add_seed(d, "first data seed of every cell")
    d.add_argument("--modes", type=cli_args.call_modes, default=(PLAIN,), metavar="LIST",
                   help=f"sweeps to run, comma-separated among {call_modes.listed((PLAIN, *MODES))} or all (default "
                        f"{PLAIN}: the regime sweeps above; a training-call mode adds its own sweeps, judged by the "
                        f"modes judge, where the kernel accepts it; all: {PLAIN} and every mode the kernel accepts)")
    cli_args.add_case_timeout(d, "cell")
    cli_args.add_run_options(d, mesh_jobs=False)


def run(args):
    """Sweep, write the heat maps, JSON and summary, print the summary; the exit status."""
    [spec] = cli_args.specs(args.kernel)
    fn, family, _ = kernel_and_family("domain", spec)
    modes = family_modes("domain", spec, family, args.modes)
    if args.out is not None and not args.out.strip():
        raise UsageError("gdn2-oracle domain: error: --out: expected a directory, got an empty path")
    needs_matplotlib("domain", "--out")  # the map (domain.png) is always drawn
    out = output_dir(args.out or "domain-" + re.sub(r"[^A-Za-z0-9_.=-]+", "_", spec.label()), option="--out")
    paths = {}

    def show_and_write(report, reason=None):  # after the sweep, or when the watchdog stopped it (the cells so far)
        print(format_domain(report), flush=True)
        if write_after_work("--out", out, lambda: paths.update(write(report, out))):
            print(f"wrote: {paths['png']}, {paths['json']}, {paths['summary']}", flush=True)

    options = DomainOptions(kernel=spec.spec, seed=args.seed, modes=modes, case_timeout=args.case_timeout,
                            show_progress=not args.no_progress, family=family)
    grid = GRIDS[args.grid] if family == GDN2 else FAMILY_GRIDS[args.grid]
    report = run_domain(fn, grid, options, on_stop=show_and_write)
    show_and_write(report)
    if report.interrupted:
        say_interrupted(sum(len(p["cells"]) for p in report.panels), "domain cell(s)", paths.get("json"))
        return EXIT["interrupted"]
    return EXIT["fail"] if failed_cells(report) else EXIT["pass"] if judged_cells(report) else EXIT["empty"]
