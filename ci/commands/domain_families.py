"""What ``domain`` maps for a family kernel (KDA, Gated DeltaNet in FLA's signature; docs/DESIGN.md §1, "Families"):
the decay regime x beta regime map, one panel per decay regime, group size G = HV / H and dtype, each cell an
:class:`oracle.family_recipes.FamilyRecipe` judged by the family judge (``ci/grading/families.py``).

A panel sweeps the beta regimes (:data:`BETA_COLUMNS`: the recipe's ``beta`` regimes, plus ``logits_high`` with
``allow_neg_eigval``) at one decay regime of ``oracle.DECAYS``; a column whose FLA keywords the kernel's signature does
not take is not swept (named in the report, not a failure).
"""

from __future__ import annotations

from typing import NamedTuple

from gdn2_oracle.oracle import DECAYS, KERNEL_DTYPES
from gdn2_oracle.oracle.family_recipes import FamilyRecipe

NEG_EIGVAL = "neg_eigval"  # the column of logits_high with allow_neg_eigval (beta = 2 sigmoid, near 2)
# Column -> the FamilyRecipe fields it sets: every beta regime, then the negative-eigenvalue one.
BETA_COLUMNS = {"uniform": {"beta": "uniform"}, "small": {"beta": "small"}, "near_one": {"beta": "near_one"},
                "near_two": {"beta": "near_two"}, "logits": {"beta": "logits"},
                "logits_high": {"beta": "logits_high"}, NEG_EIGVAL: {"beta": "logits_high", "neg_eigval": True}}
BETA_LABELS = {"uniform": "U[0,1]", "small": "~0", "near_one": "~1", "near_two": "~2", "logits": "logits",
               "logits_high": "logits 2-6", NEG_EIGVAL: "2 sigmoid"}
BETA_FIELD = "beta"  # a family panel's field: it sweeps the beta regime


class FamilyGrid(NamedTuple):
    """The family map: ``decays`` x ``betas`` (keys of :data:`BETA_COLUMNS`) per group size of ``groups`` (value heads
    per key head) and dtype of ``dtypes``, on calls of ``shape`` = (B, T, H, K, V) with HV = G H, each cell over
    ``seeds`` seeds."""

    name: str
    decays: tuple = DECAYS
    betas: tuple = tuple(BETA_COLUMNS)
    groups: tuple = (1, 4)
    dtypes: tuple = ("float32",)
    seeds: int = 1
    shape: tuple = (1, 256, 2, 16, 16)
    initial_state: bool = True

    def base(self, family):
        """The map's fixed part, as the report's ``base`` records it."""
        return {"family": family, "T": self.shape[1], "initial_state": self.initial_state, "qk": "l2",
                "decays": list(self.decays), "betas": list(self.betas), "groups": list(self.groups)}

    def shape_dict(self):
        """``{B, T, H, K, V}``: the report's ``shape`` (HV = G H per panel)."""
        return dict(zip("BTHKV", self.shape))


# Sized so that a map of our family kernel takes about as long as the GDN-2 map of the same grid name (a cell is
# cheap, ~0.1 s; each (G, dtype, beta keywords) compiles the kernel once: 6 compiles in quick, 18 in full).
FAMILY_GRIDS = {
    "quick": FamilyGrid("quick", groups=(1, 4)),
    "full": FamilyGrid("full", groups=(1, 2, 4), dtypes=tuple(KERNEL_DTYPES), seeds=3),
}


class FamilyPanel(NamedTuple):
    """One row of the map: the beta regimes at one decay regime, group size and dtype (the fields a
    ``domain_points.Panel`` has, and the family)."""

    field: str
    label: str
    dtype: str
    mode: str
    values: tuple
    labels: tuple
    points: tuple
    family: str


def column_recipe(grid: FamilyGrid, family, decay, column, G, dtype, seed=0):
    """The :class:`FamilyRecipe` of one cell (data seed ``seed``)."""
    B, T, H, K, V = grid.shape
    return FamilyRecipe(family, B, T, H, G * H, K, V, decay=decay, initial_state=grid.initial_state, seed=seed,
                        precision=dtype, **BETA_COLUMNS[column])


def family_panels(grid: FamilyGrid, family, mode, accepted_flags, seed=0):
    """``(panels, not_accepted_flags)``: a :class:`FamilyPanel` per group size, dtype and decay regime over the beta
    columns whose FLA keywords are among ``accepted_flags``, and the keywords of the columns left out. ``mode``: the
    plain call's name (a family call is one)."""
    for column in grid.betas:
        if column not in BETA_COLUMNS:
            raise ValueError(f"grid: beta column {column!r} not one of {tuple(BETA_COLUMNS)}")
    needs = {c: set(column_recipe(grid, family, grid.decays[0], c, 1, "float32").flags()) for c in grid.betas}
    columns = [c for c in grid.betas if needs[c] <= set(accepted_flags)]
    missing = sorted(set().union(*needs.values()) - set(accepted_flags))
    panels = [FamilyPanel(BETA_FIELD, f"beta (decay {decay}, G={G})", dtype, mode, tuple(columns),
                          tuple(BETA_LABELS[c] for c in columns),
                          tuple(column_recipe(grid, family, decay, c, G, dtype, seed) for c in columns), family)
              for G in grid.groups for dtype in grid.dtypes for decay in grid.decays] if columns else []
    return panels, missing
