"""Argument types and option groups the subcommands share: kernel specs, dtypes, lists, meshes, output paths."""

from __future__ import annotations

import argparse

from gdn2_oracle.kernels import DEFAULTS, KernelSpec, known, parse_value, split_specs
from gdn2_oracle.oracle import KERNEL_DTYPES

from .output import PROG, UsageError, output_path

MESH_HELP = ("run every kernel on a device mesh, e.g. data=2,seq=4 (axes seq, data, heads shard T, B, H; "
             "inputs placed with NamedSharding)")
JOBS_PER_CORE = 4  # --jobs ceiling: this many worker processes per core this process may use
JOBS_HELP = ("worker processes of the float64 oracle over batch/head slices of large problems (default: one a core; "
             f"results identical to one process); 1 to {JOBS_PER_CORE} x the cores: each is a CPU-bound process "
             "with its own NumPy and slice, so past the cores they only share them and cost memory")
SUFFIXES = {"json": (".json",), "plot": (".png",)}


def csv(kind):
    """An argparse type: a comma-separated list of ``kind``."""
    def parse(text):
        items = [t.strip() for t in text.split(",")]
        if not any(items):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        if not all(items):  # "float32," or "1,,2": a value left out, never silently dropped
            raise argparse.ArgumentTypeError(f"empty item in the comma-separated list {text!r}")
        try:
            return [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None
    return parse


def nonnegative(text):
    """An integer >= 0 (a seed)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def jobs(text):
    """A ``--jobs`` value: an integer from 1 to :data:`JOBS_PER_CORE` times the cores this process may use."""
    from gdn2_oracle.golden.processes import default_jobs

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    cores = default_jobs()
    if not 1 <= value <= JOBS_PER_CORE * cores:
        raise argparse.ArgumentTypeError(f"expected 1 to {JOBS_PER_CORE * cores} worker processes "
                                         f"({JOBS_PER_CORE} x the {cores} core(s) this process may use), got {value}")
    return value


def positive_ints(text):
    """A comma-separated list of positive integers."""
    values = csv(int)(text)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {values}")
    return values


def dtypes(text):
    """A comma-separated list of kernel input dtypes."""
    out = csv(str)(text)
    bad = [d for d in out if d not in KERNEL_DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {bad}; choose from {', '.join(KERNEL_DTYPES)}")
    return list(dict.fromkeys(out))


def call_modes(text):
    """A ``--modes`` value of domain and hunt: ``all``, or comma-separated names among ``dense`` and the training-call
    modes (``ci.grading.modes.ALL_MODES``), returned in that order."""
    from gdn2_oracle.ci.grading.modes import ALL_MODES, parse_modes

    if str(text).strip() == "all":
        return ALL_MODES
    try:
        return parse_modes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("modes: ") + " (or all)") from None


def kernels(text):
    """The specs of a ``--kernel`` value (``kernels.split_specs``: commas inside ``[...]`` separate options)."""
    try:
        return split_specs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("name: ")) from None


def one_kernel(text):
    """A one-item kernel list (domain, hunt)."""
    specs = kernels(text)
    if len(specs) != 1:
        raise argparse.ArgumentTypeError(f"expected one kernel, got {len(specs)}: {text!r}")
    return specs


def mesh(text):
    """A ``--mesh`` value, checked now (the mesh is built from the devices when the command runs)."""
    from gdn2_oracle.ci.running.mesh import parse_mesh  # JAX only once a command runs

    try:
        parse_mesh(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def kernel_help():
    return (f"kernel(s) to run (repeatable, or comma-separated): a registered name ({', '.join(known())}), "
            "or package.module:attr; options as NAME[key=value,...]; default: " + ", ".join(DEFAULTS))


def add_kernels(p, *, one=False):
    """``--kernel``: one spec (domain, hunt) or a repeatable list (validate, bench)."""
    if one:
        p.add_argument("--kernel", required=True, type=one_kernel, metavar="NAME",
                       help="the kernel (a spec as for validate)")
    else:
        p.add_argument("--kernel", action="extend", type=kernels, metavar="NAME", help=kernel_help())


def add_prefill(p):
    """``--prefill NAME``: the training-call kernel whose final states the hand-off sessions hand to each kernel."""
    from gdn2_oracle.oracle.handoff_recipes import MODE

    p.add_argument("--prefill", type=one_kernel, metavar="NAME",
                   help=f"with --modes {MODE}: the family training-call kernel that prefills the hand-off sessions "
                        "(a spec as for --kernel, e.g. gdn-factorized); its final states are written into each "
                        "--kernel's pool, which continues the request (docs/serving.md)")


def prefill(args):
    """``(kernel, spec text)`` of ``--prefill``, built (its ``family`` option as for ``--kernel``), or None; a
    UsageError when ``--modes`` names the hand-off mode without it."""
    from gdn2_oracle.oracle.handoff_recipes import MODE

    if not getattr(args, "prefill", None):
        if MODE in (getattr(args, "modes", None) or ()):
            raise UsageError(f"--modes {MODE}: needs --prefill NAME (the kernel that prefills the sessions)")
        return None
    from gdn2_oracle.ci.running.families import spec_family  # JAX only once a command runs

    spec = specs(args.prefill)[0]
    return build(spec_family(spec)[0]), spec.spec


def add_run_options(p, *, mesh_jobs=True):
    """``--no-progress`` and, where a kernel runs at scale, ``--mesh`` and ``--jobs``."""
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    if mesh_jobs:
        p.add_argument("--mesh", type=mesh, metavar="AXIS=N,...", help=MESH_HELP)
        p.add_argument("--jobs", type=jobs, metavar="N", help=JOBS_HELP)


def specs(names):
    """The :class:`KernelSpec` of each name (the defaults when none); UsageError naming a malformed one."""
    out = []
    for n in names or DEFAULTS:
        try:
            out.append(KernelSpec.parse(n))
        except ValueError as exc:
            raise UsageError(f"--kernel {n!r}: {str(exc).removeprefix('name: ')}") from None
    return out


def build(spec, **extra):
    """The kernel of ``spec`` (with ``extra`` options); UsageError with the reason when it cannot be built."""
    try:
        return spec.build(**extra)
    except ValueError as exc:
        raise UsageError(f"--kernel {spec.spec}: {exc}") from None


def outputs(args, **defaults):
    """The output files of ``--json``/``--plot`` (default names per option), probed before any work; None where
    the option is not given (an empty path is a usage error: it would silently write nothing)."""
    return {opt: output_path(getattr(args, opt), option=f"--{opt}", default_name=name, suffixes=SUFFIXES[opt])
            if getattr(args, opt) is not None else None for opt, name in defaults.items()}


def built_mesh(args):
    """The jax Mesh of ``--mesh`` over the available devices (None without it); UsageError if too few."""
    if not getattr(args, "mesh", None):
        return None
    from gdn2_oracle.ci.running.mesh import build_mesh

    try:
        return build_mesh(args.mesh)
    except ValueError as exc:
        raise UsageError(f"{PROG} {args.command}: error: --{exc}") from None


def tiles(text):
    """The one ``--tiles`` grammar (bench, cost): ``key=v1,v2;key2=v3`` or ``key=v1,v2,key2=v3`` -> ``{key: [values]}``.

    An item with ``=`` starts a key, an item without one adds a value to the key before it; ``;`` and ``,``
    both separate items; ``none`` is None; a repeated key is an error.
    """
    grid, key = {}, None
    for item in (t.strip() for t in text.replace(";", ",").split(",")):
        if not item:
            continue
        name, eq, value = item.partition("=")
        if eq:
            key = name.strip()
            if not key.isidentifier():
                raise argparse.ArgumentTypeError(f"{item!r} is not of the form key=v1,v2,...")
            if key in grid:
                raise argparse.ArgumentTypeError(f"{key!r} is given twice in {text!r}")
            grid[key] = []
        elif key is None:
            raise argparse.ArgumentTypeError(f"{item!r} is not of the form key=v1,v2,... "
                                             f"(no key before it in {text!r})")
        value = value if eq else item
        if not value.strip():
            raise argparse.ArgumentTypeError(f"{key!r} has an empty value in {text!r}")
        grid[key].append(None if value.strip().lower() == "none" else parse_value(value.strip()))
    if not grid:
        raise argparse.ArgumentTypeError(f"expected key=v1,v2,...[;key2=...], got {text!r}")
    return grid


# --- time limits ------------------------------------------------------------------------------

CASE_TIMEOUT = 900.0  # seconds one kernel call may take by default (compilation included); 0: no limit


def seconds(text):
    """A number of seconds >= 0 (``--case-timeout``; 0 means no limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def add_case_timeout(p, item="case"):
    """``--case-timeout S`` (validate, bench, domain, hunt): the limit of one kernel call of an ``item``; past it the
    item is FAIL (timed out) and the run stops with what was finished (exit 1)."""
    p.add_argument("--case-timeout", type=seconds, default=CASE_TIMEOUT, metavar="S",
                   help=f"seconds one kernel call may take (default {CASE_TIMEOUT:g}; 0: no limit); past it the "
                        f"{item} is FAIL (timed out) and the run stops with what was finished, exit 1")


def add_seed(p, help, default=0):
    """``--seed N`` (validate, bench, domain, hunt): an integer >= 0 (NumPy's generators refuse a negative one)."""
    p.add_argument("--seed", type=nonnegative, default=default, metavar="N", help=help)
