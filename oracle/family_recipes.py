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

from . import call_modes, families, mode_recipes
from .generate import DECAYS, KERNEL_DTYPES, QK_MODES, make_problem, random_cotangents, round_to

BETAS = ("uniform", "small", "near_one", "near_two", "logits", "logits_high")
# Beta regimes that are logits (the call sets use_beta_sigmoid_in_kernel).
LOGIT_BETAS = ("logits", "logits_high")
C = call_modes.FLA_CHUNK
_TAGS = {"beta": 11, "gate": 13, "params": 14, "h0": 15, "cot": 16}


def _check_int(name, n, lo):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {n!r}")
    return int(n)


@dataclass(frozen=True)
class FamilyRecipe:
    """One reproducible dense call of family ``family`` (``kda`` or ``gdn``).

    ``H`` key heads, ``HV`` value heads (a multiple of ``H``: value head ``hv`` reads key head ``hv // (HV // H)``).
    ``beta``: one of :data:`BETAS` (the logit regimes set ``use_beta_sigmoid_in_kernel``); ``neg_eigval``:
    ``allow_neg_eigval`` (needs a logit regime); ``scale``: FLA's ``scale`` (None: ``K**-0.5``); ``qk_l2norm``: raw
    q/k rows (norms ``~10^U[-1, 1]``) normalised in the kernel (``use_qk_l2norm_in_kernel``). ``precision``: the
    kernel's input dtype. ``mode``: the name of a training-call recipe (``oracle.mode_recipes``) whose structure the
    call takes -- its lengths and packing, its in-kernel gate form (which parameters, ``lower_bound``), q/k norm,
    state layout, chunk states and initial state -- in this family's parametrisation with these heads and dimensions
    (B and T are the mode recipe's); the family must take every keyword of its modes (FLA's GDN has no
    ``lower_bound`` and no chunk states).
    ``lengths``: with ``mode``, the sequences' token counts in place of the mode recipe's (e.g. whole chunks).
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
    mode: str | None = None
    scale: float | None = None
    lengths: tuple | None = None

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
        if self.scale is not None and (isinstance(self.scale, bool) or not isinstance(self.scale, numbers.Real)
                                       or not np.isfinite(self.scale) or self.scale <= 0):
            raise ValueError(f"scale: expected a finite number > 0 or None, got {self.scale!r}")
        if self.lengths is not None:
            if self.mode is None:
                raise ValueError("lengths: only with a mode (the mode recipe's lengths replaced)")
            object.__setattr__(self, "lengths", tuple(_check_int("lengths", n, 0) for n in self.lengths))
        if self.neg_eigval and self.beta not in LOGIT_BETAS:
            raise ValueError(f"neg_eigval: needs beta logits ({LOGIT_BETAS}), got beta={self.beta!r}")
        if self.mode is not None:
            structure = self.structure()
            fam = families.get(self.family)
            missing = [k for m in structure.modes for k in call_modes.get(m).keywords
                       if k not in fam.flags + tuple(n for n, _ in fam.params) and k != "lower_bound"]
            if structure.lower_bound is not None and dict(fam.refused).get("lower_bound"):
                missing.append("lower_bound")
            if missing:
                raise ValueError(f"mode: {self.mode!r} needs {sorted(set(missing))}, not keywords of the "
                                 f"{self.family} family")
            if (self.B, self.T) != structure.shape[:2]:
                raise ValueError(f"B: (B, T) = {(self.B, self.T)} is not the mode recipe's {structure.shape[:2]}")

    @property
    def shape(self):
        """``(B, T, H, HV, K, V)``."""
        return self.B, self.T, self.H, self.HV, self.K, self.V

    @classmethod
    def in_mode(cls, family, mode, H, HV, K, V, **fields):
        """The recipe of ``family`` in the structure of mode recipe ``mode`` (B and T taken from it)."""
        r = mode_recipes.get(mode)
        if fields.get("lengths") is not None:
            r = r.replace(lengths=tuple(fields["lengths"]))
        B, T = r.shape[:2]
        return cls(family, B, T, H, HV, K, V, mode=mode, **fields)

    def structure(self):
        """The mode recipe this call takes its structure from, with this recipe's heads, dimensions, precision and
        seed (ValueError naming ``mode`` for an unknown one); None for a dense call."""
        if self.mode is None:
            return None
        try:
            r = mode_recipes.get(self.mode)
        except ValueError:
            raise ValueError(f"mode: {self.mode!r} is not a recipe of oracle.mode_recipes") from None
        lengths = {} if self.lengths is None else {"lengths": self.lengths}
        return r.replace(H=self.H, K=self.K, V=self.V, precision=self.precision, seed=self.seed, **lengths)

    @property
    def modes(self):
        """The call modes this call uses (the mode recipe's; empty for a dense call)."""
        return () if self.mode is None else self.structure().modes

    def flags(self):
        """FLA's keywords this call sets (only those that are True)."""
        l2 = self.qk_l2norm or (self.mode is not None and self.structure().qk_l2norm)
        out = {"use_qk_l2norm_in_kernel": l2, "use_beta_sigmoid_in_kernel": self.beta in LOGIT_BETAS,
               "allow_neg_eigval": self.neg_eigval}
        return {k: v for k, v in out.items() if v}

    def fields(self):
        """The recipe as a JSON-ready dict (every field)."""
        return dataclasses.asdict(self)

    def regime(self):
        """The recipe's regime as a report describes it."""
        out = {"family": self.family, "HV": self.HV, "decay": self.decay, "beta": self.beta,
               "initial_state": self.initial_state, "seed": self.seed, "flags": sorted(self.flags())}
        if self.mode is not None:
            r = self.structure()
            out.update(mode=self.mode, modes=list(r.modes), lengths=list(r.lengths), packed=r.packed, gate=r.gate,
                       lower_bound=r.lower_bound, initial_state=r.initial_state or self.initial_state)
        return out

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
        if self.mode is not None:
            return self._build_in_mode()
        B, T, H, HV, K, V = self.shape
        base = make_problem(B, T, H, K, V, HV=HV, decay=self.decay, gates="uniform",
                            qk="raw" if self.qk_l2norm else self.qk, initial_state=self.initial_state,
                            precision=self.precision, seed=self.seed)
        q, k = base.q, base.k
        if self.qk_l2norm:  # rows of norm 10^U[-1, 1]: the in-kernel norm changes them
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, 12]))
            q, k = (round_to(x * 10.0 ** rng.uniform(-1, 1, x.shape[:-1] + (1,)), self.precision) for x in (q, k))
        g = base.g if self.family == "kda" else base.g[..., 0]
        fcall = families.call(self.family, q, k, base.v, g, self._beta(), scale=self.scale,
                              initial_state=base.initial_state, **self.flags())
        do, dfs = random_cotangents(base, self.seed, self.precision)
        return fcall, do, dfs

    def _build_in_mode(self):
        """:meth:`build` in the structure of :meth:`structure`: inputs as for a dense call, then the mode recipe's
        q/k rows (norm), a raw gate ``N(0, 1)`` with ``A_log = log U[1, 16]`` and ``dt_bias ~ N(0, 1)`` (float32, the
        family's shapes), its packing, state layout and chunk states; initial state and cotangents ``N(0, 1)``."""
        B, T, H, HV, K, V = self.shape
        r = self.structure()
        base = make_problem(B, T, H, K, V, HV=HV, decay=self.decay, gates="uniform", qk=self.qk,
                            precision=self.precision, seed=self.seed)
        q, k = r.qk_raw((B, T, H, K)) if r.qk_l2norm else (base.q, base.k)
        g = base.g if self.family == "kda" else base.g[..., 0]
        kw = {}
        if r.gate is not None:
            g = round_to(self._rng("gate").standard_normal(g.shape), self.precision)
            shapes = families.get(self.family).shapes(B, T, H, HV, K, V)
            rng = self._rng("params")
            A_log = round_to(np.log(rng.uniform(1.0, 16.0, shapes["A_log"])), "float32")
            dt_bias = round_to(rng.standard_normal(shapes["dt_bias"]), "float32")
            kw = dict(use_gate_in_kernel=True, A_log=A_log if r.A_log else None,
                      dt_bias=dt_bias if r.dt_bias else None, lower_bound=r.lower_bound)
        structure = {n: x for n, x in r.call_structure().items() if x is not None and x is not False}
        args = (self.family, q, k, base.v, g, self._beta())
        fcall = families.call(*args, scale=self.scale, **kw, **structure, **self.flags())
        if r.initial_state or self.initial_state:
            h0 = round_to(self._rng("h0").standard_normal(fcall.state_shape), "float32")
            fcall = families.call(*args, scale=self.scale, initial_state=h0, **kw, **structure, **self.flags())
        rng = self._rng("cot")
        do = round_to(rng.standard_normal((B, T, HV, V)), self.precision)
        return fcall, do, round_to(rng.standard_normal(fcall.state_shape), "float32")


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
    # the regimes of GDN-2's smoke (negative gates, extreme decay from an initial state) on the shapes above, no flag:
    # values only, so they share the plain calls' programs
    ("gva2_strong_beta_two", (2, 100, 2, 4, 16, 32), "strong", "near_two", {}),
    ("gva4_extreme_h0", (1, 130, 2, 8, 16, 16), "extreme", "uniform", {"initial_state": True}),
)
QUICK = {f"{fam}_{name}": FamilyRecipe(fam, *shape, decay=decay, beta=beta, seed=500 + 10 * j + i, **extra)
         for i, fam in enumerate(families.MAPPED) for j, (name, shape, decay, beta, extra) in enumerate(_QUICK)}


def _in_mode(family, mode, j, **fields):
    """The family recipe in mode recipe ``mode``'s structure (H = 2 key heads, G = 2 or 4 alternating, the mode
    recipe's K, V and precision; beta logits on every other one), or None where the family lacks a keyword of it."""
    r = mode_recipes.get(mode)
    beta = "logits" if j % 2 else "uniform"
    fields = {"precision": r.precision, **fields}
    try:
        return FamilyRecipe.in_mode(family, mode, 2, 4 if j % 2 == 0 else 8, r.K, r.V, beta=beta, seed=700 + j,
                                    decay=r.decay, **fields)
    except ValueError:
        return None


def at_whole_chunks(r):
    """Whether mode recipe ``r``'s cases are also made at whole chunks: packed sequences, the in-kernel gate, the q/k
    norm. Their lengths are not multiples of the chunk (100 = C + 36 tokens a row, packed calls of 196 or more), so a
    twin at whole chunks -- 2 C = 128 tokens a row, or two packed sequences of C -- separates a tail bug (a gate
    applied after padding T up to a chunk multiple decays the final state) from the rest."""
    return r.packed or r.gate is not None or r.qk_l2norm


def whole_chunk_lengths(r):
    """Mode recipe ``r``'s lengths at whole chunks: packed, two sequences of C; else each row 2 C tokens."""
    return (C, C) if r.packed else (2 * C,) * len(r.lengths)


def _twins(family, mode, j):
    """``{suffix: recipe}``: the family recipe in mode recipe ``mode``'s structure (suffix ``""``), in bfloat16 too
    (``_bf16``) when the mode recipe is float32, and at whole chunks (``_T128``, both dtypes) where
    :func:`at_whole_chunks`; empty where the family lacks a keyword of it."""
    base = _in_mode(family, mode, j)
    if base is None:
        return {}
    out = {"": base}
    r = mode_recipes.get(mode)
    if at_whole_chunks(r):
        out["_T128"] = _in_mode(family, mode, j, lengths=whole_chunk_lengths(r))
    if base.precision == "float32":
        out.update({f"{suffix}_bf16": x.replace(precision="bfloat16") for suffix, x in list(out.items())})
    return out


def _mode_sets():
    """``(quick, full)``: per family, for every call mode it takes (and every form of its in-kernel gate), the first
    float32 mode recipe using that mode alone (quick), and every mode recipe it takes (full), named
    ``<family>_<mode recipe>``; each in bfloat16 too (``_bf16``), the gate, norm and packed ones at whole chunks too
    (``_T128``: :func:`_twins`)."""
    quick, full = {}, {}
    catalogue = mode_recipes.names("full")
    for family in families.MAPPED:
        for j, mode in enumerate(catalogue):
            for suffix, recipe in _twins(family, mode, j).items():  # a bf16 mode recipe's own name wins over a twin's
                if suffix:
                    full.setdefault(f"{family}_{mode}{suffix}", recipe)
                else:
                    full[f"{family}_{mode}"] = recipe
        seen = set()
        for mode in mode_recipes.names("quick") + catalogue:
            r = mode_recipes.get(mode)
            kind = (r.modes, r.gate)
            if len(r.modes) == 1 and r.precision == "float32" and f"{family}_{mode}" in full and kind not in seen:
                seen.add(kind)
                quick.update({n: x for n, x in full.items() if n.removesuffix("_bf16").removesuffix("_T128")
                              == f"{family}_{mode}" and x.mode == mode})
    return quick, full


QUICK_MODES, FULL_MODES = _mode_sets()
CATALOGUE = {**QUICK, **FULL_MODES}

# The family form of each GDN-2 gate regime (oracle.generate.GATES: erase b, write w): a family has one beta in both
# places (b = w = beta), so a regime with b != w has no exact form; it maps to the beta regime nearest in what it
# tests. Exact: uniform. Nearest: zero (b = w = 0) -> small (beta in [0, 0.02]); one (b = w = 1) -> near_one;
# erase_zero (no erase, writes U[0, 1]) -> small (next to no erase: writes become small too); erase_one (a full
# erase) and write_one (a full write) -> near_one (both near 1); negative (b in [0, 2]: eigenvalues of the erase
# factor down to -1) -> near_two (beta in [1.9, 2]: the erase factor near -1 for unit keys).
GATE_BETAS = {"uniform": "uniform", "zero": "small", "one": "near_one", "erase_zero": "small",
              "erase_one": "near_one", "write_one": "near_one", "negative": "near_two"}
# The grouped value heads G = HV / H of the projections, cycled over the GDN-2 recipes' distinct shapes.
GROUPS = (1, 2, 4)


def projection(family, shape, decay, gates, *, G=1, qk="l2", scale=None, initial_state=False, precision="float32",
               seed=0):
    """The family projection of a dense GDN-2 recipe on ``shape = (B, T, H, K, V)`` (its decay regime, gate regime
    ``gates`` as :data:`GATE_BETAS`' beta regime, q/k mode, scale, initial state, precision and seed) with ``G``
    value heads per key head (``HV = G H``)."""
    if gates not in GATE_BETAS:
        raise ValueError(f"gates: {gates!r} not one of {tuple(GATE_BETAS)}")
    _check_int("G", G, 1)
    B, T, H, K, V = shape
    return FamilyRecipe(family, B, T, H, G * H, K, V, decay=decay, beta=GATE_BETAS[gates], qk=qk, scale=scale,
                        initial_state=initial_state, seed=seed, precision=precision)


def projections(family, recipes, seed=0):
    """``{name: recipe}``: the family projections of ``recipes`` (``(name, oracle.Recipe)`` pairs of dense GDN-2
    recipes, each in its own precision; a reduction is ignored: the projection is the family's own), seeds shifted
    by ``seed``, named ``<family>_<name>`` (the GDN-2 name carries its ``_bf16``); ``G`` cycles over :data:`GROUPS`
    with each new shape, in the order the shapes first appear (so cases that differ only in values share a shape)."""
    out, shapes = {}, []
    for name, r in recipes:
        shape = (r.B, r.T, r.H, r.K, r.V)
        if shape not in shapes:
            shapes.append(shape)
        out[f"{family}_{name}"] = projection(
            family, shape, r.decay, r.gates, G=GROUPS[shapes.index(shape) % len(GROUPS)], qk=r.qk, scale=r.scale,
            initial_state=r.initial_state, precision=r.precision, seed=r.seed + seed)
    return out


def names(kind="quick"):
    """The recipes' names of a case set: ``quick``: :data:`QUICK` (dense) and :data:`QUICK_MODES` (one call per
    mode); ``full``: :data:`QUICK` and :data:`FULL_MODES` (every mode recipe the family takes); ``golden``: none."""
    if kind == "quick":
        return list(QUICK) + list(QUICK_MODES)
    return list(QUICK) + list(FULL_MODES) if kind == "full" else []


def get(name) -> FamilyRecipe:
    """The catalogued recipe ``name`` (ValueError naming an unknown one)."""
    if name not in CATALOGUE:
        raise ValueError(f"name: {name!r} not one of {list(CATALOGUE)}")
    return CATALOGUE[name]
