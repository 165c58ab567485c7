"""Public entry points of the Pallas GDN-2 kernels: layout, padding, custom_vjp.

``gdn2(q, k, v, g, b, w, *, scale=None, initial_state=None, config=TileConfig(), interpret=None,
check_values=False)``
follows the kernel contract of docs/DESIGN.md §2. Around the two ``pallas_call``s the wrapper

* checks the inputs (``kernels.contract.check_inputs``);
* moves heads next to batch (``[B, T, H, D] -> [B*H, T, D]``);
* pads ``T`` to a multiple of the chunk with identity tokens (``q = k = b = v = w = 0``, ``g = 0``:
  the state passes through unchanged and their outputs are dropped), and ``K``/``V`` to multiples of
  128 with zero channels (exact: a zero key channel never writes its state row, a zero value column
  stays zero, and neither touches the real channels, forward or backward);
* raises ``g`` to ``contract.LOG_DECAY_FLOOR`` (exp is 0 there anyway; huge finite ``g`` would overflow ``G``)
  and computes the in-chunk cumulative log-decay ``G`` as a compensated two-float sum ``hi + lo``.

The forward saves only the per-chunk entering states; the backward kernel recomputes the rest.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ..contract import ACC_DTYPE, check_inputs, floor_log_decay
from .backward import backward_call
from .config import LANE, TileConfig, pad_to
from .scan import forward_call

INTERPRET_MODES = (None, "auto", True, False, "tpu", "xla")


def check_interpret(interpret):
    """Validate an ``interpret`` option (see :func:`resolve_interpret`); return it unchanged."""
    from jax.experimental.pallas import tpu as pltpu

    if isinstance(interpret, pltpu.InterpretParams):
        return interpret
    if not any(interpret is m or (isinstance(m, str) and interpret == m) for m in INTERPRET_MODES):
        raise ValueError(f"interpret: expected one of {INTERPRET_MODES} or a pltpu.InterpretParams, "
                         f"got {interpret!r}")
    return interpret


def resolve_interpret(interpret):
    """The ``interpret`` argument for ``pallas_call``.

    * ``None`` / ``"auto"``: compile with Mosaic on a TPU backend, else the TPU interpreter;
    * ``True`` / ``"tpu"``: the TPU interpreter (``pltpu.InterpretParams()``: TPU memory semantics,
      uninitialised VMEM reads as NaN) -- faithful, slower;
    * ``"xla"``: the generic Pallas interpreter (kernel body lowered to plain XLA) -- fast on CPU;
    * ``False``: compile with Mosaic (needs a TPU);
    * a ``pltpu.InterpretParams`` instance is passed through.
    """
    from jax.experimental.pallas import tpu as pltpu

    interpret = check_interpret(interpret)
    if isinstance(interpret, pltpu.InterpretParams):
        return interpret
    if interpret is None or interpret == "auto":
        interpret = jax.default_backend() != "tpu"
    if interpret is True or interpret == "tpu":
        return pltpu.InterpretParams()
    if interpret == "xla":
        return True
    return False


def _to_heads(x, Tp, Dp):
    """``[B, T, H, D] -> [B*H, Tp, Dp]`` with zero padding."""
    B, T, H, D = x.shape
    x = jnp.transpose(x, (0, 2, 1, 3)).reshape(B * H, T, D)
    if Tp != T or Dp != D:
        x = jnp.pad(x, ((0, 0), (0, Tp - T), (0, Dp - D)))
    return x


def _from_heads(x, B, H, T, D):
    """``[B*H, Tp, Dp] -> [B, T, H, D]``."""
    x = x[:, :T, :D].reshape(B, H, T, D)
    return jnp.transpose(x, (0, 2, 1, 3))


def _pad_state(s, Kp, Vp):
    B, H, K, V = s.shape
    s = s.reshape(B * H, K, V)
    if Kp != K or Vp != V:
        s = jnp.pad(s, ((0, 0), (0, Kp - K), (0, Vp - V)))
    return s


def _dims(shape, cfg):
    B, T, H, K = shape[0]
    V = shape[1][-1]
    C = cfg.chunk_size
    return B, T, H, K, V, pad_to(T, C) // C, pad_to(K, LANE), pad_to(V, LANE)


def _two_sum(a, b):
    """Error-free sum: ``a + b = s + e`` exactly (Knuth's TwoSum)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def two_float_cumsum(x, axis):
    """Cumulative sum as an unevaluated pair ``hi + lo`` (float32 each, ~2x float32 precision).

    ``hi`` is an ordinary float32 cumulative sum; ``lo`` holds its rounding errors, so differences
    ``(hi_r - hi_s) + (lo_r - lo_s)`` stay accurate when both sums are large (after a reset).
    """

    def combine(a, b):
        s, e = _two_sum(a[0], b[0])
        return s, e + (a[1] + b[1])

    return jax.lax.associative_scan(combine, (x, jnp.zeros_like(x)), axis=axis)


def _prepare(q, k, v, g, b, w, h0, cfg):
    B, T, H, K, V, nc, Kp, Vp = _dims((q.shape, v.shape), cfg)
    C = cfg.chunk_size
    Tp = nc * C
    ins = [_to_heads(q, Tp, Kp), _to_heads(k, Tp, Kp)]
    g_h = _to_heads(g.astype(ACC_DTYPE), Tp, Kp).reshape(B * H, nc, C, Kp)
    G, Gl = two_float_cumsum(g_h, axis=2)
    ins += [G.reshape(B * H, Tp, Kp), Gl.reshape(B * H, Tp, Kp),
            _to_heads(b, Tp, Kp), _to_heads(v, Tp, Vp), _to_heads(w, Tp, Vp)]
    return ins, _pad_state(h0, Kp, Vp)


def _forward(q, k, v, g, b, w, h0, scale, cfg, interpret):
    B, T, H, K, V, nc, Kp, Vp = _dims((q.shape, v.shape), cfg)
    ins, h0p = _prepare(q, k, v, g, b, w, h0, cfg)
    call = forward_call(cfg, scale, B * H, nc, Kp, Vp, q.dtype, v.dtype, resolve_interpret(interpret))
    o, states, fin = call(*ins, h0p)
    o = _from_heads(o, B, H, T, V)
    fin = fin[:, :K, :V].reshape(B, H, K, V)
    return (o, fin), (ins, states)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _gdn2(q, k, v, g, b, w, h0, scale, cfg, interpret):
    return _forward(q, k, v, g, b, w, h0, scale, cfg, interpret)[0]


def _gdn2_fwd(q, k, v, g, b, w, h0, scale, cfg, interpret):
    out, (ins, states) = _forward(q, k, v, g, b, w, h0, scale, cfg, interpret)
    # Zero-size dtype markers carry the primal dtypes into the backward.
    marks = tuple(jnp.zeros((0,), x.dtype) for x in (q, k, v, g, b, w))
    return out, (ins, states, marks)


def _gdn2_bwd(scale, cfg, interpret, res, cts):
    ins, states, marks = res
    do, dfin = cts
    B, T, H, V = do.shape
    BH, Tp, Kp = ins[0].shape
    Vp = ins[5].shape[-1]
    K = dfin.shape[2]
    nc = Tp // cfg.chunk_size
    do_h = _to_heads(do, Tp, Vp)
    dfin_h = _pad_state(dfin.astype(ACC_DTYPE), Kp, Vp)
    call = backward_call(cfg, scale, BH, nc, Kp, Vp, ins[0].dtype, resolve_interpret(interpret))
    dq, dk, dg, db, dv, dw, dh0 = call(*ins, states, do_h, dfin_h)
    out = []
    for x, dim, mark in zip((dq, dk, dv, dg, db, dw), (K, K, V, K, K, V), marks):
        out.append(_from_heads(x, B, H, T, dim).astype(mark.dtype))
    out.append(dh0[:, :K, :V].reshape(B, H, K, V))
    return tuple(out)


_gdn2.defvjp(_gdn2_fwd, _gdn2_bwd)


def gdn2(q, k, v, g, b, w, *, scale=None, initial_state=None, config: TileConfig | None = None,
         interpret=None, check_values=False):
    """GDN-2 chunked forward with Pallas TPU kernels: returns ``(o [B,T,H,V] in v.dtype, final_state)``.

    Differentiable (``jax.vjp``/``jax.grad``) in all seven inputs through a custom VJP.
    """
    cfg = TileConfig() if config is None else config
    if not isinstance(cfg, TileConfig):
        raise ValueError(f"config: expected a TileConfig, got {type(cfg).__name__}")
    shape, scale = check_inputs(q, k, v, g, b, w, scale=scale, initial_state=initial_state,
                                check_values=check_values)
    if initial_state is None:
        initial_state = jnp.zeros((shape.B, shape.H, shape.K, shape.V), ACC_DTYPE)
    check_interpret(interpret)
    g = floor_log_decay(g)  # outside the custom_vjp: its gradient zeroes dg below the floor
    return _gdn2(q, k, v, g, b, w, initial_state, scale, cfg, interpret)
