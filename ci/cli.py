"""The ``gdn2-oracle`` command line: ``validate``, ``bench``, ``golden``, ``domain``, ``hunt`` and ``cost``.

Exit status (:data:`EXIT`): 0 when every kernel passes (validate: cases graded PRECISION are a warning,
a failure with ``--strict``) / every benchmark ran on a validated kernel (bench); 1 when a kernel fails
validation or is rejected; 2 on a usage error (unknown kernel,
import failure, bad option, unwritable output path, unallocatable shape), with an argparse-style
message on stderr, before any work; 3 (validate) when no kernel failed but some cases could not be
judged because their input (a golden file, the manifest) is missing or damaged (outcome
``input-error``); 130 on Ctrl-C, after printing and writing (``--json``, marked ``"interrupted": true``)
what was finished. Run as the console script, an interrupted command ends with ``os._exit(130)``
after flushing, skipping interpreter teardown (where JAX's threads could crash the process).
"""

from __future__ import annotations

import argparse
import os
import sys

from gdn2_oracle.kernels import DEFAULTS, known
from gdn2_oracle.oracle import KERNEL_DTYPES

from .report import KernelSpec, UsageError, output_path, write_json
from .validate import CASE_SETS

PROG = "gdn2-oracle"
# Exit status of each outcome of a command (README "Exit codes and interrupted reports").
EXIT = {"pass": 0, "fail": 1, "usage": 2, "input-error": 3, "interrupted": 130,
        "precision": 0}  # precision: some case graded PRECISION (a warning; validate --strict: 1)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so ``main`` returns 2 in-process."""

    def error(self, message):
        raise UsageError(f"{self.format_usage()}{self.prog}: error: {message}")

    def exit(self, status=0, message=None):
        if message:
            print(message, file=sys.stderr if status else sys.stdout, end="")
        raise _Exit(status)


class _Exit(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


def _csv(kind):
    def parse(text):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        try:
            return [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None
    return parse


def _dtypes(text):
    out = _csv(str)(text)
    bad = [d for d in out if d not in KERNEL_DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {bad}; choose from {', '.join(KERNEL_DTYPES)}")
    return list(dict.fromkeys(out))


def _kernels(text):
    try:
        return KernelSpec.split(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--kernel {text!r}: ")) from None


def _positive(values):
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {values}")
    return values


def _kernel_help():
    return (f"kernel(s) to run (repeatable, or comma-separated): a registered name ({', '.join(known())}), "
            "or package.module:attr; options as NAME[key=value,...]; default: " + ", ".join(DEFAULTS))


MESH_HELP = ("run every kernel on a device mesh, e.g. data=2,seq=4 (axes seq, data, heads shard T, B, H; "
             "inputs placed with NamedSharding)")


JOBS_HELP = ("worker processes of the float64 oracle over batch/head slices of large problems (default: one a core; "
             "results identical to one process)")


def _mesh(text):
    """A --mesh value, checked now (the mesh is built from the devices when the command runs)."""
    from .mesh import parse_mesh  # noqa: PLC0415

    try:
        parse_mesh(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _built_mesh(args):
    """The jax Mesh of --mesh over the available devices (None without --mesh); UsageError if too few."""
    if not getattr(args, "mesh", None):
        return None
    from .mesh import build_mesh  # noqa: PLC0415

    try:
        return build_mesh(args.mesh)
    except ValueError as exc:
        raise UsageError(f"{PROG} {args.command}: error: --{exc}") from None


def build_parser():
    ap = _Parser(prog=PROG, description="Validation-gated checks and benchmarks for GDN-2 kernels.")
    ap.add_argument("--no-compile-cache", action="store_true",
                    help="do not use JAX's persistent compilation cache (default directory: env GDN2_COMPILE_CACHE, "
                         "else ~/.cache/gdn2-oracle/jax; GDN2_COMPILE_CACHE=off disables it too)")
    d = ap.add_argument_group("multi-host runs (one process a host, e.g. a TPU pod slice; ci/multihost.py)")
    d.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() first (auto-detected on Cloud TPU, SLURM, Open MPI); "
                        "each host then computes its share of the float64 oracle")
    d.add_argument("--coordinator", metavar="HOST:PORT",
                   help="with --distributed: the coordinator's address (default: auto, or env JAX_COORDINATOR_ADDRESS)")
    d.add_argument("--num-processes", type=int, metavar="N", help="with --distributed: the number of processes")
    d.add_argument("--process-id", type=int, metavar="I", help="with --distributed: this process's index")
    sub = ap.add_subparsers(dest="command", metavar="{validate,bench,golden,domain,hunt,cost}", parser_class=_Parser)
    sub.required = True

    v = sub.add_parser("validate", help="judge kernels on the golden corpus and generated problems",
                       description="Run kernels on the golden corpus and on oracle-checked generated problems; "
                                   "judge the forward output, final state and all seven gradients.")
    v.add_argument("--kernel", action="extend", type=_kernels, metavar="NAME", help=_kernel_help())
    v.add_argument("--dtype", type=_dtypes, default=list(KERNEL_DTYPES), metavar="LIST",
                   help=f"input dtypes, comma-separated (default {','.join(KERNEL_DTYPES)})")
    v.add_argument("--cases", choices=CASE_SETS, default="quick",
                   help="golden corpus only; plus a few generated regimes (quick, default); plus every "
                        "decay x gate regime at several lengths (full)")
    v.add_argument("--case", action="append", metavar="NAME", help="only this case of the set (repeatable)")
    v.add_argument("--seed", type=int, default=0, help="seed of the generated problems")
    v.add_argument("--json", metavar="PATH", help="write the JSON report here (a directory: PATH/validate.json)")
    v.add_argument("--max-failures", type=int, default=60, metavar="N", help="failing cases printed (default 60)")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    v.add_argument("--mesh", type=_mesh, metavar="AXIS=N,...", help=MESH_HELP)
    v.add_argument("--jobs", type=int, metavar="N", help=JOBS_HELP)
    v.add_argument("--strict", action="store_true",
                   help="fail (exit 1) on cases graded PRECISION too: over the working-precision tolerance but within "
                        "the precision-loss bound (default: a warning, exit 0)")

    b = sub.add_parser("bench", help="validated forward+backward latency",
                       description="Validate each kernel at the exact shape on this device against the float64 "
                                   "oracle, then time forward+backward (rejected kernels are not timed).")
    b.add_argument("--kernel", action="extend", type=_kernels, metavar="NAME", help=_kernel_help())
    b.add_argument("--batch", type=lambda s: _positive(_csv(int)(s)), default=[4], metavar="LIST")
    b.add_argument("--seq", type=lambda s: _positive(_csv(int)(s)), default=[4096], metavar="LIST")
    b.add_argument("--heads", type=lambda s: _positive(_csv(int)(s)), default=[6], metavar="LIST")
    b.add_argument("--dim", type=lambda s: _positive(_csv(int)(s)), default=[128], metavar="LIST",
                   help="head width K = V (default 128)")
    b.add_argument("--dtype", type=_dtypes, default=["float32"], metavar="LIST",
                   help="input dtypes, comma-separated (default float32)")
    b.add_argument("--tiles", metavar="SPEC",
                   help="tile sweep: 'key=v1,v2;key2=...' (e.g. 'chunk_size=32,64,128;leaf=8,16') or 'sweep' "
                        "(the Pallas SWEEP for pallas-* kernels, a default grid for the others)")
    b.add_argument("--repeats", type=int, default=20, help="timed calls per figure (median; default 20)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--json", metavar="PATH", help="write the JSON report here (a directory: PATH/bench.json)")
    b.add_argument("--plot", metavar="PATH", help="write a PNG bar chart here (a directory: PATH/bench.png)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--mesh", type=_mesh, metavar="AXIS=N,...", help=MESH_HELP)
    b.add_argument("--jobs", type=int, metavar="N", help=JOBS_HELP)

    g = sub.add_parser("golden", help="regenerate or check the golden corpus (golden.regenerate)",
                       description="regenerate [--case NAME ...] [--jobs N] [--force]; check [--case NAME ...] [--jobs N]")
    g.add_argument("action", choices=("regenerate", "check", "list"))
    g.add_argument("args", nargs=argparse.REMAINDER, help="passed to gdn2-oracle golden regenerate")
    _add_domain_and_hunt(sub)
    from .cost import add_cost_parser  # noqa: PLC0415

    add_cost_parser(sub)
    return ap


def _add_domain_and_hunt(sub):
    """The ``domain`` and ``hunt`` subcommands (ci/domain.py, ci/hunt.py)."""
    from gdn2_oracle.oracle import RESULTS  # noqa: PLC0415

    from .domain import GRIDS  # noqa: PLC0415
    from .hunt import DEFAULT_BUDGET, SHAPES  # noqa: PLC0415

    def one_kernel(text):  # a one-item list, like the kernel lists of validate and bench
        specs = _kernels(text)
        if len(specs) != 1:
            raise argparse.ArgumentTypeError(f"expected one kernel, got {len(specs)}: {text!r}")
        return specs

    d = sub.add_parser("domain", help="heat maps of error / tolerance over decay, gates, q/k norms, length, dtype",
                       description="Sweep the regimes that decide correctness (log-decay strength and the within-chunk "
                                   "span it gives, resets, erase and write gates, q/k norms, initial state, length, "
                                   "dtype) and write heat maps (PNG), JSON and a summary of where each result leaves "
                                   "PASS.")
    d.add_argument("--kernel", required=True, type=one_kernel, metavar="NAME",
                   help="the kernel to map (a spec as for validate)")
    d.add_argument("--grid", choices=tuple(GRIDS), default="quick",
                   help="quick (default: under a minute for a pure-JAX kernel on CPU) or full (finer, 3 seeds per "
                        "cell, every sweep in both dtypes: a few minutes)")
    d.add_argument("--out", metavar="DIR", help="output directory (default domain-NAME): domain.png, domain.json, "
                                                "summary.txt")
    d.add_argument("--seed", type=int, default=0, help="first data seed of every cell")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")

    h = sub.add_parser("hunt", help="Hypothesis search for a FAIL, targeting error / tolerance",
                       description="Search the conformance suite's recipes with hypothesis.target on error / "
                                   "tolerance; shrink a FAIL to a minimal recipe and print its reproducer. Exit 1 on "
                                   "a FAIL.")
    h.add_argument("--kernel", required=True, type=one_kernel, metavar="NAME",
                   help="the kernel to hunt in (a spec as for validate)")
    def count(text):
        if not text.strip().isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
        return int(text)

    h.add_argument("--budget", type=count, default=DEFAULT_BUDGET, metavar="N",
                   help=f"recipes drawn (default {DEFAULT_BUDGET}; shrinking a FAIL comes on top)")
    h.add_argument("--result", choices=RESULTS, help="target and judge only this result (default: all)")
    h.add_argument("--seed", type=int, help="search seed (default: random, printed)")
    h.add_argument("--shapes", choices=SHAPES, default="core",
                   help="core (default: the conformance suite's CORE configs) or all (its small sets' cross product)")
    h.add_argument("--no-progress", action="store_true", help="no progress bar")


def _specs(names):
    return [KernelSpec.parse(n) for n in (names or DEFAULTS)]


def _outputs(args, **defaults):
    """Check the output options (``--json``, ``--plot``) before any work; UsageError naming a bad one."""
    suffixes = {"json": (".json",), "plot": (".png",)}
    return {opt: output_path(getattr(args, opt), option=f"--{opt}", default_name=name, suffixes=suffixes[opt])
            if getattr(args, opt) else None for opt, name in defaults.items()}


def cmd_validate(args):
    from .validate import format_validation, run_validation  # noqa: PLC0415

    out = _outputs(args, json="validate.json")
    report = run_validation(_specs(args.kernel), dtypes=args.dtype, cases=args.cases, seed=args.seed,
                            only=args.case, show_progress=not args.no_progress, mesh=_built_mesh(args))
    print(format_validation(report, max_failures=args.max_failures), flush=True)
    if out["json"]:
        write_json(out["json"], report)
        print(f"report: {out['json']}", flush=True)
    if report["interrupted"]:
        _say_interrupted(sum(len(k["cases"]) for k in report["kernels"]), "kernel x case result(s)", out["json"])
    if args.strict and report["outcome"] == "precision":
        print("--strict: cases graded PRECISION count as failures", flush=True)
        return EXIT["fail"]
    return EXIT[report["outcome"]]


def _say_interrupted(n, what, json_path):
    print(f"{PROG}: interrupted; {n} {what} finished before it are reported"
          f"{f' (and in {json_path}, marked interrupted)' if json_path else ''}", file=sys.stderr, flush=True)


def cmd_bench(args):
    from .bench import format_bench, plot_bench, run_bench  # noqa: PLC0415

    if args.repeats < 1:
        raise UsageError(f"{PROG} bench: error: --repeats must be positive, got {args.repeats}")
    out = _outputs(args, json="bench.json", plot="bench.png")
    if out["plot"]:
        try:
            import matplotlib  # noqa: F401, PLC0415
        except ImportError as exc:
            raise UsageError(f"{PROG} bench: error: --plot needs matplotlib ({exc})") from None
    report = run_bench(_specs(args.kernel), batches=args.batch, seqs=args.seq, heads=args.heads, dims=args.dim,
                       dtypes=args.dtype, tiles=args.tiles, repeats=args.repeats, seed=args.seed,
                       show_progress=not args.no_progress, mesh=_built_mesh(args))
    print(format_bench(report), flush=True)
    if out["json"]:
        write_json(out["json"], report)
        print(f"report: {out['json']}", flush=True)
    if out["plot"] and report["results"]:
        plot_bench(report, out["plot"])
        print(f"plot: {out['plot']}", flush=True)
    if report["interrupted"]:
        _say_interrupted(len(report["results"]), "benchmark result(s)", out["json"])
    return EXIT[report["outcome"]]


def cmd_golden(args):
    from gdn2_oracle.golden.regenerate import main as regenerate_main  # noqa: PLC0415

    extra = list(args.args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if args.action == "check":
        extra = ["--check", *extra]
    elif args.action == "list":
        extra = ["--list", *extra]
    try:
        return regenerate_main(extra, prog=f"{PROG} golden {args.action}")
    except SystemExit as exc:  # its argparse exits on bad arguments
        return exc.code if isinstance(exc.code, int) else 2


def cmd_domain(args):
    import re  # noqa: PLC0415

    from .domain import GRIDS, format_domain, run_domain, write  # noqa: PLC0415

    [spec] = _specs(args.kernel)
    fn = spec.build()
    out = args.out or "domain-" + re.sub(r"[^A-Za-z0-9_.=-]+", "_", spec.label())
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{PROG} domain: error: --out {out}: cannot create ({exc.strerror or exc})") from None
    report = run_domain(fn, GRIDS[args.grid], kernel=spec.spec, seed=args.seed, show_progress=not args.no_progress)
    paths = write(report, out)
    print(format_domain(report), flush=True)
    print(f"wrote: {paths['png']}, {paths['json']}, {paths['summary']}", flush=True)
    return EXIT["pass"]


def cmd_hunt(args):
    import random  # noqa: PLC0415

    from .hunt import format_hunt, hunt  # noqa: PLC0415

    [spec] = _specs(args.kernel)
    seed = random.SystemRandom().randrange(2**32) if args.seed is None else args.seed
    out = hunt(spec.build(), spec.spec, budget=args.budget, result=args.result, seed=seed, shapes=args.shapes,
               show_progress=not args.no_progress)
    print(format_hunt(out), flush=True)
    return EXIT["fail"] if out["found"] is not None else EXIT["pass"]


def main(argv=None):
    """Entry point of the ``gdn2-oracle`` console script; returns the exit status. As the script
    (``argv is None``) an interrupted command exits with ``os._exit(130)`` once its output is flushed."""
    code = _main(argv)
    if code == EXIT["interrupted"] and argv is None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)  # no interpreter teardown: JAX/XLA threads can crash it after an interrupt
    return code


def _start_distributed(args):
    """``--distributed``: join the multi-host run before JAX starts (explicit options imply ``--distributed``)."""
    explicit = (args.coordinator, args.num_processes, args.process_id)
    if not args.distributed and all(x is None for x in explicit):
        return
    if not args.distributed:
        raise UsageError(f"{PROG}: error: --coordinator, --num-processes and --process-id need --distributed")
    from . import multihost  # noqa: PLC0415

    try:
        multihost.initialize(*explicit)
    except ValueError as exc:
        raise UsageError(f"{PROG}: error: --{str(exc).replace('_', '-', 1)}") from None


def _main(argv):
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _start_distributed(args)
        if not args.no_compile_cache and args.command in ("validate", "bench", "domain", "hunt"):
            from .compile_cache import enable  # noqa: PLC0415

            enable()
        if hasattr(args, "jobs"):  # set on every call (None: one a core), never left over from an earlier one
            if args.jobs is not None and args.jobs < 1:
                raise UsageError(f"{PROG} {args.command}: error: --jobs must be positive, got {args.jobs}")
            from . import parallel_oracle  # noqa: PLC0415

            parallel_oracle.JOBS = args.jobs
        if args.command == "validate":
            return cmd_validate(args)
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "cost":
            from .cost import cmd_cost  # noqa: PLC0415

            return cmd_cost(args)
        if args.command in ("domain", "hunt"):
            return cmd_domain(args) if args.command == "domain" else cmd_hunt(args)
        return cmd_golden(args)
    except _Exit as exc:
        return exc.status
    except UsageError as exc:
        msg = str(exc)
        if not msg.startswith((PROG, "usage:")):
            msg = f"{PROG}: error: {msg}"
        print(msg, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT["interrupted"]


if __name__ == "__main__":
    sys.exit(main())
