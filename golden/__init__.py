"""The GDN-2 golden corpus: exact (256-bit mpmath) forward results and gradients for named recipes.

* ``golden.names()`` -- the cases, in catalogue order (``golden/catalogue.py``).
* ``golden.load(name)`` -- a verified :class:`Golden` (mapping of array name -> ndarray) with
  ``.problem()``, ``.cotangents()``, ``.reference()``, ``.errors()``; ``golden.problem(name)``
  and ``golden.cotangents(name)`` are shortcuts. A missing, truncated or altered file raises
  :class:`GoldenError` (a ValueError) naming the case and the expected and actual sha256.
* ``golden.mode_names()`` -- the training-call (mode) cases (``golden/mode_catalogue.py``);
  ``golden.load_mode(name)`` -- a verified :class:`ModeGolden` with ``.call()`` (an ``oracle.Call``),
  ``.cotangents()``, ``.reference()`` (with ``intermediate_states``, ``dA_log``, ``ddt_bias`` when the
  call has them), ``.errors()``; refused like ``golden.load``.
* ``gdn2-oracle golden regenerate [--case NAME ...] [--jobs N] [--check] [--force]`` -- rebuild
  (or, with ``--check``, recompute and verify bit for bit) the corpus, both catalogues.

The file format is documented in :mod:`golden.load`. This package uses ``oracle`` only.
"""

from .catalogue import CASES, GENERATOR_VERSION, PRECISION_BITS, Case
from .load import (
    Golden,
    GoldenError,
    ModeGolden,
    cotangents,
    load,
    load_mode,
    mode_names,
    names,
    problem,
    read_manifest,
)

__all__ = ["CASES", "Case", "GENERATOR_VERSION", "PRECISION_BITS", "Golden", "GoldenError", "ModeGolden",
           "cotangents", "load", "load_mode", "mode_names", "names", "problem", "read_manifest"]
