"""Run a kernel on an FLA ``chunk_gdn2`` training call (docs/DESIGN.md §2, "Call modes (training)").

The kernel (a GDN-2 kernel, or a family kernel on a family call: ``oracle/families.py``, whose call passes
its own keywords too, ``kernel_keywords``) is called with FLA's keyword names (``cu_seqlens``,
``use_gate_in_kernel``, ``A_log``, ``dt_bias``, ``lower_bound``, ``use_qk_l2norm_in_kernel``, ``state_v_first``,
``return_intermediate_states``) and differentiated with ``jax.vjp`` w.r.t. its per-token inputs (``q, k, v, g, b, w``
or ``q, k, v, g, beta``), ``initial_state`` and, when the call has them,
``A_log`` and ``dt_bias``. The states at chunk starts come from a second, forward-only call with
``return_intermediate_states=True`` (FLA returns them only under inference mode, with no backward).

A kernel takes part in a mode when its signature accepts the mode's keywords (``kernels.spec.accepts_keywords``;
a ``**kwargs`` accepts everything): :func:`accepted_modes`. Which keywords a call passes is the registry's
(``oracle/call_modes.py``). Judging is ``ci/grading/modes.py``'s.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gdn2_oracle.kernels.spec import accepts_keywords
from gdn2_oracle.oracle import call_modes
from gdn2_oracle.oracle.call import Call

from ..grading.modes import KEYWORDS, MODES, ModeCase, result_names
from ..grading.tolerance import Report
from . import mesh as mesh_lib
from .harness import (
    ContractError,
    KernelError,
    check_dtype,
    guarded,
    host_callback_error,
    host_cast,
    o_dtype_hint,
    quiet_callback_failures,
    to_device,
)
from .per_kernel import per_kernel


def accepted_modes(fn):
    """The modes (of ``ci.grading.modes.MODES``) whose keywords ``fn``'s signature accepts, in that order (a
    callable without a signature: none), less those its spec option ``modes=`` leaves out (:func:`chosen_modes`)."""
    return chosen_modes(fn, tuple(m for m in MODES if accepts_keywords(fn, KEYWORDS[m])), among=MODES)


def chosen_modes(fn, accepted, among=None):
    """``accepted`` (mode names) less those kernel ``fn``'s spec option ``modes=`` leaves out (its ``chosen_modes``,
    kernels/adapt.py). ValueError naming ``modes`` for a name not in the registry, or one of ``among`` (default:
    every mode) that ``accepted`` lacks (the option opts out of modes; it cannot opt in to one the signature lacks)."""
    chosen = getattr(fn, "chosen_modes", None)
    if chosen is None:
        return tuple(accepted)
    known = call_modes.names()
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise ValueError(f"modes: unknown call mode(s) {unknown}; known: {', '.join(known)}")
    lacking = [m for m in chosen if m in (among or known) and m not in accepted and not call_modes.is_base(m)]
    if lacking:
        words = sorted({w for m in lacking for w in call_modes.get(m).keywords})
        raise ValueError(f"modes: {lacking} named, but the kernel's signature does not take its keywords {words}")
    return tuple(m for m in accepted if m in chosen)


# The results a forward-only kernel is judged on (a call's forward: the output and the states).
FORWARD_RESULTS = ("o", "final_state", "intermediate_states")


def forward_only(fn):
    """Why kernel ``fn`` has no backward (its ``no_backward`` attribute: FLA's fused recurrent inference kernels, say),
    or None: such a kernel is judged on its forward results only (:data:`FORWARD_RESULTS`)."""
    why = getattr(fn, "no_backward", None)
    return why if isinstance(why, str) and why else None


def kernel_chunk_size(fn):
    """The chunk size a kernel takes its states at chunk starts at: its ``chunk_size`` attribute, else FLA's
    (``call_modes.FLA_CHUNK``)."""
    c = getattr(fn, "chunk_size", None)
    return c if isinstance(c, int) and not isinstance(c, bool) and c > 0 else call_modes.FLA_CHUNK


class Frozen(NamedTuple):
    """An array keyword's value as a hashable record (its dtype and values)."""

    dtype: str
    values: tuple

    def array(self):
        return np.asarray(self.values, self.dtype)


def _frozen(value):
    return Frozen(value.dtype.name, tuple(value.tolist())) if isinstance(value, np.ndarray) else value


def _thawed(value):
    return value.array() if isinstance(value, Frozen) else value


class Static(NamedTuple):
    """The static part of a call: one compiled program per kernel and Static."""

    scale: float
    call_keywords: tuple  # ((FLA keyword, value), ...): the registry's non-default keywords for the call
    params: tuple  # names of the differentiated gate parameters present ("A_log", "dt_bias")
    forward_keywords: tuple = ()  # the keywords of a forward-only call (``call_modes.CallMode.forward_only``)

    @classmethod
    def of(cls, call: Call):
        """The static part of a GDN-2 or family call (a family call's own keywords, ``kernel_keywords``, with the
        modes')."""
        params = tuple(n for n in ("A_log", "dt_bias") if getattr(call, n) is not None)
        keywords = {**call.kernel_keywords(), **call_modes.keywords_for(call)}
        kw = tuple((k, _frozen(v)) for k, v in keywords.items())
        fwd = tuple((k, _frozen(v)) for k, v in call_modes.keywords_for(call, forward_only=True).items())
        return cls(float(call.scale), kw, params, fwd)

    def keywords(self):
        """FLA's keywords for this call (the differentiated parameters aside), only those that differ from the
        defaults, so a kernel accepting some modes only is called with those."""
        return {k: _thawed(v) for k, v in self.call_keywords}

    def forward_only(self):
        """The keywords of the forward-only call (the states at chunk starts), besides :meth:`keywords`."""
        return {k: _thawed(v) for k, v in self.forward_keywords}


def _check(out, q, v, state_shape, n_results, intermediate_shape=None, o_dtype=None):
    """ContractError unless ``out`` holds o ``[B,T,HV,V]`` (v's heads) in v's dtype (or the kernel's declared
    ``o_dtype``), the final state in the call's state shape (float32) and, with ``intermediate_shape``, the states at
    chunk starts (float32 or k's dtype)."""
    if not isinstance(out, (tuple, list)):
        raise ContractError(f"returned a {type(out).__name__}, expected a tuple of {n_results} results")
    if len(out) != n_results:
        raise ContractError(f"returned {len(out)} results, expected {n_results}")
    want = [("o", tuple(v.shape), (jnp.dtype(o_dtype or v.dtype),)),
            ("final_state", state_shape, (jnp.dtype(jnp.float32),))]
    if intermediate_shape is not None:
        want.append(("intermediate_states", intermediate_shape, (jnp.dtype(jnp.float32), jnp.dtype(q.dtype))))
    for (name, shape, dtypes), x in zip(want, out):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise ContractError(f"returned {name} = {x!r:.60}, expected an array of shape {shape}")
        if tuple(x.shape) != tuple(shape):
            raise ContractError(f"returned {name} of shape {tuple(x.shape)}, expected {tuple(shape)}")
        if jnp.dtype(x.dtype) not in dtypes:
            raise ContractError(f"returned {name} of dtype {jnp.dtype(x.dtype).name}, expected "
                                f"{' or '.join(d.name for d in dtypes)}" + o_dtype_hint(name, x.dtype, o_dtype))


@per_kernel
def runner(fn, static: Static, state_shape):
    """A jitted ``(inputs, h0, params, do, dfs) -> (o, final_state, d<inputs>, dh0, d<params>)`` for kernel ``fn``
    (``inputs``: the call's per-token arguments, ``q, k, v, g, b, w`` or a family's ``q, k, v, g, beta``)."""
    kw = static.keywords()

    def run(inputs, h0, params, do, dfs):
        n = len(inputs)

        def f(*args):
            xs, h0, params = args[:n], args[n], args[n + 1:]
            out = fn(*xs, scale=static.scale, initial_state=h0, **kw, **dict(zip(static.params, params)))
            _check(out, xs[0], xs[2], state_shape, 2, o_dtype=getattr(fn, "o_dtype", None))
            return tuple(out)

        (o, S), pullback = jax.vjp(f, *inputs, h0, *params)
        return (o, S) + tuple(pullback((do.astype(o.dtype), dfs)))

    return jax.jit(run)


@per_kernel
def forward_runner(fn, static: Static, state_shape):
    """A jitted forward ``(inputs, h0, params) -> (o, final_state)`` for a kernel with no backward
    (:func:`forward_only`)."""
    kw = static.keywords()

    def run(inputs, h0, params):
        out = fn(*inputs, scale=static.scale, initial_state=h0, **kw, **dict(zip(static.params, params)))
        _check(out, inputs[0], inputs[2], state_shape, 2, o_dtype=getattr(fn, "o_dtype", None))
        return tuple(out)

    return jax.jit(run)


@per_kernel
def state_runner(fn, static: Static, state_shape, intermediate_shape):
    """A jitted forward-only ``(inputs, h0, params) -> intermediate states`` (``return_intermediate_states``).

    A program of its own, not an aux output of :func:`runner`'s VJP: FLA returns the states at chunk starts only
    from a forward without a backward (under ``torch.inference_mode()``), so asking for them under the VJP is a
    call FLA does not support."""
    kw = {**static.keywords(), **static.forward_only()}

    def run(inputs, h0, params):
        out = fn(*inputs, scale=static.scale, initial_state=h0, **kw, **dict(zip(static.params, params)))
        _check(out, inputs[0], inputs[2], state_shape, 3, intermediate_shape, getattr(fn, "o_dtype", None))
        return out[2]

    return jax.jit(run)


def intermediate_shape(call: Call, C):
    """``[B, NT, HV, K, V]`` (``[..., V, K]`` in the ``[V, K]`` layout) of the states at the starts of C-token
    chunks (``oracle.call.Call.chunk_states_shape``)."""
    return call.chunk_states_shape(C)


def check_representable(call: Call, dtype):
    """ValueError unless the call's per-token inputs are exactly representable in ``dtype`` (and the float32
    ones -- initial state, gate parameters -- in float32)."""
    jdt = check_dtype(dtype)
    named = [(n, getattr(call, n), jdt) for n in call.input_names]
    named += [(n, getattr(call, n), jnp.float32) for n in ("initial_state", "A_log", "dt_bias")
              if getattr(call, n) is not None]
    for name, x, dt in named:
        if not np.array_equal(host_cast(x, dt).astype(np.float64), x):
            raise ValueError(f"{name}: values are not exactly representable in {jnp.dtype(dt).name}")


class Refused(ValueError):
    """A call outside a kernel's own domain (its ``refuses``): not run. ``validate`` lists such cases as not run
    (:func:`case_refusal`, before the call); a caller that runs the call anyway gets this error, naming why."""


def refuse(reason):
    """Raise :class:`Refused` with ``reason``; inside a Hypothesis example (the pytest plugin's properties, ``hunt``)
    the example is rejected instead (``hypothesis.reject``, the reason noted and counted as an event): a call outside
    the kernel's domain is no finding."""
    try:
        import hypothesis
    except ImportError:  # hypothesis is the test extra's: without it nothing runs inside an example
        hypothesis = None
    if hypothesis is not None and hypothesis.currently_in_test_context():
        hypothesis.note(f"refused by the kernel (not run): {reason}")
        hypothesis.event("refused by the kernel (outside its domain)")
        hypothesis.reject()
    raise Refused(reason)


def refusal(fn, call: Call):
    """Why kernel ``fn`` refuses ``call`` (its own domain: its ``refuses(inputs, keywords)`` on the call's concrete
    inputs by name and FLA's keywords), or None: a kernel without ``refuses`` takes every call."""
    refuses = getattr(fn, "refuses", None)
    if not callable(refuses):
        return None
    return refuses(dict(zip(call.input_names, call.inputs())), Static.of(call).keywords()) or None


def dtype_refusal(fn, case):
    """Why kernel ``fn`` refuses ``case``'s input dtype (its ``input_dtypes``, the dtypes it takes, and
    ``input_dtypes_reason``), or None: a kernel without ``input_dtypes`` takes every dtype."""
    taken = getattr(fn, "input_dtypes", None)
    if taken is None or case.dtype in taken:
        return None
    why = getattr(fn, "input_dtypes_reason", None)
    return f"{case.dtype} inputs: the kernel takes {', '.join(taken)} only" + (f" ({why})" if why else "")


def case_refusal(fn, case):
    """Why kernel ``fn`` refuses ``case``: its input dtype (:func:`dtype_refusal`, any case), or, for a
    training-call or family case, its own domain (:func:`refusal`); None otherwise (a kernel without either, or a
    case whose data cannot be built: its run reports the input error)."""
    if reason := dtype_refusal(fn, case):
        return reason
    if not callable(getattr(fn, "refuses", None)) or not isinstance(case, ModeCase):
        return None
    try:
        call = case.data()[0]
    except Exception:  # noqa: BLE001 - the case's run reports it as an input error
        return None
    return refusal(fn, call)


def mode_results(fn, call: Call, do, dfinal_state, *, dtype="float32", mesh=None):
    """``{name: np.ndarray}`` over ``ci.grading.modes.result_names(call)``, in the dtypes the kernel returned.

    ``initial_state`` is always passed (zeros when the call has none, so ``dh0`` is defined); the states at
    chunk starts are taken at :func:`kernel_chunk_size`. With a ``mesh`` (``--mesh``) the call runs inside it
    (``jax.set_mesh``), so a context-parallel kernel shards over it; the inputs are not placed (a packed batch
    has one row, and the kernel places its slices itself).
    """
    jdt = check_dtype(dtype)
    call.check_cotangents(do, dfinal_state)
    static = Static.of(call)
    inputs = tuple(to_device(x, jdt) for x in call.inputs())
    h0 = to_device(call.initial_state if call.initial_state is not None else np.zeros(call.state_shape), jnp.float32)
    params = tuple(to_device(getattr(call, n), jnp.float32) for n in static.params)
    jdo, jdfs = to_device(do, jdt), to_device(dfinal_state, jnp.float32)
    reason = refusal(fn, call)  # a kernel's own domain, checked on the concrete inputs before tracing
    if reason:
        refuse(reason)
    try:
        with quiet_callback_failures(), mesh_lib.using(mesh), guarded():
            if forward_only(fn):
                out = jax.block_until_ready(forward_runner(fn, static, call.state_shape)(inputs, h0, params))
            else:
                out = jax.block_until_ready(runner(fn, static, call.state_shape)(inputs, h0, params, jdo, jdfs))
            inter = None
            if static.forward_keywords:
                shape = intermediate_shape(call, kernel_chunk_size(fn))
                inter = jax.block_until_ready(state_runner(fn, static, call.state_shape, shape)(inputs, h0, params))
    except Exception as exc:
        line = host_callback_error(exc)
        if line is None:
            raise
        raise KernelError(line) from None
    names = call.dense_results + tuple("d" + n for n in static.params)
    got = {n: np.asarray(x) for n, x in zip(names, out)}
    if inter is not None:
        got["intermediate_states"] = np.asarray(inter)
    want = judged_names(fn, call)
    assert set(got) == set(want), (sorted(got), want)
    return got


def judged_names(fn, call: Call):
    """The results kernel ``fn`` is judged on for ``call``: every one (``result_names``), or for a forward-only kernel
    (:func:`forward_only`) its forward results."""
    names = result_names(call)
    return tuple(n for n in names if n in FORWARD_RESULTS) if forward_only(fn) else names


def validate(fn, case: ModeCase) -> Report:
    """Run ``fn`` on a mode case and judge it (its states at chunk starts at the kernel's chunk size)."""
    call, do, dfs = case.data()
    check_representable(call, case.dtype)
    got = mode_results(fn, call, do, dfs, dtype=case.dtype)
    return case.judge(got, chunk_size=kernel_chunk_size(fn))
