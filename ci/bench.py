"""``gdn2-oracle bench``: validation-gated forward+backward latency of GDN-2 kernels.

For every (kernel, shape, dtype):

1. the tile configurations to try: the kernel's defaults, or a sweep (``--tiles``: an explicit
   ``key=v1,v2;key2=...`` grid, or ``sweep``: the Pallas ``SWEEP`` for ``pallas-*`` kernels and
   :data:`DEFAULT_SWEEP` for the others). Keys a kernel does not accept are dropped for that kernel;
   a key no kernel of the run accepts, or a value every kernel taking the key rejects, is a usage
   error (:func:`check_tiles`, before any work);
2. with more than one configuration, each is validated cheaply first, at a smaller shape
   (:func:`small_shape`) with the same tile configuration; failures are rejected, never timed;
3. each remaining configuration is compiled ahead of time (``jit(...).lower().compile()``: the
   compile time is recorded separately) and, for a single configuration, validated at the exact
   benchmark shape on this device against the CPU float64 oracle before it is timed;
4. timing: the median (and min) of ``--repeats`` synchronized calls (``block_until_ready``) of the
   jitted forward + backward (``jax.vjp`` and the pullback of all seven inputs: ``ci.harness.runner``);
5. of a sweep, the fastest configuration is validated at the full shape; if it fails, the next
   fastest, and so on; a kernel with no validated configuration is reported as rejected, with the
   reasons, and gets no figure.

The float64 oracle reference (and the float32 recurrence baseline the tolerance model needs) is
computed once per (shape, dtype, seed) and shared by every kernel and configuration.
"""

from __future__ import annotations

import itertools
import statistics
import time

import jax
import numpy as np

from gdn2_oracle.kernels import parse_value
from gdn2_oracle.oracle import RESULTS, Recipe

from . import harness
from . import mesh as mesh_lib
from . import multihost
from .report import UsageError, environment, fmt_err, kernel_notes, progress, source_sha256, table
from .tolerance import baseline, compare, dtype_name

SCHEMA = "gdn2-oracle/bench/1"
DEFAULT_SWEEP = "chunk_size=32,64,128;leaf=4,8,16"
SMALL_T = 512


# --- tile sweeps ----------------------------------------------------------------------------

def parse_tiles(spec):
    """``"chunk_size=32,64;leaf=8,16"`` -> ``{"chunk_size": [32, 64], "leaf": [8, 16]}``; ``None``/``""`` -> ``{}``."""
    grid = {}
    if spec is None or not spec.strip():
        return grid
    for part in spec.split(";"):
        if not part.strip():
            continue
        key, eq, values = part.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier() or not values.strip():
            raise UsageError(f"--tiles: {part!r} is not of the form key=v1,v2,...")
        grid[key] = [parse_value(v.strip()) for v in values.split(",")]
    return grid


def _accepts(spec, key, value):
    try:
        spec.build(**{key: value})
    except UsageError as exc:
        return "does not accept" not in str(exc) and "unexpected keyword" not in str(exc)
    return True


def check_tiles(specs, tiles):
    """UsageError for a ``--tiles`` key that none of ``specs`` accepts, or a value that every kernel
    taking its key rejects on its own (a value valid for some combination is judged per configuration)."""
    if tiles is None or tiles in ("", "sweep"):
        return
    grid = parse_tiles(tiles)
    labels = ", ".join(s.label() for s in specs)
    for key, values in grid.items():
        takers = [s for s in specs if key not in s.options and _accepts(s, key, values[0])]
        if not takers and not any(key in s.options for s in specs):
            raise UsageError(f"--tiles: no kernel of this run ({labels}) accepts the option {key!r}")
        for value in values:
            errors = []
            for s in takers:
                try:
                    s.build(**{key: value})
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
                         f"{8 * elements / 2**30:.3g} GiB of float64 inputs on this host ({type(exc).__name__})") from None


def configurations(spec, tiles):
    """The option dicts to try for kernel ``spec``: ``[{}]`` (defaults) or the sweep's grid."""
    if tiles is None or tiles == "":
        return [{}]
    if tiles == "sweep":
        if spec.name.startswith("pallas-"):
            from gdn2_oracle.kernels.pallas.config import SWEEP  # noqa: PLC0415
            method = spec.name.split("-", 1)[1]
            return [dict(chunk_size=c.chunk_size, split=c.split, leaf=c.leaf)
                    for c in SWEEP if c.method == method] or [{}]
        grid = parse_tiles(DEFAULT_SWEEP)
    else:
        grid = parse_tiles(tiles)
    grid = {k: v for k, v in grid.items() if k not in spec.options and _accepts(spec, k, v[0])}
    if not grid:
        return [{}]
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def small_shape(shape):
    """The shape a swept configuration is validated at cheaply: ``B=1, T<=512, H<=2``, same K, V."""
    B, T, H, K, V = shape
    return (1, min(T, SMALL_T), min(H, 2), K, V)


# --- oracle cache ---------------------------------------------------------------------------

def recipe(shape, dtype, seed) -> Recipe:
    """The benchmark problem: moderate decay, uniform gates, an initial state; cotangents from ``seed``."""
    return Recipe(*shape, decay="moderate", gates="uniform", initial_state=True, precision=dtype, seed=seed)


class OracleCache:
    """Problems, float64 references and working-precision baselines per (shape, dtype, seed)."""

    def __init__(self, log=None):
        self._problems, self._refs, self._bases = {}, {}, {}
        self.log = log or (lambda msg: None)
        self.seconds = 0.0

    def problem(self, shape, dtype, seed):
        key = (tuple(shape), dtype, seed)
        if key not in self._problems:
            self._problems[key] = recipe(shape, dtype, seed).build()
        return self._problems[key]

    def reference(self, shape, dtype, seed):
        key = (tuple(shape), dtype, seed)
        if key not in self._refs:
            self.log(f"float64 oracle for shape {tuple(shape)} {dtype} (once per shape) ...")
            t0 = time.perf_counter()
            self._refs[key] = multihost.reference_results(*self.problem(shape, dtype, seed))
            self.seconds += time.perf_counter() - t0
        return self._refs[key]

    def baseline(self, shape, dtype, seed, result_dtypes):
        key = (tuple(shape), dtype, seed, tuple(result_dtypes[n] for n in RESULTS))
        if key not in self._bases:
            t0 = time.perf_counter()
            self._bases[key] = baseline(*self.problem(shape, dtype, seed), result_dtypes)
            self.seconds += time.perf_counter() - t0
        return self._bases[key]


# --- one configuration ----------------------------------------------------------------------

class Compiled:
    """A kernel compiled ahead of time for one (shape, dtype): ``args``, ``call()``, ``compile_s``."""

    def __init__(self, fn, problem, do, dfs, dtype):
        harness.check_representable(problem, dtype)
        self.args = mesh_lib.place_args(harness.device_inputs(problem, do, dfs, dtype))  # on --mesh, if any
        t0 = time.perf_counter()
        self.exe = harness.runner(fn).lower(*self.args, problem.scale).compile()
        self.compile_s = time.perf_counter() - t0

    def call(self):
        return jax.block_until_ready(self.exe(*self.args))


def judge(out, shape, dtype, seed, cache):
    """Compare a runner output tuple against the cached oracle: ``{"passed", "verdicts", "failures"}``."""
    got = {n: mesh_lib.to_host(x) for n, x in zip(RESULTS, out)}
    p, do, dfs = cache.problem(shape, dtype, seed)
    base = cache.baseline(shape, dtype, seed, {n: dtype_name(got[n]) for n in RESULTS})
    report = compare(p, do, dfs, got, cache.reference(shape, dtype, seed), dtype=dtype, base=base)
    failures = [f"{v.name}: err_ratio {fmt_err(v.err_ratio)} (tol {v.tol_ratio:.1e}), max_err {fmt_err(v.max_err)} "
                f"(tol {v.tol_max:.1e}) [{v.rule}]" for v in report.failures()]
    return {"passed": report.passed, "shape": list(shape), "verdicts": [v.as_dict() for v in report.verdicts],
            "failures": failures}


def validate_config(fn, shape, dtype, seed, cache, compiled=None):
    """Validate ``fn`` at ``shape`` (using ``compiled`` when it is for that shape); errors are failures."""
    try:
        if compiled is None:
            p, do, dfs = cache.problem(shape, dtype, seed)
            compiled = Compiled(fn, p, do, dfs, dtype)
        return judge(compiled.call(), shape, dtype, seed, cache)
    except MemoryError as exc:  # the host cannot hold this shape: a usage error, not a verdict on the kernel
        raise UsageError(f"shape {tuple(shape)}: out of host memory ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # noqa: BLE001 - the reason is reported, the kernel is not timed
        return {"passed": False, "shape": list(shape), "verdicts": [],
                "failures": [f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ''}"]}


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
    entry["reason"] = reason
    return None


def try_config(spec, opts, rec, shape, dtype, *, sweeping, repeats, seed, cache, log):
    """Build, validate, compile and time one configuration, recording it in ``rec["sweep"]``.

    Swept configurations are validated at :func:`small_shape` before compiling (the fastest is
    validated at the full shape later, by :func:`choose`); a single one at the benchmark shape before
    timing. Returns ``(entry, fn, compiled)`` when timed, else None (the entry holds the reason).
    """
    label = spec.label(opts)
    entry = {"options": opts, "label": label, "status": "rejected"}
    rec["sweep"].append(entry)
    try:
        fn = spec.build(**opts)
    except UsageError as exc:
        return _reject(entry, f"invalid configuration: {exc}")
    if "source" not in rec:
        rec["source"], rec["notes"] = source_sha256(fn), kernel_notes(fn)
    if sweeping:
        log(f"{label} {dtype}: validating at small shape {small_shape(shape)}")
        entry["small_validation"] = small = validate_config(fn, small_shape(shape), dtype, seed, cache)
        if not small["passed"]:
            return _reject(entry, "failed validation at small shape: " + "; ".join(small["failures"]))
    try:
        log(f"{label} {dtype}: compiling at {tuple(shape)}")
        compiled = Compiled(fn, *cache.problem(shape, dtype, seed), dtype)
    except MemoryError as exc:
        raise UsageError(f"shape {tuple(shape)}: out of host memory ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # noqa: BLE001
        return _reject(entry, f"compile failed: {type(exc).__name__}: {str(exc).strip()[:400]}")
    entry["compile_s"] = compiled.compile_s
    if not sweeping:
        log(f"{label} {dtype}: validating at {tuple(shape)}")
        entry["full_validation"] = full = validate_config(fn, shape, dtype, seed, cache, compiled)
        if not full["passed"]:
            return _reject(entry, "failed validation at the benchmark shape: " + "; ".join(full["failures"]))
    log(f"{label} {dtype}: timing {repeats} calls")
    try:
        entry.update(time_calls(compiled, repeats))
    except Exception as exc:  # noqa: BLE001
        return _reject(entry, f"run failed: {type(exc).__name__}: {str(exc).strip()[:400]}")
    entry["status"] = "timed"
    return entry, fn, compiled


def choose(candidates, shape, dtype, seed, cache, log):
    """The fastest timed configuration that passes validation at the benchmark shape, or None.

    Candidates are tried fastest first; one that fails is marked rejected and loses its timings.
    """
    for entry, fn, compiled in sorted(candidates, key=lambda c: c[0]["median_s"]):
        if "full_validation" not in entry:
            log(f"{entry['label']} {dtype}: validating the fastest configuration at {tuple(shape)}")
            entry["full_validation"] = validate_config(fn, shape, dtype, seed, cache, compiled)
        if entry["full_validation"]["passed"]:
            return entry
        entry["status"] = "rejected"
        entry["reason"] = "failed validation at the benchmark shape: " + "; ".join(entry["full_validation"]["failures"])
        for k in ("median_s", "min_s", "times_s"):
            entry.pop(k, None)
    return None


def bench_one(spec, shape, dtype, *, tiles, repeats, seed, cache, log):
    """Benchmark one (kernel, shape, dtype): try every configuration, keep the fastest valid one;
    returns its JSON record."""
    B, T, H, K, V = shape
    rec = {"kernel": spec.label(), "spec": spec.spec, "shape": dict(B=B, T=T, H=H, K=K, V=V), "dtype": dtype,
           "status": "rejected", "reason": None, "sweep": []}
    configs = configurations(spec, tiles)
    tried = [try_config(spec, opts, rec, shape, dtype, sweeping=len(configs) > 1, repeats=repeats, seed=seed,
                        cache=cache, log=log) for opts in configs]
    candidates = [c for c in tried if c is not None]
    chosen = choose(candidates, shape, dtype, seed, cache, log)
    for _, _, compiled in candidates:
        compiled.exe = None  # free device executables
    if chosen is None:
        reasons = [f"{e['label']}: {e.get('reason')}" for e in rec["sweep"] if e["status"] == "rejected"]
        rec["reason"] = "no configuration passed validation -- " + " | ".join(reasons)
        return rec
    chosen["status"] = "chosen"
    rec.update(status="ok", reason=None, options=chosen["options"], label=chosen["label"],
               compile_s=chosen["compile_s"], median_s=chosen["median_s"], min_s=chosen["min_s"],
               times_s=chosen["times_s"], validation=chosen["full_validation"])
    from .cost import prediction  # noqa: PLC0415 - only a TPU run of a Pallas kernel gets one

    rec["prediction"] = prediction(spec.name, chosen["options"], shape, dtype, jax.devices()[0].device_kind)
    return rec


def run_bench(specs, *, batches=(4,), seqs=(4096,), heads=(6,), dims=(128,), dtypes=("float32",),
              tiles=None, repeats=20, seed=0, show_progress=True, env=None, mesh=None):
    """Benchmark every kernel spec at every shape and dtype; returns the JSON-ready report (with
    ``"interrupted": true`` and the results finished so far after Ctrl-C); with a ``mesh`` (ci/mesh.py)
    every kernel is compiled and timed inside it on sharded inputs."""
    for spec in specs:  # unknown kernels / import failures are usage errors, before any work
        spec.build()
    check_tiles(specs, tiles)
    shapes = [(B, T, H, D, D) for D in dims for H in heads for T in seqs for B in batches]
    for shape in shapes:
        check_allocatable(shape)
    bar = progress(total=len(specs) * len(shapes) * len(dtypes), desc="bench", unit="run") if show_progress else None

    def log(msg):
        if bar is not None:
            bar.set_postfix_str(msg[:80])

    cache = OracleCache(log)
    t0 = time.perf_counter()
    results, interrupted = [], False
    in_mesh = mesh_lib.using(mesh)  # kernels compile and run inside the mesh (a no-op without one)
    in_mesh.__enter__()
    try:
        for shape in shapes:
            for dtype in dtypes:
                group = []
                for spec in specs:
                    group.append(bench_one(spec, shape, dtype, tiles=tiles, repeats=repeats, seed=seed,
                                           cache=cache, log=log))
                    results.append(group[-1])
                    if bar is not None:
                        bar.update(1)
                first = next((r for r in group if r["status"] == "ok"), None)
                for r in group:
                    if first is not None and r["status"] == "ok":
                        r["baseline_kernel"] = first["kernel"]
                        r["speedup_vs_baseline"] = first["median_s"] / r["median_s"]
    except KeyboardInterrupt:  # Ctrl-C: report what was finished, marked interrupted
        interrupted = True
    finally:
        in_mesh.__exit__(None, None, None)
        if bar is not None:
            bar.close()
    passed = not interrupted and all(r["status"] == "ok" for r in results)
    return {
        "schema": SCHEMA,
        "command": "bench",
        "environment": env or environment(),
        "repeats": repeats,
        "seed": seed,
        "tiles": tiles,
        "mesh": mesh_lib.format_mesh(mesh) if mesh is not None else None,
        "problem": "oracle.make_problem(decay='moderate', gates='uniform', initial_state=True), random cotangents",
        "timed": "jit(vjp forward + pullback of all seven inputs), block_until_ready, median of repeats",
        "oracle_seconds": cache.seconds,
        "seconds": time.perf_counter() - t0,
        "passed": passed,
        "interrupted": interrupted,
        "outcome": "interrupted" if interrupted else ("pass" if passed else "fail"),
        "results": results,
    }


def _shape_label(s):
    return f"B{s['B']} T{s['T']} H{s['H']} K{s['K']} V{s['V']}"


def format_bench(report):
    env = report["environment"]
    lines = [f"gdn2-oracle bench: device {env['device_kind']} ({env['platform']}), jax {env['jax_version']}, "
             f"commit {(env['git']['commit'] or 'unknown')[:12]}{'+dirty' if env['git']['dirty'] else ''}, "
             f"median of {report['repeats']} synchronized forward+backward calls", ""]
    rows = []
    for r in report["results"]:
        if r["status"] == "ok":
            sp = r.get("speedup_vs_baseline")
            rows.append([r["kernel"], _shape_label(r["shape"]), r["dtype"], r.get("label", r["kernel"]),
                         f"{r['compile_s']:.1f}", f"{1e3 * r['median_s']:.2f}", f"{1e3 * r['min_s']:.2f}",
                         f"{sp:.2f}x vs {r['baseline_kernel']}" if sp is not None else "-", "validated"])
        else:
            rows.append([r["kernel"], _shape_label(r["shape"]), r["dtype"], "-", "-", "-", "-", "-", "REJECTED"])
    lines.append(table(["kernel", "shape", "dtype", "config", "compile s", "median ms", "min ms", "speedup",
                        "status"], rows, "<<<<>>>><"))
    sweeps = [r for r in report["results"] if len(r["sweep"]) > 1]
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
    rejected = [r for r in report["results"] if r["status"] != "ok"]
    if rejected:
        lines += ["", "Rejected (not timed):"]
        for r in rejected:
            lines.append(f"  {r['kernel']} {_shape_label(r['shape'])} {r['dtype']}: {r['reason']}")
    notes = sorted({(r["kernel"], n) for r in report["results"] for n in r.get("notes", [])})
    if notes:
        lines += ["", "Notes:"] + [f"  {k}: {n}" for k, n in notes]
    from .cost import format_predictions  # noqa: PLC0415

    lines += format_predictions(report["results"])
    lines.append("")
    lines.append(f"float64 oracle + baselines: {report['oracle_seconds']:.1f} s; total {report['seconds']:.1f} s")
    if report.get("interrupted"):
        lines.append(f"INTERRUPTED: {len(report['results'])} result(s) finished before Ctrl-C are reported")
    return "\n".join(lines)


def plot_bench(report, path):
    """A PNG bar chart of median forward+backward time per (shape, dtype) and kernel (rejected: marked)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    groups = []
    for r in report["results"]:
        key = f"{_shape_label(r['shape'])}\n{r['dtype']}"
        if key not in groups:
            groups.append(key)
    kernels = []
    for r in report["results"]:
        if r["kernel"] not in kernels:
            kernels.append(r["kernel"])
    width = 0.8 / max(1, len(kernels))
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(groups) * max(1, len(kernels)) / 2), 4.5))
    for i, kname in enumerate(kernels):
        xs, ys = [], []
        for r in report["results"]:
            if r["kernel"] != kname:
                continue
            x = groups.index(f"{_shape_label(r['shape'])}\n{r['dtype']}") + (i - (len(kernels) - 1) / 2) * width
            if r["status"] == "ok":
                xs.append(x)
                ys.append(1e3 * r["median_s"])
                label = f"{1e3 * r['median_s']:.1f}"
                if r.get("speedup_vs_baseline") and r["kernel"] != r.get("baseline_kernel"):
                    label += f"\n{r['speedup_vs_baseline']:.2f}x"
                ax.annotate(label, (x, 1e3 * r["median_s"]), ha="center", va="bottom", fontsize=7)
            else:
                ax.annotate("rejected", (x, 0), ha="center", va="bottom", fontsize=7, rotation=90, color="red")
        ax.bar(xs, ys, width, label=kname)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel("median forward+backward (ms)")
    env = report["environment"]
    ax.set_title(f"GDN-2 kernels on {env['device_kind']} (validated against the float64 oracle)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
