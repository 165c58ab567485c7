"""Deterministic GDN-2 input generator with named decay and gate regimes."""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

import numpy as np

from .problem import Problem
from .reductions import REDUCTIONS, reduce

DECAYS = ("none", "weak", "moderate", "strong", "extreme", "mixed", "resets")
# Gate regimes: (erase b, write w). "uniform" draws both from [0, 1]; "negative" draws b from
# [0, 2], which lets I - k (b*k)^T have an eigenvalue down to -1 (negative-eigenvalue mode).
GATES = {
    "uniform": ("uniform", "uniform"),
    "zero": ("zero", "zero"),
    "one": ("one", "one"),
    "erase_zero": ("zero", "uniform"),
    "erase_one": ("one", "uniform"),
    "write_one": ("uniform", "one"),
    "negative": ("uniform2", "uniform"),
}
QK_MODES = ("l2", "raw")
# The input dtypes a kernel is run in; the oracle can also generate float64 inputs.
KERNEL_DTYPES = ("float32", "bfloat16")
INPUT_PRECISIONS = KERNEL_DTYPES + ("float64",)
RESET_LOG_DECAY = -1e3
RESET_PROBABILITY = 0.03


def round_to_bfloat16(x):
    """Round to the nearest bfloat16 (ties to even), returned as the exact float64 values."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def round_to(x, precision):
    """The float64 values a kernel sees when fed ``x`` in ``precision`` (float32, bfloat16, float64)."""
    if precision == "float64":
        return np.asarray(x, dtype=np.float64)
    if precision == "float32":
        return np.asarray(x, dtype=np.float32).astype(np.float64)
    if precision == "bfloat16":
        return round_to_bfloat16(x)
    raise ValueError(f"precision: {precision!r} not one of {INPUT_PRECISIONS}")


def log_decay(rng, shape, regime):
    """Log-decay ``g <= 0`` of shape ``[B, T, H, K]`` for a named regime."""
    B, T, H, K = shape
    if regime == "none":
        return np.zeros(shape)
    if regime == "weak":
        return -1e-3 * rng.uniform(0.5, 1.5, shape)
    if regime == "moderate":
        return -0.1 * rng.uniform(0.5, 1.5, shape)
    if regime == "strong":
        return -rng.uniform(1.0, 5.0, shape)
    if regime == "extreme":
        return -rng.uniform(20.0, 60.0, shape)
    if regime == "mixed":
        # Per channel a fixed class (no decay / moderate / extreme), per token jitter within it.
        cls = rng.integers(0, 3, (B, 1, H, K))
        scale = np.choose(cls, [0.0, 0.1, 40.0])
        return -scale * rng.uniform(0.5, 1.5, shape)
    if regime == "resets":
        g = -0.05 * rng.uniform(0.5, 1.5, shape)
        reset = rng.random((B, T, H, 1)) < RESET_PROBABILITY
        return np.where(reset, RESET_LOG_DECAY * rng.uniform(0.9, 1.1, shape), g)
    raise ValueError(f"decay: {regime!r} not one of {DECAYS}")


def _gate(rng, shape, kind):
    if kind == "uniform":
        return rng.uniform(0.0, 1.0, shape)
    if kind == "uniform2":
        return rng.uniform(0.0, 2.0, shape)
    if kind == "zero":
        return np.zeros(shape)
    if kind == "one":
        return np.ones(shape)
    raise AssertionError(kind)


def _query_key(rng, shape, mode):
    x = rng.standard_normal(shape)
    if mode == "l2":
        return x / np.linalg.norm(x, axis=-1, keepdims=True)
    if mode == "raw":
        return x / np.sqrt(shape[-1])
    raise ValueError(f"qk: {mode!r} not one of {QK_MODES}")


def make_problem(B, T, H, K, V, *, HV=None, decay="moderate", gates="uniform", qk="l2",
                 initial_state=False, scale=None, precision="float32", seed=0) -> Problem:
    """A deterministic Problem from ``seed``; inputs rounded to what a ``precision`` kernel sees.

    ``HV``: value heads (v, g, b, w and the state), a positive multiple of the ``H`` key heads (q, k); None means
    ``H``. The draws are those of ``HV == H`` in the same order, so ``HV = H`` gives the same problem as None.
    """
    for name, n in dict(B=B, T=T, H=H, K=K, V=V).items():
        if not isinstance(n, (int, np.integer)) or n < (0 if name == "T" else 1):
            raise ValueError(f"{name}: expected a positive integer, got {n!r}")
    HV = check_value_heads(HV, H)
    if gates not in GATES:
        raise ValueError(f"gates: {gates!r} not one of {tuple(GATES)}")
    if precision not in INPUT_PRECISIONS:
        raise ValueError(f"precision: {precision!r} not one of {INPUT_PRECISIONS}")
    rng = np.random.default_rng(seed)
    kshape, vshape = (B, T, H, K), (B, T, HV, V)
    gshape = (B, T, HV, K)  # g and b: per value head
    erase, write = GATES[gates]
    # Each input is rounded as soon as it is drawn, so at most one raw array is alive at a time.
    arrays = {}
    arrays["q"] = round_to(_query_key(rng, kshape, qk), precision)
    arrays["k"] = round_to(_query_key(rng, kshape, qk), precision)
    arrays["v"] = round_to(rng.standard_normal(vshape), precision)
    arrays["g"] = np.minimum(round_to(log_decay(rng, gshape, decay), precision), 0.0)
    arrays["b"] = round_to(_gate(rng, gshape, erase), precision)
    arrays["w"] = round_to(_gate(rng, vshape, write), precision)
    # The state is float32 in every kernel.
    h0 = round_to(rng.standard_normal((B, HV, K, V)), "float32") if initial_state else None
    return Problem(**arrays, scale=scale, initial_state=h0)


def random_cotangents(problem: Problem, seed=0, precision="float32"):
    """Deterministic standard-normal cotangents ``(do, dfinal_state)`` for a problem."""
    B, T, _, K, V = problem.shape
    HV = problem.HV
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x6D6E]))
    do = round_to(rng.standard_normal((B, T, HV, V)), precision)
    dfs = round_to(rng.standard_normal((B, HV, K, V)), "float32")
    return do, dfs


def check_value_heads(HV, H):
    """The value heads: ``H`` for None, else ``HV`` if it is a positive multiple of ``H``, or ValueError naming
    ``HV``."""
    if HV is None:
        return H
    if isinstance(HV, bool) or not isinstance(HV, numbers.Integral) or HV < 1 or HV % H:
        raise ValueError(f"HV: expected a positive multiple of H = {H} (value heads), got {HV!r}")
    return int(HV)


def _check_int(name, n, lo):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {n!r}")
    return int(n)


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name}: {value!r} not one of {tuple(choices)}")


@dataclass(frozen=True)
class Recipe:
    """A reproducible GDN-2 example: the :func:`make_problem` arguments, an optional reduction, the
    data seed and the cotangent seed.

    ``reduction``: ``None`` (the generated problem as is), ``"kda"`` or ``"gdn"``
    (:func:`oracle.reductions.reduce` of it). ``cot_seed=None`` means the data seed (what the golden
    corpus uses). ``scale=None`` means the default ``K**-0.5``. ``HV``: grouped value heads, a positive multiple
    of ``H`` (None, what ``HV = H`` becomes, means ``H``); :attr:`shape` stays ``(B, T, H, K, V)``. Invalid fields
    raise ValueError naming the field.
    """

    B: int
    T: int
    H: int
    K: int
    V: int
    decay: str = "moderate"
    gates: str = "uniform"
    qk: str = "l2"
    seed: int = 0
    scale: float | None = None
    initial_state: bool = False
    precision: str = "float32"
    reduction: str | None = None
    cot_seed: int | None = None
    HV: int | None = None

    def __post_init__(self):
        for dim in ("B", "T", "H", "K", "V"):
            object.__setattr__(self, dim, _check_int(dim, getattr(self, dim), 1))
        HV = check_value_heads(self.HV, self.H)
        object.__setattr__(self, "HV", None if HV == self.H else HV)  # one spelling of HV == H
        _check_choice("decay", self.decay, DECAYS)
        _check_choice("gates", self.gates, GATES)
        _check_choice("qk", self.qk, QK_MODES)
        _check_choice("precision", self.precision, INPUT_PRECISIONS)
        _check_choice("reduction", self.reduction, (None,) + REDUCTIONS)
        if not isinstance(self.initial_state, (bool, np.bool_)):
            raise ValueError(f"initial_state: expected a bool, got {self.initial_state!r}")
        object.__setattr__(self, "initial_state", bool(self.initial_state))
        object.__setattr__(self, "seed", _check_int("seed", self.seed, 0))
        if self.cot_seed is not None:
            object.__setattr__(self, "cot_seed", _check_int("cot_seed", self.cot_seed, 0))
        if self.scale is not None:
            if isinstance(self.scale, bool) or not isinstance(self.scale, numbers.Real) \
                    or not np.isfinite(self.scale):
                raise ValueError(f"scale: expected None or a finite real number, got {self.scale!r}")
            object.__setattr__(self, "scale", float(self.scale))

    @property
    def shape(self):
        """``(B, T, H, K, V)``."""
        return (self.B, self.T, self.H, self.K, self.V)

    @property
    def value_heads(self):
        """``HV``: the value heads (``H`` when the field is None)."""
        return self.H if self.HV is None else self.HV

    @property
    def dtype(self):
        """The input dtype a kernel is run in (the precision the inputs are rounded to)."""
        return self.precision

    @property
    def cotangent_seed(self):
        """The seed of the cotangents: ``cot_seed``, or the data seed when that is None."""
        return self.seed if self.cot_seed is None else self.cot_seed

    def kwargs(self):
        """The :func:`make_problem` keyword arguments (everything but the shape; ``HV`` only when grouped)."""
        heads = {} if self.HV is None else {"HV": self.HV}
        return dict(**heads, decay=self.decay, gates=self.gates, qk=self.qk, initial_state=self.initial_state,
                    scale=self.scale, precision=self.precision, seed=self.seed)

    def replace(self, **changes):
        """A new validated Recipe with some fields replaced."""
        return dataclasses.replace(self, **changes)

    def problem(self) -> Problem:
        """The problem: ``make_problem(...)``, reduced when the recipe names a reduction."""
        p = make_problem(*self.shape, **self.kwargs())
        return p if self.reduction is None else reduce(p, self.reduction)

    def cotangents(self, problem=None):
        """``(do, dfinal_state)``: :func:`random_cotangents` from the cotangent seed, ``do`` rounded
        like the inputs (``problem`` defaults to :meth:`problem`; only its shape matters)."""
        return random_cotangents(problem if problem is not None else self.problem(),
                                 seed=self.cotangent_seed, precision=self.precision)

    def build(self):
        """``(problem, do, dfinal_state)``."""
        p = self.problem()
        return (p, *self.cotangents(p))

    def call(self):
        """The problem as Python source (names from ``from gdn2_oracle import oracle``)."""
        shape = ", ".join(str(n) for n in self.shape)
        src = f"oracle.make_problem({shape}, " + ", ".join(f"{k}={v!r}" for k, v in self.kwargs().items()) + ")"
        return src if self.reduction is None else f"oracle.reductions.reduce({src}, {self.reduction!r})"

    def cotangents_call(self, problem="p"):
        """The cotangents of ``problem`` (a Python name) as Python source."""
        return f"oracle.random_cotangents({problem}, {self.cotangent_seed}, {self.precision!r})"
