"""One call of FLA ``chunk_gdn2`` with its training modes (docs/DESIGN.md §2, "Call modes (training)"):
the inputs in the layout of docs/DESIGN.md §2 plus packing, gate, L2-norm and state-layout options,
validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .problem import INPUTS, RESULTS, as_float_array, check_grouped_layout, check_scale

GATE_PARAMS = ("A_log", "dt_bias")


@dataclass(frozen=True, eq=False)
class Call:
    """One ``chunk_gdn2`` call: inputs as read-only float64 copies plus its modes.

    ``q, k: [B,T,H,K]``, ``g, b: [B,T,HV,K]``, ``v, w: [B,T,HV,V]`` with ``HV = G H`` value heads (grouped value
    heads, docs/DESIGN.md §1: value head ``hv`` reads key head ``hv // G``; ``HV == H`` is FLA ``chunk_gdn2``'s
    layout); ``g`` is the log-decay, or with ``gate_in_kernel`` the raw gate pre-activation. ``cu_seqlens:
    [N+1]`` packs N sequences into ``B == 1`` (else N = B). ``initial_state: [N,HV,K,V]`` (``[N,HV,V,K]`` with
    ``state_v_first``; None = zeros). ``A_log: [HV]``, ``dt_bias: [HV*K]``, ``lower_bound < 0`` parametrise the gate;
    ``intermediate_chunk_size`` asks for the state at the start of every chunk of that many tokens.
    """

    input_names = INPUTS  # the per-token arguments, in the contract's order
    dense_results = RESULTS  # the results without the modes' extra ones, in report order

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    b: np.ndarray
    w: np.ndarray
    scale: float | None = None
    initial_state: np.ndarray | None = None
    cu_seqlens: np.ndarray | None = None
    gate_in_kernel: bool = False
    A_log: np.ndarray | None = None
    dt_bias: np.ndarray | None = None
    lower_bound: float | None = None
    qk_l2norm: bool = False
    state_v_first: bool = False
    intermediate_chunk_size: int | None = None

    def __post_init__(self):
        for name in ("gate_in_kernel", "qk_l2norm", "state_v_first"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        self._set(**{name: as_float_array(name, getattr(self, name), copy=True) for name in INPUTS})
        B, T, H, K, V, HV = check_grouped_layout({name: getattr(self, name) for name in INPUTS}, empty_ok=True)
        if self.cu_seqlens is not None:
            self._set(cu_seqlens=_check_cu_seqlens(self.cu_seqlens, B, T))
        elif T == 0:
            raise ValueError("q: empty sequence (T == 0) without cu_seqlens")
        if not self.gate_in_kernel and np.any(self.g > 0):
            raise ValueError("g: log-decay must be <= 0 (found a positive entry)")
        self._set(scale=check_scale(self.scale, K))
        self._check_gate(HV, K)
        if self.initial_state is not None:
            h0 = as_float_array("initial_state", self.initial_state, copy=True)
            if h0.shape != self.state_shape:
                raise ValueError(f"initial_state: shape {h0.shape} does not match {self._layout_name} = "
                                 f"{self.state_shape}")
            self._set(initial_state=h0)
        n = self.intermediate_chunk_size
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1):
            raise ValueError(f"intermediate_chunk_size: expected a positive integer or None, got {n!r}")

    def _set(self, **fields):
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def _check_gate(self, HV, K):
        """Gate parameters: FLA's shapes, present only with ``gate_in_kernel``, ``lower_bound < 0``."""
        given = [n for n in GATE_PARAMS + ("lower_bound",) if getattr(self, n) is not None]
        if not self.gate_in_kernel:
            if given:
                raise ValueError(f"{given[0]}: only used with gate_in_kernel=True (FLA would ignore it)")
            return
        if self.A_log is None and self.lower_bound is None:
            raise ValueError("A_log: required with gate_in_kernel=True unless lower_bound is set")
        for name, shape in (("A_log", (HV,)), ("dt_bias", (HV * K,))):
            if getattr(self, name) is not None:
                a = as_float_array(name, getattr(self, name), copy=True)
                if a.shape != shape:
                    raise ValueError(f"{name}: shape {a.shape} does not match {shape}")
                self._set(**{name: a})
        if self.lower_bound is not None:
            try:
                lb = float(self.lower_bound)
            except (TypeError, ValueError):
                raise ValueError(f"lower_bound: expected a real number, got {self.lower_bound!r}") from None
            if not (np.isfinite(lb) and lb < 0):
                raise ValueError(f"lower_bound: must be finite and < 0 (a log-decay bound), got {lb}")
            self._set(lower_bound=lb)

    @property
    def shape(self):
        """``(B, T, H, K, V)``."""
        B, T, H, K = self.q.shape
        return B, T, H, K, self.v.shape[-1]

    @property
    def value_heads(self):
        """HV: v's heads (the state's heads)."""
        return self.v.shape[2]

    @property
    def group_size(self):
        """``G = HV // H``: the value heads reading each key head (1 without grouped value heads)."""
        return self.value_heads // self.q.shape[2]

    @property
    def num_sequences(self):
        """N: ``len(cu_seqlens) - 1`` when packed, else B."""
        return self.shape[0] if self.cu_seqlens is None else len(self.cu_seqlens) - 1

    @property
    def _layout_name(self):
        return "[N, HV, V, K]" if self.state_v_first else "[N, HV, K, V]"

    @property
    def state_shape(self):
        """Shape of initial and final state in this call's layout."""
        _, _, _, K, V = self.shape
        return (self.num_sequences, self.value_heads) + ((V, K) if self.state_v_first else (K, V))

    def chunk_states_shape(self, C):
        """``[B, NT, HV, K, V]`` (``[..., V, K]`` in the ``[V, K]`` layout) of the states at the starts of C-token
        chunks (chunks restart at every packed sequence's start)."""
        B, T, H, K, V = self.shape
        lengths = [T] if self.cu_seqlens is None else np.diff(self.cu_seqlens).tolist()
        NT = sum(-(-n // C) for n in lengths)
        return (B, NT) + self.state_shape[1:]

    def inputs(self):
        """The six per-token inputs ``(q, k, v, g, b, w)`` as given (raw q, k, g)."""
        return tuple(getattr(self, name) for name in INPUTS)

    def kernel_keywords(self):
        """Keywords every kernel call passes besides the modes' (none: the contract returns the final state)."""
        return {}

    def segments(self):
        """``(batch rows, t0, t1, state rows)`` per independent run: the dense batch, or each sequence."""
        if self.cu_seqlens is None:
            return [(slice(None), 0, self.shape[1], slice(None))]
        cu = self.cu_seqlens
        return [(slice(0, 1), int(cu[n]), int(cu[n + 1]), slice(n, n + 1)) for n in range(len(cu) - 1)]

    def to_kv(self, state):
        """A state-shaped array of this call's layout as ``[..., K, V]``."""
        return np.swapaxes(state, -1, -2) if self.state_v_first else state

    def kv_layout(self):
        """The same call with ``[K, V]`` states (its ``initial_state`` transposed where the call's are ``[V, K]``)."""
        if not self.state_v_first:
            return self
        h0 = None if self.initial_state is None else self.to_kv(self.initial_state)
        return dataclasses.replace(self, state_v_first=False, initial_state=h0)

    def h0(self):
        """The initial state as ``[N, HV, K, V]`` (zeros when none was given)."""
        _, _, _, K, V = self.shape
        if self.initial_state is None:
            return np.zeros((self.num_sequences, self.value_heads, K, V))
        return self.to_kv(self.initial_state)

    def check_cotangents(self, do, dfinal_state):
        """Validate ``do: [B,T,HV,V]`` and ``dfinal_state`` (this call's state layout); return float64."""
        B, T, _, _, V = self.shape
        do, dfs = as_float_array("do", do), as_float_array("dfinal_state", dfinal_state)
        if do.shape != (B, T, self.value_heads, V):
            raise ValueError(f"do: shape {do.shape} does not match o's {(B, T, self.value_heads, V)}")
        if dfs.shape != self.state_shape:
            raise ValueError(f"dfinal_state: shape {dfs.shape} does not match {self._layout_name} = "
                             f"{self.state_shape}")
        return do, dfs


def _check_cu_seqlens(cu, B, T):
    """``cu_seqlens``: integers, ``0 = cu[0] <= ... <= cu[N] = T``, batch size 1; read-only int64."""
    a = np.asarray(cu)
    if a.ndim != 1 or a.size < 2:
        raise ValueError(f"cu_seqlens: expected a 1-D array of N+1 >= 2 offsets, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"cu_seqlens: expected integers, got dtype {a.dtype}")
    if B != 1:
        raise ValueError(f"cu_seqlens: packed sequences need batch size 1, got B = {B}")
    if a[0] != 0 or a[-1] != T:
        raise ValueError(f"cu_seqlens: must start at 0 and end at T = {T}, got {a[0]} ... {a[-1]}")
    if np.any(np.diff(a) < 0):
        raise ValueError(f"cu_seqlens: offsets must be non-decreasing, got {a.tolist()}")
    a = a.astype(np.int64)
    a.setflags(write=False)
    return a
