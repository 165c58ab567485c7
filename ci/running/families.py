"""Family kernels: KDA and Gated DeltaNet in FLA's signature, run with their VJP (docs/DESIGN.md §2, "Families in
FLA"; §4, "Family kernels").

A family kernel is called like FLA's ``chunk_kda`` / ``chunk_gated_delta_rule``::

    o, final_state = fn(q, k, v, g, beta, scale=..., initial_state=h0, output_final_state=True, [flags])

``q, k: [B, T, H, K]``, ``v: [B, T, HV, V]``, ``beta: [B, T, HV]``, ``g: [B, T, HV, K]`` (kda) or ``[B, T, HV]``
(gdn), ``h0`` and the final state ``[B, HV, K, V]`` float32, ``o: [B, T, HV, V]`` in v's dtype; the flags
(``use_qk_l2norm_in_kernel``, ``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval``) are passed only when a case
sets them, so a kernel that does not take one is not judged on the cases that need it (:func:`takes_flags`).

Which family a kernel is (:func:`kernel_family`): the ``family`` spec option, else the kernel's ``family``
attribute (through partials and wrappers), else its signature: a kernel whose signature names ``beta`` and neither
``b`` nor ``w`` is a family kernel whose family must be given (``[family=gdn]`` or ``[family=kda]``: a name is no
proof of the parametrisation, so it is never guessed); any other kernel is ``gdn2``, the plain contract.
"""

from __future__ import annotations

import functools

from gdn2_oracle.kernels import spec as spec_lib
from gdn2_oracle.kernels.spec import KernelSpec, accepts_keywords, keyword_names
from gdn2_oracle.oracle import call_modes, families

from ..grading.families import GDN2
from . import flag_probe, modes

FAMILY_OPTION = "family"
# FLA's keywords a family case may set (oracle.family_recipes.FamilyRecipe.flags).
FLAGS = ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval")


def _attribute(fn):
    """The ``family`` attribute of ``fn`` or of what it wraps (partials, ``__wrapped__``); None if none."""
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        fam = getattr(fn, FAMILY_OPTION, None)
        if isinstance(fam, str):
            return fam
        fn = fn.func if isinstance(fn, functools.partial) else getattr(fn, "__wrapped__", None)
    return None


def beta_signature(fn):
    """Whether ``fn``'s signature is a family kernel's: it names ``beta`` and neither ``b`` nor ``w``."""
    found = keyword_names(fn)
    return found is not None and "beta" in found[0] and not {"b", "w"} & found[0]


def kernel_family(fn, option=None, *, label=None):
    """The family of kernel ``fn``: ``option`` (the spec's ``family``), else its ``family`` attribute, else
    ``gdn2`` unless its signature is a family kernel's (:func:`beta_signature`), which is a ValueError naming
    ``family``. ``label``: the kernel's name in the message."""
    fam = option if option is not None else _attribute(fn)
    if fam is not None:
        if fam not in families.FAMILIES:
            raise ValueError(f"family: {fam!r} not one of {tuple(families.FAMILIES)}")
        flag_probe.given_family(fn, fam)  # the family its probe calls it in (a spec option is no attribute)
        return fam
    if beta_signature(fn):
        name = label or getattr(fn, "__name__", type(fn).__name__)
        raise ValueError(f"family: kernel {name!r} takes beta (FLA's KDA / Gated DeltaNet signature) but says not "
                         f"which family it is: give the spec option family=kda or family=gdn (e.g. "
                         f"'module:fn[family=gdn]') or set fn.family")
    return GDN2


def spec_family(spec: KernelSpec):
    """``(spec to build, family option)``: the ``family`` option taken out of the spec, unless the kernel's factory
    (a registered name) declares a ``family`` parameter itself, where it stays to build the kernel."""
    fam = spec.options.get(FAMILY_OPTION)
    if fam is None:
        return spec, None
    if ":" not in spec.name or spec.name.startswith(spec_lib.TORCH_PREFIX):
        make = spec_lib.factory(spec.name) if ":" not in spec.name else spec_lib.resolve(spec_lib.TORCH_FACTORY)
        found = keyword_names(make)
        if found is not None and FAMILY_OPTION in found[0]:
            return spec, fam
    rest = {k: v for k, v in spec.options.items() if k != FAMILY_OPTION}
    return KernelSpec(spec.spec, spec.name, rest), fam


def takes_flags(fn, flags):
    """Whether ``fn`` can be called with FLA's keywords ``flags``: its signature names them, or takes ``**kwargs``
    and the probe found none of them ignored or refused (``ci/running/flag_probe.py``)."""
    return accepts_keywords(fn, tuple(flags), unknown=True) and not set(flags) & set(flag_probe.refused(fn))


def accepted_flags(fn):
    """The flags of :data:`FLAGS` kernel ``fn`` accepts."""
    return [f for f in FLAGS if takes_flags(fn, (f,))]


def takes_case(fn, case):
    """Whether family kernel ``fn`` can be judged on case ``case`` (kernels/torch_bridge.py's options): without
    grouped value heads (``gva=none``) only cases with as many key as value heads (``HV == H``); a kernel that takes
    no scale (``scale_arg=None``, or ``scale`` probed ignored, ``ci/running/flag_probe.py``) only cases at the
    default ``K**-0.5``."""
    if not getattr(case, "family", None) or len(case.shape) != 6:  # a serving session: its driver's own heads
        return True
    _, _, H, HV, _, _ = case.shape
    if getattr(fn, "gva", None) == "none" and H != HV:
        return False
    custom_scale = getattr(getattr(case, "recipe", None), "scale", None) is not None
    no_scale = (hasattr(fn, "scale_arg") and fn.scale_arg is None) or "scale" in flag_probe.refused(fn)
    return not (custom_scale and no_scale)


def accepted_family_modes(fn, family):
    """The training-call modes kernel ``fn`` of ``family`` takes part in: those whose keywords the family has (its
    FLA entry point's, ``oracle.families.Family``; ``lower_bound`` aside, which only the bounded gate's cases set) and
    ``fn``'s signature accepts (through ``**kwargs``: unless probed ignored or refused), in registry order."""
    fam = families.get(family)
    allowed = set(fam.flags) | {name for name, _ in fam.params}
    probed = set(flag_probe.refused(fn, family))
    out = []
    for m in call_modes.names("training"):
        needed = [k for k in call_modes.get(m).keywords if k != "lower_bound"]
        if set(needed) <= allowed and accepts_keywords(fn, tuple(needed)) and not set(needed) & probed:
            out.append(m)
    return tuple(out)


def inputs(fcall: families.FamilyCall):
    """The family call's per-token inputs by name (q, k, v, g, beta) as passed to the kernel."""
    return dict(zip(fcall.input_names, fcall.inputs()))


def check_representable(fcall: families.FamilyCall, dtype):
    """ValueError if the call's inputs are not exactly representable in ``dtype`` (``modes.check_representable``)."""
    modes.check_representable(fcall, dtype)


def family_results(fn, fcall: families.FamilyCall, do, dfinal_state, *, dtype="float32", flags=None, mesh=None):
    """``{name: np.ndarray}`` over ``ci.grading.modes.result_names(fcall)`` (``o, final_state, dq, dk, dv, dg, dbeta,
    dh0`` and the modes' extra results), in the dtypes the kernel returned, of kernel ``fn`` on the family call: the
    runner of every call (``modes.mode_results``) with the call's keywords (FLA's flags the call sets, the modes').
    ``flags`` is accepted for callers that name them; the call's own are what is passed."""
    return modes.mode_results(fn, fcall, do, dfinal_state, dtype=dtype, mesh=mesh)
