"""Hypothesis strategies for the GDN-2 property suite.

Data is drawn as *integer seeds* fed to :func:`oracle.make_problem`, never as raw arrays, so a
counterexample is an :class:`oracle.Recipe` (``make_problem`` keyword arguments and a cotangent
seed) that prints as a one-line reproduction (:func:`repro`) and pastes straight into a golden case
or an ``@example`` (:func:`example`).

Shapes come from small fixed sets, because every new ``(kernel, shape, dtype)`` triple costs one
JIT compile (seconds on a CPU) while a new seed on a known shape costs milliseconds:

* ``CORE``: the configurations every profile runs, chosen so that together they cover T = 1, 2,
  C-1, C+1, several hundred tokens (C = 64, the default chunk) and long sequences (1024 tokens, and
  1000, a multiple of no block size: past 128/256/512-token boundaries, with B = H = 1 and small
  K, V so the float64 oracle stays cheap), K != V, B and H in {1, 2}, and float32 and bfloat16;
  ``(B, H, K, V)`` families repeat so that the state-carry property can split a sequence into two
  lengths that are themselves in ``CORE`` (no extra compiles);
* ``any_shape()``: the full cross product of the small sets, drawn by Hypothesis (``thorough``).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import NamedTuple

from hypothesis import strategies as st
from hypothesis import target

from gdn2_oracle import kernels, oracle
from gdn2_oracle.ci.running import families
from gdn2_oracle.kernels import DEFAULTS as DEFAULT_KERNELS
from gdn2_oracle.kernels.spec import python_c, runnable
from gdn2_oracle.oracle import Recipe
from gdn2_oracle.oracle.mode_recipes import MODES, ModeRecipe, drawn_fields

CHUNK = kernels.get("pairwise").chunk_size  # the default chunk of our kernels; lengths are chosen around it
LENGTHS = (1, 2, CHUNK - 1, CHUNK + 1, 300)
BATCHES = (1, 2)
HEADS = (1, 2)
KEY_DIMS = (16, 32)
VALUE_DIMS = (8, 16)
DTYPES = oracle.KERNEL_DTYPES
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
# bfloat16; B = 2 with T = 1 (float32) and T = 2 (bfloat16); 300 tokens (5 chunks with a tail); 1024 and
# 1000 tokens (a block-boundary bug at 128/256/512 tokens shows there; test_conformance pins weak and no
# decay on them so the state stays informative across the whole length).
CORE = (
    Config(2, 1, 1, 16, 8, "float32"),
    Config(2, 2, 1, 16, 8, "bfloat16"),
    Config(1, 2, 2, 32, 16, "float32"),
    Config(1, 63, 2, 32, 16, "float32"),
    Config(1, 65, 2, 32, 16, "float32"),
    Config(1, 65, 2, 32, 16, "bfloat16"),
    Config(1, 300, 1, 16, 16, "float32"),
    Config(1, 1024, 1, 16, 8, "float32"),
    Config(1, 1000, 1, 16, 16, "float32"),
)
# State carry: a whole length and split points whose pieces are both in CORE (same B, H, K, V, dtype).
CARRY_CONFIG = Config(1, 65, 2, 32, 16, "float32")
CARRY_SPLITS = (63, 2)


def core_config(**match):
    """The first CORE config whose fields equal ``match``."""
    return next(c for c in CORE if all(getattr(c, k) == v for k, v in match.items()))


# A drawn example is an ``oracle.Recipe`` (``make_problem`` arguments plus the cotangent seed).


def example(recipe: Recipe) -> str:
    """The ``@example`` decorator that pins this recipe in a test drawing ``spec``."""
    return "@example(spec=" + repr(recipe) + ")"


def repro(recipe: Recipe, kernel_name="pairwise") -> str:
    """A shell one-liner that validates ``kernel_name`` on this recipe and prints the report."""
    return runnable(python_c("from gdn2_oracle import oracle, kernels; from gdn2_oracle.ci.running.harness import "
                             f"validate; p = {recipe.call()}; do, dfs = {recipe.cotangents_call('p')}; "
                             f"print(validate(kernels.get({kernel_name!r}), p, do, dfs, "
                             f"dtype={recipe.dtype!r}).format())"), kernel_name)


def carry_repro(recipe: Recipe, kernel_name="pairwise", t=CARRY_SPLITS[0]) -> str:
    """A shell one-liner that reruns ``test_state_carry``'s call of ``kernel_name`` on this recipe split at ``t``
    (``[0, t)`` then ``[t, T)`` from the carried final state, the VJPs chained: ``harness.carried_results``) and
    prints both judgements (:func:`show`): against the float64 oracle, and against the kernel's one call."""
    return runnable(python_c(
        "from gdn2_oracle import oracle, kernels; from gdn2_oracle.ci.running.harness import validate_carried; "
        f"from gdn2_oracle.property_tests.strategies import show; p = {recipe.call()}; "
        f"do, dfs = {recipe.cotangents_call('p')}; r, a = validate_carried(kernels.get({kernel_name!r}), p, do, dfs, "
        f"{t!r}, dtype={recipe.dtype!r}); show([('[0,{t}) + [{t},{recipe.shape[1]}) with carried state vs the float64 "
        "oracle', r), ('carried vs one call (tight agreement)', a)])"), kernel_name)


def carry_example(recipe: Recipe, kernel_name, t) -> str:
    """The ``@example`` line of a ``test_state_carry`` failure, with the test id of its split ``t`` (a pytest
    parameter: the example runs under every split, the failure was seen under this one)."""
    return (f"{example(recipe)}  on test_state_carry (it failed as test_state_carry[{kernel_name}-split{t}]; "
            "an example runs under every split)")


# --------------------------------------------------------------------------------------------
# serving reproducers (property_tests/test_serving.py, test_family_serving.py)

SUITE = "gdn2_oracle.property_tests"  # the installed suite a reproducer imports (pytest may name it otherwise)


def given_example(**drawn) -> str:
    """The ``@example`` decorator pinning the drawn arguments ``drawn`` of a test."""
    return "@example(" + ", ".join(f"{k}={v!r}" for k, v in drawn.items()) + ")"


class Rerun(NamedTuple):
    """What reruns one failing serving property: its ``check_*`` function (which returns ``[(label, Report)]``), the
    kernel's name as selected, the dtype and the test's drawn arguments (``{}``: a test without draws)."""

    check: Callable
    kernel: str
    dtype: str
    drawn: dict

    def command(self) -> str:
        """A shell one-liner that builds the kernel from its name (``kernel_named`` of the check's module, as pytest
        builds it), runs the check and prints every ``(label, report)`` (``show``)."""
        module = f"{SUITE}.{self.check.__module__.rsplit('.', 1)[-1]}"  # the installed module, however pytest named it
        args = ", ".join([f"kernel_named({self.kernel!r})", repr(self.dtype)]
                         + [f"{k}={v!r}" for k, v in self.drawn.items()])
        return runnable(python_c(f"from {module} import {self.check.__name__}, kernel_named, show; "
                                 f"show({self.check.__name__}({args}))"), self.kernel)

    def explain(self) -> str:
        """The lines a failure message adds: the reproducer, and the ``@example`` line that pins the draw."""
        pin = given_example(**self.drawn) if self.drawn else "(nothing drawn: the test runs these values every time)"
        return f"reproduce: {self.command()}\npin it:    {pin}"


def show(checks):
    """Print each ``(label, report)`` of a serving check: its grade and verdict table (what a reproducer prints)."""
    for label, report in checks:
        print(f"{label}: {report.grade}\n{report.format()}", flush=True)


seeds = st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def specs(draw, config, *, decays=DECAYS, gates=GATES, initial_state=None):
    """A Recipe on a fixed ``config``: decay and gate regime, q/k mode, initial state, data seeds."""
    return Recipe(
        *config.shape,
        decay=draw(st.sampled_from(decays)),
        gates=draw(st.sampled_from(gates)),
        qk=draw(st.sampled_from(oracle.QK_MODES)),
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
    """A Recipe on a drawn config."""
    return any_config().flatmap(lambda c: specs(c, **kw))


# --------------------------------------------------------------------------------------------
# kernels under test

OURS = DEFAULT_KERNELS  # our pure-JAX kernels: they accept chunk_size / split / leaf options


@functools.cache
def _kernel_fn(name, options):
    return kernels.get(name, **dict(options))


def kernel_fn(name, **options):
    """``kernels.get(name, **options)``, one object per (name, options) for the whole session.

    ``ci.running.harness.runner`` caches the jitted forward+VJP per callable, so reusing the object means a
    shape compiles once per session, across tests and Hypothesis examples.
    """
    return _kernel_fn(name, tuple(sorted(options.items())))


def selected_kernel(name):
    """``(callable, family)`` of the kernel selected as ``name`` (``--gdn2-kernel``), built as pytest builds it
    (conftest.py): the spec's ``family`` option taken out of it (``ci.running.families.spec_family``), else read from
    the kernel (``kernel_family``). What a failure's reproducer builds from the name alone."""
    spec, option = families.spec_family(kernels.KernelSpec.parse(name))
    fn = kernel_fn(name) if option is None else kernel_fn(spec.name, **spec.options)
    return fn, families.kernel_family(fn, option, label=name)


class Kernel(NamedTuple):
    """A kernel under test: its name (as selected) and its callable with the docs/DESIGN.md §2 contract."""

    name: str
    fn: Callable

    @property
    def configurable(self):
        """Whether the kernel is ours and accepts ``chunk_size`` / ``split`` options."""
        return self.name in OURS

    def variant(self, **options):
        """The same kernel built with other options (cached: one object, so one compile per shape)."""
        return Kernel(self.name, kernel_fn(self.name, **options))


def target_ratios(report, result=None):
    """``hypothesis.target`` error / tolerance (``Verdict.ratio``) of each result of a graded report (label: its
    name), or of ``result`` only; return ``{name: ratio}`` (a non-finite ratio is targeted as the largest float).
    The search targets of the ``thorough`` profile and of ``gdn2-oracle hunt``."""
    ratios = {}
    for v in report.verdicts:
        if result is None or v.name == result:
            ratios[v.name] = v.ratio
            target(ratios[v.name] if math.isfinite(ratios[v.name]) else sys.float_info.max, label=v.name)
    return ratios


# --------------------------------------------------------------------------------------------
# training-call modes (docs/modes.md): drawn ModeRecipes

MODE_LENGTHS = (0, 1, 2, 5, CHUNK - 1, CHUNK, CHUNK + 1)  # packed sequence lengths, around the chunk
MODE_DENSE_LENGTHS = (1, CHUNK - 1, CHUNK + 1, 100)  # the length of a call that is not packed
MODE_SHAPE = (2, 16, 8)  # (H, K, V) of a drawn mode call: K != V; one compile per call structure
LOWER_BOUNDS = (-5.0, -1.0, -20.0)  # the bounded gate's lower_bound (FLA ships -5)


def _chooser(draw):
    """``choose(what, options=None)`` of :func:`oracle.mode_recipes.drawn_fields`: a draw among ``options``, else
    among this module's set for ``what`` (read when drawing)."""
    sets = {"packed_lengths": lambda: tuple(draw(st.lists(st.sampled_from(MODE_LENGTHS), min_size=1, max_size=5)
                                                 .filter(lambda lengths: sum(lengths) > 0))),
            "row_length": lambda: draw(st.sampled_from(MODE_DENSE_LENGTHS)),
            "rows": lambda: draw(st.sampled_from(BATCHES)),
            "lower_bound": lambda: draw(st.sampled_from(LOWER_BOUNDS)),
            "qk": lambda: draw(st.sampled_from(oracle.QK_MODES)),
            "flag": lambda: draw(st.booleans())}

    def choose(what, options=None):
        return draw(st.sampled_from(options)) if options is not None else sets[what]()

    return choose


@st.composite
def mode_recipes(draw, modes=MODES, dtypes=None, shape=MODE_SHAPE):
    """A :class:`oracle.mode_recipes.ModeRecipe` using some of ``modes`` (each drawn on or off, at least one on;
    all off shrinks away): packed lengths around the chunk (varlen), the gate's form, ``lower_bound`` and
    parameters (gate), near-zero q/k rows (l2norm), ``[V, K]`` states, states at chunk starts (intermediate),
    with drawn decay and gate regimes, q/k mode, initial state, dtype (among ``dtypes``, default :data:`DTYPES`) and
    data seeds. The sets drawn from are this module's constants, read when drawing."""
    modes = tuple(m for m in MODES if m in modes)
    if not modes:
        raise ValueError(f"modes: expected some of {MODES}, got none")
    on = {m: draw(st.booleans()) for m in modes}
    if not any(on.values()):
        on[draw(st.sampled_from(modes))] = True
    H, K, V = shape
    choose = _chooser(draw)
    kw = {}
    for mode in MODES:  # each mode's fields (oracle.mode_recipes.drawn_fields), drawn in registry order
        kw.update(drawn_fields(mode, on.get(mode, False), choose))
    return ModeRecipe(H, K, V, decay=draw(st.sampled_from(DECAYS)), gates=draw(st.sampled_from(GATES)),
                      initial_state=draw(st.booleans()), precision=draw(st.sampled_from(tuple(dtypes or DTYPES))),
                      seed=draw(seeds), cot_seed=draw(seeds), **kw)


def mode_example(recipe: ModeRecipe) -> str:
    """The ``@example`` decorator that pins this recipe in a test drawing ``recipe`` (property_tests/test_modes.py)."""
    return "@example(recipe=" + recipe.call_source() + ")"


def mode_repro(recipe: ModeRecipe, kernel_name="pairwise") -> str:
    """A shell one-liner that judges ``kernel_name`` on this training call and prints the report."""
    return runnable(python_c("from gdn2_oracle import kernels; from gdn2_oracle.oracle.mode_recipes import "
                             "ModeRecipe; from gdn2_oracle.ci.grading.modes import ModeCase; from "
                             "gdn2_oracle.ci.running.modes import validate; print(validate(kernels.get("
                             f"{kernel_name!r}), ModeCase.from_recipe('hunt', {recipe.call_source()})).format())"),
                    kernel_name)
