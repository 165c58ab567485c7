"""The ``gdn2-oracle`` command line: global options, the subcommand table and dispatch.

Each subcommand is a module of ``ci/commands`` with ``add_parser(sub)`` and ``run(args) -> exit status``.
Exit status (``commands.output.EXIT``, README "Exit codes"): 0 pass (validate: PRECISION is a warning,
a failure with ``--strict``), 1 a kernel failed or was rejected, 2 a usage error (before any work),
3 some validate cases could not be judged (input error), 4 nothing was judged for a kernel (empty), 130 Ctrl-C
after reporting what was finished (143 for SIGTERM, handled the same way).
Ctrl-C and SIGTERM are handled from the first moment of :func:`main`: the subcommands (and JAX) are imported only
then, and a signal whose exception some code swallowed still makes the run interrupted (never a pass).
Run as the console script, an interrupted command ends with ``os._exit(130)`` after flushing, skipping
interpreter teardown (where JAX's threads could crash the process).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time

from gdn2_oracle.golden.processes import TERMINATED, is_interrupt, signal_status, signalled, terminate_as_interrupt

from .commands.output import EXIT, PROG, UsageError
from .grading.grades import INTERRUPTED
from .running import ast_guard, collector, supervised, xla_cpu

# The subcommands (modules of ci/commands, imported when the parser is built: those the command line names, or all for
# the top-level help), in the order ``--help`` lists them.
COMMANDS = ("validate", "bench", "golden", "domain", "hunt", "cost")
# Commands that compile kernels (the persistent compilation cache applies to them).
COMPILING = ("validate", "bench", "domain", "hunt")
# Options naming a file or directory to write: an empty value would write nothing (or into the working directory).
PATH_OPTIONS = ("json", "plot", "dump", "out")


def command(name):
    """The module of subcommand ``name`` (imports it, and with most of them JAX)."""
    return importlib.import_module(f"{__package__}.commands.{name}")


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


def _global_options(parser, default):
    """The options every command takes, before or after its name (``default``: argparse.SUPPRESS in a subcommand,
    so that an option given before the subcommand's name is not reset by the subcommand's default)."""
    parser.add_argument("--no-compile-cache", action="store_true", default=default if default else False,
                        help="do not use JAX's persistent compilation cache (default directory: env "
                             "GDN2_COMPILE_CACHE, else JAX_COMPILATION_CACHE_DIR, else ~/.cache/gdn2-oracle/jax; "
                             "GDN2_COMPILE_CACHE=off disables it too)")
    d = parser.add_argument_group("multi-host runs (one process a host, e.g. a TPU pod slice; "
                                  "ci/running/multihost.py)")
    d.add_argument("--distributed", action="store_true", default=default if default else False,
                   help="call jax.distributed.initialize() first (auto-detected on Cloud TPU, SLURM, Open MPI); "
                        "each host then computes its share of the float64 oracle")
    d.add_argument("--coordinator", metavar="HOST:PORT", default=default,
                   help="with --distributed: the coordinator's address (default: auto, or env JAX_COORDINATOR_ADDRESS)")
    d.add_argument("--num-processes", type=int, metavar="N", default=default,
                   help="with --distributed: the number of processes")
    d.add_argument("--process-id", type=int, metavar="I", default=default,
                   help="with --distributed: this process's index")
    d.add_argument("--init-timeout", type=int, metavar="S", default=default,
                   help="with --distributed: seconds to wait for the other processes (default 300)")


class _Commands:
    """The subparsers, each given the global options (so every subcommand's --help shows them)."""

    def __init__(self, sub, parents):
        self.sub, self.parents = sub, parents

    def add_parser(self, name, **kwargs):
        return self.sub.add_parser(name, parents=self.parents, **kwargs)


def build_parser(argv=None):
    """The parser: global options, then one subparser per entry of :data:`COMMANDS`.

    With ``argv`` (the command line it will parse) only the subcommands named in it are imported and get their
    options (the others an empty subparser, so a wrong name is still refused with the list): a run imports its own
    command's modules, not every command's (``hunt`` imports Hypothesis, ``cost`` the cost model; 0.10-0.15 s of
    every console run). Help asked for before any command name (``gdn2-oracle --help``) builds them all."""
    ap = _Parser(prog=PROG, description="Validation-gated checks and benchmarks for GDN-2 kernels.")
    _global_options(ap, None)
    shared = argparse.ArgumentParser(add_help=False)
    _global_options(shared, argparse.SUPPRESS)
    sub = ap.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", parser_class=_Parser)
    sub.required = True
    named = _named_commands(argv)
    for name in COMMANDS:
        if named is None or name in named:
            command(name).add_parser(_Commands(sub, [shared]))
        else:
            sub.add_parser(name, parents=[shared])
    return ap


def _named_commands(argv):
    """The entries of :data:`COMMANDS` among the words of ``argv``; None (every command) without ``argv``, or where
    no command is named or ``-h`` / ``--help`` comes before the first one (the help lists every command)."""
    if argv is None:
        return None
    words = [str(a) for a in argv]
    first = next((i for i, a in enumerate(words) if a in COMMANDS), None)
    if first is None or any(a in ("-h", "--help") for a in words[:first]):
        return None
    return set(words) & set(COMMANDS)


def main(argv=None):
    """The command line's entry point (the console script's child, ``ci/supervisor.py``; or in-process with ``argv``);
    returns the exit status. With ``argv is None`` an interrupted command exits with ``os._exit(130)`` once its
    output is flushed, and a supervised one tells its parent the status once its report is complete."""
    if argv is None:
        supervised.start()
        _quick_compile(sys.argv[1:])
        collector.raise_threshold()  # a fresh process: fewer young collections while kernels trace
    ast_guard.install()  # before any thread: CPython's ast.parse is not thread-safe (ci/running/ast_guard.py)
    supervised.guard_exit()  # a kernel calling os._exit fails its case instead of ending the run
    with terminate_as_interrupt() as received:  # SIGTERM: the same partial report as Ctrl-C, then exit 143
        code = _interrupted(received.status(_main(argv)))
    supervised.finished(code)
    if argv is None and (code in (EXIT["interrupted"], TERMINATED) or _joining()):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        supervised.exit_process(code)  # no interpreter teardown: JAX/XLA threads can crash it after an interrupt
    return code


def _quick_compile(argv):
    """A fresh process of a judging command compiles with XLA's quick-compiling CPU settings, before JAX starts
    (``ci/running/xla_cpu.py``); a bad ``GDN2_XLA_CPU`` is left to :func:`_main`, which says so."""
    with contextlib.suppress(ValueError):
        xla_cpu.apply(next((a for a in argv if a in COMMANDS), None))


def _interrupted(code):
    """``code``, or 130 (143 for SIGTERM) when a signal reached the run and the command still returned a pass, an
    empty or an input-error status (its exception swallowed where the command could not see it): said on stderr."""
    sig = signalled()
    if sig is None or code not in (EXIT["pass"], EXIT["input-error"], EXIT["empty"]):
        return code
    print(f"{PROG}: interrupted: a signal reached the run; the report above may be incomplete and is not a pass",
          file=sys.stderr, flush=True)
    return signal_status(sig)


def _check_paths(args):
    """An output option given an empty path is a usage error (it would silently write no report)."""
    for name in PATH_OPTIONS:
        value = getattr(args, name, None)
        if value is not None and not str(value).strip():
            raise UsageError(f"{PROG} {args.command}: error: --{name}: expected a path, got an empty one")


def _raw_args(argv):
    """``command`` and ``json`` as the raw arguments give them (for an interrupt that came before parsing)."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    name = next((a for a in argv if a in COMMANDS), None)
    given = [argv[i + 1] if a == "--json" and i + 1 < len(argv) else a.removeprefix("--json=")
             for i, a in enumerate(argv) if a == "--json" or a.startswith("--json=")]
    return argparse.Namespace(command=name, json=given[-1] if given and name else None)


def _report_path(args):
    """The ``--json`` file of the command (resolved as the command resolves it), or None."""
    if getattr(args, "json", None) is None:
        return None
    from .commands.output import output_path

    return output_path(args.json, option="--json", default_name=f"{args.command}.json", suffixes=(".json",))


def _mark_report(args, **fields):
    """Write the command's ``--json`` file as a report that judged nothing (``fields``: its outcome); returns the path
    written, or None. Before the command runs it is marked incomplete (``supervised.INCOMPLETE``: no earlier run's
    report stays there to be read as this one's, whatever ends the process); a start-up interrupt or a usage error
    then rewrites it."""
    from .commands.output import write_json

    module = sys.modules.get(f"{__package__}.commands.{args.command}")
    try:
        path = _report_path(args)
        if path is None:
            return None
        write_json(path, {"schema": getattr(module, "SCHEMA", None), "command": args.command,
                          **supervised.INCOMPLETE, **fields})
    except (UsageError, OSError):
        return None
    return path


def _report_interrupt(args, started):
    """After an interrupt the command did not report (it came during start-up): its ``--json`` file, unless this
    run already wrote a report there, becomes a report that judged nothing and is marked interrupted, so that no
    earlier run's report is left there to be read as this one's. Returns the path written, or None."""
    with contextlib.suppress(UsageError, OSError, ValueError, AttributeError):
        path = _report_path(args)
        if path is not None and path.exists() and path.stat().st_mtime >= started and not _marker(path):
            return None
    return _mark_report(args, interrupted=True, outcome="interrupted", grade=INTERRUPTED,
                        note="interrupted before any result: nothing was judged")


def _marker(path):
    """Whether the JSON at ``path`` is the incomplete marker this run wrote before its command started."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text(encoding="utf-8")).get("outcome") == supervised.INCOMPLETE["outcome"]
    return False


def _joining():
    """Whether a ``--distributed`` start-up is still blocked in JAX (its C++ wait cannot be cancelled)."""
    multihost = sys.modules.get("gdn2_oracle.ci.running.multihost")  # imported only by --distributed runs
    return multihost is not None and multihost.joining()


def _start_distributed(args):
    """``--distributed``: join the multi-host run before JAX starts (explicit options imply ``--distributed``)."""
    explicit = (args.coordinator, args.num_processes, args.process_id)
    if not args.distributed and all(x is None for x in (*explicit, args.init_timeout)):
        return
    if not args.distributed:
        raise UsageError(f"{PROG}: error: --coordinator, --num-processes, --process-id and --init-timeout need "
                         "--distributed")
    from .running import multihost  # imports JAX

    timeout = multihost.INIT_TIMEOUT if args.init_timeout is None else args.init_timeout
    who = (f"process {args.process_id} of {args.num_processes}, coordinator {args.coordinator}"
           if args.num_processes is not None else "auto-detected cluster")
    print(f"{PROG}: joining the distributed run ({who}; up to {timeout} s, Ctrl-C stops)", file=sys.stderr,
          flush=True)
    try:
        multihost.initialize(*explicit, timeout=timeout)
    except ValueError as exc:
        raise UsageError(f"{PROG}: error: --{str(exc).replace('_', '-', 1)}") from None


def _set_jobs(args):
    """``--jobs`` of the float64 oracle: set on every call (None: one a core), never left from an earlier one."""
    from .grading import references

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"{PROG} {args.command}: error: --jobs must be positive, got {args.jobs}")
    references.JOBS = args.jobs


def _main(argv):
    started, args, marked = time.time(), None, None
    try:
        args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
        _check_paths(args)
        try:
            xla_cpu.mode()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        _start_distributed(args)
        if not args.no_compile_cache and args.command in COMPILING:
            from .running.compile_cache import enable  # imports JAX

            enable()
        if hasattr(args, "jobs"):
            _set_jobs(args)
        marked = _mark_report(args)  # before any kernel is imported or run
        if marked is not None:
            supervised.report(marked)
        supervised.ready()  # start-up is over: the supervising parent forwards signals from here on
        return command(args.command).run(args)
    except _Exit as exc:
        return exc.status
    except UsageError as exc:
        msg = str(exc)
        if not msg.startswith((PROG, "usage:")):
            msg = f"{PROG}: error: {msg}"
        print(msg, file=sys.stderr)
        if marked is not None:  # the command refused its options after the report was marked incomplete
            _mark_report(args, outcome="usage-error", grade="EMPTY", note=msg)
        return EXIT["usage"]
    except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - only a signal's interrupt (else re-raised)
        if not is_interrupt(exc):  # before the command's own interrupt handling (start-up) or after it
            raise
        written = _report_interrupt(args or _raw_args(argv), started)
        print(f"{PROG}: interrupted{'' if written is None else f'; nothing judged ({written} marked interrupted)'}",
              file=sys.stderr)
        return EXIT["interrupted"]  # 143 for a SIGTERM (main)


if __name__ == "__main__":
    sys.exit(main())
