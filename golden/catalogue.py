"""The golden catalogue: named, deterministic recipes for GDN-2 problems.

A :class:`Case` is a name, a free-text ``purpose`` and an :class:`oracle.Recipe` (shape, decay
regime, gate regime, qk mode, seed, scale, initial state, input precision, optional reduction).
:meth:`Case.build` turns it into the exact ``oracle.Problem`` and cotangents the golden was computed
from, so a recipe plus :data:`GENERATOR_VERSION` determines a golden file bit for bit.
:meth:`Case.checksum` is the sha256 of the recipe's canonical JSON (the :data:`RECIPE_FIELDS`,
sorted keys, no whitespace); the name and the purpose are not part of it, so renaming or
re-describing a case does not invalidate it.

Reductions (``reduction``; ``oracle.reductions.reduce``):

* ``None``  -- ``oracle.make_problem(...)`` as is.
* ``"kda"`` -- KDA: ``beta = b[..., 0]`` of the generated problem (so ``gates`` chooses how beta
  is drawn: ``uniform`` -> U[0, 1], ``one`` -> 1, ``zero`` -> 0), ``b = w = beta * 1``
  (``oracle.reductions.kda_problem``).
* ``"gdn"`` -- Gated DeltaNet: as KDA, and a scalar log-decay per head and token,
  ``g_scalar = g[..., 0]`` (``oracle.reductions.gated_deltanet_problem``).

Cotangents are ``oracle.random_cotangents(problem, seed=recipe.seed, precision=recipe.precision)``
(``do`` rounded like the inputs, ``dfinal_state`` float32): a golden recipe's cotangent seed is its
data seed (``cot_seed`` is None), which is why the checksum does not cover it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from gdn2_oracle.oracle import Recipe

# Bump when anything that determines a golden's bytes changes outside the recipes (the oracle's
# algorithm, the cotangent recipe, the file format, the mpmath precision).
GENERATOR_VERSION = "1"
# Working precision of the mpmath oracle (the error estimate reruns at twice this).
PRECISION_BITS = 256

# Fields of a recipe the checksum covers (all but ``cot_seed``, which a golden leaves at the data seed).
RECIPE_FIELDS = ("B", "T", "H", "K", "V", "decay", "gates", "qk", "seed", "scale",
                 "initial_state", "precision", "reduction")


@dataclass(frozen=True)
class Case:
    """One golden: a name, what it is for, and its :class:`oracle.Recipe`."""

    name: str
    recipe: Recipe
    purpose: str = ""

    def __post_init__(self):
        if not isinstance(self.recipe, Recipe):
            raise ValueError(f"{self.name}: recipe must be an oracle.Recipe, got {self.recipe!r}")
        if self.recipe.cot_seed is not None:
            raise ValueError(f"{self.name}: cot_seed must be None (a golden's cotangent seed is its data "
                             f"seed), got {self.recipe.cot_seed!r}")
        if self.recipe.HV is not None:
            raise ValueError(f"{self.name}: HV must be None (the corpus format records no value heads: "
                             f"RECIPE_FIELDS), got {self.recipe.HV!r}")

    @property
    def shape(self):
        """``(B, T, H, K, V)``."""
        return self.recipe.shape

    def fields(self) -> dict:
        """The recipe as a JSON-ready dict of :data:`RECIPE_FIELDS` (what the checksum covers)."""
        return {f: getattr(self.recipe, f) for f in RECIPE_FIELDS}

    def checksum(self) -> str:
        """sha256 of the recipe's canonical JSON."""
        return recipe_checksum(self.fields())

    def cost(self) -> int:
        """Rough relative cost of the mpmath run (token x state elements), for scheduling."""
        B, T, H, K, V = self.shape
        return B * H * T * (K * V + K + V)

    def build(self):
        """``(problem, do, dfinal_state)``: the exact inputs and cotangents of this case."""
        return self.recipe.build()


def recipe_checksum(recipe: dict) -> str:
    """sha256 (hex) of ``json.dumps(recipe, sort_keys=True, separators=(",", ":"))``."""
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _c(name, shape, purpose, **kw):
    try:
        recipe = Recipe(*shape, **kw)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return Case(name, recipe, purpose)


# Shapes shared by many cases, so a kernel test compiles once per (shape, dtype).
STD = (1, 40, 2, 16, 16)        # ordinary: < 1 chunk of 64, 2.5 chunks of 16
WIDE = (2, 24, 1, 16, 32)       # K != V, B = 2
TPU1 = (1, 1, 1, 128, 128)      # TPU lane width
TPU = (1, 20, 1, 128, 128)
# Lengths that must differ are chosen once, and every case that needs a length of that kind takes its shape:
C16_TAIL = (1, 53, 2, 16, 16)   # several chunks of 16 and a tail, H = 2
C64_TAIL = (1, 201, 1, 8, 16)   # several chunks of 64 and a tail, K != V

CASES: tuple[Case, ...] = (
    # --- every decay regime -------------------------------------------------------------
    _c("decay_none", STD, "no decay: g = 0 (pure delta rule)", decay="none", seed=101),
    _c("decay_weak", STD, "weak decay, g ~ -1e-3", decay="weak", seed=102),
    _c("decay_moderate", STD, "moderate decay, g ~ -0.1", decay="moderate", seed=103),
    _c("decay_strong", STD, "strong decay, g in [-5, -1]", decay="strong", seed=104),
    _c("decay_extreme", STD, "extreme decay, g in [-60, -20]: spans far past float32's exp range",
       decay="extreme", seed=105),
    _c("decay_mixed", STD, "per-channel mix of none / moderate / extreme", decay="mixed", seed=106,
       initial_state=True),
    _c("decay_resets", C16_TAIL, "moderate decay with state resets (g ~ -1e3 at some tokens)",
       decay="resets", seed=107, initial_state=True),
    _c("decay_extreme_h0", WIDE, "extreme decay from a non-zero initial state", decay="extreme",
       seed=108, initial_state=True),
    # --- gate regimes --------------------------------------------------------------------
    _c("gates_zero", STD, "b = w = 0: the state only decays from h0", gates="zero", seed=201,
       initial_state=True),
    _c("gates_one", STD, "b = w = 1 (plain delta rule with decay)", gates="one", seed=202),
    _c("gates_erase_zero", STD, "b = 0: gated linear attention (closed form exists)",
       gates="erase_zero", seed=203, initial_state=True),
    _c("gates_erase_zero_strong", WIDE, "b = 0 with strong decay", gates="erase_zero",
       decay="strong", seed=204),
    _c("gates_erase_one", STD, "b = 1, w uniform", gates="erase_one", seed=205),
    _c("gates_write_one", STD, "w = 1, b uniform", gates="write_one", seed=206, initial_state=True),
    _c("gates_negative", STD, "erase b in [0, 2]: negative eigenvalues of I - k (b k)^T",
       gates="negative", seed=207),
    _c("gates_negative_raw", STD, "b in [0, 2] with un-normalised q, k and weak decay",
       gates="negative", qk="raw", decay="weak", seed=208, initial_state=True),
    # --- lengths around C = 16 ----------------------------------------------------------
    _c("len_1", (2, 1, 2, 16, 16), "a single token", seed=301, initial_state=True),
    _c("len_c16_minus1", (1, 15, 2, 16, 16), "T = 15 = C16 - 1", seed=302),
    _c("len_c16", (1, 16, 2, 16, 16), "T = 16 = C16", seed=303, initial_state=True),
    _c("len_c16_plus1", (1, 17, 2, 16, 16), "T = 17 = C16 + 1", seed=304),
    _c("len_c16_x3_tail", C16_TAIL, "T = 3 * 16 + 5", decay="strong", seed=305),
    # --- lengths around C = 64 ----------------------------------------------------------
    _c("len_c64_minus1", (1, 63, 1, 16, 16), "T = 63 = C64 - 1", seed=311),
    _c("len_c64", (1, 64, 1, 16, 16), "T = 64 = C64", seed=312, initial_state=True),
    _c("len_c64_plus1", (1, 65, 1, 16, 16), "T = 65 = C64 + 1", decay="strong", seed=313),
    _c("len_c64_x3_tail", C64_TAIL, "T = 3 * 64 + 9, K != V", decay="mixed", seed=314,
       initial_state=True),
    _c("len_c64_x3_tail_extreme", C64_TAIL, "T = 3 * 64 + 9, extreme decay", decay="extreme", seed=315),
    # --- K != V -------------------------------------------------------------------------
    _c("kv_16x32", WIDE, "K = 16 < V = 32", seed=401),
    _c("kv_32x8", (1, 33, 2, 32, 8), "K = 32 > V = 8", seed=402, initial_state=True),
    _c("kv_8x64_negative", (2, 18, 1, 8, 64), "K = 8, V = 64, b in [0, 2]", gates="negative",
       seed=403),
    # --- scale and qk mode --------------------------------------------------------------
    _c("scale_custom", STD, "custom scale 0.3", scale=0.3, seed=501, initial_state=True),
    _c("scale_custom_raw", STD, "custom scale 0.3, un-normalised q, k (at scale 1.0 a scale applied twice, or to one "
       "side only, would pass)", scale=0.3, qk="raw", seed=502),
    _c("qk_raw_strong", STD, "un-normalised q, k with strong decay", qk="raw", decay="strong",
       seed=503),
    # --- reductions ---------------------------------------------------------------------
    _c("kda_moderate", STD, "KDA: b = w = beta, per-channel decay", reduction="kda", seed=601),
    _c("kda_strong_h0", WIDE, "KDA, strong decay, initial state", reduction="kda", decay="strong",
       seed=602, initial_state=True),
    _c("kda_beta_one_len65", (1, 65, 1, 16, 16), "KDA with beta = 1, T = C64 + 1", reduction="kda",
       gates="one", seed=603),
    _c("gdn_moderate", STD, "Gated DeltaNet: scalar decay per head", reduction="gdn", seed=611),
    _c("gdn_extreme_h0", STD, "Gated DeltaNet, extreme scalar decay, initial state",
       reduction="gdn", decay="extreme", seed=612, initial_state=True),
    _c("gdn_resets_len17", (1, 17, 2, 16, 16), "Gated DeltaNet with resets, T = C16 + 1",
       reduction="gdn", decay="resets", seed=614),
    # --- bfloat16-rounded inputs --------------------------------------------------------
    _c("bf16_moderate", STD, "bf16-rounded inputs, moderate decay", precision="bfloat16", seed=701),
    _c("bf16_strong_h0", STD, "bf16 inputs, strong decay, initial state", precision="bfloat16",
       decay="strong", seed=702, initial_state=True),
    _c("bf16_negative_wide", WIDE, "bf16 inputs, b in [0, 2], K != V", precision="bfloat16",
       gates="negative", seed=703),
    _c("bf16_kda_len65", (1, 65, 1, 16, 16), "bf16 KDA, T = C64 + 1", precision="bfloat16",
       reduction="kda", seed=704),
    _c("bf16_gdn", STD, "bf16 Gated DeltaNet", precision="bfloat16", reduction="gdn",
       decay="strong", seed=705),
    # --- TPU width K = V = 128 ----------------------------------------------------------
    _c("tpu128_len1", TPU1, "K = V = 128, one token, initial state", seed=801, initial_state=True),
    _c("tpu128_moderate", TPU, "K = V = 128, T = 20", seed=802, initial_state=True),
    _c("tpu128_bf16_strong", TPU, "K = V = 128, bf16 inputs, strong decay", precision="bfloat16",
       decay="strong", seed=803),
)

_BY_NAME = {c.name: c for c in CASES}
if len(_BY_NAME) != len(CASES):  # pragma: no cover - guards edits to the table above
    raise AssertionError("duplicate case names in golden.catalogue.CASES")


def names() -> list[str]:
    """Case names in catalogue order."""
    return [c.name for c in CASES]


def get(name: str) -> Case:
    """The case called ``name``; ValueError naming it if there is none."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"golden: unknown case {name!r} ({len(CASES)} cases; see golden.names())") from None


def case_from_recipe(name: str, recipe: dict) -> Case:
    """Rebuild a Case from a manifest recipe dict."""
    return Case(name, Recipe(**{f: recipe[f] for f in RECIPE_FIELDS}))


__all__ = ["Case", "CASES", "GENERATOR_VERSION", "PRECISION_BITS", "RECIPE_FIELDS", "names", "get",
           "recipe_checksum", "case_from_recipe"]

