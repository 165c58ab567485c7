"""The GDN-2 problem type: inputs in the layout of docs/DESIGN.md §2, validated on construction."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# Layout (docs/DESIGN.md §2): which inputs are [B, T, H, K] and which are [B, T, H, V].
KEY_INPUTS = ("q", "k", "g", "b")
VALUE_INPUTS = ("v", "w")
INPUTS = ("q", "k", "v", "g", "b", "w")
GRADS = ("dq", "dk", "dv", "dg", "db", "dw", "dh0")
# Everything a kernel call is judged on: the forward output, the final state and the seven gradients.
RESULTS = ("o", "final_state") + GRADS


# Floating dtypes NumPy knows only through an extension (ml_dtypes, as JAX gives them): upcast exactly.
EXTENSION_FLOATS = ("bfloat16",)


def as_float_array(name, x, *, copy=False):
    """Return ``x`` as a read-only float64 array, or raise ValueError naming ``name``.

    Any NumPy floating dtype or bfloat16 is upcast exactly. With ``copy``, the result never shares
    memory with a writable array of the caller, so later changes to ``x`` cannot alter it.
    """
    try:
        a = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - ragged nesting, objects NumPy cannot hold, ...
        raise ValueError(f"{name}: not convertible to an array ({type(exc).__name__}: {exc})") from None
    if not (np.issubdtype(a.dtype, np.floating) or a.dtype.name in EXTENSION_FLOATS):
        raise ValueError(f"{name}: expected a floating-point array, got dtype {a.dtype}")
    private = not a.flags.writeable and a.flags.owndata and a.dtype == np.float64
    a = np.array(a, dtype=np.float64) if copy and not private else np.asarray(a, dtype=np.float64).view()
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: contains NaN or inf")
    a.setflags(write=False)
    return a


def check_scale(scale, K):
    """The effective scale: ``K**-0.5`` for None, else a finite real number (not a string, not a bool)."""
    if scale is None:
        return float(K) ** -0.5
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (numbers.Real, np.floating, np.integer)):
        raise ValueError(f"scale: expected a real number, got {scale!r}")
    if not np.isfinite(float(scale)):
        raise ValueError(f"scale: must be finite, got {scale}")
    return float(scale)


def check_layout(arrays, *, empty_ok=False):
    """Ranks and shapes of the six inputs ``q, k, g, b: [B,T,H,K]``, ``v, w: [B,T,H,V]`` (docs/DESIGN.md §2);
    returns ``(B, T, H, K, V)``, or ValueError naming the input. ``empty_ok``: T == 0 is allowed."""
    for name, a in arrays.items():
        if a.ndim != 4:
            raise ValueError(f"{name}: expected rank 4 [B, T, H, dim], got shape {a.shape}")
    B, T, H, K = arrays["q"].shape
    V = arrays["v"].shape[-1]
    if T == 0 and not empty_ok:
        raise ValueError("q: empty sequence (T == 0)")
    if min(B, H, K, V) == 0:
        raise ValueError(f"q: zero-sized dimension in shape {arrays['q'].shape} / v {arrays['v'].shape}")
    for names, shape in ((KEY_INPUTS, (B, T, H, K)), (VALUE_INPUTS, (B, T, H, V))):
        for name in names:
            got = arrays[name].shape
            if got != shape:
                gva = " (no GVA: v, w, g, b have q's heads)" if got[:2] == shape[:2] and got[2] != H else ""
                raise ValueError(f"{name}: shape {got} does not match {shape}{gva}")
    return B, T, H, K, V


def check_grouped_layout(arrays, *, empty_ok=False):
    """Ranks and shapes of the six inputs with grouped value heads (docs/DESIGN.md §1): ``q, k: [B,T,H,K]``,
    ``g, b: [B,T,HV,K]``, ``v, w: [B,T,HV,V]`` with ``HV`` (v's heads) a positive multiple of ``H``; returns
    ``(B, T, H, K, V, HV)``, or ValueError naming the input. ``HV == H`` is :func:`check_layout`'s layout.
    ``empty_ok``: T == 0 is allowed."""
    for name, a in arrays.items():
        if a.ndim != 4:
            raise ValueError(f"{name}: expected rank 4 [B, T, heads, dim], got shape {a.shape}")
    B, T, H, K = arrays["q"].shape
    HV, V = arrays["v"].shape[2:]
    if T == 0 and not empty_ok:
        raise ValueError("q: empty sequence (T == 0)")
    if min(B, H, K, V) == 0:
        raise ValueError(f"q: zero-sized dimension in shape {arrays['q'].shape} / v {arrays['v'].shape}")
    if HV == 0 or HV % H:
        raise ValueError(f"v: {HV} value heads (shape {arrays['v'].shape}) is not a positive multiple of "
                         f"q's {H} key heads")
    shapes = {"q": (B, T, H, K), "k": (B, T, H, K), "g": (B, T, HV, K), "b": (B, T, HV, K),
              "v": (B, T, HV, V), "w": (B, T, HV, V)}
    for name in INPUTS:
        if arrays[name].shape != shapes[name]:
            raise ValueError(f"{name}: shape {arrays[name].shape} does not match {shapes[name]}")
    return B, T, H, K, V, HV


def repeat_heads(x, G):
    """``[B, T, H, D] -> [B, T, G*H, D]``: head ``h`` becomes heads ``h*G .. h*G + G-1`` (value head ``hv`` reads
    key head ``hv // G``); ``x`` itself when ``G == 1``."""
    return x if G == 1 else np.repeat(x, G, axis=2)


def sum_groups(x, G):
    """``[B, T, G*H, D] -> [B, T, H, D]``: the sum over each group of ``G`` consecutive heads (the adjoint of
    :func:`repeat_heads`); ``x`` itself when ``G == 1``."""
    if G == 1:
        return x
    B, T, HV, D = x.shape
    return x.reshape(B, T, HV // G, G, D).sum(axis=3)


@dataclass(frozen=True, eq=False)
class Problem:
    """One GDN-2 instance: ``q, k: [B,T,H,K]``, ``g, b: [B,T,HV,K]``, ``v, w: [B,T,HV,V]``,
    ``initial_state: [B,HV,K,V]``; ``HV`` (v's heads, a positive multiple of ``H``, ``H`` by default) are grouped
    value heads, value head ``hv`` reading key head ``hv // (HV // H)`` (docs/DESIGN.md §1).

    Arrays are held as read-only float64 copies (the exact values a kernel saw; float16/32/64 and
    bfloat16 inputs are upcast exactly), so changing the caller's arrays later cannot change a
    validated problem; ``scale`` defaults to ``K**-0.5``.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    b: np.ndarray
    w: np.ndarray
    scale: float | None = None
    initial_state: np.ndarray | None = None

    def __post_init__(self):
        arrays = {name: as_float_array(name, getattr(self, name), copy=True) for name in INPUTS}
        B, T, H, K, V, HV = check_grouped_layout(arrays)
        if np.any(arrays["g"] > 0):
            raise ValueError("g: log-decay must be <= 0 (found a positive entry)")
        for name, a in arrays.items():
            object.__setattr__(self, name, a)
        object.__setattr__(self, "scale", check_scale(self.scale, K))
        if self.initial_state is not None:
            h0 = as_float_array("initial_state", self.initial_state, copy=True)
            if h0.shape != (B, HV, K, V):
                raise ValueError(f"initial_state: shape {h0.shape} does not match [B, HV, K, V] = {(B, HV, K, V)}")
            object.__setattr__(self, "initial_state", h0)

    @property
    def shape(self):
        """``(B, T, H, K, V)``; ``H``: the key heads (q's), the value heads are :attr:`HV`."""
        B, T, H, K = self.q.shape
        return B, T, H, K, self.v.shape[-1]

    @property
    def HV(self):
        """The value heads (v's, g's, b's, w's and the state's): ``H`` unless grouped."""
        return self.v.shape[2]

    @property
    def group_size(self):
        """``G = HV // H``: the value heads reading each key head."""
        return self.HV // self.q.shape[2]

    def h0(self):
        """The initial state ``[B, HV, K, V]``, zeros when none was given."""
        B, _, _, K, V = self.shape
        return np.zeros((B, self.HV, K, V)) if self.initial_state is None else self.initial_state

    def per_value_head(self):
        """The same problem with q and k repeated to the value heads (``HV == H``, each value head its own key
        head; :func:`repeat_heads`): the gradients of ``q, k`` here summed over each group
        (:func:`sum_groups`) are this problem's. ``self`` when ``HV == H``."""
        G = self.group_size
        return self if G == 1 else self.replace(q=repeat_heads(self.q, G), k=repeat_heads(self.k, G))

    def inputs(self):
        """The six per-token inputs in contract order ``(q, k, v, g, b, w)``."""
        return tuple(getattr(self, name) for name in INPUTS)

    def replace(self, **changes):
        """A new validated Problem with some fields replaced."""
        fields = {name: getattr(self, name) for name in INPUTS + ("scale", "initial_state")}
        fields.update(changes)
        return Problem(**fields)

    def check_cotangents(self, do, dfinal_state):
        """Validate output cotangents ``do: [B,T,HV,V]`` and ``dfinal_state: [B,HV,K,V]``; return float64."""
        B, T, _, K, V = self.shape
        HV = self.HV
        do = as_float_array("do", do)
        dfs = as_float_array("dfinal_state", dfinal_state)
        if do.shape != (B, T, HV, V):
            raise ValueError(f"do: shape {do.shape} does not match o's {(B, T, HV, V)}")
        if dfs.shape != (B, HV, K, V):
            raise ValueError(f"dfinal_state: shape {dfs.shape} does not match {(B, HV, K, V)}")
        return do, dfs


class Grads(NamedTuple):
    """The seven gradients of a scalar loss: inputs' layouts, and ``dh0: [B,HV,K,V]``."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dg: np.ndarray
    db: np.ndarray
    dw: np.ndarray
    dh0: np.ndarray


def named_results(outputs, grads):
    """``((o, final_state), grads)`` of a forward + VJP as one mapping over ``RESULTS``."""
    o, final_state = outputs
    return {"o": o, "final_state": final_state, **grads._asdict()}
