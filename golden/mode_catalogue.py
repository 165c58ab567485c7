"""The golden catalogue of training calls: named :class:`oracle.mode_recipes.ModeRecipe` s (docs/modes.md).

A :class:`ModeGoldenCase` is a name, a free-text ``purpose`` and a ``ModeRecipe`` (sequence lengths and
packing, decay and gate regimes, the in-kernel gate, the q/k L2 norm, the ``[V, K]`` state layout, the
states at chunk starts, input precision, seed). :meth:`ModeGoldenCase.build` rebuilds the exact
``oracle.Call`` and cotangents bit for bit, so a recipe plus :data:`GENERATOR_VERSION` determines a mode
golden file bit for bit. :meth:`ModeGoldenCase.checksum` is the sha256 of the recipe's canonical JSON
(``golden.catalogue.recipe_checksum`` of every ``ModeRecipe`` field); name and purpose are not part of it.

This catalogue is separate from the dense one (``golden/catalogue.py``): its files share ``golden/data/``
(names never collide) but have their own member list (``golden/load.py``: :data:`MODE_ARRAY_ORDER`) and
their own manifest section (``mode_cases``), so adding or changing a mode golden leaves every dense file and
manifest entry byte-identical.

Sizes are what a 256-bit mpmath run (and the 512-bit error estimate) affords: at most a few hundred tokens
of ``K, V <= 16``, each case a few seconds on one core. The varlen cases pack the lengths 0, 1, C-1, C, C+1
around FLA's chunk C = 64 (``oracle.mode_recipes.FLA_CHUNK``) with ``K = V = 8``, so the boundary logic of a
chunk-64 kernel is exercised at golden-affordable cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from gdn2_oracle.oracle.mode_recipes import FLA_CHUNK, ModeRecipe

from .catalogue import recipe_checksum

# Bump when anything that determines a mode golden's bytes changes outside the recipes (oracle.modes'
# pipeline, the recipes' generators, the mode file format, the mpmath precision). Separate from the dense
# catalogue's version, so a change here never touches the dense files.
GENERATOR_VERSION = "1"


@dataclass(frozen=True)
class ModeGoldenCase:
    """One mode golden: a name, what it is for, and its :class:`oracle.mode_recipes.ModeRecipe`."""

    name: str
    recipe: ModeRecipe
    purpose: str = ""

    def __post_init__(self):
        if not isinstance(self.recipe, ModeRecipe):
            raise ValueError(f"{self.name}: recipe must be an oracle.mode_recipes.ModeRecipe, got {self.recipe!r}")
        if self.recipe.cot_seed is not None:
            raise ValueError(f"{self.name}: cot_seed must be None (a golden's cotangent seed is its data "
                             f"seed), got {self.recipe.cot_seed!r}")
        if not self.recipe.modes:
            raise ValueError(f"{self.name}: recipe uses no mode (a dense call belongs in golden/catalogue.py)")

    @property
    def shape(self):
        """``(B, T, H, K, V)`` of the call's per-token inputs."""
        return self.recipe.shape

    @property
    def modes(self):
        """The training-call modes the case uses (``oracle.mode_recipes.MODES`` order)."""
        return self.recipe.modes

    def fields(self) -> dict:
        """The recipe as a JSON-ready dict (every ``ModeRecipe`` field: what the checksum covers)."""
        return self.recipe.fields()

    def checksum(self) -> str:
        """sha256 of the recipe's canonical JSON."""
        return recipe_checksum(self.fields())

    def cost(self) -> int:
        """Rough relative cost of the mpmath run (token x state elements; the chunk-start states rerun the
        forward), for scheduling."""
        B, T, H, K, V = self.shape
        forwards = 2 if self.recipe.intermediate_chunk_size is not None else 1
        return B * H * T * (K * V + K + V) * (1 + forwards)

    def build(self):
        """``(call, do, dfinal_state)``: the exact call and cotangents of this case."""
        return self.recipe.build()


def _m(name, H, K, V, lengths, purpose, **kw):
    try:
        recipe = ModeRecipe(H, K, V, tuple(lengths), **kw)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return ModeGoldenCase(name, recipe, purpose)


C = FLA_CHUNK
# Around FLA's chunk: an empty sequence, one token, C-1, C, C+1 (boundaries inside and on chunk edges).
EDGES = (0, 1, C - 1, C, C + 1)

CASES: tuple[ModeGoldenCase, ...] = (
    # --- packed variable-length sequences --------------------------------------------------------
    _m("mode_varlen_edges", 1, 8, 8, EDGES,
       "packed lengths 0, 1, C-1, C, C+1 (C = 64) with initial states", initial_state=True, seed=9001),
    _m("mode_varlen_edges_bf16", 2, 8, 8, (C + 1, 0, C, 1, C - 1),
       "bf16, packed C+1, 0, C, 1, C-1 without initial states, strong decay, b in [0, 2]",
       decay="strong", gates="negative", precision="bfloat16", seed=9002),
    # --- in-kernel gate --------------------------------------------------------------------------
    _m("mode_gate_bounded", 2, 16, 16, (40, 40),
       "bounded gate lower_bound = -5 with A_log and dt_bias, two rows, initial states",
       packed=False, gate="bounded", lower_bound=-5.0, initial_state=True, seed=9003),
    _m("mode_gate_softplus_varlen", 2, 8, 8, (5, 0, 30, 1),
       "softplus gate with A_log and dt_bias, packed", gate="softplus", seed=9004),
    # --- in-kernel q/k L2 normalisation ----------------------------------------------------------------
    _m("mode_l2norm_near_zero", 2, 16, 16, (24, 24),
       "q/k L2 norm with a zero row, rows of norm sqrt(eps) and below", packed=False, qk_l2norm=True,
       near_zero=True, initial_state=True, seed=9005),
    # --- [V, K] state layout ---------------------------------------------------------------------
    _m("mode_state_v_first", 2, 8, 16, (20, 20),
       "[V, K] states (K != V), two rows, initial states", packed=False, state_v_first=True, initial_state=True,
       seed=9006),
    # --- states at chunk starts ------------------------------------------------------------------
    _m("mode_intermediate_varlen", 1, 8, 8, (C + 1, 1, 0, C),
       "states at chunk starts (C = 64), packed: FLA's offsets per sequence", intermediate_chunk_size=C,
       initial_state=True, seed=9007),
    _m("mode_intermediate_dense", 1, 8, 8, (2 * C + 1,),
       "states at chunk starts (C = 64) of one row of 2C+1 tokens", packed=False, intermediate_chunk_size=C,
       initial_state=True, decay="weak", seed=9008),
    # --- everything at once ----------------------------------------------------------------------
    _m("mode_all", 2, 8, 8, (1, 0, C + 1, 3),
       "all five modes: packed, bounded gate -5, L2 norm with near-zero rows, [V, K] states, chunk starts",
       gate="bounded", lower_bound=-5.0, qk_l2norm=True, near_zero=True, state_v_first=True,
       intermediate_chunk_size=C, initial_state=True, seed=9009),
    _m("mode_all_softplus_bf16", 2, 8, 16, (0, C + 1, 1, 7),
       "all five modes in bf16: packed, softplus gate, L2 norm with near-zero rows, [V, K] states, chunk starts",
       gate="softplus", qk_l2norm=True, near_zero=True, state_v_first=True, intermediate_chunk_size=C,
       initial_state=True, precision="bfloat16", seed=9010),
)

_BY_NAME = {c.name: c for c in CASES}
if len(_BY_NAME) != len(CASES):  # pragma: no cover - guards edits to the table above
    raise AssertionError("duplicate case names in golden.mode_catalogue.CASES")


def names() -> list[str]:
    """Mode case names in catalogue order."""
    return [c.name for c in CASES]


def get(name: str) -> ModeGoldenCase:
    """The mode case called ``name``; ValueError naming it if there is none."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"golden: unknown mode case {name!r} ({len(CASES)} mode cases; see "
                         f"golden.mode_names())") from None


__all__ = ["ModeGoldenCase", "CASES", "GENERATOR_VERSION", "names", "get"]
