"""Reading (and the byte format of) golden files: ``golden/data/<case>.npz`` checked against the manifest.

File format: a zip archive (stored, not compressed; every member dated 1980-01-01 00:00:00, Unix
mode 0644) of ``.npy`` members (format version 1.0, little-endian float64, C order), in the
fixed order of :data:`ARRAY_ORDER`, so a recipe produces the same bytes on every machine and every
run. ``np.load`` reads it like any ``.npz``.

Arrays (all float64):

* inputs: ``q, k, g, b`` ``[B,T,H,K]``; ``v, w`` ``[B,T,H,V]``; ``scale`` (0-d, the effective
  scale); ``initial_state`` ``[B,H,K,V]`` only when the case has one;
* cotangents: ``do`` ``[B,T,H,V]``, ``dfinal_state`` ``[B,H,K,V]``;
* results (rounded to nearest float64 from the mpmath run): ``o, final_state, dq, dk, dv, dg, db,
  dw, dh0``;
* error estimates: ``err_<result>`` for each result, a 0-d array holding the largest per-element
  estimate ``max |x_prec - x_2prec|`` of that result (absolute; see ``oracle.mp``). The manifest
  also records the largest relative estimate, ``max err / max |result|`` over the results.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.oracle import RESULTS
from . import catalogue

ROOT = Path(__file__).resolve().parent
DATA_DIR = ROOT / "data"
MANIFEST = ROOT / "MANIFEST.json"

INPUT_ARRAYS = oracle.INPUTS + ("scale", "initial_state")
COTANGENT_ARRAYS = ("do", "dfinal_state")
ERROR_ARRAYS = tuple(f"err_{r}" for r in RESULTS)
ARRAY_ORDER = INPUT_ARRAYS + COTANGENT_ARRAYS + RESULTS + ERROR_ARRAYS
OPTIONAL_ARRAYS = ("initial_state",)
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


class GoldenError(ValueError):
    """A golden file is missing, truncated, altered, stale or unreadable."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The canonical bytes of a golden file holding ``arrays`` (names from :data:`ARRAY_ORDER`)."""
    unknown = set(arrays) - set(ARRAY_ORDER)
    if unknown:
        raise ValueError(f"arrays: unknown names {sorted(unknown)}")
    missing = [n for n in ARRAY_ORDER if n not in arrays and n not in OPTIONAL_ARRAYS]
    if missing:
        raise ValueError(f"arrays: missing {missing}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=False) as zf:
        for name in ARRAY_ORDER:
            if name not in arrays:
                continue
            a = np.array(arrays[name], dtype="<f8", order="C")  # keeps 0-d arrays 0-d
            member = io.BytesIO()
            np.lib.format.write_array(member, a, version=(1, 0), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=ZIP_DATE)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3
            info.external_attr = 0o100644 << 16
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def decode(data: bytes) -> dict[str, np.ndarray]:
    """Arrays of a golden file's bytes, by name (in file order)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def manifest_recovery() -> str:
    """How to restore a damaged manifest (from git, or rebuilt from the catalogue)."""
    return ("restore it with `git checkout golden/MANIFEST.json` or rebuild it with "
            "`gdn2-oracle golden regenerate --force`")


def file_recovery(name: str) -> str:
    """How to restore the golden file of case ``name`` (from git, or recomputed)."""
    return (f"restore it with `git checkout golden/data/{name}.npz` or "
            f"`gdn2-oracle golden regenerate --case {name}`")


def read_manifest(path=None) -> dict:
    """The manifest as a dict (``{"cases": {}}`` if the file does not exist); a file that is not a
    manifest (bad JSON, wrong structure) raises :class:`GoldenError` naming it and the recovery."""
    path = Path(path) if path is not None else MANIFEST
    if not path.exists():
        return {"cases": {}}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise GoldenError(f"golden manifest {path} is corrupt ({type(exc).__name__}: {exc}); "
                          f"{manifest_recovery()}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("cases", {}), dict) or not all(
            isinstance(e, dict) for e in manifest.get("cases", {}).values()):
        raise GoldenError(f"golden manifest {path} is corrupt (not an object with a 'cases' object of entries); "
                          f"{manifest_recovery()}")
    return manifest


def names() -> list[str]:
    """The golden cases, in catalogue order."""
    return catalogue.names()


class Golden(Mapping):
    """One loaded golden: a read-only mapping ``array name -> np.ndarray`` plus helpers."""

    def __init__(self, name, case, arrays, entry):
        self.name, self.case, self.entry = name, case, entry
        for a in arrays.values():
            a.setflags(write=False)
        self._arrays = arrays

    def __getitem__(self, key):
        return self._arrays[key]

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self):
        return len(self._arrays)

    def __repr__(self):
        return f"Golden({self.name!r}, shape={self.shape}, precision={self.precision!r})"

    @property
    def shape(self):
        """``(B, T, H, K, V)``."""
        B, T, H, K = self["q"].shape
        return B, T, H, K, self["v"].shape[-1]

    @property
    def precision(self) -> str:
        """Input precision of the recipe (``float32`` or ``bfloat16``): what to feed a kernel."""
        return self.case.recipe.precision

    def problem(self) -> oracle.Problem:
        """The exact ``oracle.Problem`` the golden was computed from."""
        return oracle.Problem(*(self[n] for n in oracle.INPUTS), scale=float(self["scale"]),
                              initial_state=self._arrays.get("initial_state"))

    def cotangents(self):
        """``(do, dfinal_state)``."""
        return self["do"], self["dfinal_state"]

    def reference(self) -> dict[str, np.ndarray]:
        """The exact results by name: ``o, final_state, dq, dk, dv, dg, db, dw, dh0``."""
        return {n: self[n] for n in RESULTS}

    def errors(self) -> dict[str, float]:
        """Largest absolute error estimate of each result."""
        return {n: float(self[f"err_{n}"]) for n in RESULTS}


def load(name: str, *, data_dir=None, manifest=None) -> Golden:
    """Load case ``name`` after checking its sha256 against the manifest.

    ``data_dir`` (default ``golden/data``) holds ``<name>.npz``; ``manifest`` is a path or an
    already-read dict (default ``golden/MANIFEST.json``). Unknown name: ValueError. Missing,
    truncated, altered or stale file: :class:`GoldenError` naming the case and both hashes.
    """
    case = catalogue.get(name)
    if not isinstance(manifest, Mapping):
        manifest = read_manifest(manifest)
    entry = manifest.get("cases", {}).get(name)
    if entry is None:
        raise GoldenError(f"golden case {name!r}: not in the manifest "
                          f"(run `gdn2-oracle golden regenerate --case {name}`)")
    if entry.get("recipe_sha256") != case.checksum():
        raise GoldenError(f"golden case {name!r}: stale; the catalogue recipe (sha256 {case.checksum()}) "
                          f"differs from the manifest's ({entry.get('recipe_sha256')}); "
                          f"run `gdn2-oracle golden regenerate --case {name}`")
    expected = entry.get("sha256")
    path = Path(data_dir if data_dir is not None else DATA_DIR) / f"{name}.npz"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise GoldenError(f"golden case {name!r}: file {path} is missing: expected sha256 {expected}, "
                          f"actual: no file; {file_recovery(name)}") from None
    except OSError as exc:
        raise GoldenError(f"golden case {name!r}: cannot read {path} ({type(exc).__name__}: {exc}); "
                          f"{file_recovery(name)}") from None
    actual = sha256(data)
    if actual != expected:
        raise GoldenError(f"golden case {name!r}: file {path} is truncated or altered ({len(data)} bytes): "
                          f"expected sha256 {expected}, actual sha256 {actual}; {file_recovery(name)}")
    try:
        arrays = decode(data)
    except Exception as exc:
        raise GoldenError(f"golden case {name!r}: cannot read {path}: {type(exc).__name__}: {exc}; "
                          f"{file_recovery(name)}") from exc
    return Golden(name, case, arrays, entry)


def problem(name: str, **kw) -> oracle.Problem:
    """``load(name, **kw).problem()``."""
    return load(name, **kw).problem()


def cotangents(name: str, **kw):
    """``load(name, **kw).cotangents()``: ``(do, dfinal_state)``."""
    return load(name, **kw).cotangents()
