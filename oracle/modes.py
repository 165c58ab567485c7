"""FLA ``chunk_gdn2``'s training-call modes on top of the token-by-token core (docs/DESIGN.md §2,
"Call modes (training)"): packed variable-length sequences, the in-kernel gate, in-kernel q/k L2
normalisation, the ``[V, K]`` state layout and the states at chunk starts.

Each sequence runs through :mod:`oracle.recurrence`'s forward and adjoint; the pre-activations of
:mod:`oracle.preprocess` are chained by hand around it. One pipeline, run in a NumPy working precision
or in mpmath (``mp_*``, error estimate by doubling the precision as in :mod:`oracle.mp`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import mpmath
import numpy as np

from . import chunked32, mp, preprocess, recurrence
from .call import GATE_PARAMS, Call
from .problem import GRADS, INPUTS, Problem, repeat_heads, sum_groups

MODE_GRADS = GRADS + ("dA_log", "ddt_bias")
# The per-sequence core a pipeline runs: the token-by-token recurrence (the reference, and e_rec in float32)
# or the float32 chunked algorithm of :mod:`oracle.chunked32` (the tolerance model's e_cum, docs/DESIGN.md §4),
# with float32 operands, or bfloat16 ones in every product or in the chunk solve (the diagnosis's operand-rounding
# baselines).
OPERAND_CORES = {"bfloat16": "chunked32_bf16", "bfloat16_solve": "chunked32_bf16_solve"}  # chunked32.OPERANDS
CORES = ("recurrence", "chunked32", *OPERAND_CORES.values())


class ModesForward(NamedTuple):
    """``o: [B,T,H,V]``, ``final_state`` and ``intermediate_states`` in the call's layout.

    ``intermediate_states: [B, NT, H, K, V]`` (``[..., V, K]`` with ``state_v_first``), None unless
    asked for; ``errors`` maps names to per-element error estimates (mpmath only).
    """

    o: np.ndarray
    final_state: np.ndarray
    intermediate_states: np.ndarray | None = None
    errors: dict | None = None


class ModesGrads(NamedTuple):
    """Gradients w.r.t. the call's raw inputs; ``dA_log`` / ``ddt_bias`` None without those parameters."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dg: np.ndarray
    db: np.ndarray
    dw: np.ndarray
    dh0: np.ndarray
    dA_log: np.ndarray | None = None
    ddt_bias: np.ndarray | None = None
    errors: dict | None = None


class _Sequence(NamedTuple):
    """One run's pre-processed inputs and entering state, in the form ``recurrence``'s core reads."""

    arrays: tuple
    state: np.ndarray
    scale: float

    @property
    def shape(self):
        B, T, H, K = self.arrays[0].shape
        return B, T, H, K, self.arrays[2].shape[-1]

    def inputs(self):
        return self.arrays

    def h0(self):
        return self.state


class _Inputs(NamedTuple):
    """A call's values in one element type: raw inputs, gate parameters, ``h0: [N,H,K,V]``, constants."""

    raw: dict
    params: dict
    h0: np.ndarray
    eps: object
    one: object
    lower_bound: object


def _inputs(call, ar, overrides):
    """The call's values (or ``overrides``, in the call's layout) converted by ``ar``."""
    def value(n):
        return ar.array(overrides[n] if n in overrides else getattr(call, n))

    def const(c):
        return None if c is None else ar.array(c)[()]

    params = {n: None if getattr(call, n) is None else value(n) for n in GATE_PARAMS}
    h0 = call.to_kv(value("initial_state")) if "initial_state" in overrides else ar.array(call.h0())
    return _Inputs({n: value(n) for n in INPUTS}, params, h0, const(preprocess.L2NORM_EPS), const(1.0),
                   const(call.lower_bound))


def _preprocessed(call, x):
    """The core's ``(q, k, v, g, b, w)``: q, k L2-normalised and g from the gate when the call says so."""
    arrays = dict(x.raw)
    if call.qk_l2norm:
        arrays["q"], arrays["k"] = (preprocess.l2norm(x.raw[n], x.eps) for n in ("q", "k"))
    if call.gate_in_kernel:
        arrays["g"] = preprocess.gated_log_decay(x.raw["g"], x.params["A_log"], x.params["dt_bias"], x.lower_bound,
                                                 x.one)
    return tuple(arrays[n] for n in INPUTS)


def core_inputs(call: Call, dtype=np.float64):
    """The core's ``(q, k, v, g, b, w)`` of the call computed in working precision ``dtype``: q, k L2-normalised and g
    through the gate where the call says so (the inputs of the plain contract call it amounts to)."""
    return _preprocessed(call, _inputs(call, recurrence.Arith(dtype), {}))


def _chain_back(call, x, grads):
    """Gradients w.r.t. the core's inputs -> w.r.t. the call's raw inputs and parameters, in place."""
    if call.qk_l2norm:
        for n in ("q", "k"):
            grads["d" + n] = preprocess.l2norm_vjp(x.raw[n], x.eps, grads["d" + n])
    grads["dA_log"] = grads["ddt_bias"] = None
    if call.gate_in_kernel:
        grads["dg"], grads["dA_log"], grads["ddt_bias"] = preprocess.gate_vjp(
            x.raw["g"], x.params["A_log"], x.params["dt_bias"], x.lower_bound, x.one, grads["dg"])
    grads["dh0"] = call.to_kv(grads["dh0"])


def run_call(call: Call, ar, do=None, dfinal_state=None, overrides=None, *, core="recurrence", inner=None):
    """The whole call in the element type of ``ar``: a dict over ``o, final_state, intermediate_states``
    (and, given cotangents, ``MODE_GRADS``) in the call's layouts.

    ``overrides`` maps input names (``INPUTS``, ``initial_state``, ``A_log``, ``dt_bias``, in the
    call's layout) to element-type arrays used instead of the call's values (finite differences).
    ``core`` (one of :data:`CORES`) is what runs each sequence; ``chunked32`` computes in float32 whatever
    ``ar`` is (the pre-activations and their adjoints stay in ``ar``'s type). ``inner``, a dict, receives
    the core's view: ``inputs`` (the pre-processed ``q, k, v, g, b, w`` by name) and, given cotangents,
    ``grads`` (the gradients w.r.t. those, ``dq ... dw``, and ``dh0`` as ``[N, HV, K, V]``). With grouped value
    heads the core runs every value head on its own copy of its key head's ``q, k`` (``repeat_heads``; their
    gradients summed over each group, ``sum_groups``, are the call's), and ``inner`` holds that per-value-head view.
    """
    run = _core(core)
    x = _inputs(call, ar, overrides or {})
    G = call.group_size
    arrays = _preprocessed(call, x)
    arrays = tuple(repeat_heads(a, G) if n in ("q", "k") else a for n, a in zip(INPUTS, arrays))
    out = {"o": np.zeros(call.v.shape, dtype=x.h0.dtype), "final_state": np.array(x.h0)}
    if do is not None:
        dfs = ar.array(call.to_kv(dfinal_state))
        grads = {n: np.zeros_like(a) for n, a in zip(GRADS, arrays)}
        grads["dh0"] = np.array(dfs)  # an empty sequence passes dL/dS_T straight to h0
    for rows, t0, t1, states in call.segments():
        if t1 == t0:
            continue  # an empty sequence: final state = initial state
        seq = _Sequence(tuple(a[rows, t0:t1] for a in arrays), x.h0[states], call.scale)
        if do is None:
            out["o"][rows, t0:t1], out["final_state"][states] = run(seq, ar)
            continue
        out["o"][rows, t0:t1], out["final_state"][states], g = run(seq, ar, do[rows, t0:t1], dfs[states])
        for n in GRADS[:-1]:
            grads[n][rows, t0:t1] = g[n]
        grads["dh0"][states] = g["dh0"]
    out["final_state"] = call.to_kv(out["final_state"])
    out["intermediate_states"] = None
    if call.intermediate_chunk_size is not None:
        out["intermediate_states"] = call.to_kv(_chunk_start_states(call, arrays, x.h0, ar, run))
    if inner is not None:
        inner["inputs"] = dict(zip(INPUTS, arrays))
    if do is None:
        return out
    if inner is not None:
        inner["grads"] = {n: np.array(a) for n, a in grads.items()}
    grads["dq"], grads["dk"] = sum_groups(grads["dq"], G), sum_groups(grads["dk"], G)
    _chain_back(call, x, grads)
    return {**out, **grads}


def _core(name):
    """The per-sequence runner ``(seq, ar, do=None, dfs=None, outputs=True)`` of core ``name``."""
    if name == "recurrence":
        return recurrence.run
    if name == "chunked32":
        return _chunked32_run
    for operands, core in OPERAND_CORES.items():
        if name == core:
            return functools.partial(_chunked32_run, operands=operands)
    raise ValueError(f"core: {name!r} not one of {CORES}")


def _chunked32_run(seq, ar, do=None, dfinal_state=None, outputs=True, operands=None):
    """One sequence through :func:`oracle.chunked32.forward_and_vjp` (float32, chunk 64; ``operands`` its operand
    precision), in the form of ``recurrence.run``'s results (a forward alone runs with zero cotangents)."""
    B, T, H, K, V = seq.shape
    problem = Problem(*seq.arrays, scale=float(seq.scale), initial_state=seq.state)
    cot = (do, dfinal_state) if do is not None else (np.zeros((B, T, H, V)), np.zeros(seq.state.shape))
    # Huge log-decays overflow the float32 cumulative sums (NaN, as in a kernel of this kind): the
    # grading ignores a non-finite e_cum.
    with np.errstate(over="ignore", invalid="ignore"):
        (o, S), grads = chunked32.forward_and_vjp(problem, *cot, operands=operands)
    o = o if outputs else None
    if do is None:
        return o, S
    return o, S, dict(zip(GRADS, grads))


def _chunk_start_states(call, arrays, h0, ar, run=recurrence.run):
    """``[B, NT, H, K, V]``: each run's state before tokens 0, C, 2C, ... (C = intermediate_chunk_size),
    runs concatenated along NT in order (packed: sequence n's chunks at ``sum_{m<n} ceil(L_m / C)``)."""
    C = call.intermediate_chunk_size
    per_run = []
    for rows, t0, t1, states in call.segments():
        S, starts = h0[states], []
        for c0 in range(t0, t1, C):
            starts.append(S)
            chunk = _Sequence(tuple(a[rows, c0:min(c0 + C, t1)] for a in arrays), S, call.scale)
            _, S = run(chunk, ar, outputs=False)
        empty = np.zeros((S.shape[0], 0) + S.shape[1:], dtype=S.dtype)
        per_run.append(np.stack(starts, axis=1) if starts else empty)
    return np.concatenate(per_run, axis=1)


def _as_results(results, errors=None):
    """Split a :func:`run_call` dict into ``ModesForward`` (and ``ModesGrads`` when it has gradients)."""
    fwd = ModesForward(results["o"], results["final_state"], results["intermediate_states"],
                       None if errors is None else {n: e for n, e in errors.items() if n in ModesForward._fields})
    if "dq" not in results:
        return fwd
    grads = ModesGrads(**{n: results[n] for n in MODE_GRADS},
                       errors=None if errors is None else {n: e for n, e in errors.items() if n in MODE_GRADS})
    return fwd, grads


def forward_modes(call: Call, dtype=np.float64, *, core="recurrence") -> ModesForward:
    """Forward of the call in working precision ``dtype``: ``(o, final_state, intermediate_states)``
    (``core`` as in :func:`run_call`)."""
    return _as_results(run_call(call, recurrence.Arith(dtype), core=core))


def forward_and_vjp_modes(call: Call, do, dfinal_state, dtype=np.float64, *, core="recurrence", inner=None):
    """Forward and hand-derived adjoint of the call: ``(ModesForward, ModesGrads)``.

    ``core`` and ``inner`` as in :func:`run_call` (``core="chunked32"``: the tolerance model's e_cum source).
    """
    do, dfinal_state = call.check_cotangents(do, dfinal_state)
    return _as_results(run_call(call, recurrence.Arith(dtype), do, dfinal_state, core=core, inner=inner))


def run_mpf_modes(call: Call, prec, do=None, dfinal_state=None, *, overrides=None):
    """:func:`run_call` at ``prec`` bits: a dict of mpf object arrays (None where absent)."""
    mp.check_prec(prec)
    with mpmath.workprec(int(prec)):
        return run_call(call, mp.MPArith(), do, dfinal_state, overrides)


def _mp_results(call, prec, do=None, dfinal_state=None):
    """Results at ``prec`` bits rounded to float64, with ``|x_prec - x_2prec|`` per element as ``errors``."""
    lo = run_mpf_modes(call, prec, do, dfinal_state)
    hi = run_mpf_modes(call, 2 * prec, do, dfinal_state)
    errors = {n: mp.error_estimate(x, hi[n]) for n, x in lo.items() if x is not None}
    return _as_results({n: None if x is None else mp.to_float64(x) for n, x in lo.items()}, errors)


def mp_forward_modes(call: Call, prec=mp.DEFAULT_PREC) -> ModesForward:
    """Forward at ``prec`` bits: float64 ``ModesForward`` with ``errors``."""
    return _mp_results(call, prec)


def mp_forward_and_vjp_modes(call: Call, do, dfinal_state, prec=mp.DEFAULT_PREC):
    """Forward and adjoint at ``prec`` bits: float64 ``(ModesForward, ModesGrads)`` with ``errors``."""
    do, dfinal_state = call.check_cotangents(do, dfinal_state)
    return _mp_results(call, prec, do, dfinal_state)
