"""Deterministic recipes of FLA family calls: KDA and Gated DeltaNet in their own parametrisation (docs/DESIGN.md §1,
"Families"; ``oracle/families.py``).

A :class:`FamilyRecipe` is data -- the family, the dimensions with grouped value heads, the decay and beta regimes,
FLA's beta and q/k flags, seeds, the kernel's input precision -- and :meth:`FamilyRecipe.build` rebuilds the same
:class:`oracle.families.FamilyCall` and cotangents from it bit for bit. :data:`QUICK` is the family set of the judge's
``quick`` cases (``ci/grading/families.py``; ``gdn2-oracle validate``), each recipe in both families.

Inputs: ``q, k, v`` and the log-decay are ``oracle.make_problem``'s (its decay regimes, on ``[B, T, HV, K]`` for
``kda``; for ``gdn`` one channel of it, so one log-decay per head: under ``mixed`` each head is one of no decay
(long memory), moderate or extreme decay; under ``resets`` a head is hard-reset at ~3% of the tokens), then
``beta: [B, T, HV]`` from its own seeded stream (``SeedSequence([seed, tag])``):

* ``uniform``: ``U[0, 1]``; ``small``: ``U[0, 0.02]`` (near 0: almost no erase or write); ``near_one``:
  ``U[0.97, 1]`` (a full delta-rule step); ``near_two``: ``U[1.9, 2]`` (the erase factor ``1 - beta |k|^2`` near
  -1 for unit keys, as FLA's negative eigenvalues reach; no flag needed: FLA takes any beta);
* ``logits``: ``N(0, 2)`` logits with ``use_beta_sigmoid_in_kernel``; ``logits_high``: ``U[2, 6]`` (with
  ``allow_neg_eigval``: beta = 2 sigmoid near 2).

Cotangents as for the dense recipes (``random_cotangents``); the initial state ``N(0, 1)`` float32.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

import numpy as np

from . import families
from .generate import DECAYS, KERNEL_DTYPES, QK_MODES, make_problem, random_cotangents, round_to

BETAS = ("uniform", "small", "near_one", "near_two", "logits", "logits_high")
# Beta regimes that are logits (the call sets use_beta_sigmoid_in_kernel).
LOGIT_BETAS = ("logits", "logits_high")
_TAGS = {"beta": 11}


def _check_int(name, n, lo):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {n!r}")
    return int(n)


@dataclass(frozen=True)
class FamilyRecipe:
    """One reproducible dense call of family ``family`` (``kda`` or ``gdn``).

    ``H`` key heads, ``HV`` value heads (a multiple of ``H``: value head ``hv`` reads key head ``hv // (HV // H)``).
    ``beta``: one of :data:`BETAS` (the logit regimes set ``use_beta_sigmoid_in_kernel``); ``neg_eigval``:
    ``allow_neg_eigval`` (needs a logit regime); ``qk_l2norm``: raw q/k rows (norms ``~10^U[-1, 1]``) normalised in
    the kernel (``use_qk_l2norm_in_kernel``). ``precision``: the kernel's input dtype.
    """

    family: str
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    decay: str = "moderate"
    beta: str = "uniform"
    neg_eigval: bool = False
    qk_l2norm: bool = False
    qk: str = "l2"
    initial_state: bool = False
    seed: int = 0
    precision: str = "float32"

    def __post_init__(self):
        families.get(self.family)
        if self.family not in families.MAPPED:
            raise ValueError(f"family: {self.family!r} not one of {families.MAPPED}")
        for name, lo in dict(B=1, T=1, H=1, HV=1, K=1, V=1, seed=0).items():
            _check_int(name, getattr(self, name), lo)
        if self.HV % self.H:
            raise ValueError(f"HV: {self.HV} value heads are not a multiple of the H = {self.H} key heads")
        for name, value, choices in (("decay", self.decay, DECAYS), ("beta", self.beta, BETAS),
                                     ("qk", self.qk, QK_MODES), ("precision", self.precision, KERNEL_DTYPES)):
            if value not in choices:
                raise ValueError(f"{name}: {value!r} not one of {tuple(choices)}")
        if self.neg_eigval and self.beta not in LOGIT_BETAS:
            raise ValueError(f"neg_eigval: needs beta logits ({LOGIT_BETAS}), got beta={self.beta!r}")

    @property
    def shape(self):
        """``(B, T, H, HV, K, V)``."""
        return self.B, self.T, self.H, self.HV, self.K, self.V

    def flags(self):
        """FLA's keywords this call sets (only those that are True)."""
        out = {"use_qk_l2norm_in_kernel": self.qk_l2norm, "use_beta_sigmoid_in_kernel": self.beta in LOGIT_BETAS,
               "allow_neg_eigval": self.neg_eigval}
        return {k: v for k, v in out.items() if v}

    def fields(self):
        """The recipe as a JSON-ready dict (every field)."""
        return dataclasses.asdict(self)

    def regime(self):
        """The recipe's regime as a report describes it."""
        return {"family": self.family, "HV": self.HV, "decay": self.decay, "beta": self.beta,
                "initial_state": self.initial_state, "seed": self.seed, "flags": sorted(self.flags())}

    def replace(self, **changes):
        """A new validated recipe with some fields replaced."""
        return dataclasses.replace(self, **changes)

    def call_source(self):
        """The recipe as Python source (``from gdn2_oracle.oracle.family_recipes import FamilyRecipe``)."""
        return "FamilyRecipe(" + ", ".join(f"{k}={v!r}" for k, v in self.fields().items()) + ")"

    def _rng(self, what):
        return np.random.default_rng(np.random.SeedSequence([self.seed, _TAGS[what]]))

    def _beta(self):
        rng, shape = self._rng("beta"), (self.B, self.T, self.HV)
        draw = {"uniform": lambda: rng.uniform(0.0, 1.0, shape), "small": lambda: rng.uniform(0.0, 0.02, shape),
                "near_one": lambda: rng.uniform(0.97, 1.0, shape), "near_two": lambda: rng.uniform(1.9, 2.0, shape),
                "logits": lambda: 2.0 * rng.standard_normal(shape),
                "logits_high": lambda: rng.uniform(2.0, 6.0, shape)}[self.beta]
        return round_to(draw(), self.precision)

    def build(self):
        """``(call, do, dfinal_state)``: the exact family call (``oracle.families.call``) and its cotangents."""
        B, T, H, HV, K, V = self.shape
        base = make_problem(B, T, H, K, V, HV=HV, decay=self.decay, gates="uniform",
                            qk="raw" if self.qk_l2norm else self.qk, initial_state=self.initial_state,
                            precision=self.precision, seed=self.seed)
        q, k = base.q, base.k
        if self.qk_l2norm:  # rows of norm 10^U[-1, 1]: the in-kernel norm changes them
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, 12]))
            q, k = (round_to(x * 10.0 ** rng.uniform(-1, 1, x.shape[:-1] + (1,)), self.precision) for x in (q, k))
        g = base.g if self.family == "kda" else base.g[..., 0]
        fcall = families.call(self.family, q, k, base.v, g, self._beta(), initial_state=base.initial_state,
                              **self.flags())
        do, dfs = random_cotangents(base, self.seed, self.precision)
        return fcall, do, dfs


# The quick set, per family (docs/DESIGN.md §4): grouped value heads with G = 2 and 4 on H = 2 key heads; a long
# memory (weak decay, and under mixed some heads without decay), hard resets; beta near 0, 1 and 2, as logits through
# the sigmoid and with negative eigenvalues; the in-kernel q/k norm.
_QUICK = (
    # name, (B, T, H, HV, K, V), decay, beta, extra fields
    ("gva2_moderate_h0", (2, 100, 2, 4, 16, 32), "moderate", "uniform", {"initial_state": True}),
    ("gva4_weak_beta_one", (1, 130, 2, 8, 16, 16), "weak", "near_one", {"initial_state": True}),
    ("gva2_resets_beta_small", (2, 100, 2, 4, 16, 32), "resets", "small", {}),
    ("gva2_mixed_logits", (2, 100, 2, 4, 16, 32), "mixed", "logits", {"initial_state": True}),
    ("gva4_strong_neg_eigval", (1, 130, 2, 8, 16, 16), "strong", "logits_high", {"neg_eigval": True}),
    ("gva4_moderate_beta_two", (1, 130, 2, 8, 16, 16), "moderate", "near_two", {}),
    ("gva2_l2norm_h0", (2, 100, 2, 4, 16, 32), "moderate", "uniform", {"qk_l2norm": True, "initial_state": True}),
)
QUICK = {f"{fam}_{name}": FamilyRecipe(fam, *shape, decay=decay, beta=beta, seed=500 + 10 * j + i, **extra)
         for i, fam in enumerate(families.MAPPED) for j, (name, shape, decay, beta, extra) in enumerate(_QUICK)}


def names(kind="quick"):
    """The recipes' names of a case set (``quick`` and ``full``: :data:`QUICK`; ``golden``: none)."""
    return list(QUICK) if kind in ("quick", "full") else []


def get(name) -> FamilyRecipe:
    """The catalogued recipe ``name`` (ValueError naming an unknown one)."""
    if name not in QUICK:
        raise ValueError(f"name: {name!r} not one of {list(QUICK)}")
    return QUICK[name]
