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


@dataclass(frozen=True, eq=False)
class Problem:
    """One GDN-2 instance: ``q, k, g, b: [B,T,H,K]``, ``v, w: [B,T,H,V]``, ``initial_state: [B,H,K,V]``.

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
        B, T, H, K, V = check_layout(arrays)
        if np.any(arrays["g"] > 0):
            raise ValueError("g: log-decay must be <= 0 (found a positive entry)")
        for name, a in arrays.items():
            object.__setattr__(self, name, a)
        object.__setattr__(self, "scale", check_scale(self.scale, K))
        if self.initial_state is not None:
            h0 = as_float_array("initial_state", self.initial_state, copy=True)
            if h0.shape != (B, H, K, V):
                raise ValueError(f"initial_state: shape {h0.shape} does not match [B, H, K, V] = {(B, H, K, V)}")
            object.__setattr__(self, "initial_state", h0)

    @property
    def shape(self):
        """``(B, T, H, K, V)``."""
        B, T, H, K = self.q.shape
        return B, T, H, K, self.v.shape[-1]

    def h0(self):
        """The initial state, zeros when none was given."""
        B, _, H, K, V = self.shape
        return np.zeros((B, H, K, V)) if self.initial_state is None else self.initial_state

    def inputs(self):
        """The six per-token inputs in contract order ``(q, k, v, g, b, w)``."""
        return tuple(getattr(self, name) for name in INPUTS)

    def replace(self, **changes):
        """A new validated Problem with some fields replaced."""
        fields = {name: getattr(self, name) for name in INPUTS + ("scale", "initial_state")}
        fields.update(changes)
        return Problem(**fields)

    def check_cotangents(self, do, dfinal_state):
        """Validate output cotangents ``do: [B,T,H,V]`` and ``dfinal_state: [B,H,K,V]``; return float64."""
        B, T, H, K, V = self.shape
        do = as_float_array("do", do)
        dfs = as_float_array("dfinal_state", dfinal_state)
        if do.shape != (B, T, H, V):
            raise ValueError(f"do: shape {do.shape} does not match o's {(B, T, H, V)}")
        if dfs.shape != (B, H, K, V):
            raise ValueError(f"dfinal_state: shape {dfs.shape} does not match {(B, H, K, V)}")
        return do, dfs


class Grads(NamedTuple):
    """The seven gradients of a scalar loss: inputs' layouts, and ``dh0: [B,H,K,V]``."""

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
