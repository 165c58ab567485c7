"""Time to a verdict: ``validate`` and the plugin cold and warm, with where the time goes (a script, not a test).

Each run is a fresh process with its own cache home (``XDG_CACHE_HOME``: JAX's compilation cache and the
reference cache live there): *cold* starts with it empty, *warm* reuses what the cold run left. The pure-Python
workload ``sum(i*i for i in range(30_000_000))`` is timed in the same run, so every figure is also a ratio to it
(machines of the same kind differ by ~2x; the ratios do not).

    python -m gdn2_oracle.ci.benchmarks.bench_verdict --repeats 3
    python -m gdn2_oracle.ci.benchmarks.bench_verdict --what validate --kernel pairwise --validate-args \
        "--case decay_resets --dtype float32" --repeats 1

Where the time goes (``--inner``, the runs' own processes): JAX's monitoring events give the seconds spent
tracing, lowering and compiling (and the number of programs compiled and taken from the persistent cache); a
sampler looks at the main thread's stack every 5 ms and counts each sample as tracing, lowering, XLA compile,
the oracle, the kernel running, reporting or other (the innermost frame that decides it). Results: a table, and
``--json FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

WORKLOAD = "sum(i*i for i in range(30_000_000))"
TARGETS = ("validate", "torch", "plugin")
# a correct torch kernel that needs no GPU
TORCH_KERNEL = "torch:gdn2_oracle.kernels.testing_torch:recurrent[output_final_state=True]"

# Sampled stack categories: (category, path fragment, function name or None), innermost frame first.
_RULES = (
    ("xla-compile", "jax/_src/compiler.py", "backend_compile"),
    ("xla-compile", "jax/_src/compiler.py", "backend_compile_and_load"),
    ("compile-cache", "jax/_src/compilation_cache.py", None),
    ("lowering", "jax/_src/interpreters/mlir.py", None),
    ("tracing", "jax/_src/interpreters/partial_eval.py", None),
    ("tracing", "jax/_src/interpreters/ad.py", None),
    ("oracle", "gdn2_oracle/oracle/", None),
    ("oracle", "/oracle/", None),
    ("kernel-run", "jax/_src/interpreters/pxla.py", "__call__"),
    ("kernel-run", "jax/_src/array.py", "block_until_ready"),
    ("kernel-run", "torch/", None),
    ("reporting", "ci/commands/output.py", None),
    ("reporting", "ci/commands/dump.py", None),
    ("reporting", "matplotlib/", None),
    ("importing", "<frozen importlib._bootstrap", None),
)
_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
           "/jax/core/compile/backend_compile_duration": "compile_s",
           "/jax/compilation_cache/cache_retrieval_time_sec": "cache_read_s"}
_COUNTS = {"/jax/compilation_cache/cache_hits": "cache_hits", "/jax/compilation_cache/cache_misses": "cache_misses"}


def category(frames):
    """The category of one sampled stack (``frames``: (filename, function) pairs, innermost first)."""
    for filename, function in frames:
        path = filename.replace(os.sep, "/")
        for name, fragment, fn in _RULES:
            if fragment in path and (fn is None or fn == function):
                return name
    return "other"


class Sampler:
    """Counts the main thread's sampled stacks by :func:`category` every ``interval`` seconds."""

    def __init__(self, interval=0.005):
        self.interval, self.counts, self._stop = interval, Counter(), threading.Event()
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self._main)
            frames = []
            while frame is not None:
                frames.append((frame.f_code.co_filename, frame.f_code.co_name))
                frame = frame.f_back
            self.counts[category(frames)] += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def seconds(self, wall):
        """Each category's share of ``wall`` seconds."""
        total = sum(self.counts.values()) or 1
        return {k: wall * n / total for k, n in sorted(self.counts.items())}


def inner(argv, out):
    """Run one command in this process (``validate ...`` through the CLI, ``pytest ...``) and write its profile; the
    process is fresh, so a judging command compiles and collects garbage as the console script's would
    (``ci/running/xla_cpu.py``, ``ci/running/collector.py``; a pytest run's conftest sets the latter itself)."""
    from gdn2_oracle.ci.running import collector, xla_cpu

    xla_cpu.apply(argv[0])
    if argv[0] != "pytest":
        collector.raise_threshold()
    import jax.monitoring as monitoring

    events = Counter()
    monitoring.register_event_duration_secs_listener(
        lambda e, s, **kw: events.update({_EVENTS[e]: s, _EVENTS[e].replace("_s", "_n"): 1}) if e in _EVENTS else None)
    monitoring.register_event_listener(lambda e, **kw: events.update({_COUNTS[e]: 1}) if e in _COUNTS else None)
    t0 = time.perf_counter()
    with Sampler() as sampler:
        if argv[0] == "pytest":
            import pytest

            rc = pytest.main(argv[1:])
        else:
            from gdn2_oracle.ci import cli

            rc = cli.main(argv)
    wall = time.perf_counter() - t0
    Path(out).write_text(json.dumps({"rc": int(rc), "wall_s": wall, "sampled_s": sampler.seconds(wall),
                                     "jax": dict(events)}))
    return 0


def _workload():
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", WORKLOAD], check=True)
    return time.perf_counter() - t0


def _command(what, args, workdir):
    """The in-process command line of a target (``--inner`` runs it)."""
    if what == "plugin":
        return ["pytest", "--pyargs", "gdn2_oracle.property_tests", "-q", "-p", "no:cacheprovider",
                "-x", *shlex.split(args.plugin_args)]
    kernel = TORCH_KERNEL if what == "torch" else args.kernel
    return ["validate", "--kernel", kernel, "--cases", args.cases, "--json", str(Path(workdir) / "v.json"),
            *shlex.split(args.validate_args)]


def run_once(what, args, home, workdir):
    """One fresh process of ``what`` with cache home ``home``; its total wall time and profile."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GDN2_COMPILE_CACHE", "JAX_COMPILATION_CACHE_DIR", "GDN2_REFERENCE_CACHE")}
    env.update(XDG_CACHE_HOME=str(home), CI="true")
    prof = Path(workdir) / "profile.json"
    cmd = [sys.executable, "-m", "gdn2_oracle.ci.benchmarks.bench_verdict", "--inner", str(prof), "--",
           *_command(what, args, workdir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not prof.exists():
        raise SystemExit(f"{what}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    profile = json.loads(prof.read_text())
    if profile["rc"] not in (0,) and what != "plugin":
        raise SystemExit(f"{what}: the command exited {profile['rc']}\n{proc.stdout[-2000:]}")
    return {**profile, "wall_s": wall, "inner_wall_s": profile["wall_s"]}  # wall: with the interpreter's start


def measure(args):
    """Median of ``args.repeats`` cold and warm runs of each target, with the workload timed alongside."""
    rows, workloads = {}, []
    for _ in range(args.repeats):
        workloads.append(_workload())
        for what in args.what:
            with tempfile.TemporaryDirectory(prefix="gdn2-verdict-") as tmp:
                home, work = Path(tmp) / "cache", Path(tmp) / "work"
                work.mkdir()
                for state in ("cold", "warm"):
                    rows.setdefault((what, state), []).append(run_once(what, args, home, work))
    w = statistics.median(workloads)
    out = {"workload_s": w, "workload_runs": workloads, "python": sysconfig.get_python_version(), "rows": []}
    for (what, state), runs in rows.items():
        med = statistics.median(r["wall_s"] for r in runs)
        mid = min(runs, key=lambda r: abs(r["wall_s"] - med))  # the median run's breakdown
        out["rows"].append({"target": what, "state": state, "wall_s": med, "ratio": med / w,
                            "runs_s": [r["wall_s"] for r in runs], "inner_wall_s": mid["inner_wall_s"],
                            "sampled_s": mid["sampled_s"], "jax": mid["jax"]})
    return out


def format_table(result):
    """The measured rows as a plain-text table."""
    cats = sorted({c for r in result["rows"] for c in r["sampled_s"]})
    head = ["target", "state", "wall s", "x workload", "programs", "cache hits", "trace s", "lower s",
            "compile s", *cats]
    lines = ["\t".join(head)]
    for r in result["rows"]:
        j = r["jax"]
        lines.append("\t".join([r["target"], r["state"], f"{r['wall_s']:.1f}", f"{r['ratio']:.1f}",
                                str(int(j.get("lower_n", 0))), str(int(j.get("cache_hits", 0))),
                                f"{j.get('trace_s', 0):.1f}", f"{j.get('lower_s', 0):.1f}",
                                f"{j.get('compile_s', 0):.1f}",
                                *(f"{r['sampled_s'].get(c, 0):.1f}" for c in cats)]))
    return (f"pure-Python workload: median {result['workload_s']:.2f} s of "
            f"{', '.join(f'{t:.2f}' for t in result['workload_runs'])}\n" + "\n".join(lines))


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", default=",".join(TARGETS), type=lambda s: [x for x in s.split(",") if x],
                        help=f"comma-separated targets among {', '.join(TARGETS)}")
    parser.add_argument("--kernel", default="factorized", help="the JAX kernel of the validate target")
    parser.add_argument("--cases", default="quick")
    parser.add_argument("--validate-args", default="", help="more arguments for validate (both targets)")
    parser.add_argument("--plugin-args", default="", help="more arguments for the plugin's pytest run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--inner", metavar="PROFILE", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.inner:
        return inner(args.rest[1:] if args.rest[:1] == ["--"] else args.rest, args.inner)
    unknown = set(args.what) - set(TARGETS)
    if unknown:
        raise SystemExit(f"--what: unknown target(s) {', '.join(sorted(unknown))}; choose from {', '.join(TARGETS)}")
    if args.repeats < 1:
        raise SystemExit(f"--repeats: expected >= 1, got {args.repeats}")
    result = measure(args)
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
