"""A case: one problem judged in one input dtype, with its exact reference and baselines computed once.

Every consumer of a judgement -- ``validate``, ``bench``, ``domain``, ``hunt`` and the conformance suite --
builds a :class:`Case` and calls :meth:`Case.judge` on a kernel's results; the reference (float64 oracle,
or a golden's mpmath results) and the working-precision baselines of docs/DESIGN.md §4 are computed lazily,
once per case (per result dtypes), and shared by every kernel judged on it. A case built from a recipe or a golden
file has a ``key`` and reads them from the reference cache (``reference_cache``) when an earlier run stored them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gdn2_oracle.oracle import RESULTS, Recipe

from . import reference_cache, references
from .tolerance import Report, baseline, compare, cumulative_baseline, dtype_name


class CachedCase:
    """What every case kind shares (dense :class:`Case`, training-call ``modes.ModeCase``, serving
    ``serving.Session``): its identity (``name``, ``dtype``, ``shape``, ``modes``: the call modes it uses, none for
    the dense contract), ``describe()`` and ``release()``, and the seconds spent on its oracle side, every value
    computed once and, for a case with a ``key``, through the reference cache. A kernel is run on a case by the
    running floor (``ci/running/cases.py``: ``case.run(kernel, mesh) -> CaseResult``)."""

    modes: tuple = ()
    seconds: float = 0.0
    key: dict | None = None

    def _timed(self, fn, *args, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            self.seconds += time.perf_counter() - t0

    def _cached(self, what, compute):
        """``compute()`` (named arrays) for this case's value ``what``, timed; through the reference cache when
        the case has a key (call after the data are built: a golden's key is its file's)."""
        if self.key is None:
            return self._timed(compute)
        return self._timed(reference_cache.cached, {**self.key, **what}, compute)


@dataclass(eq=False)
class Case(CachedCase):
    """One problem in one dtype. ``build()`` returns ``((problem, do, dfinal_state), reference or None)``;
    ``reference_fn(problem, do, dfinal_state)`` computes the float64 oracle's reference when the build gives none
    (in whatever processes, bit for bit ``references.reference_results``). ``key`` (a JSON-ready dict; None: not
    cached) names what determines the data exactly -- the recipe, the golden file's sha256 -- and is known once the
    data are built: the reference and baselines are then cached by it (``reference_cache``)."""

    name: str
    source: str  # "golden" | "generated"
    dtype: str
    shape: tuple
    build: Callable
    regime: dict = field(default_factory=dict)
    reference_fn: Callable = references.reference_results
    seconds: float = 0.0  # spent on the reference and baselines
    key: dict | None = None
    _data: tuple | None = None
    _ref: dict | None = None
    _base: dict = field(default_factory=dict)
    _cum: dict = field(default_factory=dict)

    @classmethod
    def of(cls, problem, do, dfinal_state, *, dtype="float32", ref=None, name="case"):
        """A case over given arrays (and, optionally, a given reference)."""
        return cls(name, "given", dtype, problem.shape, lambda: ((problem, do, dfinal_state), ref))

    @classmethod
    def from_recipe(cls, name, recipe: Recipe, *, reference_fn=references.reference_results, regime=None):
        """A generated problem from ``recipe``, in the recipe's precision (reference: the float64 oracle)."""
        regime = regime if regime is not None else {"decay": recipe.decay, "gates": recipe.gates,
                                                    "initial_state": recipe.initial_state, "seed": recipe.seed}
        return cls(name, "generated", recipe.precision, recipe.shape, lambda: (recipe.build(), None), regime,
                   reference_fn, key={"dense_recipe": dataclasses.asdict(recipe)})

    @classmethod
    def golden(cls, name):
        """The golden case ``name`` (loaded and hash-checked when first used), in its own precision."""
        from gdn2_oracle import golden  # the corpus is read only by cases that use it

        def build():
            g = golden.load(name)
            case.key = {"golden_sha256": g.entry["sha256"]}  # the file's bytes, checked by load
            return (g.problem(), *g.cotangents()), g.reference()

        c = golden.catalogue.get(name)
        r = c.recipe
        regime = {"decay": r.decay, "gates": r.gates, "qk": r.qk, "initial_state": r.initial_state,
                  "reduction": r.reduction, "purpose": c.purpose}
        case = cls(name, "golden", r.precision, r.shape, build, regime)
        return case

    def data(self):
        """``(problem, do, dfinal_state)``."""
        if self._data is None:
            self._data, self._ref = self.build()
        return self._data

    def reference(self):
        """The exact results by name (RESULTS)."""
        if self._ref is None:
            data = self.data()
            if self._ref is None:
                self._ref = self._cached({"value": "reference"}, lambda: self.reference_fn(*data))
        return self._ref

    def baseline(self, result_dtypes):
        """The float32 recurrence baseline (``tolerance.baseline``) for these result dtypes, cached."""
        key = tuple(result_dtypes[n] for n in RESULTS)
        if key not in self._base:
            data = self.data()
            self._base[key] = self._cached({"value": "baseline", "result_dtypes": list(key)},
                                           lambda: baseline(*data, result_dtypes))
        return self._base[key]

    def cum_baseline(self, result_dtypes):
        """The cumulative-sum-exponent chunked baseline (``tolerance.cumulative_baseline``), cached."""
        key = tuple(result_dtypes[n] for n in RESULTS)
        if key not in self._cum:
            data = self.data()
            self._cum[key] = self._cached({"value": "cumulative_baseline", "result_dtypes": list(key)},
                                          lambda: cumulative_baseline(*data, result_dtypes))
        return self._cum[key]

    def judge(self, got) -> Report:
        """Grade a kernel's results ``got`` (a mapping over RESULTS) against this case's reference."""
        result_dtypes = {n: dtype_name(got[n]) for n in RESULTS}
        return compare(*self.data(), got, self.reference(), dtype=self.dtype, base=self.baseline(result_dtypes),
                       cum=lambda: self.cum_baseline(result_dtypes))

    def release(self):
        """Drop the cached arrays (kept small when many cases run)."""
        self._data = self._ref = None
        self._base, self._cum = {}, {}

    def describe(self):
        """The case's identity in a report."""
        return {"case": self.name, "source": self.source, "dtype": self.dtype, "shape": list(self.shape),
                **({"regime": self.regime} if self.regime else {})}
