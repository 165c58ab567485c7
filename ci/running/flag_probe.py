"""FLA keywords a family kernel takes only through ``**kwargs``, probed (docs/DESIGN.md §2, "PyTorch kernels").

A signature ``fn(q, k, v, g, beta, ..., **kwargs)`` says nothing about which of FLA's keywords the function reads:
transformers' Gated DeltaNet fallbacks take ``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval`` and
``use_gate_in_kernel`` through ``**kwargs`` and ignore them. For each such keyword of a torch or JAX family kernel
(:func:`hidden_keywords`, kernels/family_keywords.py; none where the spec declares ``flags=``) the kernel is called
twice on one tiny call, with and without the keyword, on inputs where the oracle's two results differ; a kernel whose
output does not move (less than :data:`MOVED` of the oracle's change) ignores it, one that raises refuses it. Either way
the judge does not run the cases that set it, and the kernel's notes say why (:func:`notes`). Each kernel object is
probed once per keyword (a memo by identity).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from gdn2_oracle.kernels import family_keywords
from gdn2_oracle.oracle import families

from ..grading.families import GDN2

MOVED = 1e-3  # a kernel's change below this fraction of the oracle's is no change
SHAPE = dict(B=1, T=8, H=1, K=16, V=16)  # the probe call: one head (K, V = 16: Triton's tl.dot needs 16)
CU_SEQLENS = np.array([0, 3, 8])
_MEMO: dict = {}  # id(kernel) -> (kernel, {keyword: Verdict}); the kernel is kept so that its id is not reused
_GIVEN: dict = {}  # id(kernel) -> (kernel, family): the family a spec option gave a kernel without the attribute


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the probe found for one keyword: whether the kernel takes it, and why not."""

    keyword: str
    taken: bool
    reason: str = ""


def hidden_keywords(fn):
    """The FLA keywords family kernel ``fn`` takes only through ``**kwargs``: its ``hidden_keywords`` attribute (a
    torch or ``pkg.mod:attr`` family kernel, none when its ``flags=`` are declared), else those its signature, read
    through ``__wrapped__``, does not name while it takes ``**kwargs`` (kernels/family_keywords.py)."""
    if hasattr(fn, "hidden_keywords"):
        return tuple(fn.hidden_keywords or ())
    return family_keywords.hidden_keywords(fn)


def _inputs(family, seed=0):
    """The probe's arrays: q, k not unit-norm, v, log-decays in [-0.5, -0.05] (raw gate inputs with the in-kernel
    gate), beta in (0.1, 0.9), A_log and dt_bias."""
    rng = np.random.default_rng(seed)
    B, T, H, K, V = (SHAPE[n] for n in "BTHKV")
    g_shape = (B, T, H, K) if family == "kda" else (B, T, H)
    arrays = dict(q=rng.standard_normal((B, T, H, K)), k=rng.standard_normal((B, T, H, K)),
                  v=rng.standard_normal((B, T, H, V)), g=-rng.uniform(0.05, 0.5, g_shape),
                  beta=rng.uniform(0.1, 0.9, (B, T, H)))
    dt_bias = rng.uniform(-0.5, 0.5, (H * K if family == "kda" else H,))
    params = dict(A_log=rng.uniform(-1.0, 0.0, (H,)), dt_bias=dt_bias)
    return {n: a.astype(np.float32) for n, a in arrays.items()}, {n: a.astype(np.float32) for n, a in params.items()}


def _keywords(keyword, params):
    """``(without, with)``: the call's keywords without and with ``keyword`` (``allow_neg_eigval`` needs the beta
    sigmoid in both; the in-kernel gate brings its parameters; ``scale``: half the default)."""
    base = {"use_beta_sigmoid_in_kernel": True} if keyword == "allow_neg_eigval" else {}
    if keyword == "scale":  # half the default K**-0.5
        return base, {"scale": 0.5 * SHAPE["K"] ** -0.5}
    if keyword == "cu_seqlens":
        return base, {"cu_seqlens": CU_SEQLENS}
    if keyword == "use_gate_in_kernel":
        return base, {"use_gate_in_kernel": True, **params}
    return base, {**base, keyword: True}


def _oracle_o(family, arrays, keywords):
    """The oracle's ``o`` of the probe call in float64."""
    return np.asarray(families.forward(families.call(family, **arrays, **keywords))[0], np.float64)


def _kernel_o(fn, arrays, keywords):
    """Kernel ``fn``'s ``o`` of the probe call, from a zero initial state passed explicitly (as the judge passes one:
    transformers' recurrent fallbacks require it), on JAX arrays as the judge calls a family kernel
    (ci/running/modes.py; ``cu_seqlens`` stays on the host)."""
    B, HV, K, V = SHAPE["B"], arrays["v"].shape[2], arrays["k"].shape[3], arrays["v"].shape[3]
    N = len(keywords["cu_seqlens"]) - 1 if "cu_seqlens" in keywords else B
    h0 = jnp.zeros((N, HV, K, V), jnp.float32)
    on_device = {n: x if n == "cu_seqlens" or not isinstance(x, np.ndarray) else jnp.asarray(x)
                 for n, x in keywords.items()}
    o, _ = fn(*(jnp.asarray(arrays[n]) for n in ("q", "k", "v", "g", "beta")), initial_state=h0,
              output_final_state=True, **on_device)
    return np.asarray(o, np.float64)


def probe(fn, family, keyword):
    """The :class:`Verdict` on kernel ``fn`` of ``family`` taking ``keyword`` (memoized by the kernel's identity)."""
    entry = _MEMO.get(id(fn))
    if entry is None or entry[0] is not fn:
        entry = _MEMO[id(fn)] = (fn, {})
    if keyword not in entry[1]:
        entry[1][keyword] = _probe(fn, family, keyword)
    return entry[1][keyword]


def _probe(fn, family, keyword):
    arrays, params = _inputs(family)
    without, with_ = _keywords(keyword, params)
    change = np.max(np.abs(_oracle_o(family, arrays, with_) - _oracle_o(family, arrays, without)))
    if not change > 0:  # the oracle cannot tell the two calls apart: nothing to learn
        return Verdict(keyword, True, "oracle: no change")
    try:
        base = _kernel_o(fn, arrays, without)
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot run the plain probe: judged as it says
        line = (str(exc).strip().splitlines() or [""])[0][:160]
        return Verdict(keyword, True, f"could not be probed for {keyword} (the call without it raised "
                                      f"{type(exc).__name__}: {line}); the cases that set it are run")
    try:
        moved = np.max(np.abs(_kernel_o(fn, arrays, with_) - base))
    except Exception as exc:  # noqa: BLE001 - a kernel refusing the keyword at run time does not take it
        line = (str(exc).strip().splitlines() or [""])[0][:160]
        return Verdict(keyword, False, f"refuses {keyword} (probed: the call with it raised {type(exc).__name__}: "
                                       f"{line})")
    if moved < MOVED * change:
        what = "same output with and without it" if moved == 0 else (
            f"output moved by {moved:.2g} where the oracle's moves by {change:.2g}")
        return Verdict(keyword, False, f"ignores {keyword} (probed: {what})")
    return Verdict(keyword, True)


def given_family(fn, family):
    """Record that kernel ``fn`` is of ``family`` (its spec's ``family`` option, ``ci.running.families.kernel_family``):
    a plain ``pkg.mod:fn[family=gdn]`` carries no attribute saying so (a memo by identity)."""
    if getattr(fn, "family", None) is None:
        _GIVEN[id(fn)] = (fn, family)


def _family(fn, family):
    """The kernel's family: ``family``, else its ``family`` attribute, else the one its spec gave it
    (:func:`given_family`); None: not a family kernel, nothing probed."""
    given = _GIVEN.get(id(fn))
    fam = family or getattr(fn, "family", None) or (given[1] if given and given[0] is fn else None)
    return fam if fam in families.FAMILIES and fam != GDN2 else None


def refused(fn, family=None):
    """The hidden keywords kernel ``fn`` does not take (ignored or refused), each probed once."""
    fam = _family(fn, family)
    if fam is None:
        return ()
    return tuple(k for k in hidden_keywords(fn) if not probe(fn, fam, k).taken)


def notes(fn, family=None):
    """One line per hidden keyword kernel ``fn`` does not take (``kernel X ignores K (probed: ...)``; its cases are
    not run) or could not be probed for (its cases are run)."""
    fam = _family(fn, family)
    if fam is None:
        return []
    name = getattr(fn, "__name__", type(fn).__name__)
    verdicts = [probe(fn, fam, k) for k in hidden_keywords(fn)]
    return ([f"kernel {name} {v.reason}; the cases that set it are not run" for v in verdicts if not v.taken]
            + [f"kernel {name} {v.reason}" for v in verdicts if v.taken and v.reason.startswith("could not")])
