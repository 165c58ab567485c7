"""FLA's keywords of a family kernel's call (``gdn`` / ``kda``): those a kernel takes only through ``**kwargs``
(hidden: the judge probes them, ci/running/flag_probe.py) and the ``flags=`` option declaring the ones it takes
(docs/DESIGN.md §2, "PyTorch kernels"), for torch and JAX family kernels alike."""

from __future__ import annotations

import functools
import inspect

from .families import FAMILIES
from .spec import signature_of

# FLA's keywords of a family call a kernel may take or not (the ``flags=`` option declares which; the gate
# parameters A_log, dt_bias and lower_bound come with use_gate_in_kernel).
FAMILY_KEYWORDS = ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "use_gate_in_kernel",
                   "cu_seqlens")
GATE_KEYWORDS = ("A_log", "dt_bias", "lower_bound")
SCALE = "scale"  # probed like a flag when the kernel takes it only through **kwargs


def declared_flags(value):
    """The ``flags=`` option as a tuple of :data:`FAMILY_KEYWORDS` (``+``-separated; empty: none; None: not
    given); ValueError naming ``flags`` for another name."""
    if value is None:
        return None
    names = tuple(n.strip() for n in str(value).split("+") if n.strip()) if value != () else ()
    bad = [n for n in names if n not in FAMILY_KEYWORDS]
    if bad:
        raise ValueError(f"flags: {bad} not among FLA's family keywords {list(FAMILY_KEYWORDS)} ('+'-separated; "
                         "'flags=' alone: none)")
    return names


def _parameters(fn):
    """``fn``'s parameters, its signature read through ``__wrapped__`` and pass-through wrappers; None if it has
    no signature."""
    try:
        return list(signature_of(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def var_keyword(fn):
    """Whether callable ``fn``'s signature (read through wrappers) takes ``**kwargs``."""
    return any(p.kind is p.VAR_KEYWORD for p in _parameters(fn) or ())


def named_keyword(fn, name):
    """Whether callable ``fn``'s signature (read through wrappers) names keyword ``name`` (no signature: yes)."""
    params = _parameters(fn)
    return params is None or any(p.name == name and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                                 for p in params)


def hidden_keywords(fn, *, declared=None, scale_arg=SCALE, packed=True):
    """The FLA keywords kernel function ``fn`` takes only through ``**kwargs``: those of :data:`FAMILY_KEYWORDS`
    its signature (read through ``__wrapped__``) does not name (none when ``declared``, the ``flags=`` option;
    ``cu_seqlens`` only when ``packed``), and ``scale`` when its scale keyword ``scale_arg`` (None: none) is not
    named either. A signature without ``**kwargs`` hides nothing."""
    if not var_keyword(fn):
        return ()
    hidden = () if declared is not None else tuple(
        k for k in FAMILY_KEYWORDS if not named_keyword(fn, k) and (k != "cu_seqlens" or packed))
    return hidden + ((SCALE,) if scale_arg is not None and not named_keyword(fn, scale_arg) else ())


def declared_signature(fn, declared):
    """``fn``'s signature with FLA's keywords as ``declared`` (``flags=``): no ``**kwargs``, the declared flags
    (with the gate parameters for ``use_gate_in_kernel``) as keyword parameters, no other FLA keyword."""
    dropped = FAMILY_KEYWORDS + GATE_KEYWORDS
    params = [p for p in _parameters(fn) if p.kind is not p.VAR_KEYWORD and p.name not in dropped]
    extra = declared + (GATE_KEYWORDS if "use_gate_in_kernel" in declared else ())
    return inspect.Signature(params + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
                                       for n in extra])


def family_function(fn, family=None, flags=None):
    """Kernel function ``fn`` (a ``pkg.mod:attr`` spec) as a kernel of FLA family ``family`` (None: the spec's
    ``family`` option is read elsewhere): the same call, with ``family`` and its :func:`hidden_keywords` as
    attributes; with ``flags`` (the option, :func:`declared_flags`) a signature naming only the declared FLA keywords,
    none hidden and nothing probed. Without ``flags``, a callable object is left as it is (the suite reads its type
    and attributes), and so is any kernel of the plain contract (``family`` neither ``gdn`` nor ``kda``)."""
    declared = declared_flags(flags)
    if family is not None and family not in FAMILIES:
        if declared is not None:
            raise ValueError(f"flags: only a family kernel (family=gdn or family=kda) takes FLA's flags, not "
                             f"family={family!r}")
        return fn
    if declared is None and (family is None or not (inspect.isroutine(fn) or isinstance(fn, functools.partial))):
        return fn

    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        return fn(*args, **kwargs)

    if family is not None:
        kernel.family = family
    kernel.declared, kernel.hidden_keywords = declared, hidden_keywords(fn, declared=declared)
    if declared is not None and _parameters(fn) is not None:
        kernel.__signature__ = declared_signature(fn, declared)
    return kernel
