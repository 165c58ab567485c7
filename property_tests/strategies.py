"""Hypothesis strategies for the GDN-2 property suite.

Data is drawn as *integer seeds* fed to :func:`oracle.make_problem`, never as raw arrays, so a
counterexample is a handful of ``make_problem`` keyword arguments (``Spec``) that print as a
one-line reproduction and paste straight into a golden case or an ``@example``.

Shapes come from small fixed sets, because every new ``(kernel, shape, dtype)`` triple costs one
JIT compile (seconds on a CPU) while a new seed on a known shape costs milliseconds:

* ``CORE``: the configurations every profile runs, chosen so that together they cover T = 1, 2,
  C-1, C+1 and several hundred tokens (C = 64, the default chunk), K != V, B and H in {1, 2}, and
  float32 and bfloat16; ``(B, H, K, V)`` families repeat so that the state-carry property can
  split a sequence into two lengths that are themselves in ``CORE`` (no extra compiles);
* ``any_shape()``: the full cross product of the small sets, drawn by Hypothesis (``thorough``).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from typing import Callable, NamedTuple

from hypothesis import strategies as st

from gdn2_oracle import oracle
from gdn2_oracle.ci import tolerance
from gdn2_oracle.ci.tolerance import RESULTS, Report, Verdict

CHUNK = 64  # the default chunk of our kernels; lengths are chosen around it
LENGTHS = (1, 2, CHUNK - 1, CHUNK + 1, 300)
BATCHES = (1, 2)
HEADS = (1, 2)
KEY_DIMS = (16, 32)
VALUE_DIMS = (8, 16)
DTYPES = ("float32", "bfloat16")
DECAYS = oracle.DECAYS
GATES = tuple(oracle.GATES)


class Config(NamedTuple):
    """A fixed shape and input dtype (one JIT compile per kernel)."""

    B: int
    T: int
    H: int
    K: int
    V: int
    dtype: str

    @property
    def shape(self):
        return (self.B, self.T, self.H, self.K, self.V)

    @property
    def id(self):
        dt = "f32" if self.dtype == "float32" else "bf16"
        return f"B{self.B}T{self.T}H{self.H}K{self.K}V{self.V}-{dt}"


# Family (B=1, H=2, K=32, V=16): T = 2, 63, 65 (65 = 63 + 2 = 2 + 63, for the state carry) and 65 in
# bfloat16; B = 2 with T = 1 (float32) and T = 2 (bfloat16); 300 tokens (5 chunks with a tail).
CORE = (
    Config(2, 1, 1, 16, 8, "float32"),
    Config(2, 2, 1, 16, 8, "bfloat16"),
    Config(1, 2, 2, 32, 16, "float32"),
    Config(1, 63, 2, 32, 16, "float32"),
    Config(1, 65, 2, 32, 16, "float32"),
    Config(1, 65, 2, 32, 16, "bfloat16"),
    Config(1, 300, 1, 16, 16, "float32"),
)
# State carry: a whole length and split points whose pieces are both in CORE (same B, H, K, V, dtype).
CARRY_CONFIG = Config(1, 65, 2, 32, 16, "float32")
CARRY_SPLITS = (63, 2)


def core_config(**match):
    """The first CORE config whose fields equal ``match``."""
    return next(c for c in CORE if all(getattr(c, k) == v for k, v in match.items()))


@dataclass(frozen=True)
class Spec:
    """``make_problem`` keyword arguments plus the cotangent seed: one reproducible example."""

    B: int
    T: int
    H: int
    K: int
    V: int
    decay: str = "moderate"
    gates: str = "uniform"
    qk: str = "l2"
    initial_state: bool = False
    scale: float | None = None
    precision: str = "float32"
    seed: int = 0
    cot_seed: int = 0

    @property
    def dtype(self):
        return self.precision

    def make_kwargs(self):
        kw = asdict(self)
        kw.pop("cot_seed")
        return kw

    def problem(self):
        """The problem (inputs rounded to what a kernel in ``precision`` sees)."""
        kw = self.make_kwargs()
        shape = [kw.pop(n) for n in "BTHKV"]
        return oracle.make_problem(*shape, **kw)

    def cotangents(self, problem=None):
        """``(do, dfinal_state)``, standard normal, rounded like the kernel's output."""
        return oracle.random_cotangents(problem or self.problem(), self.cot_seed, self.precision)

    def replace(self, **changes):
        return replace(self, **changes)

    def call(self):
        """``make_problem(...)`` as Python source."""
        kw = self.make_kwargs()
        shape = ", ".join(str(kw.pop(n)) for n in "BTHKV")
        return f"oracle.make_problem({shape}, " + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")"

    def example(self):
        """The ``@example`` decorator that pins this case in a test drawing ``spec``."""
        return "@example(spec=" + repr(self) + ")"

    def repro(self, kernel_name="pairwise"):
        """A shell one-liner that validates ``kernel_name`` on this example and prints the report."""
        return ("python -c \"import oracle, kernels; from ci.harness import validate; "
                f"p = {self.call()}; do, dfs = oracle.random_cotangents(p, {self.cot_seed}, {self.precision!r}); "
                f"print(validate(kernels.get({kernel_name!r}), p, do, dfs, dtype={self.precision!r}).format())\"")


seeds = st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def specs(draw, config, *, decays=DECAYS, gates=GATES, initial_state=None):
    """A Spec on a fixed ``config``: decay and gate regime, q/k mode, initial state, data seeds."""
    return Spec(
        *config.shape,
        decay=draw(st.sampled_from(decays)),
        gates=draw(st.sampled_from(gates)),
        qk=draw(st.sampled_from(("l2", "raw"))),
        initial_state=draw(st.booleans()) if initial_state is None else initial_state,
        precision=config.dtype,
        seed=draw(seeds),
        cot_seed=draw(seeds),
    )


def any_config():
    """Any config from the full cross product of the small shape sets (thorough profile)."""
    return st.builds(Config, st.sampled_from(BATCHES), st.sampled_from(LENGTHS), st.sampled_from(HEADS),
                     st.sampled_from(KEY_DIMS), st.sampled_from(VALUE_DIMS), st.sampled_from(DTYPES))


def any_spec(**kw):
    """A Spec on a drawn config."""
    return any_config().flatmap(lambda c: specs(c, **kw))


# --------------------------------------------------------------------------------------------
# the tight agreement bound (see test_properties.py's docstring for the derivation)

AGREE_FRACTION = 1 / 3
BF16_ULP = 2.0 ** -7  # one bf16 ulp relative to an element in [1, 2) (the largest one sets max_err)


def agreement_bound(base_ratio, base_max, dtype, bf16_result=False):
    """``(tol_ratio, tol_max)`` two correct results must agree within: AGREE_FRACTION of the model's
    recurrence rule (MULTIPLE x the plain recurrence's error), never below the model's FLOOR (a few
    ulps: two different float32 computations cannot be asked to agree better), plus one bf16 ulp when
    a result was returned in bfloat16."""
    from gdn2_oracle.ci.tolerance import FLOOR, MULTIPLE
    out = []
    for e in (base_ratio, base_max):
        t = max(AGREE_FRACTION * MULTIPLE[dtype] * e, FLOOR[dtype])
        out.append(t + BF16_ULP if bf16_result else t)
    return tuple(out)


# --------------------------------------------------------------------------------------------
# kernels under test

from gdn2_oracle.kernels import DEFAULTS as DEFAULT_KERNELS  # noqa: E402

OURS = DEFAULT_KERNELS  # our pure-JAX kernels: they accept chunk_size / split / leaf options


@functools.lru_cache(maxsize=None)
def _kernel_fn(name, options):
    from gdn2_oracle import kernels
    return kernels.get(name, **dict(options))


def kernel_fn(name, **options):
    """``kernels.get(name, **options)``, one object per (name, options) for the whole session.

    ``ci.harness.runner`` caches the jitted forward+VJP per callable, so reusing the object means a
    shape compiles once per session, across tests and Hypothesis examples.
    """
    return _kernel_fn(name, tuple(sorted(options.items())))


class Kernel(NamedTuple):
    """A kernel under test: its name (as selected) and its callable with the DESIGN.md §2 contract."""

    name: str
    fn: Callable

    @property
    def configurable(self):
        """Whether the kernel is ours and accepts ``chunk_size`` / ``split`` options."""
        return self.name in OURS

    def variant(self, **options):
        """The same kernel built with other options (cached: one object, so one compile per shape)."""
        return Kernel(self.name, kernel_fn(self.name, **options))


def agreement(problem, do, dfs, a, b, ref, base, dtype, what="agreement"):
    """Judge ``a`` against ``b`` (two kernel results) with the tight bound ``strategies.agreement_bound``.

    The errors are normalised exactly as in ``tolerance.compare`` (the reference's scale, or the
    envelope for dg); the bound is AGREE_FRACTION x MULTIPLE x e_rec, never below FLOOR, plus one
    bf16 ulp for results returned in bfloat16 (see the module docstring).
    """
    report = Report(dtype=dtype)
    for name in RESULTS:
        s_rms, s_max = tolerance.scales(name, problem, ref)
        e_r, e_m = tolerance.metrics(a[name], b[name], s_rms, s_max)
        b_r, b_m = tolerance.metrics(base[name], ref[name], s_rms, s_max)
        bf16 = "bfloat16" in (tolerance.dtype_name(a[name]), tolerance.dtype_name(b[name]))
        t_r, t_m = agreement_bound(b_r, b_m, dtype, bf16)
        rule = f"{what} ({AGREE_FRACTION:.3g} x recurrence rule{', floor' if t_r <= tolerance.FLOOR[dtype] else ''})"
        if bf16:
            rule += " + 1 bf16 ulp"
        passed = bool(e_r <= t_r and e_m <= t_m)
        report.verdicts.append(Verdict(name, e_r, e_m, t_r, t_m, rule, passed))
    return report
