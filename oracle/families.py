"""The FLA families GDN-2 contains: KDA and Gated DeltaNet as parametrisations of GDN-2 (docs/DESIGN.md §1,
"Families"; their FLA signatures in §2, "Families in FLA"), pinned from fla-core 0.6.0.

A family call (:func:`call`) holds the inputs in the family's own parametrisation -- ``beta: [B, T, HV]``
(logits with ``use_beta_sigmoid_in_kernel``), a per-channel (KDA) or per-head (GDN) log-decay or gate
pre-activation, the gate's ``A_log`` / ``dt_bias`` -- and maps them to a GDN-2 :class:`oracle.Problem`
(:meth:`FamilyCall.to_gdn2`: ``b = beta 1_K``, ``w = beta 1_V``, GDN's decay broadcast over K) and the GDN-2
gradients back (:meth:`FamilyCall.project`). :func:`forward` and :func:`forward_and_vjp` chain the two around
:mod:`oracle.recurrence` in one NumPy working precision: float64 is the reference, float32 is "the plain
recurrence in the family's own parametrisation" (activations in float32, then the recurrence in float32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import call_modes, preprocess, recurrence
from .problem import GRADS, Grads, Problem, as_float_array, check_scale

# --- the registry ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One FLA family: its entry points, its inputs and gate parameters with their shapes, its flags.

    ``inputs`` / ``params`` are ``(name, dims)`` pairs, each dim a name of ``(B, T, H, HV, K, V)`` or a
    product of them (``"HV*K"``: FLA's flat ``dt_bias``). ``flags`` are the semantic keywords of FLA's chunk
    entry point; ``refused`` maps keywords of FLA's other entry points that GDN-2 cannot express to why.
    """

    name: str
    fla: tuple[str, ...]
    inputs: tuple[tuple[str, tuple[str, ...]], ...]
    params: tuple[tuple[str, tuple[str, ...]], ...]
    flags: tuple[str, ...]
    refused: tuple[tuple[str, str], ...] = ()

    def shapes(self, B, T, H, HV, K, V):
        """``{name: shape}`` of the inputs and gate parameters for these dimensions."""
        dims = dict(B=B, T=T, H=H, HV=HV, K=K, V=V)

        def size(dim):
            return int(np.prod([dims[d] for d in dim.split("*")]))

        return {name: tuple(size(d) for d in spec) for name, spec in self.inputs + self.params}


_QK = (("q", ("B", "T", "H", "K")), ("k", ("B", "T", "H", "K")), ("v", ("B", "T", "HV", "V")))
_GV = ("gv", "a decay along V (fused_recurrent_gated_delta_rule's gv) is outside GDN-2, whose decay acts on "
             "the key rows of the state")

# FLA's keywords of the call modes (oracle/call_modes.py: the gate's A_log and dt_bias are params above) and the
# beta flags of the KDA and GDN entry points.
_MODE_KEYWORDS = tuple(k for m in call_modes.names("training") for k in call_modes.get(m).keywords
                       if k not in ("A_log", "dt_bias"))
_BETA_FLAGS = ("use_beta_sigmoid_in_kernel", "allow_neg_eigval")

GDN2 = Family(
    name="gdn2",
    fla=("fla/ops/gdn2/chunk.py: chunk_gdn2", "fla/ops/gdn2/fused_recurrent.py: fused_recurrent_gdn2",
         "fla/ops/gdn2/naive.py: naive_recurrent_gdn2"),
    inputs=_QK + (("g", ("B", "T", "HV", "K")), ("b", ("B", "T", "HV", "K")), ("w", ("B", "T", "HV", "V"))),
    params=(("A_log", ("HV",)), ("dt_bias", ("HV*K",))),
    flags=_MODE_KEYWORDS,
)
KDA = Family(
    name="kda",
    fla=("fla/ops/kda/chunk.py: chunk_kda", "fla/ops/kda/fused_recurrent.py: fused_recurrent_kda",
         "fla/ops/kda/naive.py: naive_recurrent_kda, naive_chunk_kda",
         "fla/ops/kda/gate.py"),
    inputs=_QK + (("g", ("B", "T", "HV", "K")), ("beta", ("B", "T", "HV"))),
    params=(("A_log", ("HV",)), ("dt_bias", ("HV*K",))),
    flags=_MODE_KEYWORDS + _BETA_FLAGS,
    refused=(_GV,),
)
GDN = Family(
    name="gdn",
    fla=("fla/ops/gated_delta_rule/chunk.py: chunk_gated_delta_rule",
         "fla/ops/gated_delta_rule/fused_recurrent.py: fused_recurrent_gated_delta_rule",
         "fla/ops/gated_delta_rule/naive.py: naive_recurrent_gated_delta_rule, naive_chunk_gated_delta_rule",
         "fla/ops/gated_delta_rule/gate.py"),
    inputs=_QK + (("g", ("B", "T", "HV")), ("beta", ("B", "T", "HV"))),
    params=(("A_log", ("HV",)), ("dt_bias", ("HV",))),
    flags=tuple(f for f in _MODE_KEYWORDS + _BETA_FLAGS if f not in ("lower_bound", "return_intermediate_states")),
    refused=(_GV, ("gk", "a per-key decay (fused_recurrent_gated_delta_rule's gk) is the kda family's g"),
             ("lower_bound", "GDN's in-kernel log-decay has no bounded form (gdn_gate_chunk_cumsum: softplus only)")),
)
FAMILIES = {f.name: f for f in (GDN2, KDA, GDN)}
# The families mapped onto GDN-2 here (gdn2 is the oracle's own Problem / Call).
MAPPED = ("kda", "gdn")


def get(name) -> Family:
    """The family called ``name`` (one of :data:`FAMILIES`), or ValueError."""
    if name not in FAMILIES:
        raise ValueError(f"family: {name!r} not one of {tuple(FAMILIES)}")
    return FAMILIES[name]


# --- a call in a family's parametrisation ------------------------------------------------------------------

# Keywords of FLA's entry points that change how FLA computes or how a call is packed, not what one dense call
# computes: not keywords here (packed calls and the [V, K] layout are oracle.call.Call's modes for GDN-2).
_HANDLED = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "lower_bound")
_NOT_MAPPED = tuple(k for k in _MODE_KEYWORDS if k not in _HANDLED) + ("output_final_state",)


class FamilyGrads(NamedTuple):
    """Gradients w.r.t. a family call's arguments as passed: ``dbeta`` is w.r.t. ``beta`` (the logits with
    ``use_beta_sigmoid_in_kernel``), ``dg`` w.r.t. ``g`` (the gate pre-activation with ``use_gate_in_kernel``),
    ``dq`` / ``dk`` w.r.t. the raw q / k; ``dA_log`` / ``ddt_bias`` None without those parameters."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dg: np.ndarray
    dbeta: np.ndarray
    dh0: np.ndarray
    dA_log: np.ndarray | None = None
    ddt_bias: np.ndarray | None = None


FAMILY_GRADS = FamilyGrads._fields


@dataclass(frozen=True, eq=False)
class FamilyCall:
    """One call of a mapped family (``kda`` or ``gdn``) with FLA's keywords; built by :func:`call`.

    Arrays are read-only float64 copies. ``scale`` is the effective one (``K**-0.5`` by default).
    """

    family: Family
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    beta: np.ndarray
    scale: float
    initial_state: np.ndarray | None
    use_qk_l2norm_in_kernel: bool
    use_beta_sigmoid_in_kernel: bool
    allow_neg_eigval: bool
    use_gate_in_kernel: bool
    A_log: np.ndarray | None
    dt_bias: np.ndarray | None
    lower_bound: float | None

    @property
    def shape(self):
        """``(B, T, H, HV, K, V)``."""
        B, T, H, K = self.q.shape
        return B, T, H, self.v.shape[2], K, self.v.shape[3]

    @property
    def beta_scale(self):
        """The factor of FLA's beta sigmoid: 2 with ``allow_neg_eigval`` (erase eigenvalue down to -1), else 1."""
        return 2 if self.allow_neg_eigval else 1

    def _values(self, ar):
        names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")
        x = {n: None if getattr(self, n) is None else ar.array(getattr(self, n)) for n in names}
        x["one"] = ar.array(1.0)[()]
        x["lower_bound"] = None if self.lower_bound is None else ar.array(self.lower_bound)[()]
        return x

    def _gate_view(self, g):
        """GDN's per-head gate as preprocess's per-channel gate with one channel (``[B,T,HV] -> [B,T,HV,1]``)."""
        return g[..., None] if self.family is GDN else g

    def log_decay(self, dtype=np.float64):
        """The family's log-decay in working precision ``dtype``: ``g``, or the in-kernel gate of ``g``
        (``[B,T,HV,K]`` for KDA, ``[B,T,HV]`` for GDN)."""
        x = self._values(recurrence.Arith(dtype))
        return self._log_decay(x)

    def _log_decay(self, x):
        if not self.use_gate_in_kernel:
            return x["g"]
        g = preprocess.gated_log_decay(self._gate_view(x["g"]), x["A_log"], x["dt_bias"], x["lower_bound"], x["one"])
        return g[..., 0] if self.family is GDN else g

    def _beta(self, x):
        if not self.use_beta_sigmoid_in_kernel:
            return x["beta"]
        return self.beta_scale * preprocess.sigmoid(x["beta"])

    def to_gdn2(self, dtype=np.float64) -> Problem:
        """The GDN-2 problem this call is, its activations computed in working precision ``dtype``:
        ``q, k`` L2-normalised, ``beta`` through its sigmoid and ``g`` through the gate where the flags say so,
        then ``b = beta 1_K``, ``w = beta 1_V`` and (GDN) ``g 1_K``; the values are held exactly (float64)."""
        B, T, H, HV, K, V = self.shape
        x = self._values(recurrence.Arith(dtype))
        q, k = x["q"], x["k"]
        if self.use_qk_l2norm_in_kernel:
            q, k = (preprocess.l2norm(a, preprocess.L2NORM_EPS) for a in (q, k))
        beta = self._beta(x)
        g = self._log_decay(x)
        if self.family is GDN:
            g = np.broadcast_to(g[..., None], (B, T, HV, K))
        b = np.broadcast_to(beta[..., None], (B, T, HV, K))
        w = np.broadcast_to(beta[..., None], (B, T, HV, V))
        return Problem(q, k, x["v"], g, b, w, scale=self.scale, initial_state=self.initial_state)

    def project(self, grads: Grads, dtype=np.float64) -> FamilyGrads:
        """The GDN-2 gradients of :meth:`to_gdn2`'s problem mapped back onto this call's arguments, in working
        precision ``dtype``: ``dbeta = sum_k db + sum_v dw``, GDN's ``dg = sum_k dg_k``, then the adjoints of the
        activations (beta's sigmoid, the gate, the L2 norm)."""
        ar = recurrence.Arith(dtype)
        x = self._values(ar)
        d = {n: ar.array(x) for n, x in zip(GRADS, grads)}
        dbeta = np.sum(d["db"], axis=-1) + np.sum(d["dw"], axis=-1)
        if self.use_beta_sigmoid_in_kernel:
            dbeta = self.beta_scale * preprocess.sigmoid_slope(x["beta"]) * dbeta
        dg = np.sum(d["dg"], axis=-1) if self.family is GDN else d["dg"]
        dA_log = ddt_bias = None
        if self.use_gate_in_kernel:
            dg, dA_log, ddt_bias = preprocess.gate_vjp(self._gate_view(x["g"]), x["A_log"], x["dt_bias"],
                                                       x["lower_bound"], x["one"], self._gate_view(dg))
            dg = dg[..., 0] if self.family is GDN else dg
        dq, dk = d["dq"], d["dk"]
        if self.use_qk_l2norm_in_kernel:
            dq, dk = (preprocess.l2norm_vjp(x[n], preprocess.L2NORM_EPS, dn) for n, dn in (("q", dq), ("k", dk)))
        return FamilyGrads(dq, dk, d["dv"], dg, dbeta, d["dh0"], dA_log, ddt_bias)


def call(family, q, k, v, g, beta, *, scale=None, initial_state=None, use_qk_l2norm_in_kernel=False,
         use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, use_gate_in_kernel=False, A_log=None,
         dt_bias=None, lower_bound=None, **other) -> FamilyCall:
    """A validated call of family ``family`` (``"kda"`` / ``"gdn"`` or the :class:`Family`) with FLA's keywords.

    Shapes (docs/DESIGN.md §1, "Families"): ``q, k: [B,T,H,K]``, ``v: [B,T,HV,V]``, ``beta: [B,T,HV]``,
    ``g: [B,T,HV,K]`` (kda) or ``[B,T,HV]`` (gdn), ``initial_state: [B,HV,K,V]``, ``A_log: [HV]``,
    ``dt_bias: [HV*K]`` (kda) or ``[HV]`` (gdn). Bad input is a ValueError naming the argument: a keyword GDN-2
    cannot express (``gv``; for gdn ``gk`` and ``lower_bound``) is refused by name with the reason.
    """
    fam = family if isinstance(family, Family) else get(family)
    if fam.name not in MAPPED:
        raise ValueError(f"family: {fam.name!r} is the oracle's own problem (oracle.Problem, oracle.Call); "
                         f"mapped families: {MAPPED}")
    refused = dict(fam.refused)
    if lower_bound is not None and "lower_bound" in refused:
        raise ValueError(f"lower_bound: not a keyword of the {fam.name} family: {refused['lower_bound']}")
    for name in other:
        if name in refused:
            raise ValueError(f"{name}: not accepted by the {fam.name} family: {refused[name]}")
        if name in _NOT_MAPPED:
            raise ValueError(f"{name}: not mapped by oracle.families (one dense call, [K, V] states; packed "
                             "sequences and the [V, K] layout are oracle.call.Call's modes)")
        raise ValueError(f"{name}: not a keyword of the {fam.name} family")
    flags = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                 use_gate_in_kernel=use_gate_in_kernel)
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name}: expected a bool, got {value!r}")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True (as in FLA)")
    arrays = {n: as_float_array(n, a, copy=True) for n, a in dict(q=q, k=k, v=v, g=g, beta=beta).items()}
    B, T, H, HV, K, V = _check_shapes(fam, arrays)
    if not use_gate_in_kernel and np.any(arrays["g"] > 0):
        raise ValueError("g: log-decay must be <= 0 (found a positive entry)")
    shapes = fam.shapes(B, T, H, HV, K, V)
    gate_params = _check_gate(fam, shapes, use_gate_in_kernel, A_log, dt_bias, lower_bound)
    h0 = None
    if initial_state is not None:
        h0 = as_float_array("initial_state", initial_state, copy=True)
        if h0.shape != (B, HV, K, V):
            raise ValueError(f"initial_state: shape {h0.shape} does not match [B, HV, K, V] = {(B, HV, K, V)}")
    return FamilyCall(fam, **arrays, scale=check_scale(scale, K), initial_state=h0, **flags, **gate_params)


def _check_shapes(fam, arrays):
    """``(B, T, H, HV, K, V)`` of the family's inputs, or ValueError naming the first input that does not fit."""
    for name in ("q", "v"):
        if arrays[name].ndim != 4:
            raise ValueError(f"{name}: expected rank 4 [B, T, heads, dim], got shape {arrays[name].shape}")
    B, T, H, K = arrays["q"].shape
    HV, V = arrays["v"].shape[2:]
    if T == 0 or min(B, H, K, HV, V) == 0:
        raise ValueError(f"q: zero-sized dimension in shape {arrays['q'].shape} / v {arrays['v'].shape}")
    if arrays["v"].shape[:2] != (B, T):
        raise ValueError(f"v: shape {arrays['v'].shape} does not match q's [B, T] = {(B, T)}")
    if HV % H:
        raise ValueError(f"v: value heads HV = {HV} are not a multiple of the query/key heads H = {H}")
    expected = fam.shapes(B, T, H, HV, K, V)
    for name in ("k", "g", "beta"):
        if arrays[name].shape != expected[name]:
            dims = dict(fam.inputs)[name]
            raise ValueError(f"{name}: shape {arrays[name].shape} does not match [{', '.join(dims)}] = "
                             f"{expected[name]} ({fam.name})")
    return B, T, H, HV, K, V


def _check_gate(fam, shapes, use_gate_in_kernel, A_log, dt_bias, lower_bound):
    """The gate parameters as read-only float64 (A_log, dt_bias) and a float (lower_bound)."""
    given = {n: x for n, x in dict(A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound).items() if x is not None}
    if not use_gate_in_kernel:
        if given:
            raise ValueError(f"{next(iter(given))}: only used with use_gate_in_kernel=True (FLA would ignore it)")
        return dict(A_log=None, dt_bias=None, lower_bound=None)
    if A_log is None and lower_bound is None:
        raise ValueError("A_log: required with use_gate_in_kernel=True"
                         + (" unless lower_bound is set" if fam is KDA else ""))
    out = dict(A_log=None, dt_bias=None, lower_bound=None)
    for name in ("A_log", "dt_bias"):
        if name in given:
            a = as_float_array(name, given[name], copy=True)
            if a.shape != shapes[name]:
                raise ValueError(f"{name}: shape {a.shape} does not match [{', '.join(dict(fam.params)[name])}] = "
                                 f"{shapes[name]} ({fam.name})")
            out[name] = a
    if lower_bound is not None:
        try:
            lb = float(lower_bound)
        except (TypeError, ValueError):
            raise ValueError(f"lower_bound: expected a real number, got {lower_bound!r}") from None
        if not (np.isfinite(lb) and lb < 0):
            raise ValueError(f"lower_bound: must be finite and < 0 (a log-decay bound), got {lb}")
        out["lower_bound"] = lb
    return out


# --- forward and adjoint -----------------------------------------------------------------------------------


def forward(fcall: FamilyCall, dtype=np.float64):
    """``(o, final_state)`` of the family call: activations and the recurrence in working precision ``dtype``."""
    return recurrence.forward(fcall.to_gdn2(dtype), dtype)


def forward_and_vjp(fcall: FamilyCall, do, dfinal_state, dtype=np.float64):
    """Forward and hand-derived adjoint in working precision ``dtype``: ``((o, final_state), FamilyGrads)``."""
    problem = fcall.to_gdn2(dtype)
    outputs, grads = recurrence.forward_and_vjp(problem, do, dfinal_state, dtype)
    return outputs, fcall.project(grads, dtype)
