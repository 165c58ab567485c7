"""What ``domain`` sweeps: the regimes (:class:`Point`) and the problem of each, built from a seed; the grids of
one-at-a-time sweeps and their panels. The training-call modes' sweeps are the registry's (oracle/call_modes.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.oracle import KERNEL_DTYPES, call_modes, mode_recipes
from gdn2_oracle.oracle.generate import log_decay, round_to

from ..grading.diagnose import chunk_log_decay
from .domain_families import BETA_FIELD

RESETS = "resets"  # the oracle's resets regime, as a value of the decay-strength sweep
SHAPE = (1, 2, 16, 16)  # (B, H, K, V): small and fixed, so a kernel compiles once per (T, dtype)


@dataclass(frozen=True)
class Point:
    """One regime: every input is drawn from a seed by :func:`build`.

    ``strength``: g = -strength * U(0.5, 1.5) per token and channel, or ``"resets"`` (the oracle's
    regime); ``erase``, ``write``: b = erase * U(0.9, 1), w = write * U(0.9, 1); ``qk``: ``"l2"``
    (unit-norm q, k) or a number r (raw: standard normal * r / sqrt(K), norm ~ r).
    """

    strength: float | str = 0.1
    erase: float = 1.0
    write: float = 1.0
    qk: str | float = "l2"
    T: int = 256
    initial_state: bool = True
    dtype: str = "float32"

    def __post_init__(self):
        if not (self.strength == RESETS or _nonnegative(self.strength)):
            raise ValueError(f"strength: expected a number >= 0 or {RESETS!r}, got {self.strength!r}")
        for name in ("erase", "write"):
            if not _nonnegative(getattr(self, name)):
                raise ValueError(f"{name}: expected a number >= 0, got {getattr(self, name)!r}")
        if not (self.qk == "l2" or (_nonnegative(self.qk) and self.qk > 0)):
            raise ValueError(f"qk: expected 'l2' or a positive norm, got {self.qk!r}")
        if isinstance(self.T, bool) or not isinstance(self.T, (int, np.integer)) or self.T < 1:
            raise ValueError(f"T: expected a positive integer, got {self.T!r}")
        if self.dtype not in KERNEL_DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} not one of {KERNEL_DTYPES}")

    def replace(self, **changes):
        """A new validated Point with some fields replaced."""
        return dataclasses.replace(self, **changes)


def _nonnegative(x):
    return not isinstance(x, (bool, str)) and isinstance(x, (int, float, np.number)) and math.isfinite(x) and x >= 0


def build(point: Point, seed=0, shape=SHAPE):
    """``(problem, do, dfinal_state)`` of a point: inputs rounded to its dtype, cotangents from the same seed."""
    B, H, K, V = shape
    ks, vs = (B, point.T, H, K), (B, point.T, H, V)
    rng = np.random.default_rng(seed)

    def query_key():
        x = rng.standard_normal(ks)
        return x / np.linalg.norm(x, axis=-1, keepdims=True) if point.qk == "l2" else x * (point.qk / np.sqrt(K))

    # Every draw happens whatever the point, so neighbouring points share their random numbers.
    q, k, v = query_key(), query_key(), rng.standard_normal(vs)
    jitter = rng.uniform(0.5, 1.5, ks)
    if point.strength == RESETS:
        g = log_decay(np.random.default_rng([seed, 1]), ks, RESETS)
    else:
        g = -point.strength * jitter
    b = point.erase * rng.uniform(0.9, 1.0, ks)
    w = point.write * rng.uniform(0.9, 1.0, vs)
    h0 = rng.standard_normal((B, H, K, V))
    dt = point.dtype
    problem = oracle.Problem(round_to(q, dt), round_to(k, dt), round_to(v, dt), np.minimum(round_to(g, dt), 0.0),
                             round_to(b, dt), round_to(w, dt),
                             initial_state=round_to(h0, "float32") if point.initial_state else None)
    return (problem, *oracle.random_cotangents(problem, seed, dt))


def decay_span(g, chunk):
    """The largest within-chunk log-decay span ``max |G|`` over chunks of ``chunk`` tokens, rows and channels."""
    return float(np.max(chunk_log_decay(g, chunk)))


# --- grids ------------------------------------------------------------------------------------

class Axis(NamedTuple):
    """A sweep of one :class:`Point` field over ``values``, run in each of ``dtypes``."""

    field: str
    label: str
    values: tuple
    dtypes: tuple = ("float32",)


# --- training-call modes: their sweeps are the registry's (oracle/call_modes.py) ------------------------

PLAIN = call_modes.BASE.name  # the plain dense call's sweeps (the Point axes)
MODE_T = call_modes.MODE_T  # the length of a mode call that is not packed
MODE_VALUES = call_modes.sweep_values()  # ``"mode.quantity"`` -> the swept values
UNORDERED = ("qk", "initial_state", BETA_FIELD, *call_modes.UNORDERED_SWEEPS)  # no order to cross
ModePoint = mode_recipes.ModePoint


def build_mode(point: ModePoint, seed=0):
    """``(call, do, dfinal_state)`` of a mode point with data seed ``seed`` (the recipe's call, overridden)."""
    return point.build(seed)


def mode_points(sweep, values, shape, dtype):
    """The :class:`ModePoint` of each value of a mode sweep (``"mode.quantity"``) at (H, K, V) of ``shape``."""
    return mode_recipes.sweep_points(sweep, values, shape, dtype)


def mode_value_label(sweep, value):
    """How a mode sweep's value is printed."""
    return call_modes.SWEEPS[sweep].shown(value)


class Grid(NamedTuple):
    """Sweeps around ``base`` on problems of ``shape`` = (B, H, K, V), each cell over ``seeds`` seeds; the mode
    sweeps (:data:`MODE_VALUES`) in ``mode_dtypes`` at the same H, K, V."""

    name: str
    axes: tuple
    seeds: int = 1
    base: Point = Point()
    shape: tuple = SHAPE
    mode_values: dict = MODE_VALUES
    mode_dtypes: tuple = ("float32",)


def _strengths(per_decade):
    return tuple(float(f"{s:.3g}") for s in np.logspace(-4, 3, 7 * per_decade + 1)) + (RESETS,)


BOTH = tuple(KERNEL_DTYPES)
GRIDS = {
    "quick": Grid("quick", (
        Axis("strength", "log-decay strength s", _strengths(2), BOTH),
        Axis("erase", "erase gate b", (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)),
        Axis("write", "write gate w", (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)),
        Axis("qk", "q/k norm", ("l2", 0.5, 1.0, 1.5)),
        Axis("initial_state", "initial state", (False, True)),
        Axis("T", "length T", (1, 63, 65, 256, 1000, 1024)),
    ), seeds=1),
    "full": Grid("full", (
        Axis("strength", "log-decay strength s", _strengths(4), BOTH),
        Axis("erase", "erase gate b", tuple(np.round(np.arange(0, 2.01, 0.125), 3).tolist()), BOTH),
        Axis("write", "write gate w", (0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0), BOTH),
        Axis("qk", "q/k norm", ("l2", 0.25, 0.5, 0.75, 1.0, 1.25, 1.5), BOTH),
        Axis("initial_state", "initial state", (False, True), BOTH),
        Axis("T", "length T", (1, 2, 15, 17, 63, 64, 65, 127, 129, 255, 256, 257, 511, 513, 1000, 1024, 1025,
                               2048, 4100), BOTH),
    ), seeds=3, mode_dtypes=BOTH),
}


def value_label(field, value):
    """How a swept value is printed: ``raw x1.5``, ``on``/``off``, ``1e-04``."""
    if field == "qk":
        return "l2" if value == "l2" else f"raw x{value:g}"
    if field == "initial_state":
        return "on" if value else "off"
    if field == "strength" and value != RESETS:
        return f"{value:.0e}" if value < 0.01 or value >= 1000 else f"{value:g}"
    return str(value) if isinstance(value, str) else f"{value:g}"


class Panel(NamedTuple):
    """One sweep in one dtype: ``field`` (a :class:`Point` field, or ``"mode.quantity"``), its ``mode`` (``dense``
    for the Point sweeps), the swept values with their labels and the point of each (Point or ModePoint)."""

    field: str
    label: str
    dtype: str
    mode: str
    values: tuple
    labels: tuple
    points: tuple


def panels(grid: Grid, modes=(PLAIN,)):
    """``[Panel]``: every sweep of the grid in each of its dtypes (``dense`` in ``modes``), then the sweeps of the
    other ``modes`` (:data:`MODE_VALUES`, in ``grid.mode_dtypes``)."""
    out = []
    fields = {f.name for f in dataclasses.fields(Point)}
    if PLAIN in modes:
        for axis in grid.axes:
            if axis.field not in fields or axis.field == "dtype":
                raise ValueError(f"grid: axis field {axis.field!r} is not a Point field to sweep")
            for dtype in axis.dtypes:
                out.append(Panel(axis.field, axis.label, dtype, PLAIN, tuple(axis.values),
                                 tuple(value_label(axis.field, v) for v in axis.values),
                                 tuple(grid.base.replace(**{axis.field: v, "dtype": dtype}) for v in axis.values)))
    for sweep, values in grid.mode_values.items():
        mode = call_modes.sweep_mode(sweep)
        if mode in modes:
            for dtype in grid.mode_dtypes:
                out.append(Panel(sweep, call_modes.sweep_label(sweep), dtype, mode, tuple(values),
                                 tuple(mode_value_label(sweep, v) for v in values),
                                 tuple(mode_points(sweep, values, grid.shape, dtype))))
    return out
