"""The judge of FLA family kernels: KDA and Gated DeltaNet in FLA's signature (docs/DESIGN.md §1, "Families"; §2,
"Families in FLA"; §4).

A :class:`FamilyCase` is one dense family call (:class:`oracle.families.FamilyCall`, built from an
:class:`oracle.family_recipes.FamilyRecipe`) with its cotangents, judged like the dense GDN-2 call on the family's
own results ``o, final_state, dq, dk, dv, dg, dbeta, dh0`` (:data:`FAMILY_RESULTS`):

* reference: ``oracle.families.forward_and_vjp`` in float64;
* ``e_rec``: the same in float32 (the activations, the recurrence, the projection and the activations' adjoints in
  float32) on the values the kernel saw, each result rounded to the dtype the kernel returned it in;
* ``e_cum`` (precision-loss bound): the float32 cumulative-sum chunked algorithm (``oracle/chunked32.py``) on the
  float32 GDN-2 problem, projected back in float32, rounded likewise;
* envelopes: ``dg`` on ``E = |q^ dq^| + |k^ dk^| + |b db|`` (DESIGN §4, "The dg envelope") from the float64
  GDN-2 view, per value head (``q^, k^`` repeated to the value heads, ``dq^, dk^`` before the sum over each group);
  Gated DeltaNet's scalar ``dg`` is the sum over K of GDN-2's, so its envelope is ``sum_K E``;
* grades: ``rule.judge_results`` through ``ci.grading.modes.compare`` (the grading rule, nothing new).

NumPy and the oracle only (docs/DESIGN.md §3): the kernel is run by ``ci/running/families.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from gdn2_oracle.oracle import chunked32, families, family_recipes, recurrence
from gdn2_oracle.oracle.family_recipes import FamilyRecipe
from gdn2_oracle.oracle.generate import KERNEL_DTYPES as DTYPES
from gdn2_oracle.oracle.problem import Grads, sum_groups

from .case import CachedCase
from .modes import compare
from .rule import Yardstick
from .tolerance import Report, dtype_name, rounded

# The results a family kernel is judged on, in report order (the gradients are w.r.t. q, k, v, g, beta, h0).
FAMILY_RESULTS = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0")
# The family a kernel in the plain contract (q, k, v, g, b, w) is.
GDN2 = families.GDN2.name


def named(outputs, fgrads: families.FamilyGrads):
    """``((o, final_state), FamilyGrads)`` as float64 arrays by name over :data:`FAMILY_RESULTS`."""
    both = {"o": outputs[0], "final_state": outputs[1], **fgrads._asdict()}
    return {n: np.asarray(both[n], np.float64) for n in FAMILY_RESULTS}


def reference_and_envelopes(fcall: families.FamilyCall, do, dfs):
    """``(results, envelopes)``: the float64 reference by name (bit for bit ``families.forward_and_vjp(...,
    float64)``'s) and the ``dg`` envelope, from one float64 run of the GDN-2 problem per value head."""
    problem = fcall.to_gdn2(np.float64)
    G = problem.group_size
    per_head = problem.per_value_head()
    outputs, grads = recurrence.forward_and_vjp(per_head, do, dfs, np.float64)
    E = np.abs(per_head.q * grads.dq) + np.abs(per_head.k * grads.dk) + np.abs(per_head.b * grads.db)
    grads = Grads(*grads)._replace(dq=sum_groups(grads.dq, G), dk=sum_groups(grads.dk, G))
    env = E if fcall.family is families.KDA else np.sum(E, axis=-1)
    return named(outputs, fcall.project(grads, np.float64)), {"dg": env}


def baseline(fcall, do, dfs, result_dtypes=None):
    """The family call in float32 (``families.forward_and_vjp``), rounded to the result dtypes: ``e_rec``'s source."""
    return rounded(named(*families.forward_and_vjp(fcall, do, dfs, np.float32)), result_dtypes)


def cumulative_baseline(fcall, do, dfs, result_dtypes=None):
    """The float32 chunked algorithm with cumulative-sum exponents (``oracle.chunked32``) on the float32 GDN-2
    problem, projected in float32 and rounded to the result dtypes: ``e_cum``'s source."""
    outputs, grads = chunked32.forward_and_vjp(fcall.to_gdn2(np.float32), do, dfs)
    return rounded(named(outputs, fcall.project(grads, np.float32)), result_dtypes)


@dataclass(eq=False)
class FamilyCase(CachedCase):
    """One family call in one input dtype; ``build()`` returns ``(fcall, do, dfinal_state)``. Reference, baselines
    and envelopes are computed lazily, once per case (baselines per result dtypes), shared by every kernel judged on
    it, and cached on disk by the recipe (``key``)."""

    name: str
    source: str
    dtype: str
    shape: tuple
    build: Callable
    family: str
    flags: tuple = ()  # FLA's keywords the call sets (True): a kernel must accept them
    regime: dict = field(default_factory=dict)
    seconds: float = 0.0
    key: dict | None = None
    _data: tuple | None = None
    _ref: dict | None = None
    _env: dict | None = None
    _base: dict = field(default_factory=dict)
    _cum: dict = field(default_factory=dict)

    @classmethod
    def from_recipe(cls, name, recipe: FamilyRecipe):
        """The case of a :class:`oracle.family_recipes.FamilyRecipe`, in the recipe's precision."""
        case = cls(name, "generated", recipe.precision, recipe.shape, recipe.build, recipe.family,
                   tuple(recipe.flags()), recipe.regime(), key={"family_recipe": recipe.fields()})
        case.recipe = recipe
        return case

    @classmethod
    def named(cls, name, *, precision="float32", seed=0):
        """The catalogued recipe ``name`` (``oracle.family_recipes``) in ``precision``, its seed shifted by ``seed``
        (a ``_bf16`` suffix for bfloat16)."""
        r = family_recipes.get(name)
        r = r.replace(precision=precision, seed=r.seed + seed)
        return cls.from_recipe(name if precision == "float32" else f"{name}_bf16", r)

    def data(self):
        """``(fcall, do, dfinal_state)``."""
        if self._data is None:
            self._data = self.build()
        return self._data

    def names(self):
        return FAMILY_RESULTS

    def reference(self):
        """The float64 results by name (:data:`FAMILY_RESULTS`)."""
        if self._ref is None:
            fcall, do, dfs = self.data()

            def compute():
                ref, env = reference_and_envelopes(fcall, do, dfs)
                return {**{f"ref/{n}": a for n, a in ref.items()}, **{f"env/{n}": a for n, a in env.items()}}

            both = self._cached({"value": "reference"}, compute)
            self._ref = {n[4:]: a for n, a in both.items() if n.startswith("ref/")}
            self._env = {n[4:]: a for n, a in both.items() if n.startswith("env/")}
        return self._ref

    def envelopes(self):
        self.reference()
        return self._env

    def _baseline(self, cache, which, fn, result_dtypes):
        key = tuple(result_dtypes.get(n, "float32") for n in FAMILY_RESULTS)
        if key not in cache:
            data = self.data()
            cache[key] = self._cached({"value": which, "result_dtypes": list(key)},
                                      lambda: fn(*data, result_dtypes))
        return cache[key]

    def baseline(self, result_dtypes):
        """The float32 family call, rounded to the result dtypes: e_rec."""
        return self._baseline(self._base, "baseline", baseline, result_dtypes)

    def cum_baseline(self, result_dtypes):
        """The float32 cumulative-sum chunked algorithm, projected and rounded: e_cum."""
        return self._baseline(self._cum, "cumulative_baseline", cumulative_baseline, result_dtypes)

    def yardstick(self, result_dtypes):
        """What results in ``result_dtypes`` are judged against (``rule.Yardstick``)."""
        return Yardstick(self.reference(), self.baseline(result_dtypes), self.dtype,
                         lambda: self.cum_baseline(result_dtypes), self.envelopes())

    def diagnosis_problem(self):
        """What the diagnosis reads: the GDN-2 log-decay ``[B, T, HV, K]`` and the initial state."""
        fcall = self.data()[0]
        g = fcall.log_decay()
        if fcall.family is families.GDN:
            g = np.broadcast_to(g[..., None], g.shape + (fcall.shape[4],))
        return SimpleNamespace(g=g, initial_state=fcall.initial_state)

    def judge(self, got) -> Report:
        """Grade a kernel's results ``got`` (a mapping over :data:`FAMILY_RESULTS`) against this case's reference."""
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} not one of {DTYPES}")
        result_dtypes = {n: dtype_name(got[n]) for n in FAMILY_RESULTS if n in got}
        return compare(FAMILY_RESULTS, got, self.yardstick(result_dtypes), self.diagnosis_problem())

    def release(self):
        """Drop the cached arrays."""
        self._data = self._ref = self._env = None
        self._base, self._cum = {}, {}

    def describe(self):
        """The case's identity in a report: a dense case's keys and the family."""
        return {"case": self.name, "source": self.source, "dtype": self.dtype, "shape": list(self.shape),
                "family": self.family, **({"regime": self.regime} if self.regime else {})}


def cases(kind="quick", dtypes=DTYPES, *, seed=0, families_selected=families.MAPPED, case_type=None):
    """The family cases of a case set (``oracle.family_recipes.names(kind)``) in each of ``dtypes``, for the families
    in ``families_selected``; ``case_type``: the :class:`FamilyCase` subclass built (the running floor's)."""
    case_type = case_type or FamilyCase
    return [case_type.named(n, precision=d, seed=seed) for d in dtypes for n in family_recipes.names(kind)
            if family_recipes.get(n).family in families_selected]
