"""The ``gdn2-oracle`` command line: ``validate``, ``bench`` and ``golden``.

Exit status: 0 when every kernel passes (validate) / every benchmark ran on a validated kernel
(bench); 1 when a kernel fails validation or is rejected; 2 on a usage error (unknown kernel,
import failure, bad option), with an argparse-style message on stderr.
"""

from __future__ import annotations

import argparse
import sys

from gdn2_oracle.kernels import DEFAULTS, known
from gdn2_oracle.oracle import KERNEL_DTYPES

from .report import KernelSpec, UsageError, write_json
from .validate import CASE_SETS

PROG = "gdn2-oracle"


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


def _positive(values):
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {values}")
    return values


def _kernel_help():
    return (f"kernel to run (repeatable): a registered name ({', '.join(known())}), or "
            "package.module:attr; options as NAME[key=value,...]; default: " + ", ".join(DEFAULTS))


def build_parser():
    ap = _Parser(prog=PROG, description="Validation-gated checks and benchmarks for GDN-2 kernels.")
    sub = ap.add_subparsers(dest="command", metavar="{validate,bench,golden}", parser_class=_Parser)
    sub.required = True

    v = sub.add_parser("validate", help="judge kernels on the golden corpus and generated problems",
                       description="Run kernels on the golden corpus and on oracle-checked generated problems; "
                                   "judge the forward output, final state and all seven gradients.")
    v.add_argument("--kernel", action="append", metavar="NAME", help=_kernel_help())
    v.add_argument("--dtype", type=_dtypes, default=list(KERNEL_DTYPES), metavar="LIST",
                   help=f"input dtypes, comma-separated (default {','.join(KERNEL_DTYPES)})")
    v.add_argument("--cases", choices=CASE_SETS, default="quick",
                   help="golden corpus only; plus a few generated regimes (quick, default); plus every "
                        "decay x gate regime at several lengths (full)")
    v.add_argument("--case", action="append", metavar="NAME", help="only this case of the set (repeatable)")
    v.add_argument("--seed", type=int, default=0, help="seed of the generated problems")
    v.add_argument("--json", metavar="PATH", help="write the JSON report here")
    v.add_argument("--max-failures", type=int, default=60, metavar="N", help="failing cases printed (default 60)")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")

    b = sub.add_parser("bench", help="validated forward+backward latency",
                       description="Validate each kernel at the exact shape on this device against the float64 "
                                   "oracle, then time forward+backward (rejected kernels are not timed).")
    b.add_argument("--kernel", action="append", metavar="NAME", help=_kernel_help())
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
    b.add_argument("--json", metavar="PATH", help="write the JSON report here")
    b.add_argument("--plot", metavar="PATH", help="write a PNG bar chart here")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")

    g = sub.add_parser("golden", help="regenerate or check the golden corpus (golden.regenerate)",
                       description="regenerate [--case NAME ...] [--jobs N] [--force]; check [--case NAME ...] [--jobs N]")
    g.add_argument("action", choices=("regenerate", "check", "list"))
    g.add_argument("args", nargs=argparse.REMAINDER, help="passed to gdn2-oracle golden regenerate")
    return ap


def _specs(names):
    return [KernelSpec.parse(n) for n in (names or DEFAULTS)]


def cmd_validate(args):
    from .validate import format_validation, run_validation  # noqa: PLC0415

    report = run_validation(_specs(args.kernel), dtypes=args.dtype, cases=args.cases, seed=args.seed,
                            only=args.case, show_progress=not args.no_progress)
    print(format_validation(report, max_failures=args.max_failures))
    if args.json:
        write_json(args.json, report)
        print(f"report: {args.json}")
    return 0 if report["passed"] else 1


def cmd_bench(args):
    from .bench import format_bench, plot_bench, run_bench  # noqa: PLC0415

    if args.repeats < 1:
        raise UsageError(f"{PROG} bench: error: --repeats must be positive, got {args.repeats}")
    if args.plot:
        try:
            import matplotlib  # noqa: F401, PLC0415
        except ImportError as exc:
            raise UsageError(f"{PROG} bench: error: --plot needs matplotlib ({exc})") from None
    report = run_bench(_specs(args.kernel), batches=args.batch, seqs=args.seq, heads=args.heads, dims=args.dim,
                       dtypes=args.dtype, tiles=args.tiles, repeats=args.repeats, seed=args.seed,
                       show_progress=not args.no_progress)
    print(format_bench(report))
    if args.json:
        write_json(args.json, report)
        print(f"report: {args.json}")
    if args.plot:
        plot_bench(report, args.plot)
        print(f"plot: {args.plot}")
    return 0 if report["passed"] else 1


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
        return regenerate_main(extra)
    except SystemExit as exc:  # its argparse exits on bad arguments
        return exc.code if isinstance(exc.code, int) else 2


def main(argv=None):
    """Entry point of the ``gdn2-oracle`` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "validate":
            return cmd_validate(args)
        if args.command == "bench":
            return cmd_bench(args)
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
        return 130


if __name__ == "__main__":
    sys.exit(main())
