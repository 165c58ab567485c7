"""The judge for FLA ``chunk_gdn2`` training calls (docs/DESIGN.md §2, "Call modes (training)"; §4).

A :class:`ModeCase` is one :class:`oracle.Call` (packed sequences, in-kernel gate, in-kernel q/k L2 norm,
``[V, K]`` states, states at chunk starts) with its cotangents, judged like the dense call:

* reference: ``oracle.modes.forward_and_vjp_modes`` in float64 (the states at chunk starts from a forward
  at the kernel's chunk size); for a mode golden (``golden/mode_catalogue.py``, :meth:`ModeCase.golden`) the
  golden's 256-bit results rounded to float64, as a dense golden's (its states at chunk starts where the kernel's
  chunk size is the golden's, else the float64 forward at the kernel's);
* ``e_rec``: the same pipeline in float32 on the values the kernel saw, each result rounded to the dtype the
  kernel returned it in;
* ``e_cum`` (precision-loss bound): the pipeline with every sequence run by the float32 cumulative-sum
  chunked algorithm (``oracle/chunked32.py``) on the pre-processed inputs, rounded likewise;
* grades: per result the grading rule of ``ci/grading/rule.py`` (``judge_results``, ``agree_results``),
  generalised from the nine dense results to the set a call has: ``o, final_state, dq ... dh0`` plus
  ``intermediate_states``, ``dA_log``, ``ddt_bias`` when present.

Envelopes (docs/DESIGN.md §4, "The dg envelope"), from the float64 reference's core view (the pre-processed
``q^, k^, b`` and the gradients w.r.t. them): ``E = |q^ dq^| + |k^ dk^| + |b db|``; ``dg`` is judged on ``E``
without the gate and on ``|dgate/dx| E`` with it; ``ddt_bias`` on ``sum_{B,T} |dgate/dx| E``; ``dA_log`` on
``sum |g| E`` (softplus form) or ``sum |dgate/dx| |x| E`` (bounded form): the same sums with every term
taken by magnitude, so a gradient that cancels under strong decay is held to float32 resolution of its terms.

NumPy and the oracle only (docs/DESIGN.md §3): the kernel is run by ``ci/running/modes.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from gdn2_oracle.oracle import RESULTS, mode_recipes, modes, preprocess, recurrence
from gdn2_oracle.oracle import call_modes as registry
from gdn2_oracle.oracle.call import Call
from gdn2_oracle.oracle.generate import KERNEL_DTYPES as DTYPES
from gdn2_oracle.oracle.generate import round_to
from gdn2_oracle.oracle.mode_recipes import MODES, ModeRecipe

from . import diagnose
from .case import CachedCase
from .rule import Yardstick, agree_results, judge_results
from .tolerance import PER_TOKEN, Report, dtype_name, rounded, token_profile

# Every mode name a run may select: ``dense`` (the plain contract) and the training-call modes.
ALL_MODES = (registry.BASE.name,) + MODES
# Results a call may have besides the nine dense ones, in report order.
EXTRA_RESULTS = ("intermediate_states", "dA_log", "ddt_bias")
MODE_RESULTS = RESULTS + EXTRA_RESULTS
# The keywords a kernel must accept for each mode (FLA chunk_gdn2's names; ``**kwargs`` accepts all).
KEYWORDS = {m: registry.get(m).keywords for m in MODES}


def parse_modes(text):
    """``"varlen,gate"`` -> ``("varlen", "gate")`` in :data:`ALL_MODES` order; ValueError naming an unknown one."""
    return registry.parse(text, ALL_MODES)


def call_modes(call: Call):
    """The modes a Call uses (a subset of :data:`MODES`)."""
    return registry.active(call)


def result_names(call: Call):
    """The results a kernel is judged on for this call (a GDN-2 :class:`oracle.call.Call` or a family call: its
    ``dense_results``), in report order."""
    extra = {"intermediate_states": call.intermediate_chunk_size is not None,
             "dA_log": call.A_log is not None, "ddt_bias": call.dt_bias is not None}
    return call.dense_results + tuple(n for n in EXTRA_RESULTS if extra[n])


def named(forward, grads, names):
    """``(ModesForward, ModesGrads)`` as a dict over ``names``."""
    both = {**forward._asdict(), **grads._asdict()}
    return {n: np.asarray(both[n], np.float64) for n in names}


# --- scales: the reference's size, or the envelope of the terms a result is summed from -------------------


def envelopes(call: Call, inner):
    """``{name: envelope}`` for ``dg`` (and ``dA_log`` / ``ddt_bias``) from the float64 core view ``inner``
    (``oracle.preprocess.envelopes``)."""
    return preprocess.envelopes(call, inner)


# Gradients that are sums of another result's terms inherit its baseline error: ``ddt_bias`` and ``dA_log``
# are sums over tokens (and channels) of ``dg``'s terms, and an error within ``eps x`` dg's envelope per token
# gives an error within ``eps x`` the summed envelope however the per-token errors correlate (a chunked
# kernel's dg errors do correlate: it forms dg as a reverse cumulative sum), while the float32 recurrence's
# own errors in the sum, uncorrelated, average out far below that.
INHERITS = {"ddt_bias": "dg", "dA_log": "dg"}


def compare(names, got, yard: Yardstick, diagnosis_problem=None) -> Report:
    """Judge and grade results ``got`` over ``names`` against the yardstick ``yard`` (``rule.Yardstick``: the float64
    reference, the baselines, envelopes; ``tolerance.compare`` for any result set). A non-PASS report gets per-token
    profiles and, given ``diagnosis_problem`` (anything with ``g`` and ``initial_state``), a diagnosis."""
    if yard.dtype not in DTYPES:
        raise ValueError(f"dtype: {yard.dtype!r} not one of {DTYPES}")
    missing = [n for n in names if n not in got]
    if missing:
        raise ValueError(f"got: missing results {missing}")
    report = Report(dtype=yard.dtype)
    for v, s_rms in judge_results(names, got, yard):
        if not v.passed and v.name in PER_TOKEN and np.ndim(got[v.name]) == 4:
            report.profiles[v.name] = token_profile(got[v.name], yard.ref[v.name], s_rms)
        report.verdicts.append(v)
    if not report.passed and diagnosis_problem is not None:
        report.diagnosis = diagnose.diagnose_case(report, diagnosis_problem, lambda: yard.operand_errors(got))
    return report


def agreement(names, a, b, yard: Yardstick, what="agreement") -> Report:
    """Results ``a`` against ``b`` over ``names`` within the tight agreement bound (``tolerance.agreement``, any
    result set): errors normalised by the reference's scales (envelopes for dg & co), the bound from the
    working-precision baseline; over it, PRECISION within the precision-loss bound of one run (from the
    cumulative-sum baseline, formed only when needed: two runs whose chunks are aligned differently lose precision
    independently), else FAIL; without one, over the tight bound is FAIL (``rule.agree_results``)."""
    return Report(verdicts=agree_results(names, a, b, yard, what=what, result_dtype=dtype_name), dtype=yard.dtype)


# --- the case ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class ModeCase(CachedCase):
    """One training call in one input dtype; ``build()`` returns ``(call, do, dfinal_state)``.

    Reference, baselines and envelopes are computed lazily, once per case (baselines per result dtypes;
    the states at chunk starts once per chunk size) and shared by every kernel judged on it; a case with a ``key``
    (its recipe) caches them on disk by it (``reference_cache``).
    """

    name: str
    source: str
    dtype: str
    shape: tuple
    build: Callable
    modes: tuple
    regime: dict = field(default_factory=dict)
    seconds: float = 0.0
    key: dict | None = None  # what determines the data (the recipe), the reference cache's key; None: not cached
    stored_reference: Callable | None = None  # () -> a golden's stored results by name; None: the float64 oracle
    _data: tuple | None = None
    _ref: dict | None = None
    _env: dict | None = None
    _base: dict = field(default_factory=dict)
    _cum: dict = field(default_factory=dict)
    _ops: dict = field(default_factory=dict)
    _chunks: dict = field(default_factory=dict)
    _exact_states: np.ndarray | None = None

    @classmethod
    def of(cls, call: Call, do, dfinal_state, *, dtype="float32", name="mode-case"):
        """A case over a given call and cotangents."""
        call.check_cotangents(do, dfinal_state)
        return cls(name, "given", dtype, call.shape, lambda: (call, do, dfinal_state), call_modes(call))

    @classmethod
    def from_recipe(cls, name, recipe: ModeRecipe):
        """The case of a :class:`oracle.mode_recipes.ModeRecipe`, in the recipe's precision."""
        regime = recipe.regime()
        return cls(name, "generated", recipe.precision, recipe.shape, recipe.build, recipe.modes, regime,
                   key={"mode_recipe": recipe.fields()})

    @classmethod
    def golden(cls, name):
        """The mode golden ``name`` (``golden/mode_catalogue.py``; loaded and hash-checked when first used), in its
        own precision; its reference is the golden's stored results (:attr:`stored_reference`)."""
        from gdn2_oracle import golden  # the corpus is read only by cases that use it

        c = golden.mode_catalogue.get(name)

        def build():
            g = golden.load_mode(name)
            return (g.call(), *g.cotangents())

        case = cls.from_recipe(name, c.recipe)
        case.source, case.build = "golden", build
        case.stored_reference = lambda: golden.load_mode(name).reference()
        case.key = None  # the data are the golden file's: not cached by the recipe
        case.regime["purpose"] = c.purpose
        return case

    @classmethod
    def named(cls, name, *, seed=0):
        """The catalogued recipe ``name`` (``oracle.mode_recipes``), its data seed shifted by ``seed``."""
        recipe = mode_recipes.get(name)
        return cls.from_recipe(name, recipe.replace(seed=recipe.seed + seed) if seed else recipe)

    def data(self):
        """``(call, do, dfinal_state)``."""
        if self._data is None:
            self._data = self.build()
        return self._data

    @property
    def call(self) -> Call:
        return self.data()[0]

    def names(self):
        """The results judged on this case (:func:`result_names`)."""
        return result_names(self.call)

    def _without_intermediate(self):
        call = self.call
        return dataclasses.replace(call, intermediate_chunk_size=None) if call.intermediate_chunk_size else call

    def _chunk(self, chunk_size):
        """The chunk size the states at chunk starts are judged at: ``chunk_size``, else the call's (None: none)."""
        C = self.call.intermediate_chunk_size
        return None if C is None else int(chunk_size or C)

    def reference(self, chunk_size=None):
        """The float64 results by name (:meth:`names`); the states at chunk starts at ``chunk_size`` tokens
        (default: the call's ``intermediate_chunk_size``, FLA's 64)."""
        if self._ref is None:
            call, do, dfs = self.data()
            names = [n for n in self.names() if n != "intermediate_states"]
            self._ref, self._env = self._float64(call, do, dfs, names)  # the envelopes: a golden's too
            if self.stored_reference is not None:
                stored = self.stored_reference()
                self._ref = {n: np.asarray(stored[n], np.float64) for n in names}
                self._exact_states = stored.get("intermediate_states")
        return self._with_states(self._ref, chunk_size, "reference")

    # --- the pipeline a case's call runs (overridden by a family case, ci/grading/families.py) ----------------

    def run_pipeline(self, call, dtype, do=None, dfs=None, *, core="recurrence", inner=None):
        """The call's results by name in working precision ``dtype`` (``oracle.modes.run_call``)."""
        if do is not None:
            do, dfs = call.check_cotangents(do, dfs)
        return modes.run_call(call, recurrence.Arith(dtype), do, dfs, core=core, inner=inner)

    def envelopes_of(self, call, inner):
        """The envelopes of the call's results from the float64 core view ``inner`` (:func:`envelopes`)."""
        return envelopes(call, inner)

    def core_call(self):
        """The GDN-2 :class:`oracle.call.Call` whose core the results come from (the case's call itself)."""
        return self.call

    # ----------------------------------------------------------------------------------------------------------

    def _float64(self, call, do, dfs, names):
        """``(results over names, envelopes)`` of the float64 pipeline (one cached entry: ``ref/N``, ``env/N``)."""
        def compute():
            inner = {}  # the float64 core view: the envelopes' terms
            results = self.run_pipeline(self._without_intermediate(), np.float64, do, dfs, inner=inner)
            return {**{f"ref/{n}": np.asarray(results[n], np.float64) for n in names},
                    **{f"env/{n}": a for n, a in self.envelopes_of(call, inner).items()}}

        both = self._cached({"value": "reference"}, compute)
        return ({n[4:]: a for n, a in both.items() if n.startswith("ref/")},
                {n[4:]: a for n, a in both.items() if n.startswith("env/")})

    def envelopes(self):
        """Envelopes by name (:func:`envelopes`)."""
        self.reference()
        return self._env

    def chunk_states(self, C):
        """``{"reference", "recurrence", "chunked32"}``: the states at the starts of C-token chunks by the float64
        pipeline and by the two float32 baselines (cached per C)."""
        if C not in self._chunks:
            call = dataclasses.replace(self.call, intermediate_chunk_size=int(C))
            run = self.run_pipeline
            self._chunks[C] = self._cached({"value": "chunk_states", "chunk_size": int(C)}, lambda: {
                "reference": run(call, np.float64)["intermediate_states"],
                "recurrence": run(call, np.float32)["intermediate_states"],
                "chunked32": run(call, np.float32, core="chunked32")["intermediate_states"]})
        return self._chunks[C]

    def _with_states(self, results, chunk_size, which, result_dtypes=None):
        C = self._chunk(chunk_size)
        if C is None:
            return results
        if which == "reference" and self._exact_states is not None and C == self.call.intermediate_chunk_size:
            return {**results, "intermediate_states": np.asarray(self._exact_states, np.float64)}
        states = self.chunk_states(C)[which]
        if result_dtypes is not None:
            states = round_to(states, result_dtypes.get("intermediate_states", "float32"))
        return {**results, "intermediate_states": states}

    def _baseline(self, cache, core, result_dtypes, chunk_size, states=True):
        names = self.names()
        key = tuple(result_dtypes.get(n, "float32") for n in names)
        if key not in cache:
            _, do, dfs = self.data()

            def compute():
                results = self.run_pipeline(self._without_intermediate(), np.float32, do, dfs, core=core)
                return rounded({n: np.asarray(results[n], np.float64) for n in names if n != "intermediate_states"},
                               result_dtypes)

            cache[key] = self._cached({"value": core, "result_dtypes": list(key)}, compute)
        return self._with_states(cache[key], chunk_size, core, result_dtypes) if states else cache[key]

    def baseline(self, result_dtypes, chunk_size=None):
        """The float32 pipeline (token-by-token core) on the same inputs, rounded to the result dtypes: e_rec."""
        return self._baseline(self._base, "recurrence", result_dtypes, chunk_size)

    def cum_baseline(self, result_dtypes, chunk_size=None):
        """The float32 pipeline with the cumulative-sum chunked core (``oracle.chunked32``), rounded: e_cum."""
        return self._baseline(self._cum, "chunked32", result_dtypes, chunk_size)

    def operand_baseline(self, result_dtypes, operands="bfloat16"):
        """:meth:`cum_baseline` with ``operands`` rounded (``chunked32.OPERANDS``; core ``chunked32_bf16`` or
        ``chunked32_bf16_solve``; no chunk-start states): what the diagnosis tells operand rounding by."""
        core = modes.OPERAND_CORES[operands]
        return self._baseline(self._ops.setdefault(core, {}), core, result_dtypes, None, states=False)

    def diagnosis_problem(self):
        """What the diagnosis reads: the log-decay the core saw (after the gate), the initial state, the packing."""
        call = self.core_call()
        return SimpleNamespace(g=preprocess.call_log_decay(call), initial_state=call.initial_state,
                               cu_seqlens=call.cu_seqlens)

    def judge(self, got, *, chunk_size=None, names=None) -> Report:
        """Grade a kernel's results ``got`` (a mapping over :meth:`names`, or over ``names``, a subset of them: a
        forward-only kernel's) against this case's reference; ``chunk_size``: the kernel's, where its states at chunk
        starts are taken (default the call's)."""
        names = self.names() if names is None else tuple(n for n in self.names() if n in names)
        result_dtypes = {n: dtype_name(got[n]) for n in names if n in got}
        return compare(names, got, self.yardstick(result_dtypes, chunk_size), self.diagnosis_problem())

    def agreement(self, a, b, *, what="agreement", names=None, chunk_size=None) -> Report:
        """Two results of this call that should agree (:func:`agreement`), over ``names`` (default all)."""
        names = tuple(names or self.names())
        result_dtypes = {n: dtype_name(a[n]) for n in names}
        return agreement(names, a, b, self.yardstick(result_dtypes, chunk_size), what)

    def yardstick(self, result_dtypes, chunk_size=None):
        """What a kernel's results in ``result_dtypes`` are judged against (``rule.Yardstick``): the reference, the
        float32 baseline, the cumulative-sum baseline (formed only when needed), the envelopes."""
        return Yardstick(self.reference(chunk_size), self.baseline(result_dtypes, chunk_size), self.dtype,
                         lambda: self.cum_baseline(result_dtypes, chunk_size), self.envelopes(), INHERITS,
                         operands=lambda ops: self.operand_baseline(result_dtypes, ops))

    def release(self):
        """Drop the cached arrays."""
        self._data = self._ref = self._env = self._exact_states = None
        self._base, self._cum, self._ops, self._chunks = {}, {}, {}, {}

    def describe(self):
        """The case's identity in a report."""
        return {"case": self.name, "source": self.source, "dtype": self.dtype, "shape": list(self.shape),
                "modes": list(self.modes), **({"regime": self.regime} if self.regime else {})}


# The case sets that hold the mode goldens (as the dense goldens, every set but ``quick``'s two cheap calls).
GOLDEN_SETS = ("golden", "full")


def cases(kind="quick", dtypes=DTYPES, *, seed=0, modes_selected=MODES, case_type=None):
    """The mode cases of a case set (``quick``: :data:`oracle.mode_recipes.QUICK`; ``full``: every recipe and the
    mode goldens; ``golden``: the mode goldens, ``golden/mode_catalogue.py``), restricted to ``dtypes`` and to
    recipes whose modes are all in ``modes_selected``. ``seed`` shifts the generated recipes, not the goldens.
    ``case_type``: the :class:`ModeCase` subclass built (the running floor's, which runs kernels)."""
    case_type = case_type or ModeCase
    out = []

    def wanted(r):
        return r.precision in dtypes and set(r.modes) <= set(modes_selected)

    for name in mode_recipes.names(kind) if kind != "golden" else ():
        if wanted(mode_recipes.get(name)):
            out.append(case_type.named(name, seed=seed))
    if kind in GOLDEN_SETS:
        from gdn2_oracle import golden  # the corpus is read only when a set has it

        out += [case_type.golden(n) for n in golden.mode_names() if wanted(golden.mode_catalogue.get(n).recipe)]
    return out
