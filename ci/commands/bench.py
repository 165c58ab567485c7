"""``gdn2-oracle bench``: validation-gated forward+backward latency of GDN-2 kernels.

For every (kernel, shape, dtype):

1. the tile configurations to try: the kernel's defaults, or a sweep (``--tiles``: an explicit
   ``key=v1,v2;key2=...`` grid (``args.tiles``), or ``sweep``: the Pallas ``SWEEP`` for ``pallas-*`` kernels and
   :data:`DEFAULT_SWEEP` for the others). Keys a kernel does not accept are dropped for that kernel;
   a key no kernel of the run accepts, or a value every kernel taking the key rejects, is a usage
   error (:func:`check_tiles`, before any work);
2. with more than one configuration, each is validated cheaply first, at a smaller shape
   (:func:`small_shape`) with the same tile configuration; failures are rejected, never timed;
3. each remaining configuration is compiled ahead of time (``jit(...).lower().compile()``: the
   compile time is recorded separately) and, for a single configuration, validated at the exact
   benchmark shape on this device against the CPU float64 oracle before it is timed;
4. timing: the median (and min) of ``--repeats`` synchronized calls (``block_until_ready``) of the
   jitted forward + backward (``jax.vjp`` and the pullback of all seven inputs: ``ci.running.harness.runner``);
5. of a sweep, the fastest configuration is validated at the full shape; if it fails, the next
   fastest, and so on; a kernel with no validated configuration is reported as rejected, with the
   reasons, and gets no figure.

The float64 oracle reference (and the float32 recurrence baseline the tolerance model needs) is
computed once per (shape, dtype, seed) and shared by every kernel and configuration.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from dataclasses import asdict, dataclass, field

import jax
import numpy as np

from gdn2_oracle.oracle import RESULTS, Recipe

from ..grading.case import Case
from ..grading.grades import FAIL, PASS
from ..grading.result import error_text
from ..running import harness, multihost
from ..running import mesh as mesh_lib
from ..running.fingerprint import source_sha256
from . import args as cli_args
from .loop import RunLoop, needs_matplotlib
from .output import (
    EXIT,
    UsageError,
    fmt_err,
    interrupt_error,
    say_interrupted,
    table,
    timed_out,
    write_after_work,
    write_json,
)
from .provenance import environment, kernel_notes

SCHEMA = "gdn2-oracle/bench/2"  # 2: outcome "empty" (nothing timed)
DEFAULT_SWEEP = "chunk_size=32,64,128;leaf=4,8,16"
SMALL_T = 512


# --- tile sweeps ----------------------------------------------------------------------------

def parse_tiles(spec):
    """The grid of a ``--tiles`` value (``args.tiles``); ``None``/``""`` -> ``{}``; UsageError when malformed."""
    if spec is None or not spec.strip():
        return {}
    try:
        return cli_args.tiles(spec)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--tiles: {exc}") from None


def _accepts(spec, key):
    """Whether the kernel of ``spec`` takes option ``key`` (the kernel declares it: ``kernels.accepts``)."""
    return spec.accepts(key)


def check_tiles(specs, tiles):
    """UsageError for a ``--tiles`` key that none of ``specs`` accepts, or a value that every kernel
    taking its key rejects on its own (a value valid for some combination is judged per configuration)."""
    if tiles is None or tiles in ("", "sweep"):
        return
    grid = parse_tiles(tiles)
    labels = ", ".join(s.label() for s in specs)
    for key, values in grid.items():
        takers = [s for s in specs if key not in s.options and _accepts(s, key)]
        if not takers and not any(key in s.options for s in specs):
            raise UsageError(f"--tiles: no kernel of this run ({labels}) accepts the option {key!r}")
        for value in values:
            errors = []
            for s in takers:
                try:
                    cli_args.build(s, **{key: value})
                    break
                except UsageError as exc:
                    errors.append(str(exc))
            else:
                if errors:
                    raise UsageError(f"--tiles: {key}={value!r} is rejected by every kernel that takes {key!r}: "
                                     f"{errors[0]}")


def check_allocatable(shape):
    """UsageError when the float64 oracle arrays of a benchmark ``shape`` cannot be allocated on this host."""
    B, T, H, K, V = shape
    elements = B * T * H * (4 * K + 3 * V)  # q, k, g, b; v, w, do (float64, before any other work)
    try:
        np.empty(elements, dtype=np.float64)
    except (MemoryError, ValueError, OverflowError) as exc:
        raise UsageError(f"shape B={B} T={T} H={H} K={K} V={V}: cannot allocate its "
                         f"{8 * elements / 2**30:.3g} GiB of float64 inputs on this host "
                         f"({type(exc).__name__})") from None


def configurations(spec, tiles):
    """The option dicts to try for kernel ``spec``: ``[{}]`` (defaults) or the sweep's grid."""
    if tiles is None or tiles == "":
        return [{}]
    if tiles == "sweep":
        if spec.name.startswith("pallas-"):
            from gdn2_oracle.kernels.pallas.config import SWEEP
            method = spec.name.split("-", 1)[1]
            return [dict(chunk_size=c.chunk_size, split=c.split, leaf=c.leaf)
                    for c in SWEEP if c.method == method] or [{}]
        grid = parse_tiles(DEFAULT_SWEEP)
    else:
        grid = parse_tiles(tiles)
    grid = {k: v for k, v in grid.items() if k not in spec.options and _accepts(spec, k)}
    if not grid:
        return [{}]
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def small_shape(shape):
    """The shape a swept configuration is validated at cheaply: ``B=1, T<=512, H<=2``, same K, V."""
    B, T, H, K, V = shape
    return (1, min(T, SMALL_T), min(H, 2), K, V)


# --- the cases ---------------------------------------------------------------------------------

def recipe(shape, dtype, seed) -> Recipe:
    """The benchmark problem: moderate decay, uniform gates, an initial state; cotangents from ``seed``."""
    return Recipe(*shape, decay="moderate", gates="uniform", initial_state=True, precision=dtype, seed=seed)


class Cases:
    """The :class:`Case` of each (shape, dtype, seed), built once and shared by every kernel and configuration."""

    def __init__(self):
        self._cases = {}

    def __call__(self, shape, dtype, seed) -> Case:
        key = (tuple(shape), dtype, seed)
        if key not in self._cases:
            name = f"bench_{'x'.join(map(str, shape))}_{dtype}"
            self._cases[key] = Case.from_recipe(name, recipe(shape, dtype, seed),
                                                reference_fn=multihost.reference_results)
        return self._cases[key]

    @property
    def seconds(self):
        """Time spent on references and baselines."""
        return sum(c.seconds for c in self._cases.values())


# --- one configuration ----------------------------------------------------------------------

class Compiled:
    """A kernel compiled ahead of time for one (shape, dtype): ``args``, ``call()``, ``compile_s``."""

    def __init__(self, fn, problem, do, dfs, dtype):
        harness.check_representable(problem, dtype)
        self.args = mesh_lib.place_args(harness.device_inputs(problem, do, dfs, dtype))  # on --mesh, if any
        t0 = time.perf_counter()
        with harness.guarded():  # tracing runs the kernel's Python
            self.exe = harness.runner(fn).lower(*self.args, problem.scale).compile()
        self.compile_s = time.perf_counter() - t0

    def call(self):
        with harness.guarded():  # host callbacks (torch kernels) run the kernel's Python
            return jax.block_until_ready(self.exe(*self.args))


def judge(out, shape, dtype, seed, cases):
    """Judge a runner output tuple on its case: ``{"passed", "grade", "verdicts", "failures", "diagnosis"}``.

    A PRECISION grade passes (the algorithm is right, as for ``validate``) and is timed, marked as such; FAIL
    is rejected. ``failures``: one short line per result over its tolerance; ``diagnosis``: the case's findings.
    """
    got = {n: mesh_lib.to_host(x) for n, x in zip(RESULTS, out)}
    report = cases(shape, dtype, seed).judge(got)
    over = sorted(report.failures(), key=lambda v: v.ratio, reverse=True)
    failures = [f"{v.name} {v.grade} {fmt_ratio(v.ratio)} the tolerance (err_ratio {fmt_err(v.err_ratio)}, "
                f"tol {v.tol_ratio:.1e})" for v in over[:3]]
    if len(over) > 3:
        failures.append(f"and {', '.join(v.name for v in over[3:])} over their tolerance")
    return {"passed": report.grade != FAIL, "grade": report.grade, "shape": list(shape),
            "verdicts": [v.as_dict() for v in report.verdicts], "failures": failures,
            "diagnosis": [str(f) for f in report.diagnosis]}


def fmt_ratio(x):
    """``3.2e+03x`` / ``1.5x`` of an error / tolerance."""
    return f"{x:.3g}x" if x == x and x != float("inf") else "inf x"


def _failed(what, validation):
    """A rejection's reason: what failed, each result over its tolerance, then the diagnosis."""
    return "; ".join([f"failed validation at {what}", *validation["failures"], *validation.get("diagnosis", [])])


def validate_config(fn, shape, dtype, seed, cases, compiled=None):
    """Validate ``fn`` at ``shape`` (using ``compiled`` when it is for that shape); errors are failures."""
    try:
        if compiled is None:
            compiled = Compiled(fn, *cases(shape, dtype, seed).data(), dtype)
        return judge(compiled.call(), shape, dtype, seed, cases)
    except MemoryError as exc:  # the host cannot hold this shape: a usage error, not a verdict on the kernel
        raise UsageError(f"shape {tuple(shape)}: out of host memory ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # noqa: BLE001 - the reason is reported, the kernel is not timed
        return {"passed": False, "shape": list(shape), "verdicts": [], "failures": [error_text(exc)]}


def time_calls(compiled, repeats):
    """``{"median_s", "min_s", "times_s"}`` of ``repeats`` synchronized calls after one warm-up call."""
    compiled.call()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        compiled.call()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "times_s": times}


# --- the benchmark --------------------------------------------------------------------------

def _reject(entry, reason):
    """Mark ``entry`` rejected for ``reason``; None (no timed configuration)."""
    entry["reason"] = reason
    return None


@dataclass(frozen=True)
class BenchOptions:
    """What a bench run times and how (defaults: B=4, T=4096, H=6, K=V=128, float32, the kernels' own tiles).

    The shapes are every (``batches``, ``seqs``, ``heads``, ``dims``) combination, K = V = the dim; ``tiles``: a
    ``--tiles`` value (None: the defaults; ``"sweep"``; a grid); ``repeats``: timed calls per figure; ``seed``: of the
    timed problems; ``mesh``: a ``jax.sharding.Mesh`` (ci/running/mesh.py) every kernel is compiled and timed inside,
    on sharded inputs; ``case_timeout``: the seconds one kernel call may take (0 or None: no limit); ``env``: the
    environment record (None: this machine's)."""

    batches: tuple = (4,)
    seqs: tuple = (4096,)
    heads: tuple = (6,)
    dims: tuple = (128,)
    dtypes: tuple = ("float32",)
    tiles: str | None = None
    repeats: int = 20
    seed: int = 0
    mesh: object = None
    case_timeout: float | None = None
    show_progress: bool = True
    env: dict | None = None

    def shapes(self):
        """The benchmark shapes ``(B, T, H, K, V)``, the batch varying fastest."""
        return [(B, T, H, D, D) for D in self.dims for H in self.heads for T in self.seqs for B in self.batches]


def run_bench(specs, options=BenchOptions(), *, on_stop=None):
    """Benchmark every kernel spec at every shape and dtype of ``options`` (:class:`BenchOptions`); returns the
    :class:`BenchReport` (``interrupted`` and the results finished so far after Ctrl-C).

    ``on_stop(report, reason)``: a watchdog (ci/running/watchdog.py) stops the run when one kernel call (compiling,
    validating or the timed calls of one configuration) passes ``options.case_timeout`` (that configuration rejected,
    timed out) or hangs through Ctrl-C / SIGTERM; ``on_stop`` gets the results finished so far and the process ends
    (exit 1, 130, 143). Unknown kernels, bad tiles and shapes too large for this host are usage errors, before any
    work."""
    run = BenchRun(specs, options, on_stop)
    return run.loop.run(run.bench_all, mesh_lib.using(options.mesh))  # kernels compile and run inside the mesh


@dataclass
class Trial:
    """One (kernel, shape, dtype) of a bench run and its JSON record (each configuration tried: ``rec["sweep"]``)."""

    spec: object
    shape: tuple
    dtype: str
    rec: dict = field(init=False)

    def __post_init__(self):
        """The record before any configuration is tried: rejected, no reason yet."""
        B, T, H, K, V = self.shape
        self.rec = {"kernel": self.spec.label(), "spec": self.spec.spec, "shape": dict(B=B, T=T, H=H, K=K, V=V),
                    "dtype": self.dtype, "status": "rejected", "reason": None, "sweep": []}

    def rejected(self):
        """The record of a kernel with no validated configuration: the reason of each configuration's rejection."""
        reasons = [f"{e['label']}: {e.get('reason')}" for e in self.rec["sweep"] if e["status"] == "rejected"]
        self.rec["reason"] = "no configuration passed validation -- " + " | ".join(reasons)
        return self.rec

    def chosen(self, entry):
        """The record of a timed kernel: the ``entry`` chosen, its figures and (TPU, Pallas) roofline prediction."""
        from ..running.cost_model import prediction  # only a TPU run of a Pallas kernel gets one

        entry["status"] = "chosen"
        self.rec.update(status="ok", reason=None, options=entry["options"], label=entry["label"],
                        compile_s=entry["compile_s"], median_s=entry["median_s"], min_s=entry["min_s"],
                        times_s=entry["times_s"], validation=entry["full_validation"])
        self.rec["prediction"] = prediction(self.spec.name, entry["options"], self.shape, self.dtype,
                                            jax.devices()[0].device_kind)
        return self.rec


class BenchRun:
    """One bench run: the shapes, the cases shared by every kernel, the records so far, and the :class:`RunLoop`
    whose units are the kernel calls (compiling, validating, timing one configuration)."""

    def __init__(self, specs, options, on_stop=None):
        for spec in specs:  # unknown kernels / import failures are usage errors, before any work
            cli_args.build(spec)
        check_tiles(specs, options.tiles)
        self.shapes = options.shapes()
        for shape in self.shapes:
            check_allocatable(shape)
        self.specs, self.options = specs, options
        self.cases = Cases()
        self.t0 = time.perf_counter()
        self.results, self.stopped = [], []  # stopped: the record of a configuration the watchdog stopped
        self.loop = RunLoop(self.report, "benchmark results", total=len(specs) * len(self.shapes) * len(options.dtypes),
                            desc="bench", unit_name="run", show_progress=options.show_progress,
                            case_timeout=options.case_timeout, on_timeout=self.timed_out, on_stop=on_stop)

    def report(self, interrupted):
        """The :class:`BenchReport` of the records so far (after an interrupt, not those it broke off)."""
        done = self.results + self.stopped
        if interrupted:  # a kernel call the interrupt broke off was not rejected: it was not judged
            done = [r for r in done if r["status"] == "ok" or not interrupt_error(r["reason"])]
        passed = not interrupted and bool(done) and all(r["status"] == "ok" for r in done)
        o = self.options
        return BenchReport(environment=o.env or environment(), repeats=o.repeats, seed=o.seed, tiles=o.tiles,
                           mesh=mesh_lib.format_mesh(o.mesh) if o.mesh is not None else None,
                           oracle_seconds=self.cases.seconds, seconds=time.perf_counter() - self.t0, passed=passed,
                           interrupted=interrupted, outcome=bench_outcome(done, interrupted), results=done)

    def timed_out(self, unit):
        """The watchdog stopped this configuration's kernel call: it and its kernel are rejected, timed out."""
        rec, entry = unit["rec"], unit["entry"]
        entry.update(status="rejected", reason=f"{unit['what']}: {timed_out(self.options.case_timeout)}")
        rec.update(status="rejected", reason=f"{entry['label']}: {entry['reason']}")
        self.stopped.append(rec)

    def stage(self, trial, entry, what, said=None):
        """Name the kernel call of ``entry`` on the progress bar (``said``, default ``what``) and return the
        watchdog's context it runs in (``what``: compiling, validating, timing)."""
        self.loop.note(f"{entry['label']} {trial.dtype}: {said or what}"[:80])
        return self.loop.unit(f"{entry['label']} {what}", rec=trial.rec, entry=entry, what=what)

    def bench_all(self, _in_mesh):
        """Benchmark every kernel at every (shape, dtype); each group's speedups over its first timed kernel."""
        for shape in self.shapes:
            for dtype in self.options.dtypes:
                group = []
                for spec in self.specs:
                    group.append(self.bench_one(spec, shape, dtype))
                    self.results.append(group[-1])
                    self.loop.advance()
                mark_speedups(group)

    def bench_one(self, spec, shape, dtype):
        """Benchmark one (kernel, shape, dtype): try every configuration, keep the fastest valid one; its JSON
        record."""
        trial = Trial(spec, shape, dtype)
        configs = configurations(spec, self.options.tiles)
        tried = [self.try_config(trial, opts, sweeping=len(configs) > 1) for opts in configs]
        candidates = [c for c in tried if c is not None]
        chosen = self.choose(trial, candidates)
        for _, _, compiled in candidates:
            compiled.exe = None  # free device executables
        return trial.rejected() if chosen is None else trial.chosen(chosen)

    def try_config(self, trial, opts, sweeping):
        """Build, validate, compile and time one configuration, recording it in ``trial.rec["sweep"]``.

        Swept configurations are validated at :func:`small_shape` before compiling (the fastest is validated at the
        full shape later, by :meth:`choose`); a single one at the benchmark shape before timing. Returns
        ``(entry, fn, compiled)`` when timed, else None (the entry holds the reason).
        """
        entry = {"options": opts, "label": trial.spec.label(opts), "status": "rejected"}
        trial.rec["sweep"].append(entry)
        try:
            fn = cli_args.build(trial.spec, **opts)
        except UsageError as exc:
            return _reject(entry, f"invalid configuration: {exc}")
        if "source" not in trial.rec:
            trial.rec["source"], trial.rec["notes"] = source_sha256(fn), kernel_notes(fn)
        if sweeping and not self.passes(trial, fn, entry, small=True):
            return None
        compiled = self.compile_config(trial, fn, entry)
        if compiled is None or (not sweeping and not self.passes(trial, fn, entry, compiled)):
            return None
        return (entry, fn, compiled) if self.time_config(trial, entry, compiled) else None

    def passes(self, trial, fn, entry, compiled=None, small=False):
        """Validate configuration ``fn`` of ``entry`` at the benchmark shape (with ``small``: at :func:`small_shape`),
        recorded in the entry; whether it passed (if not, the entry's reason says why)."""
        if small:
            shape, where, key = small_shape(trial.shape), "small shape", "small_validation"
            what = f"validating at small shape {shape}"
        else:
            shape, where, key = trial.shape, "the benchmark shape", "full_validation"
            what = f"validating at {tuple(shape)}"
        with self.stage(trial, entry, what):
            entry[key] = result = validate_config(fn, shape, trial.dtype, self.options.seed, self.cases, compiled)
        if not result["passed"]:
            _reject(entry, _failed(where, result))
        return result["passed"]

    def compile_config(self, trial, fn, entry):
        """``fn`` compiled at the benchmark shape (its compile time in ``entry``), or None: rejected, it failed."""
        shape, dtype = trial.shape, trial.dtype
        try:
            with self.stage(trial, entry, f"compiling at {tuple(shape)}"):
                compiled = Compiled(fn, *self.cases(shape, dtype, self.options.seed).data(), dtype)
        except MemoryError as exc:
            raise UsageError(f"shape {tuple(shape)}: out of host memory ({type(exc).__name__}: {exc})") from None
        except Exception as exc:  # noqa: BLE001 - a kernel that fails to compile is rejected, not timed
            return _reject(entry, f"compile failed: {error_text(exc)}")
        entry["compile_s"] = compiled.compile_s
        return compiled

    def time_config(self, trial, entry, compiled):
        """Time ``repeats`` calls of ``compiled`` into ``entry`` (status timed); False when a call fails (rejected)."""
        repeats = self.options.repeats
        try:
            with self.stage(trial, entry, f"timing {repeats} calls"):
                entry.update(time_calls(compiled, repeats))
        except Exception as exc:  # noqa: BLE001 - a kernel that fails to run is rejected, not timed
            _reject(entry, f"run failed: {error_text(exc)}")
            return False
        entry["status"] = "timed"
        return True

    def choose(self, trial, candidates):
        """The fastest timed configuration that passes validation at the benchmark shape, or None.

        Candidates are tried fastest first; one that fails is marked rejected and loses its timings.
        """
        for entry, fn, compiled in sorted(candidates, key=lambda c: c[0]["median_s"]):
            if "full_validation" not in entry:
                with self.stage(trial, entry, f"validating at {tuple(trial.shape)}",
                                said=f"validating the fastest configuration at {tuple(trial.shape)}"):
                    entry["full_validation"] = validate_config(fn, trial.shape, trial.dtype, self.options.seed,
                                                               self.cases, compiled)
            if entry["full_validation"]["passed"]:
                return entry
            entry["status"] = "rejected"
            entry["reason"] = _failed("the benchmark shape", entry["full_validation"])
            for k in ("median_s", "min_s", "times_s"):
                entry.pop(k, None)
        return None


def mark_speedups(group):
    """Each timed record of one (shape, dtype) gets its speedup over the first kernel timed there."""
    first = next((r for r in group if r["status"] == "ok"), None)
    for r in group:
        if first is not None and r["status"] == "ok":
            r["baseline_kernel"] = first["kernel"]
            r["speedup_vs_baseline"] = first["median_s"] / r["median_s"]


def bench_outcome(results, interrupted):
    """``interrupted``, else ``fail`` when a kernel was rejected, else ``empty`` when nothing was timed, else
    ``pass``."""
    if interrupted:
        return "interrupted"
    if any(r["status"] != "ok" for r in results):
        return "fail"
    return "pass" if results else "empty"


@dataclass
class BenchReport:
    """What ``bench`` measured: one record (a plain JSON dict) per (kernel, shape, dtype), timed or rejected."""

    environment: dict
    repeats: int
    seed: int
    tiles: str | None
    mesh: str | None
    oracle_seconds: float
    seconds: float
    passed: bool
    interrupted: bool
    outcome: str  # pass | fail | empty | interrupted
    results: list = field(default_factory=list)
    problem: str = "oracle.make_problem(decay='moderate', gates='uniform', initial_state=True), random cotangents"
    timed: str = "jit(vjp forward + pullback of all seven inputs), block_until_ready, median of repeats"

    def to_json(self):
        """The JSON report (schema :data:`SCHEMA`), keys in their documented order."""
        d = asdict(self)
        order = ("environment", "repeats", "seed", "tiles", "mesh", "problem", "timed", "oracle_seconds", "seconds",
                 "passed", "interrupted", "outcome", "results")
        return {"schema": SCHEMA, "command": "bench", **{k: d[k] for k in order}}


def _shape_label(s):
    return f"B{s['B']} T{s['T']} H{s['H']} K{s['K']} V{s['V']}"


def format_bench(report):
    env = report.environment
    lines = [f"gdn2-oracle bench: device {env['device_kind']} ({env['platform']}), jax {env['jax_version']}, "
             f"commit {(env['git']['commit'] or 'unknown')[:12]}{'+dirty' if env['git']['dirty'] else ''}, "
             f"median of {report.repeats} synchronized forward+backward calls", ""]
    rows = []
    for r in report.results:
        if r["status"] == "ok":
            sp = r.get("speedup_vs_baseline")
            grade = r.get("validation", {}).get("grade", PASS)
            rows.append([r["kernel"], _shape_label(r["shape"]), r["dtype"], r.get("label", r["kernel"]),
                         f"{r['compile_s']:.1f}", f"{1e3 * r['median_s']:.3g}", f"{1e3 * r['min_s']:.3g}",
                         f"{sp:.3g}x vs {r['baseline_kernel']}" if sp is not None else "-",
                         "validated" + (f" ({grade})" if grade != PASS else "")])
        else:
            rows.append([r["kernel"], _shape_label(r["shape"]), r["dtype"], "-", "-", "-", "-", "-", "REJECTED"])
    lines.append(table(["kernel", "shape", "dtype", "config", "compile s", "median ms", "min ms", "speedup",
                        "status"], rows, "<<<<>>>><"))
    sweeps = [r for r in report.results if len(r["sweep"]) > 1]
    if sweeps:
        lines += ["", "Tile sweeps (median ms; validated at small shape; * = chosen, validated at full shape):"]
        for r in sweeps:
            parts = []
            for e in r["sweep"]:
                if e.get("median_s") is not None:
                    parts.append(f"{e['label']}={1e3 * e['median_s']:.2f}{'*' if e['status'] == 'chosen' else ''}")
                else:
                    parts.append(f"{e['label']}=rejected")
            lines.append(f"  {r['kernel']} {_shape_label(r['shape'])} {r['dtype']}: " + ", ".join(parts))
    rejected = [r for r in report.results if r["status"] != "ok"]
    if rejected:
        lines += ["", "Rejected (not timed):"]
        for r in rejected:
            head, *why = (r["reason"] or "").split("; ")
            lines.append(f"  {r['kernel']} {_shape_label(r['shape'])} {r['dtype']}: {head}")
            lines += [f"      {w}" for w in why]
    notes = sorted({(r["kernel"], n) for r in report.results for n in r.get("notes", [])})
    if notes:
        lines += ["", "Notes:"] + [f"  {k}: {n}" for k, n in notes]
    lines += format_predictions(report.results)
    lines.append("")
    lines.append(f"float64 oracle + baselines: {report.oracle_seconds:.1f} s; total {report.seconds:.1f} s")
    if report.interrupted:
        lines.append(f"INTERRUPTED: {len(report.results)} result(s) finished before Ctrl-C are reported")
    elif not report.results:
        lines.append("EMPTY: no kernel was validated or timed (not a pass)")
    return "\n".join(lines)


def format_predictions(results) -> list[str]:
    """Lines comparing each timed result's measured median with its roofline prediction (when it has one)."""
    rows = [r for r in results if r.get("status") == "ok" and r.get("prediction")]
    if not rows:
        return []
    lines = ["", "Predicted (roofline ESTIMATE from the traced kernel, docs/DESIGN.md §8) vs measured:"]
    for r in rows:
        p = r["prediction"]
        lines.append(f"  {r['kernel']} {_shape_label(r['shape'])} {r['dtype']} on {p['chip']}: "
                     f"predicted {1e3 * p['seconds']:.2f} ms ({p['bound']}-bound), "
                     f"measured {1e3 * r['median_s']:.2f} ms "
                     f"= {r['median_s'] / p['seconds']:.2f}x the estimate")
    return lines


def plot_bench(report, path):
    """A PNG bar chart, log time axis: median forward+backward per (shape, dtype) and kernel, labelled with the
    configuration that was timed; a rejected kernel is a grey hatched bar marked REJECTED (never a time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    results = report.results
    groups = list(dict.fromkeys(f"{_shape_label(r['shape'])}\n{r['dtype']}" for r in results))
    kernels = list(dict.fromkeys(r["kernel"] for r in results))
    timed = [1e3 * r["median_s"] for r in results if r["status"] == "ok"]
    lo, hi = (min(timed), max(timed)) if timed else (1.0, 1.0)
    width = 0.8 / max(1, len(kernels))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) * max(1, len(kernels)) / 2 + 2), 4.8))
    colours = plt.get_cmap("tab10")
    for i, kname in enumerate(kernels):
        for r in (r for r in results if r["kernel"] == kname):
            x = groups.index(f"{_shape_label(r['shape'])}\n{r['dtype']}") + (i - (len(kernels) - 1) / 2) * width
            if r["status"] == "ok":
                y = 1e3 * r["median_s"]
                ax.bar(x, y, width, color=colours(i % 10), label=kname)
                label = f"{y:.3g} ms" + (f"\n{r['label']}" if r.get("label", kname) != kname else "")
                if r.get("speedup_vs_baseline") and r["kernel"] != r.get("baseline_kernel"):
                    label += f"\n{r['speedup_vs_baseline']:.3g}x"
                ax.annotate(label, (x, y), ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                            textcoords="offset points")
            else:
                ax.bar(x, hi, width, color="#d0d0d0", edgecolor="#a00000", hatch="//", label=f"{kname} (rejected)")
                ax.annotate("REJECTED\nnot timed", (x, hi), ha="center", va="bottom", fontsize=7, color="#a00000",
                            xytext=(0, 2), textcoords="offset points")
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_ylim(lo / 3, hi * 8)  # room above the tallest bar for its labels, inside the frame
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylabel("median forward+backward (ms, log scale)")
    env = report.environment
    ax.set_title(f"GDN-2 kernels on {env['device_kind']}, validated against the float64 oracle "
                 f"(median of {report.repeats})", fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_parser(sub):
    """``gdn2-oracle bench``."""
    b = sub.add_parser("bench", help="validated forward+backward latency",
                       description="Validate each kernel at the exact shape on this device against the float64 "
                                   "oracle, then time forward+backward (rejected kernels are not timed).")
    cli_args.add_kernels(b)
    b.add_argument("--batch", type=cli_args.positive_ints, default=[4], metavar="LIST")
    b.add_argument("--seq", type=cli_args.positive_ints, default=[4096], metavar="LIST")
    b.add_argument("--heads", type=cli_args.positive_ints, default=[6], metavar="LIST")
    b.add_argument("--dim", type=cli_args.positive_ints, default=[128], metavar="LIST",
                   help="head width K = V (default 128)")
    b.add_argument("--dtype", type=cli_args.dtypes, default=["float32"], metavar="LIST",
                   help="input dtypes, comma-separated (default float32)")
    b.add_argument("--tiles", metavar="SPEC",
                   help="tile sweep: 'key=v1,v2;key2=...' (e.g. 'chunk_size=32,64,128;leaf=8,16') or 'sweep' "
                        "(the Pallas SWEEP for pallas-* kernels, a default grid for the others)")
    b.add_argument("--repeats", type=int, default=20, help="timed calls per figure (median; default 20)")
    cli_args.add_seed(b, "seed of the timed problems (default 0)")
    b.add_argument("--json", metavar="PATH", help="write the JSON report here (a directory: PATH/bench.json)")
    b.add_argument("--plot", metavar="PATH", help="write a PNG bar chart here (a directory: PATH/bench.png)")
    cli_args.add_case_timeout(b, "configuration")
    cli_args.add_run_options(b)


def run(args):
    """Validate and time, print the table, write ``--json``/``--plot``; the exit status."""
    if args.repeats < 1:
        raise UsageError(f"gdn2-oracle bench: error: --repeats must be positive, got {args.repeats}")
    out = cli_args.outputs(args, json="bench.json", plot="bench.png")
    if out["plot"]:
        needs_matplotlib("bench", "--plot")

    def show_and_write(report, reason=None):  # after the run, or when the watchdog stopped it (the results so far)
        print(format_bench(report), flush=True)
        if out["json"] and write_after_work("--json", out["json"], lambda: write_json(out["json"], report.to_json())):
            print(f"report: {out['json']}", flush=True)
        if out["plot"] and report.results and write_after_work("--plot", out["plot"],
                                                               lambda: plot_bench(report, out["plot"])):
            print(f"plot: {out['plot']}", flush=True)

    options = BenchOptions(batches=args.batch, seqs=args.seq, heads=args.heads, dims=args.dim, dtypes=args.dtype,
                           tiles=args.tiles, repeats=args.repeats, seed=args.seed, mesh=cli_args.built_mesh(args),
                           case_timeout=args.case_timeout, show_progress=not args.no_progress)
    report = run_bench(cli_args.specs(args.kernel), options, on_stop=show_and_write)
    show_and_write(report)
    if report.interrupted:
        say_interrupted(len(report.results), "benchmark result(s)", out["json"])
    return EXIT[report.outcome]
