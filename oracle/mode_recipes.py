"""Deterministic recipes for FLA ``chunk_gdn2`` training calls (docs/DESIGN.md §2, "Call modes (training)").

A :class:`ModeRecipe` is data -- sequence lengths, packing, decay and gate regimes, which modes are on,
seeds -- and :meth:`ModeRecipe.build` rebuilds the same :class:`oracle.Call` and cotangents from it bit for
bit, on every machine. :data:`RECIPES` is the catalogue the judge's mode cases are drawn from
(``ci/grading/modes.py``; ``gdn2-oracle validate --modes``); :data:`QUICK` names the few cheap ones of the
``quick`` case set. Lengths are chosen around FLA's chunk (C = 64): 0, 1, C-1, C, C+1, many short
sequences, boundaries inside chunks and on chunk edges, one sequence of over 1024 tokens among short ones.

Inputs: the per-token inputs are ``oracle.make_problem``'s (its decay, gate and q/k regimes), then, by mode:

* ``gate``: ``g`` is a raw pre-activation ``N(0, 1)``, ``A_log = log U[1, 16]`` (FLA's test range),
  ``dt_bias ~ N(0, 1)``, both float32 (FLA's parameters are float32); ``lower_bound`` -5 (the shipped
  setting) for the bounded form, None for the softplus form;
* ``l2norm``: raw q and k rows of norm ``~ 10^U[-1, 1]`` and, with ``near_zero``, a zero row, a row of
  norm ``sqrt(eps) = 1e-3`` and a row of norm ``1e-5`` in each (where the epsilon's placement shows);
* ``initial_state``: ``N(0, 1)`` float32 states ``[N, H, K, V]`` (``[N, H, V, K]`` with ``state_v_first``);
* cotangents: ``do ~ N(0, 1)`` rounded like the inputs, ``dfinal_state ~ N(0, 1)`` float32.

Every array comes from its own seeded stream (``SeedSequence([seed, tag])``), so changing one mode does not
change the others' values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
from dataclasses import dataclass

import numpy as np

from . import call_modes
from .call import Call
from .call_modes import FLA_CHUNK
from .generate import DECAYS, GATES, KERNEL_DTYPES, QK_MODES, make_problem, round_to

# The training-call modes, in the order reports list them (``dense`` is a call without any of them).
MODES = call_modes.names("training")
GATE_FORMS = (None, "softplus", "bounded")

# Stream tags of the seeded generators (one per array family).
_TAGS = {"qk": 1, "gate": 2, "params": 3, "h0": 4, "cot": 5, "rows": 6}


def _check_int(name, n, lo):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {n!r}")
    return int(n)


@dataclass(frozen=True)
class ModeRecipe:
    """One reproducible ``chunk_gdn2`` call.

    ``lengths``: the sequences' token counts; ``packed`` puts them into one row with ``cu_seqlens``
    (``B = 1``), else they are the ``B`` rows of a dense call and must be equal. ``gate``: None, ``"softplus"``
    or ``"bounded"`` (``lower_bound``, default -5); ``A_log`` / ``dt_bias``: whether the gate has them.
    ``qk_l2norm`` with ``near_zero``: zero and tiny q/k rows. ``intermediate_chunk_size``: the states at
    chunk starts are asked for (FLA: 64). ``precision``: the kernel's input dtype.
    """

    H: int
    K: int
    V: int
    lengths: tuple
    packed: bool = True
    decay: str = "moderate"
    gates: str = "uniform"
    qk: str = "l2"
    gate: str | None = None
    lower_bound: float | None = None
    A_log: bool = True
    dt_bias: bool = True
    qk_l2norm: bool = False
    near_zero: bool = False
    state_v_first: bool = False
    intermediate_chunk_size: int | None = None
    initial_state: bool = False
    precision: str = "float32"
    seed: int = 0
    cot_seed: int | None = None

    def __post_init__(self):
        for dim in ("H", "K", "V"):
            object.__setattr__(self, dim, _check_int(dim, getattr(self, dim), 1))
        lengths = tuple(_check_int("lengths", n, 0) for n in self.lengths)
        if not lengths or sum(lengths) == 0:
            raise ValueError(f"lengths: expected at least one token, got {self.lengths!r}")
        if not self.packed and (min(lengths) != max(lengths)):
            raise ValueError(f"lengths: a dense call needs equal lengths, got {lengths}")
        object.__setattr__(self, "lengths", lengths)
        for name, value, choices in (("decay", self.decay, DECAYS), ("gates", self.gates, tuple(GATES)),
                                     ("qk", self.qk, QK_MODES), ("gate", self.gate, GATE_FORMS),
                                     ("precision", self.precision, KERNEL_DTYPES)):
            if value not in choices:
                raise ValueError(f"{name}: {value!r} not one of {choices}")
        for name in ("packed", "A_log", "dt_bias", "qk_l2norm", "near_zero", "state_v_first", "initial_state"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))
        if self.gate == "bounded" and self.lower_bound is None:
            object.__setattr__(self, "lower_bound", -5.0)
        if self.lower_bound is not None:
            if self.gate != "bounded":
                raise ValueError("lower_bound: only with gate='bounded'")
            object.__setattr__(self, "lower_bound", float(self.lower_bound))
        if self.gate == "softplus" and not self.A_log:
            raise ValueError("A_log: the softplus gate needs A_log")
        if self.near_zero and not self.qk_l2norm:
            raise ValueError("near_zero: only with qk_l2norm (unnormalised q/k rows)")
        if self.intermediate_chunk_size is not None:
            _check_int("intermediate_chunk_size", self.intermediate_chunk_size, 1)
        object.__setattr__(self, "seed", _check_int("seed", self.seed, 0))
        if self.cot_seed is not None:
            object.__setattr__(self, "cot_seed", _check_int("cot_seed", self.cot_seed, 0))

    # --- what the recipe is --------------------------------------------------------------------------

    @property
    def modes(self):
        """The modes this call uses (a subset of :data:`MODES`, in that order); empty: a dense call."""
        on = dict(varlen=self.packed, gate=self.gate is not None, l2norm=self.qk_l2norm,
                  state_v_first=self.state_v_first, intermediate=self.intermediate_chunk_size is not None)
        return tuple(m for m in MODES if on[m])

    @property
    def log_decay_given(self):
        """Whether the call's log-decay is given (by its decay regime), not computed from a raw gate in the kernel."""
        return self.gate is None

    def regime(self):
        """The recipe's regime as a report describes it (lengths, packing, decay, gates, gate form, modes)."""
        return {"lengths": list(self.lengths), "packed": self.packed, "decay": self.decay, "gates": self.gates,
                "gate": self.gate, "lower_bound": self.lower_bound, "initial_state": self.initial_state,
                "seed": self.seed, "modes": list(self.modes)}

    @property
    def num_sequences(self):
        return len(self.lengths)

    @property
    def shape(self):
        """``(B, T, H, K, V)`` of the call's per-token inputs."""
        if self.packed:
            return 1, sum(self.lengths), self.H, self.K, self.V
        return len(self.lengths), self.lengths[0], self.H, self.K, self.V

    @property
    def dtype(self):
        return self.precision

    @property
    def cu_seqlens(self):
        """``[N+1]`` int64 offsets when packed, else None."""
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64) if self.packed else None

    @property
    def cotangent_seed(self):
        return self.seed if self.cot_seed is None else self.cot_seed

    def replace(self, **changes):
        """A new validated recipe with some fields replaced."""
        return dataclasses.replace(self, **changes)

    def fields(self):
        """The recipe as a JSON-ready dict (every field)."""
        d = dataclasses.asdict(self)
        d["lengths"] = list(self.lengths)
        return d

    def checksum(self):
        """sha256 of the recipe's canonical JSON (sorted keys, no whitespace)."""
        return hashlib.sha256(json.dumps(self.fields(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def call_source(self):
        """The recipe as Python source (``from gdn2_oracle.oracle.mode_recipes import ModeRecipe``)."""
        return "ModeRecipe(" + ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(self).items()) + ")"

    def call_structure(self):
        """The call's structure as :class:`oracle.call.Call` keywords (what a recipe of another parametrisation,
        ``oracle.family_recipes``, takes from this one): ``cu_seqlens``, the state layout, the chunk states."""
        return {"cu_seqlens": self.cu_seqlens, "state_v_first": self.state_v_first,
                "intermediate_chunk_size": self.intermediate_chunk_size}

    # --- building it -------------------------------------------------------------------------------

    def _rng(self, tag, seed=None):
        return np.random.default_rng(np.random.SeedSequence([self.seed if seed is None else seed, _TAGS[tag]]))

    def qk_raw(self, shape):
        """Unnormalised q, k for the L2-norm mode (rows of norm ~10^U[-1,1]; near-zero rows on request)."""
        rng = self._rng("qk")
        B, T, H, K = shape
        out = []
        for _ in range(2):
            x = rng.standard_normal(shape)
            x = x / np.linalg.norm(x, axis=-1, keepdims=True) * 10.0 ** rng.uniform(-1, 1, (B, T, H, 1))
            out.append(x)
        if self.near_zero and T:
            rows = self._rng("rows").permutation(T)
            q, k = out
            for i, norm in zip(rows[:3], (0.0, 1e-3, 1e-5)):  # zero, sqrt(eps), below sqrt(eps)
                for x in (q, k):
                    x[:, i] = 0.0 if norm == 0 else x[:, i] / np.linalg.norm(x[:, i], axis=-1, keepdims=True) * norm
            if len(rows) > 3:  # one row zero in q only, one tiny in k only
                q[:, rows[3]] = 0.0
            if len(rows) > 4:
                k[:, rows[4]] *= 1e-4 / np.linalg.norm(k[:, rows[4]], axis=-1, keepdims=True)
        return [round_to(x, self.precision) for x in out]

    def build(self):
        """``(call, do, dfinal_state)``: the exact call and cotangents of this recipe."""
        B, T, H, K, V = self.shape
        base = make_problem(B, T, H, K, V, decay=self.decay, gates=self.gates, qk=self.qk,
                            precision=self.precision, seed=self.seed)
        q, k, v, g, b, w = base.inputs()
        kw = {}
        if self.qk_l2norm:
            q, k = self.qk_raw(q.shape)
        if self.gate is not None:
            g = round_to(self._rng("gate").standard_normal(g.shape), self.precision)
            rng = self._rng("params")
            A_log = round_to(np.log(rng.uniform(1.0, 16.0, H)), "float32")
            dt_bias = round_to(rng.standard_normal(H * K), "float32")
            kw = dict(gate_in_kernel=True, A_log=A_log if self.A_log else None,
                      dt_bias=dt_bias if self.dt_bias else None, lower_bound=self.lower_bound)
        N = self.num_sequences
        state_shape = (N, H) + ((V, K) if self.state_v_first else (K, V))
        h0 = round_to(self._rng("h0").standard_normal(state_shape), "float32") if self.initial_state else None
        call = Call(q, k, v, g, b, w, initial_state=h0, cu_seqlens=self.cu_seqlens, qk_l2norm=self.qk_l2norm,
                    state_v_first=self.state_v_first, intermediate_chunk_size=self.intermediate_chunk_size, **kw)
        rng = self._rng("cot", self.cotangent_seed)
        do = round_to(rng.standard_normal((B, T, H, V)), self.precision)
        dfs = round_to(rng.standard_normal(state_shape), "float32")
        return call, do, dfs


# --- the catalogue ------------------------------------------------------------------------------------

C = FLA_CHUNK
# 0, 1, C-1, C, C+1 and short ones: boundaries inside chunks and on chunk edges (64, 128, 192 -> 1+63+64 = 128).
EDGE_LENGTHS = (0, 1, C - 1, C, C + 1, 2, 0, 3)
# Many short sequences (40, lengths 1..9): several boundaries in every chunk.
MANY_SHORT = (3, 1, 7, 2, 9, 5, 1, 1, 4, 6, 2, 8, 3, 1, 5, 2, 7, 1, 9, 4,
              2, 6, 1, 3, 8, 1, 1, 5, 2, 9, 4, 1, 7, 3, 2, 6, 1, 1, 2, 5)
# Boundaries exactly on chunk edges (64, 128, 256) and inside (288, 352 - 32).
CHUNK_EDGES = (C, C, 2 * C, C // 2, C // 2, C - 32)
# One sequence past 1024 tokens (past the 128/256/512-token block boundaries) among short ones.
LONG_AMONG_SHORT = (5, 2, 1030, 3, 0, 7)
# A dense call: two rows of C+1 tokens.
DENSE = (C + 36, C + 36)

RECIPES = {
    # packed variable-length sequences
    "varlen_edges": ModeRecipe(2, 16, 16, EDGE_LENGTHS, initial_state=True, seed=11),
    "varlen_edges_no_h0": ModeRecipe(2, 16, 16, EDGE_LENGTHS, decay="strong", gates="negative", seed=12),
    "varlen_many_short": ModeRecipe(2, 16, 8, MANY_SHORT, decay="strong", initial_state=True, seed=13),
    "varlen_chunk_edges": ModeRecipe(1, 16, 16, CHUNK_EDGES, decay="mixed", gates="write_one", initial_state=True,
                                     seed=14),
    "varlen_long": ModeRecipe(1, 8, 8, LONG_AMONG_SHORT, decay="weak", gates="erase_zero", initial_state=True,
                              seed=15),
    "varlen_edges_bf16": ModeRecipe(2, 16, 16, EDGE_LENGTHS, initial_state=True, precision="bfloat16", seed=16),
    # in-kernel gate
    "gate_bounded": ModeRecipe(2, 16, 16, DENSE, packed=False, gate="bounded", initial_state=True, seed=21),
    "gate_bounded_no_A_log": ModeRecipe(2, 16, 16, DENSE, packed=False, gate="bounded", A_log=False, seed=22),
    "gate_softplus": ModeRecipe(2, 16, 16, DENSE, packed=False, gate="softplus", initial_state=True, seed=23),
    "gate_softplus_no_dt_bias": ModeRecipe(2, 16, 16, DENSE, packed=False, gate="softplus", dt_bias=False,
                                           seed=24),
    "gate_varlen": ModeRecipe(2, 16, 16, EDGE_LENGTHS, gate="bounded", initial_state=True, seed=25),
    "gate_bounded_bf16": ModeRecipe(2, 16, 16, DENSE, packed=False, gate="bounded", initial_state=True,
                                    precision="bfloat16", seed=26),
    # in-kernel q/k L2 normalisation
    "l2norm": ModeRecipe(2, 16, 16, DENSE, packed=False, qk_l2norm=True, near_zero=True, initial_state=True,
                         seed=31),
    "l2norm_varlen": ModeRecipe(2, 16, 16, EDGE_LENGTHS, qk_l2norm=True, near_zero=True, seed=32),
    # [V, K] state layout
    "state_v_first": ModeRecipe(2, 16, 8, DENSE, packed=False, state_v_first=True, initial_state=True, seed=41),
    "state_v_first_varlen": ModeRecipe(2, 16, 8, EDGE_LENGTHS, state_v_first=True, initial_state=True, seed=42),
    # states at chunk starts
    "intermediate": ModeRecipe(2, 16, 16, (3 * C + 8,) * 2, packed=False, intermediate_chunk_size=C,
                               initial_state=True, seed=51),
    "intermediate_varlen": ModeRecipe(2, 16, 16, EDGE_LENGTHS + (2 * C + 5,), intermediate_chunk_size=C,
                                      initial_state=True, seed=52),
    # everything in one call
    "all_modes": ModeRecipe(2, 16, 16, EDGE_LENGTHS, gate="bounded", qk_l2norm=True, near_zero=True,
                            state_v_first=True, intermediate_chunk_size=C, initial_state=True, seed=61),
    "all_modes_softplus_bf16": ModeRecipe(2, 16, 16, EDGE_LENGTHS, gate="softplus", qk_l2norm=True,
                                          state_v_first=True, intermediate_chunk_size=C, initial_state=True,
                                          precision="bfloat16", seed=62),
}

# The cheap cases of ``validate --cases quick``: one packed call, one gated call (one compile each).
QUICK = {
    "varlen_quick": ModeRecipe(1, 16, 16, (0, 1, C - 1, C, C + 1, 3), initial_state=True, seed=71),
    "gate_quick": ModeRecipe(1, 16, 16, (C + 36,), packed=False, gate="bounded", initial_state=True, seed=72),
}


def names(kind="full"):
    """The recipe names of a case set: ``quick`` (:data:`QUICK`) or ``full`` (:data:`RECIPES` and ``QUICK``)."""
    if kind == "quick":
        return list(QUICK)
    if kind == "full":
        return list(RECIPES) + list(QUICK)
    raise ValueError(f"kind: {kind!r} not one of ('quick', 'full')")


def get(name):
    """The recipe called ``name`` (ValueError naming the known ones otherwise)."""
    found = RECIPES.get(name) or QUICK.get(name)
    if found is None:
        raise ValueError(f"name: unknown mode recipe {name!r}; known: {names('full')}")
    return found


# --- points of the domain sweeps -----------------------------------------------------------------------


@dataclass(frozen=True)
class ModePoint:
    """One training call of a mode sweep: ``recipe`` (a :class:`ModeRecipe`; its ``seed`` is the cell's) and, where
    the recipe has no field for the swept quantity, an override of its built call: ``A_log`` (every head's value)
    or ``qk_norm`` (every raw q and k row rescaled to this norm; 0 = zero rows)."""

    recipe: ModeRecipe
    A_log: float | None = None
    qk_norm: float | None = None

    def __post_init__(self):
        if not isinstance(self.recipe, ModeRecipe):
            raise ValueError(f"recipe: expected a ModeRecipe, got {self.recipe!r}")
        if self.A_log is not None and not (self.recipe.gate and self.recipe.A_log and math.isfinite(self.A_log)):
            raise ValueError(f"A_log: a finite value for a gated recipe with A_log, got {self.A_log!r}")
        if self.qk_norm is not None and not (self.recipe.qk_l2norm and _nonnegative(self.qk_norm)):
            raise ValueError(f"qk_norm: a norm >= 0 for a recipe with qk_l2norm, got {self.qk_norm!r}")

    def as_dict(self):
        """The point as JSON (``ModePoint(ModeRecipe(**d["recipe"]), d["A_log"], d["qk_norm"])`` rebuilds it)."""
        return {"recipe": self.recipe.fields(), "A_log": self.A_log, "qk_norm": self.qk_norm}

    def build(self, seed=0):
        """``(call, do, dfinal_state)`` with data seed ``seed`` (the recipe's call, overridden)."""
        recipe = self.recipe.replace(seed=seed)
        call, do, dfs = recipe.build()
        changes = {}
        if self.A_log is not None:
            changes["A_log"] = round_to(np.full(recipe.H, self.A_log), "float32")
        if self.qk_norm is not None:
            for name in ("q", "k"):
                x = getattr(call, name)
                unit = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-300)
                changes[name] = round_to(unit * self.qk_norm, recipe.precision)
        return (dataclasses.replace(call, **changes) if changes else call), do, dfs


def _nonnegative(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def sweep_points(sweep, values, shape, dtype):
    """The :class:`ModePoint` of each value of a mode sweep (``"mode.quantity"``, ``oracle.call_modes.SWEEPS``) at
    (H, K, V) of ``shape`` = (B, H, K, V), around a dense base call of ``call_modes.MODE_T`` tokens in ``dtype``."""
    _, H, K, V = shape
    base = ModeRecipe(H, K, V, (call_modes.MODE_T,), packed=False, initial_state=True, precision=dtype)
    build = call_modes.SWEEPS[sweep].build
    return [ModePoint(*_point(build(base, v))) for v in values]


def _point(built):
    recipe, overrides = built
    return recipe, overrides.get("A_log"), overrides.get("qk_norm")


# --- the conformance suite's recipes (property_tests/test_modes.py, property_tests/strategies.py) -------------

# Sequence lengths: 2 (a boundary inside the first chunk), C-1, an empty sequence, C+1 (crosses a chunk edge) and a
# short tail; K != V.
SUITE_LENGTHS = (2, C - 1, 0, C + 1, 2)
SUITE_SHAPE = (2, 16, 8)  # (H, K, V)
SUITE_ROWS = (C + 1, C + 1)  # a call that is not packed: two rows of C+1 tokens
_H, _K, _V = SUITE_SHAPE
# Every mode alone (both gate forms, a bfloat16 packed call) and all at once, judged against the float64 oracle; the
# names are the suite's test ids.
SUITE = {
    "varlen": ModeRecipe(_H, _K, _V, SUITE_LENGTHS, initial_state=True),
    "varlen_bf16": ModeRecipe(_H, _K, _V, SUITE_LENGTHS, initial_state=True, precision="bfloat16"),
    "gate_bounded": ModeRecipe(_H, _K, _V, SUITE_ROWS, packed=False, gate="bounded", initial_state=True),
    "gate_softplus": ModeRecipe(_H, _K, _V, SUITE_ROWS, packed=False, gate="softplus", initial_state=True),
    "l2norm": ModeRecipe(_H, _K, _V, SUITE_ROWS, packed=False, qk_l2norm=True, near_zero=True, initial_state=True),
    "state_v_first": ModeRecipe(_H, _K, _V, SUITE_LENGTHS, state_v_first=True, initial_state=True),
    "intermediate": ModeRecipe(_H, _K, _V, SUITE_LENGTHS, intermediate_chunk_size=C, initial_state=True),
    "all_modes": ModeRecipe(_H, _K, _V, SUITE_LENGTHS, gate="bounded", qk_l2norm=True, near_zero=True,
                            state_v_first=True, intermediate_chunk_size=C, initial_state=True),
}


@dataclass(frozen=True)
class SuiteProperty:
    """A property of the conformance suite written for one mode: the recipes it is drawn around (``{id: recipe}``)
    and the call modes a kernel must accept for it, the one the property is about last."""

    recipes: dict
    modes: tuple

    @property
    def recipe(self):
        """The first (for most, the only) recipe."""
        return next(iter(self.recipes.values()))

    @property
    def mode(self):
        """The mode the property is about."""
        return self.modes[-1]


# The suite's per-mode properties, by the equivalence each checks.
PROPERTIES = {
    # packed == each sequence alone; perturbing one packed sequence leaves the others
    "packed_alone": SuiteProperty({"varlen": SUITE["varlen"]}, ("varlen",)),
    # rows of equal length packed == the batch that is not packed (drawn around the batch)
    "packed_rows": SuiteProperty({"rows": ModeRecipe(_H, _K, _V, SUITE_ROWS, packed=False, initial_state=True)},
                                 ("varlen",)),
    # the in-kernel gate == the call on the log-decay computed beforehand (each form)
    "gate_precomputed": SuiteProperty({n: SUITE[n] for n in ("gate_bounded", "gate_softplus")}, ("gate",)),
    # in-kernel q/k L2 norm == the call on q, k normalised beforehand
    "l2norm_precomputed": SuiteProperty({"l2norm": SUITE["l2norm"]}, ("l2norm",)),
    # [V, K] states == the transposes of the [K, V] ones
    "transposed_states": SuiteProperty({"state_v_first": SUITE["state_v_first"]}, ("varlen", "state_v_first")),
    # the states at chunk starts, by value
    "chunk_starts": SuiteProperty({"intermediate": SUITE["intermediate"]}, ("varlen", "intermediate")),
}


# --- drawn recipes: the fields each mode sets (property_tests/strategies.py draws the open choices) ----------------

# The gate's forms as drawn (the bounded one first: what a failing draw shrinks to).
DRAWN_GATE_FORMS = ("bounded", "softplus")


def _packing_fields(on, choose):
    """Packed lengths, or equal rows of a call that is not packed."""
    if on:
        return {"lengths": choose("packed_lengths")}
    return {"lengths": (choose("row_length"),) * choose("rows"), "packed": False}


def _gate_fields(on, choose):
    """The gate's form, ``lower_bound`` and which parameters it has."""
    if not on:
        return {}
    fields = {"gate": choose("gate_form", DRAWN_GATE_FORMS)}
    if fields["gate"] == "bounded":
        fields.update(lower_bound=choose("lower_bound"), A_log=choose("flag"))
    fields["dt_bias"] = choose("flag")
    return fields


def _norm_fields(on, choose):
    """Raw q/k rows (near-zero ones drawn), or the q/k regime of a call that normalises none."""
    return {"qk_l2norm": True, "near_zero": choose("flag")} if on else {"qk": choose("qk")}


DRAWN_FIELDS = {
    "varlen": _packing_fields,
    "gate": _gate_fields,
    "l2norm": _norm_fields,
    "state_v_first": lambda on, choose: {"state_v_first": bool(on)},
    "intermediate": lambda on, choose: {"intermediate_chunk_size": FLA_CHUNK} if on else {},
}


def drawn_fields(mode, on, choose):
    """The :class:`ModeRecipe` fields of training mode ``mode`` switched ``on`` or off, every open choice made by
    ``choose(what, options=None)``: among ``options`` where given, else among the drawer's own set called ``what``
    (``packed_lengths``: a tuple with at least one token; ``row_length``, ``rows``, ``lower_bound``, ``qk``;
    ``flag``: a bool)."""
    return DRAWN_FIELDS[mode](on, choose)
