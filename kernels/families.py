"""Our GDN-2 kernels in the signatures of FLA's families: Gated DeltaNet (``gdn``) and KDA (``kda``).

docs/DESIGN.md §1 ("Families", "Grouped value heads") gives the map and §2 ("Families in FLA") FLA's signatures
(fla-core 0.6.0). A family kernel is called like ``chunk_gated_delta_rule`` / ``chunk_kda``::

    o, final_state = fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                        use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None, check_values=False)

``q, k: [B, T, H, K]``, ``v: [B, T, HV, V]`` with ``HV = G H`` (value head ``hv`` reads key head ``hv // G``),
``beta: [B, T, HV]``, ``g: [B, T, HV, K]`` (kda) or ``[B, T, HV]`` (gdn), ``initial_state: [B, HV, K, V]``
float32; ``o: [B, T, HV, V]`` in ``v``'s dtype, ``final_state`` float32 -- None unless
``output_final_state=True``, as in FLA. ``lower_bound`` is KDA's only (a ValueError for gdn, whose gate has no
bounded form); ``A_log: [HV]``, ``dt_bias: [HV*K]`` (kda) or ``[HV]`` (gdn) with ``use_gate_in_kernel``.

The map onto GDN-2, in JAX before our chunked core (so ``jax.vjp`` gives the family's gradients by autodiff
through it, the core keeping its hand-written backward): ``q, k`` L2-normalised when asked (kernels/modes.py's
``l2norm``: FLA's eps inside the square root) and repeated to the value heads (``jnp.repeat(x, G, axis=2)``);
``beta`` through ``s * sigmoid`` (``s = 2`` with ``allow_neg_eigval``) when ``use_beta_sigmoid_in_kernel``;
``g`` through the in-kernel gate when asked (kernels/modes.py's ``gated_log_decay``; GDN's on the
``[B, T, HV, 1]`` view);
GDN's scalar log-decay broadcast over K; ``b = beta 1_K``, ``w = beta 1_V``. Each step is a method of
:class:`FamilyKernel`, so a deliberately wrong kernel (kernels/testing_families.py) overrides exactly one.

Registered (kernels/registry.py) as ``gdn-factorized``, ``gdn-pairwise``, ``kda-factorized``, ``kda-pairwise``
(options: those of ``factorized`` / ``pairwise``: ``chunk_size``, ``split``, ``leaf``) and ``gdn-scalar``
(kernels/gdn_scalar.py: GDN's scalar decay needs only a C x C decay matrix per chunk; ``chunk_size``).
Each kernel has ``family`` ("gdn" / "kda"), which tells a judge its signature.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import kernel as gdn2
from .contract import ACC_DTYPE, CHUNK_SIZE, INPUT_DTYPES, STATE_DTYPE
from .modes import check_gate_param, check_lower_bound, gated_log_decay, l2norm

FAMILIES = ("gdn", "kda")
FLAGS = ("output_final_state", "use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
         "use_gate_in_kernel")


# --- checks ------------------------------------------------------------------------------------------------


def check_family_call(family, q, k, v, g, beta, *, scale=None, initial_state=None, flags=None, A_log=None,
                      dt_bias=None, lower_bound=None, packed=False):
    """Static checks of a family call; returns ``((B, T, H, HV, K, V), scale, lower_bound)``. ValueError naming
    the argument (shapes, dtypes, flags, gate parameters), as FLA's asserts and docs/DESIGN.md §2 say (``packed``:
    sequences packed with ``cu_seqlens``, T == 0 allowed; the state's shape is then the core's to check)."""
    if family not in FAMILIES:
        raise ValueError(f"family: {family!r} not one of {FAMILIES}")
    named = dict(q=q, k=k, v=v, g=g, beta=beta)
    for name, x in named.items():
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ValueError(f"{name}: expected an array, got {type(x).__name__}")
        if jnp.dtype(x.dtype) not in [jnp.dtype(d) for d in INPUT_DTYPES]:
            raise ValueError(f"{name}: dtype {x.dtype} not supported (float32 or bfloat16)")
    for name in ("q", "v"):
        if len(named[name].shape) != 4:
            raise ValueError(f"{name}: expected rank 4 [B, T, heads, dim], got shape {tuple(named[name].shape)}")
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    if (T == 0 and not packed) or min(B, H, K, HV, V) == 0:
        raise ValueError(f"q: zero-sized dimension in shape {tuple(q.shape)} / v {tuple(v.shape)}")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: shape {tuple(v.shape)} does not match q's [B, T] = {(B, T)}")
    if HV % H:
        raise ValueError(f"v: value heads HV = {HV} are not a multiple of the query/key heads H = {H}")
    want = dict(k=(B, T, H, K), g=(B, T, HV, K) if family == "kda" else (B, T, HV), beta=(B, T, HV))
    for name, shape in want.items():
        if tuple(named[name].shape) != shape:
            raise ValueError(f"{name}: shape {tuple(named[name].shape)} != {shape} ({family})")
    flags = dict(flags or {})
    for name, flag in flags.items():
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name}: expected a bool, got {flag!r}")
    if flags.get("allow_neg_eigval") and not flags.get("use_beta_sigmoid_in_kernel"):
        raise ValueError("allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True (as in FLA)")
    if scale is None:
        scale = float(K) ** -0.5
    elif isinstance(scale, jax.core.Tracer):
        raise ValueError("scale: must be a Python number, not traced")
    else:
        scale = float(scale)
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"scale: must be finite and > 0, got {scale}")
    if initial_state is not None:
        if not hasattr(initial_state, "shape") or tuple(initial_state.shape) != (B, HV, K, V):
            raise ValueError(f"initial_state: shape {tuple(getattr(initial_state, 'shape', ()))} != "
                             f"{(B, HV, K, V)} ([B, HV, K, V])")
        if jnp.dtype(initial_state.dtype) != jnp.dtype(STATE_DTYPE):
            raise ValueError(f"initial_state: dtype {initial_state.dtype} must be float32")
    lb = _check_gate(family, flags.get("use_gate_in_kernel", False), A_log, dt_bias, lower_bound, HV, K)
    return (B, T, H, HV, K, V), scale, lb


def _check_gate(family, use_gate, A_log, dt_bias, lower_bound, HV, K):
    if family == "gdn" and lower_bound is not None:
        raise ValueError("lower_bound: not a keyword of the gdn family: GDN's in-kernel log-decay has no bounded "
                         "form (gdn_gate_chunk_cumsum: softplus only)")
    given = [n for n, x in (("A_log", A_log), ("dt_bias", dt_bias), ("lower_bound", lower_bound)) if x is not None]
    if not use_gate:
        if given:
            raise ValueError(f"{given[0]}: only used with use_gate_in_kernel=True (FLA ignores it otherwise)")
        return None
    if A_log is None and lower_bound is None:
        raise ValueError("A_log: required with use_gate_in_kernel=True" + (" unless lower_bound is set"
                                                                             if family == "kda" else ""))
    shapes = dict(A_log=(HV,), dt_bias=(HV * K,) if family == "kda" else (HV,))
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        check_gate_param(name, x, shapes[name], f" ({family})")
    return check_lower_bound(lower_bound)


def check_family_values(use_gate, **arrays):
    """NaN/inf anywhere, and (without the in-kernel gate, where ``g`` is a raw pre-activation) ``g > 0``: a
    ValueError naming the argument (a host sync: only with ``check_values=True``)."""
    for name, x in arrays.items():
        if x is not None and not bool(jnp.all(jnp.isfinite(jnp.asarray(x, ACC_DTYPE)))):
            raise ValueError(f"{name}: contains NaN or inf")
    if not use_gate and bool(jnp.any(jnp.asarray(arrays["g"], ACC_DTYPE) > 0)):
        raise ValueError("g: log-decay must be <= 0 (found a positive entry)")


@jax.custom_jvp
def exact_sigmoid(x):
    """``1 / (1 + exp(-x))`` whose derivative is ``sigmoid(x) sigmoid(-x)``: autodiff of ``jax.nn.sigmoid`` gives
    ``y (1 - y)``, which cancels in float32 for large logits (``dbeta`` then loses ~``eps / (1 - y)`` relative)."""
    return jax.nn.sigmoid(x)


@exact_sigmoid.defjvp
def _exact_sigmoid_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = jax.nn.sigmoid(x)
    return y, t * (y * jax.nn.sigmoid(-x))


# --- the kernel ----------------------------------------------------------------------------------------------


class FamilyKernel:
    """A ``gdn`` or ``kda`` kernel over a GDN-2 kernel ``core`` (``fn(q, k, v, g, b, w, *, scale,
    initial_state) -> (o, final_state)``). The steps of the map are methods (module docstring)."""

    def __init__(self, name, family, core):
        if family not in FAMILIES:
            raise ValueError(f"family: {family!r} not one of {FAMILIES}")
        self.__name__ = name
        self.name, self.family, self.core = name, family, core
        self.chunk_size = getattr(core, "chunk_size", None)
        self._jitted = jax.jit(self._run, static_argnums=(0, 1, 2))

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r}, family={self.family!r}, core={self.core!r})"

    def __call__(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                 use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None, check_values=False,
                 cu_seqlens=None, return_intermediate_states=False, **layout):
        """``(o [B, T, HV, V] in v.dtype, final_state [B, HV, K, V] float32 or None)`` (module docstring); with the
        structural modes (``cu_seqlens``, ``return_intermediate_states`` -- kda only, as in FLA -- and the ``[V, K]``
        state layout's keyword in ``layout``) the core's call modes (kernels/modes.py) run on the mapped problem, and
        ``return_intermediate_states`` adds a third result."""
        flags = dict(output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                     use_gate_in_kernel=use_gate_in_kernel)
        structure = dict(layout)
        if cu_seqlens is not None:
            structure["cu_seqlens"] = cu_seqlens
        if return_intermediate_states:
            if self.family == "gdn":
                raise ValueError("return_intermediate_states: not a keyword of the gdn family (FLA's "
                                 "chunk_gated_delta_rule has none)")
            structure["return_intermediate_states"] = True
        _, scale, lb = check_family_call(self.family, q, k, v, g, beta, scale=scale,
                                         initial_state=None if structure else initial_state, flags=flags, A_log=A_log,
                                         dt_bias=dt_bias, lower_bound=lower_bound, packed=cu_seqlens is not None)
        if check_values:
            check_family_values(use_gate_in_kernel, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                                A_log=A_log, dt_bias=dt_bias)
        static = tuple(bool(flags[f]) for f in FLAGS[1:])
        if structure:  # the core's modes validate and run them (one program per structure, jitted inside)
            out = self._run(scale, static, lb, q, k, v, g, beta, initial_state, A_log, dt_bias, structure)
        else:
            out = self._jitted(scale, static, lb, q, k, v, g, beta, initial_state, A_log, dt_bias)
        o, final, *rest = out
        return (o, final if output_final_state else None, *rest)

    # --- the steps of the map (overridden by the mutants of kernels/testing_families.py) -------------------

    def heads(self, x, G):
        """Key-head tensor ``[B, T, H, K]`` to the value heads: head ``hv`` reads key head ``hv // G``."""
        return jnp.repeat(x, G, axis=2)

    def activate_beta(self, beta, sigmoid, neg):
        """FLA's ``fused_beta_sigmoid``: ``s * sigmoid(beta)``, ``s = 2`` with ``allow_neg_eigval`` (its derivative
        without the ``1 - y`` cancellation: :func:`exact_sigmoid`)."""
        if not sigmoid:
            return beta
        return (2.0 if neg else 1.0) * exact_sigmoid(beta)

    def log_decay(self, g, A_log, dt_bias, lower_bound, use_gate):
        """The log-decay ``[B, T, HV, K]`` (kda) / ``[B, T, HV]`` (gdn): ``g``, or the in-kernel gate of it."""
        if not use_gate:
            return g
        if self.family == "kda":
            return gated_log_decay(g, A_log, dt_bias, lower_bound)
        return gated_log_decay(g[..., None], A_log, dt_bias, None)[..., 0]  # dt_bias [HV] = [HV * 1]

    def gates(self, beta, K, V):
        """GDN-2's erase and write gates from the per-head ``beta [B, T, HV]``: ``b = beta 1_K``, ``w = beta 1_V``."""
        shape = beta.shape
        return (jnp.broadcast_to(beta[..., None], (*shape, K)), jnp.broadcast_to(beta[..., None], (*shape, V)))

    def run_core(self, q, k, v, g, b, w, scale, h0, structure=None):
        """GDN-2 on the mapped problem (every head a value head), with the core's structural ``structure`` modes."""
        return self.core(q, k, v, g, b, w, scale=scale, initial_state=h0, **(structure or {}))

    # --------------------------------------------------------------------------------------------------------

    def to_gdn2(self, q, k, v, g, beta, *, l2norm_qk=False, sigmoid=False, neg=False, use_gate=False, A_log=None,
                dt_bias=None, lower_bound=None):
        """The GDN-2 problem ``(q, k, v, g, b, w)`` of a family call, in float32, ``[B, T, HV, ...]``."""
        q, k, v, g, beta = (x.astype(ACC_DTYPE) for x in (q, k, v, g, beta))
        H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
        if l2norm_qk:
            q, k = l2norm(q), l2norm(k)
        q, k = self.heads(q, HV // H), self.heads(k, HV // H)
        beta = self.activate_beta(beta, sigmoid, neg)
        g = self.log_decay(g, A_log, dt_bias, lower_bound, use_gate)
        if self.family == "gdn":
            g = jnp.broadcast_to(g[..., None], (*g.shape, K))
        b, w = self.gates(beta, K, V)
        return q, k, v, g, b, w

    def _run(self, scale, static, lower_bound, q, k, v, g, beta, h0, A_log, dt_bias, structure=None):
        l2, sigmoid, neg, use_gate = static
        dtype = v.dtype
        xs = self.to_gdn2(q, k, v, g, beta, l2norm_qk=l2, sigmoid=sigmoid, neg=neg, use_gate=use_gate, A_log=A_log,
                          dt_bias=dt_bias, lower_bound=lower_bound)
        o, *rest = self.run_core(*xs, scale, h0, structure)
        return (o.astype(dtype), *rest)


# --- factories (kernels/registry.py) -------------------------------------------------------------------------


def gdn_factorized(chunk_size=CHUNK_SIZE, split=None, leaf=16):
    """``gdn-factorized``: Gated DeltaNet over the boundary-factorized chunked kernel (``factorized``'s options)."""
    return FamilyKernel("gdn-factorized", "gdn", gdn2.factorized(chunk_size, split, leaf))


def gdn_pairwise(chunk_size=CHUNK_SIZE):
    """``gdn-pairwise``: Gated DeltaNet over the pairwise-decay chunked kernel."""
    return FamilyKernel("gdn-pairwise", "gdn", gdn2.pairwise(chunk_size))


def kda_factorized(chunk_size=CHUNK_SIZE, split=None, leaf=16):
    """``kda-factorized``: KDA over the boundary-factorized chunked kernel (``factorized``'s options)."""
    return FamilyKernel("kda-factorized", "kda", gdn2.factorized(chunk_size, split, leaf))


def kda_pairwise(chunk_size=CHUNK_SIZE):
    """``kda-pairwise``: KDA over the pairwise-decay chunked kernel."""
    return FamilyKernel("kda-pairwise", "kda", gdn2.pairwise(chunk_size))


def over(family, core, name=None):
    """A ``family`` kernel over any GDN-2-contract kernel ``core`` (a chunked kernel with other options, a peer)."""
    return FamilyKernel(name or f"{family}-{getattr(core, '__name__', type(core).__name__)}", family, core)


__all__ = ["FAMILIES", "FamilyKernel", "check_family_call", "check_family_values", "gdn_factorized", "gdn_pairwise",
           "kda_factorized", "kda_pairwise", "over"]
