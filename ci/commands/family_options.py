"""``domain`` and ``hunt`` on a family kernel (KDA, Gated DeltaNet in FLA's signature; docs/DESIGN.md §2, "Families
in FLA"): the kernel and its family from a ``--kernel`` spec, and the GDN-2-only options refused for a family kernel
before any work (a usage error naming the option)."""

from __future__ import annotations

from ..grading.families import GDN2
from ..grading.modes import ALL_MODES
from ..running import families as family_running
from ..running import modes as mode_running
from . import args as cli_args
from .output import UsageError


def kernel_and_family(command, spec):
    """``(fn, family, build_spec)``: the kernel of ``spec`` built without its ``family`` option
    (``ci.running.families.spec_family``) and its family (``kernel_family``); UsageError naming ``--kernel`` when it
    cannot be built, takes ``beta`` without saying which family it is, or its spec option ``modes=`` names a mode
    the registry lacks or its signature does not take."""
    build_spec, option = family_running.spec_family(spec)
    fn = cli_args.build(build_spec)
    try:
        family = family_running.kernel_family(fn, option, label=spec.spec)
        if family == GDN2:  # its spec option modes= names modes the registry has and its signature takes
            mode_running.accepted_modes(fn)
        else:
            mode_running.chosen_modes(fn, family_running.accepted_family_modes(fn, family))
    except ValueError as exc:
        raise UsageError(f"gdn2-oracle {command}: error: --kernel {spec.spec}: {exc}") from None
    return fn, family, build_spec


def family_modes(command, spec, family, modes):
    """The modes a kernel of ``family`` is run with: ``modes`` for a GDN-2 kernel; for a family kernel the plain call
    only (``all`` is every mode it accepts: that one), and a UsageError naming ``--modes`` when ``modes`` lists a
    training-call mode (GDN-2's keywords: a family kernel has its own map and search)."""
    if family == GDN2:
        return tuple(modes)
    plain = ALL_MODES[0]
    if tuple(modes) in ((plain,), tuple(ALL_MODES)):
        return (plain,)
    calls = ",".join(m for m in modes if m != plain)
    raise UsageError(f"gdn2-oracle {command}: error: --modes {calls}: training-call modes are GDN-2's; kernel "
                     f"{spec.spec!r} is a {family} family kernel (FLA's signature), run on its own family calls: "
                     f"leave --modes out (or give {plain})")


def refuse(command, spec, family, option, value, allowed):
    """UsageError naming ``option`` when its ``value`` is not among ``allowed`` for a kernel of ``family``."""
    if value is not None and value not in allowed:
        kind = "GDN-2" if family == GDN2 else f"{family} family"
        raise UsageError(f"gdn2-oracle {command}: error: {option} {value}: not a result of kernel {spec.spec!r}, a "
                         f"{kind} kernel (its results: {', '.join(allowed)})")
