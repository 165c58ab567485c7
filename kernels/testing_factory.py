"""Test support: correct and deliberately wrong GDN-2 kernels all made by one factory, :func:`make`.

Every kernel here is ``make(**bug)``: the same closure (one ``__qualname__``, ``make.<locals>.kernel``, one module,
one source file) wrapping our pairwise kernel, with at most one small planted bug. Nothing but the traced program
tells them apart, which is what the program cache's staleness battery needs
(``ci/tests/test_program_cache_staleness.py``, ``python -m gdn2_oracle.ci.cache_selfcheck``): a cache keyed by a
kernel's name or source would hand one kernel's program to another. ``good`` and ``good_too`` are correct (the
pairwise kernel at chunk 64 and 16); each of ``bad_01`` .. ``bad_17`` (:data:`WHAT` says what is wrong) FAILs
``gdn2-oracle validate`` on a golden case with an initial state, ``K != V`` and two heads (``kv_32x8``), with or
without a cache. Like ``kernels/testing.py`` this module never imports the oracle.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .contract import CHUNK_SIZE
from .spec import get

# Each option of make(): its value when there is no bug.
DEFAULTS = dict(chunk_size=CHUNK_SIZE, scale=1.0, decay=1.0, decay_shift=False, erase=True, write=True, write_power=1,
                state=True, drop_last=False, swap=None, output=1.0, heads_reversed=False, final=1.0, final_dtype=None,
                grad=None, frozen=None)
SWAPS = ("qk",)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def grad_times(x, factor):
    """``x`` itself, whose gradient comes back multiplied by ``factor`` (a gradient-only bug)."""
    return x


def _grad_times_fwd(x, factor):
    return x, None


def _grad_times_bwd(factor, _, cotangent):
    return (cotangent * factor,)


grad_times.defvjp(_grad_times_fwd, _grad_times_bwd)


def _check(opts):
    """The options with their defaults; ValueError naming an unknown one or a bad ``swap``."""
    unknown = sorted(set(opts) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"options: make() does not accept {unknown} (known: {sorted(DEFAULTS)})")
    out = {**DEFAULTS, **opts}
    if out["swap"] not in (None, *SWAPS):
        raise ValueError(f"swap: {out['swap']!r} not one of {SWAPS}")
    return out


def _gates_and_decay(o, g, b, w):
    """The log-decay and gates the kernel uses: scaled, shifted by one token, or a gate ignored (taken as 1)."""
    g = g * o["decay"]
    if o["decay_shift"]:
        g = jnp.concatenate([jnp.zeros_like(g[:, :1]), g[:, :-1]], axis=1)
    return g, b if o["erase"] else jnp.ones_like(b), w if o["write"] else jnp.ones_like(w)


def _tensors(o, q, k, v, g, b, w):
    """The six tensors as the buggy kernel sees them."""
    g, b, w = _gates_and_decay(o, g, b, w)
    if o["swap"] == "qk":
        q, k = k, q
    w = w ** o["write_power"] if o["write_power"] != 1 else w
    named = dict(q=q, k=k, v=v, g=g, b=b, w=w)
    if o["grad"] is not None:
        name, factor = o["grad"]
        named[name] = grad_times(named[name], factor)
    if o["frozen"] in named:
        named[o["frozen"]] = jax.lax.stop_gradient(named[o["frozen"]])
    if o["drop_last"]:
        named = {n: x[:, :-1] for n, x in named.items()}
    return [named[n] for n in "qkvgbw"]


def _state_in(o, q, initial_state):
    """The initial state the buggy kernel starts from: ignored, or frozen (no gradient)."""
    if not o["state"]:
        return None
    if o["frozen"] == "initial_state" and initial_state is not None:
        return jax.lax.stop_gradient(initial_state)
    return initial_state


def _results(o, out, state, T):
    """``(o, final_state)`` with the output-side bugs applied."""
    if o["drop_last"]:
        out = jnp.concatenate([out, jnp.zeros_like(out[:, :1])], axis=1)[:, :T]
    if o["heads_reversed"]:
        out = out[:, :, ::-1]
    out = (out * o["output"]).astype(out.dtype) if o["output"] != 1.0 else out
    state = state * o["final"] if o["final"] != 1.0 else state
    if o["final_dtype"] is not None:
        state = state.astype(o["final_dtype"]).astype(jnp.float32)
    return out, state


def make(**opts):
    """A contract kernel: the pairwise kernel (``chunk_size``) with the planted bug ``opts`` names (none: correct)."""
    o = _check(opts)
    base = get("pairwise", chunk_size=o["chunk_size"])

    def kernel(q, k, v, g, b, w, *, scale=None, initial_state=None):
        scale = (q.shape[-1] ** -0.5 if scale is None else scale) * o["scale"]
        tensors = _tensors(o, q, k, v, g, b, w)
        out, state = base(*tensors, scale=scale, initial_state=_state_in(o, q, initial_state))
        return _results(o, out, state, q.shape[1])

    return kernel


good = make()  # correct
good_too = make(chunk_size=16)  # correct, another chunk
bad_01 = make(scale=1.01)
bad_02 = make(decay=1.01)
bad_03 = make(decay_shift=True)
bad_04 = make(erase=False)
bad_05 = make(write=False)
bad_06 = make(state=False)
bad_07 = make(drop_last=True)
bad_08 = make(swap="qk")
bad_09 = make(write_power=2)
bad_10 = make(output=1 + 1e-3)
bad_11 = make(heads_reversed=True)
bad_12 = make(final=1.01)
bad_13 = make(final_dtype="bfloat16")
bad_14 = make(grad=("q", 1.01))
bad_15 = make(grad=("k", 0.99))
bad_16 = make(frozen="g")
bad_17 = make(frozen="initial_state")

# What each kernel is, by its attribute name (for tables and messages); the correct ones first.
WHAT = {
    "good": "correct (chunk 64)",
    "good_too": "correct (chunk 16)",
    "bad_01": "scale x1.01",
    "bad_02": "log-decay x1.01",
    "bad_03": "log-decay read one token late",
    "bad_04": "erase gate ignored (taken as 1)",
    "bad_05": "write gate ignored (taken as 1)",
    "bad_06": "initial state ignored",
    "bad_07": "last token dropped",
    "bad_08": "queries and keys swapped",
    "bad_09": "write gate squared",
    "bad_10": "output x(1 + 1e-3)",
    "bad_11": "output heads in reverse order",
    "bad_12": "final state x1.01",
    "bad_13": "final state rounded to bfloat16",
    "bad_14": "dq x1.01 (custom_vjp; forward right)",
    "bad_15": "dk x0.99 (custom_vjp; forward right)",
    "bad_16": "no gradient through g (forward right)",
    "bad_17": "no gradient through the initial state (forward right)",
}
GOOD = ("good", "good_too")
BAD = tuple(name for name in WHAT if name not in GOOD)


def spec(name):
    """The ``--kernel`` spec of this module's kernel ``name``."""
    return f"{__name__}:{name}"
