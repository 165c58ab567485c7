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

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import mpmath
import numpy as np

from . import call_modes, modes, mp, preprocess, recurrence
from .call import Call
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

# FLA's mode keywords that are oracle.call.Call's own fields (as the [V, K] state layout's flag): a family call
# passes them to its mapped Call (FamilyCall.call_keywords) and reads them back from it.
_CALL_FIELDS = tuple(f.name for f in dataclasses.fields(Call))
_PASSED = tuple(k for k in _MODE_KEYWORDS if k in _CALL_FIELDS and k not in ("cu_seqlens", "lower_bound"))
# FLA's mode keywords that are not arguments of :func:`call` (which takes the chunk states' quantity itself,
# ``intermediate_chunk_size``) and ``output_final_state`` (always on here).
_ARGUMENTS = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "lower_bound", "cu_seqlens")
_NOT_MAPPED = tuple(k for k in _MODE_KEYWORDS if k not in _ARGUMENTS + _PASSED) + ("output_final_state",)
# The results of a family call without the modes' extra ones, in report order (the gradients are w.r.t. the call's
# arguments as passed: q, k, v, g, beta, initial_state).
FAMILY_RESULTS = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0")


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
    """One call of a mapped family (``kda`` or ``gdn``) with FLA's keywords and call modes; built by :func:`call`.

    Arrays are read-only float64 copies. ``scale`` is the effective one (``K**-0.5`` by default). The call modes
    are :class:`oracle.call.Call`'s (``cu_seqlens``, ``state_v_first``, ``intermediate_chunk_size``; the gate and
    the q/k norm under the registry's names :attr:`gate_in_kernel` / :attr:`qk_l2norm`), so
    ``oracle.call_modes.active`` and ``keywords_for`` read a family call as they read a GDN-2 one.
    """

    input_names = ("q", "k", "v", "g", "beta")  # the per-token arguments, in FLA's order
    dense_results = FAMILY_RESULTS

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
    cu_seqlens: np.ndarray | None = None
    intermediate_chunk_size: int | None = None
    call_keywords: tuple = ()  # ((name, value), ...): the other mode keywords of the mapped Call (_PASSED)

    def __getattr__(self, name):
        """A mode field of :class:`oracle.call.Call` this call has no field for: the mapped call's."""
        if name in _CALL_FIELDS:
            return getattr(self.to_call(), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def shape(self):
        """``(B, T, H, HV, K, V)``."""
        B, T, H, K = self.q.shape
        return B, T, H, self.v.shape[2], K, self.v.shape[3]

    # --- the registry's view (oracle/call_modes.py) and the runner's (ci/running/modes.py) ------------------

    @property
    def gate_in_kernel(self):
        """``use_gate_in_kernel`` under the registry's name."""
        return self.use_gate_in_kernel

    @property
    def qk_l2norm(self):
        """``use_qk_l2norm_in_kernel`` under the registry's name."""
        return self.use_qk_l2norm_in_kernel

    def inputs(self):
        """The per-token arguments ``(q, k, v, g, beta)`` as passed to a kernel."""
        return tuple(getattr(self, n) for n in self.input_names)

    def kernel_keywords(self):
        """FLA's keywords of the family every kernel call passes besides the modes': ``output_final_state=True``
        and the beta flags that are on."""
        flags = dict(use_beta_sigmoid_in_kernel=self.use_beta_sigmoid_in_kernel,
                     allow_neg_eigval=self.allow_neg_eigval)
        return {"output_final_state": True, **{k: True for k, on in flags.items() if on}}

    @property
    def state_shape(self):
        """``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``): initial and final state."""
        return self.to_call().state_shape

    def chunk_states_shape(self, C):
        """The states at the starts of C-token chunks: ``oracle.call.Call.chunk_states_shape``."""
        return self.to_call().chunk_states_shape(C)

    def check_cotangents(self, do, dfinal_state):
        """``do: [B,T,HV,V]`` and ``dfinal_state`` in the state layout as float64 (ValueError naming either)."""
        return self.to_call().check_cotangents(do, dfinal_state)

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

    def to_call(self, dtype=np.float64) -> Call:
        """The GDN-2 call (:class:`oracle.call.Call`, grouped value heads) this call is: ``b = beta 1_K``,
        ``w = beta 1_V`` with ``beta`` through its sigmoid (in working precision ``dtype``, held exactly) where the
        flags say so; GDN's log-decay (or gate pre-activation) ``g 1_K`` and its ``dt_bias`` repeated over K (the
        broadcast whose adjoint is the sum over K); the q/k norm, the gate and the call modes as they are."""
        key = np.dtype(dtype).name
        cache = self.__dict__.setdefault("_mapped", {})
        if key not in cache:
            cache[key] = self._to_call(dtype)
        return cache[key]

    def _to_call(self, dtype):
        B, T, H, HV, K, V = self.shape
        beta = np.asarray(self._beta(self._values(recurrence.Arith(dtype))), np.float64)
        g, dt_bias = self.g, self.dt_bias
        if self.family is GDN:
            g = np.broadcast_to(g[..., None], (B, T, HV, K))
            dt_bias = None if dt_bias is None else np.repeat(dt_bias, K)
        return Call(self.q, self.k, self.v, g, np.broadcast_to(beta[..., None], (B, T, HV, K)),
                    np.broadcast_to(beta[..., None], (B, T, HV, V)), scale=self.scale,
                    initial_state=self.initial_state, cu_seqlens=self.cu_seqlens,
                    gate_in_kernel=self.use_gate_in_kernel, A_log=self.A_log, dt_bias=dt_bias,
                    lower_bound=self.lower_bound, qk_l2norm=self.use_qk_l2norm_in_kernel,
                    intermediate_chunk_size=self.intermediate_chunk_size, **dict(self.call_keywords))

    def project_results(self, results, dtype=np.float64, *, standard=False, ar=None):
        """A GDN-2 results dict of :meth:`to_call`'s call (``oracle.modes.run_call``'s) as this call's: ``dbeta =
        sum_k db + sum_v dw`` through beta's sigmoid, GDN's ``dg = sum_k dg_k`` and ``ddt_bias`` summed over K; the
        outputs, states and the other gradients as they are (None stays None). The sigmoid's slope is exact
        (``e / (1 + e)^2``), or with ``standard`` the usual ``y (1 - y)`` of the activation's output (FLA's
        ``fused_beta_sigmoid_bwd``, autodiff of a sigmoid: ``1 - y`` cancels for large logits). ``ar``: the element
        type to work in instead of ``dtype`` (``oracle.mp.MPArith``: mpmath)."""
        ar = ar or recurrence.Arith(dtype)
        out = {n: results.get(n) for n in ("o", "final_state", "intermediate_states", "dq", "dk", "dv", "dg",
                                            "dh0", "dA_log", "ddt_bias")}
        if "db" not in results:
            return {n: x for n, x in out.items() if n in ("o", "final_state", "intermediate_states")}
        dbeta = np.sum(ar.array(results["db"]), axis=-1) + np.sum(ar.array(results["dw"]), axis=-1)
        if self.use_beta_sigmoid_in_kernel:
            x = ar.array(self.beta)
            if standard:
                y = ar.array(preprocess.sigmoid(x))
                slope = y * (ar.array(1.0) - y)
            else:
                slope = preprocess.sigmoid_slope(x)
            dbeta = self.beta_scale * slope * dbeta
        out["dbeta"] = dbeta
        return self.project_sums(out)

    def project_sums(self, named):
        """GDN's ``dg`` (``[B,T,HV,K] -> [B,T,HV]``) and ``ddt_bias`` (``[HV*K] -> [HV]``) summed over K in ``named``
        (results or their envelopes: sums of magnitudes stay envelopes); KDA's as they are."""
        if self.family is not GDN:
            return named
        out = dict(named)
        if out.get("dg") is not None:
            out["dg"] = np.sum(out["dg"], axis=-1)
        if out.get("ddt_bias") is not None:
            out["ddt_bias"] = np.sum(np.reshape(out["ddt_bias"], (self.shape[3], -1)), axis=-1)
        return out

    def to_gdn2(self, dtype=np.float64) -> Problem:
        """The GDN-2 problem this dense call is, its activations computed in working precision ``dtype``:
        ``q, k`` L2-normalised, ``beta`` through its sigmoid and ``g`` through the gate where the flags say so,
        then ``b = beta 1_K``, ``w = beta 1_V`` and (GDN) ``g 1_K``; the values are held exactly (float64).
        ValueError for a call with packed sequences, the ``[V, K]`` layout or chunk states (:meth:`to_call`)."""
        if self.cu_seqlens is not None or self.intermediate_chunk_size is not None or any(
                v for _, v in self.call_keywords):
            raise ValueError("call: packed sequences, the [V, K] layout and chunk states are oracle.call.Call's "
                             "modes: use to_call()")
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
         dt_bias=None, lower_bound=None, cu_seqlens=None, intermediate_chunk_size=None, **other) -> FamilyCall:
    """A validated call of family ``family`` (``"kda"`` / ``"gdn"`` or the :class:`Family`) with FLA's keywords.

    Shapes (docs/DESIGN.md §1, "Families"): ``q, k: [B,T,H,K]``, ``v: [B,T,HV,V]``, ``beta: [B,T,HV]``,
    ``g: [B,T,HV,K]`` (kda) or ``[B,T,HV]`` (gdn), ``initial_state: [B,HV,K,V]``, ``A_log: [HV]``,
    ``dt_bias: [HV*K]`` (kda) or ``[HV]`` (gdn). The call modes are :class:`oracle.call.Call`'s: ``cu_seqlens``
    (``[N+1]``, B == 1; ``initial_state: [N, HV, K, V]``), the ``[V, K]`` state layout (FLA's keyword, in
    ``other``), ``intermediate_chunk_size`` (the states at chunk starts; FLA's ``return_intermediate_states`` at
    its chunk of 64). Bad input is a ValueError naming the argument: a keyword GDN-2 cannot express (``gv``; for
    gdn ``gk`` and ``lower_bound``) is refused by name with the reason.
    """
    passed = {n: other.pop(n) for n in _PASSED if n in other}
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
            raise ValueError(f"{name}: not an argument of oracle.families.call (the chunk states are asked for "
                             "with intermediate_chunk_size; the final state is always returned)")
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
    B, T, H, HV, K, V = _check_shapes(fam, arrays, packed=cu_seqlens is not None)
    if not use_gate_in_kernel and np.any(arrays["g"] > 0):
        raise ValueError("g: log-decay must be <= 0 (found a positive entry)")
    shapes = fam.shapes(B, T, H, HV, K, V)
    gate_params = _check_gate(fam, shapes, use_gate_in_kernel, A_log, dt_bias, lower_bound)
    h0 = None if initial_state is None else as_float_array("initial_state", initial_state, copy=True)
    fcall = FamilyCall(fam, **arrays, scale=check_scale(scale, K), initial_state=h0, **flags, **gate_params,
                       cu_seqlens=cu_seqlens, intermediate_chunk_size=intermediate_chunk_size,
                       call_keywords=tuple(sorted(passed.items())))
    mapped = fcall.to_call()  # the call modes' checks (cu_seqlens, the state's shape and layout): ValueErrors
    object.__setattr__(fcall, "cu_seqlens", mapped.cu_seqlens)
    object.__setattr__(fcall, "initial_state", mapped.initial_state)
    return fcall


def _check_shapes(fam, arrays, packed=False):
    """``(B, T, H, HV, K, V)`` of the family's inputs, or ValueError naming the first input that does not fit
    (``packed``: T == 0 allowed)."""
    for name in ("q", "v"):
        if arrays[name].ndim != 4:
            raise ValueError(f"{name}: expected rank 4 [B, T, heads, dim], got shape {arrays[name].shape}")
    B, T, H, K = arrays["q"].shape
    HV, V = arrays["v"].shape[2:]
    if (T == 0 and not packed) or min(B, H, K, HV, V) == 0:
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


def run(fcall: FamilyCall, dtype=np.float64, do=None, dfinal_state=None, *, core="recurrence", inner=None):
    """The family call in working precision ``dtype``: a dict over ``o, final_state, intermediate_states`` (and, given
    cotangents, ``dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias``; None where absent) in the call's layouts --
    :meth:`FamilyCall.to_call` (beta's sigmoid in ``dtype``), ``oracle.modes.run_call`` (``core``, ``inner`` as
    there), :meth:`FamilyCall.project_results` in ``dtype``. The ``chunked32`` core is the standard float32
    algorithm (the precision-loss bound, docs/DESIGN.md §4): with it, beta's sigmoid is differentiated the standard
    way too (``y (1 - y)``)."""
    mapped = fcall.to_call(dtype)
    if do is not None:
        do, dfinal_state = mapped.check_cotangents(do, dfinal_state)
    results = modes.run_call(mapped, recurrence.Arith(dtype), do, dfinal_state, core=core, inner=inner)
    return fcall.project_results(results, dtype, standard=core == "chunked32")


def forward(fcall: FamilyCall, dtype=np.float64):
    """``(o, final_state)`` of the family call: activations and the recurrence in working precision ``dtype``."""
    out = run(fcall, dtype)
    return out["o"], out["final_state"]


def forward_and_vjp(fcall: FamilyCall, do, dfinal_state, dtype=np.float64):
    """Forward and hand-derived adjoint in working precision ``dtype``: ``((o, final_state), FamilyGrads)``."""
    out = run(fcall, dtype, do, dfinal_state)
    return (out["o"], out["final_state"]), FamilyGrads(*(out[n] for n in FamilyGrads._fields))


def run_mpf(fcall: FamilyCall, prec, do=None, dfinal_state=None):
    """:func:`run` at ``prec`` bits (every mode): beta's sigmoid, the mapped call's pipeline (``oracle.modes.run_call``
    with ``b = beta 1_K``, ``w = beta 1_V`` in mpmath as overrides) and the projection in mpmath; mpf object arrays."""
    mp.check_prec(prec)
    mapped = fcall.to_call()
    if do is not None:
        do, dfinal_state = mapped.check_cotangents(do, dfinal_state)
    with mpmath.workprec(int(prec)):
        ar = mp.MPArith()
        beta = fcall._beta(fcall._values(ar))
        B, T, H, HV, K, V = fcall.shape
        gates = {"b": np.broadcast_to(beta[..., None], (B, T, HV, K)),
                 "w": np.broadcast_to(beta[..., None], (B, T, HV, V))}
        results = modes.run_call(mapped, ar, do, dfinal_state, {n: np.array(x) for n, x in gates.items()})
        return fcall.project_results(results, ar=ar)


def mp_run(fcall: FamilyCall, do=None, dfinal_state=None, prec=mp.DEFAULT_PREC):
    """``(results, errors)``: :func:`run_mpf` at ``prec`` bits rounded to float64, and ``|x_prec - x_2prec|`` per
    element (the error estimate of ``oracle/mp.py``), by name (results absent from the call are None / left out)."""
    lo = run_mpf(fcall, prec, do, dfinal_state)
    hi = run_mpf(fcall, 2 * prec, do, dfinal_state)
    errors = {n: mp.error_estimate(x, hi[n]) for n, x in lo.items() if x is not None}
    return {n: None if x is None else mp.to_float64(x) for n, x in lo.items()}, errors
