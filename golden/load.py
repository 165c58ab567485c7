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

Mode goldens (training calls, ``golden/mode_catalogue.py``) use the same byte rules with their own member
list, :data:`MODE_ARRAY_ORDER` (a member is present only when the call has it):

* inputs: ``q k v g b w`` (``g`` the raw gate pre-activation when the call has the in-kernel gate; ``q, k``
  the raw rows when it has the L2 norm), ``scale`` (0-d), ``cu_seqlens`` ``[N+1]`` when packed (integers
  stored as float64, exact), ``A_log`` ``[H]``, ``dt_bias`` ``[H*K]``, ``lower_bound`` (0-d) when the gate has
  them, ``initial_state`` ``[N,H,K,V]`` (``[N,H,V,K]`` with ``state_v_first``) when the call has one;
* cotangents: ``do``, ``dfinal_state`` (the call's state layout);
* results: ``o, final_state, dq, dk, dv, dg, db, dw, dh0`` and, when present, ``intermediate_states``
  ``[B,NT,H,K,V]`` (at the recipe's ``intermediate_chunk_size``), ``dA_log``, ``ddt_bias``;
* error estimates: ``err_<result>`` for each result present.

The flags a file does not hold (``qk_l2norm``, ``state_v_first``, ``intermediate_chunk_size``, whether the
gate is in the kernel) come from the recipe, which the manifest entry's ``recipe_sha256`` pins.

Family goldens (KDA and Gated DeltaNet calls, ``golden/family_catalogue.py``) use the same byte rules with their own
member list, :data:`FAMILY_ARRAY_ORDER` (a member is present only when the call has it), and one manifest section
per family (:data:`FAMILY_SECTIONS`):

* inputs: the call's arguments as passed, ``q k`` ``[B,T,H,K]``, ``v`` ``[B,T,HV,V]``, ``g`` (``[B,T,HV,K]`` for
  KDA, ``[B,T,HV]`` for Gated DeltaNet; the raw pre-activation with the in-kernel log-decay), ``beta`` ``[B,T,HV]``
  (logits with the sigmoid), ``scale`` (0-d), ``A_log``, ``dt_bias``, ``lower_bound`` (0-d) when the call has
  them, ``initial_state`` ``[B,HV,K,V]`` when it has one;
* cotangents: ``do``, ``dfinal_state``;
* results: ``o, final_state, dq, dk, dv, dg, dbeta, dh0`` (gradients w.r.t. the arguments as passed) and, when
  present, ``dA_log``, ``ddt_bias``;
* error estimates: ``err_<result>`` for each result present.

The family and FLA's flags (``use_qk_l2norm_in_kernel``, ``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval``,
``use_gate_in_kernel``) come from the case, which the manifest entry's ``recipe_sha256`` pins.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.oracle import GRADS, RESULTS, call_modes, families
from gdn2_oracle.oracle.call import Call
from gdn2_oracle.oracle.modes import MODE_GRADS

from . import catalogue, family_catalogue, mode_catalogue

ROOT = Path(__file__).resolve().parent
DATA_DIR = ROOT / "data"
MANIFEST = ROOT / "MANIFEST.json"

INPUT_ARRAYS = oracle.INPUTS + ("scale", "initial_state")
COTANGENT_ARRAYS = ("do", "dfinal_state")
ERROR_ARRAYS = tuple(f"err_{r}" for r in RESULTS)
ARRAY_ORDER = INPUT_ARRAYS + COTANGENT_ARRAYS + RESULTS + ERROR_ARRAYS
OPTIONAL_ARRAYS = ("initial_state",)
ZIP_DATE = (1980, 1, 1, 0, 0, 0)

# Mode goldens: the call's inputs (those it has), cotangents, results (the extra ones when present), estimates.
MODE_OPTIONAL_INPUTS = ("cu_seqlens", "A_log", "dt_bias", "lower_bound", "initial_state")
MODE_INPUT_ARRAYS = oracle.INPUTS + ("scale",) + MODE_OPTIONAL_INPUTS
MODE_EXTRA_RESULTS = ("intermediate_states",) + tuple(n for n in MODE_GRADS if n not in GRADS)
MODE_RESULT_ARRAYS = RESULTS + MODE_EXTRA_RESULTS
MODE_ERROR_ARRAYS = tuple(f"err_{r}" for r in MODE_RESULT_ARRAYS)
MODE_ARRAY_ORDER = MODE_INPUT_ARRAYS + COTANGENT_ARRAYS + MODE_RESULT_ARRAYS + MODE_ERROR_ARRAYS
MODE_OPTIONAL_ARRAYS = MODE_OPTIONAL_INPUTS + MODE_EXTRA_RESULTS + tuple(f"err_{r}" for r in MODE_EXTRA_RESULTS)

# Family goldens: the call's arguments (those it has), cotangents, results (dA_log, ddt_bias when present), estimates.
FAMILY_OPTIONAL_INPUTS = ("A_log", "dt_bias", "lower_bound", "initial_state")
FAMILY_INPUT_ARRAYS = ("q", "k", "v", "g", "beta", "scale") + FAMILY_OPTIONAL_INPUTS
FAMILY_RESULT_ARRAYS = family_catalogue.RESULTS
FAMILY_EXTRA_RESULTS = ("dA_log", "ddt_bias")
FAMILY_ERROR_ARRAYS = tuple(f"err_{r}" for r in FAMILY_RESULT_ARRAYS)
FAMILY_ARRAY_ORDER = FAMILY_INPUT_ARRAYS + COTANGENT_ARRAYS + FAMILY_RESULT_ARRAYS + FAMILY_ERROR_ARRAYS
FAMILY_OPTIONAL_ARRAYS = (FAMILY_OPTIONAL_INPUTS + FAMILY_EXTRA_RESULTS
                          + tuple(f"err_{r}" for r in FAMILY_EXTRA_RESULTS))

# The manifest's sections: dense cases, mode cases, and one per mapped family (family cases).
SECTION, MODE_SECTION = "cases", "mode_cases"
FAMILY_SECTIONS = {f: f"{f}_cases" for f in families.MAPPED}


class GoldenError(ValueError):
    """A golden file is missing, truncated, altered, stale or unreadable."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(arrays: Mapping[str, np.ndarray], order=ARRAY_ORDER, optional=OPTIONAL_ARRAYS) -> bytes:
    """The canonical bytes of a golden file holding ``arrays`` (names from ``order``, default the dense
    :data:`ARRAY_ORDER`; a mode golden's: :data:`MODE_ARRAY_ORDER` with :data:`MODE_OPTIONAL_ARRAYS`)."""
    unknown = set(arrays) - set(order)
    if unknown:
        raise ValueError(f"arrays: unknown names {sorted(unknown)}")
    missing = [n for n in order if n not in arrays and n not in optional]
    if missing:
        raise ValueError(f"arrays: missing {missing}")
    unpaired = [n for n in order if f"err_{n}" in order and (n in arrays) != (f"err_{n}" in arrays)]
    if unpaired:
        raise ValueError(f"arrays: a result and its error estimate go together; unpaired: {unpaired}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=False) as zf:
        for name in order:
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
    if not isinstance(manifest, dict) or not all(
            isinstance(manifest.get(s, {}), dict) and all(isinstance(e, dict) for e in manifest.get(s, {}).values())
            for s in (SECTION, MODE_SECTION, *FAMILY_SECTIONS.values())):
        raise GoldenError(f"golden manifest {path} is corrupt (not an object with a 'cases' object of entries "
                          f"and, optionally, 'mode_cases' and family ones); {manifest_recovery()}")
    return manifest


def names() -> list[str]:
    """The golden cases, in catalogue order."""
    return catalogue.names()


def mode_names() -> list[str]:
    """The mode golden cases (training calls), in catalogue order."""
    return mode_catalogue.names()


def family_names(family=None) -> list[str]:
    """The family golden cases (of one family, ``"gdn"`` or ``"kda"``, when given), in catalogue order."""
    return family_catalogue.names(family)


class _Stored(Mapping):
    """A loaded golden file: a read-only mapping ``array name -> np.ndarray``."""

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
        return f"{type(self).__name__}({self.name!r}, shape={self.shape}, precision={self.precision!r})"

    @property
    def shape(self):
        """``(B, T, H, K, V)``."""
        B, T, H, K = self["q"].shape
        return B, T, H, K, self["v"].shape[-1]

    @property
    def precision(self) -> str:
        """Input precision of the recipe (``float32`` or ``bfloat16``): what to feed a kernel."""
        return self.case.recipe.precision

    def cotangents(self):
        """``(do, dfinal_state)``."""
        return self["do"], self["dfinal_state"]


class Golden(_Stored):
    """One loaded golden: a read-only mapping ``array name -> np.ndarray`` plus helpers."""

    def problem(self) -> oracle.Problem:
        """The exact ``oracle.Problem`` the golden was computed from."""
        return oracle.Problem(*(self[n] for n in oracle.INPUTS), scale=float(self["scale"]),
                              initial_state=self._arrays.get("initial_state"))

    def reference(self) -> dict[str, np.ndarray]:
        """The exact results by name: ``o, final_state, dq, dk, dv, dg, db, dw, dh0``."""
        return {n: self[n] for n in RESULTS}

    def errors(self) -> dict[str, float]:
        """Largest absolute error estimate of each result."""
        return {n: float(self[f"err_{n}"]) for n in RESULTS}


class ModeGolden(_Stored):
    """One loaded mode golden (a training call): the arrays of :data:`MODE_ARRAY_ORDER` it has, plus helpers."""

    @property
    def modes(self):
        """The training-call modes of the case (``oracle.mode_recipes.MODES`` order)."""
        return self.case.modes

    def call(self) -> Call:
        """The exact ``oracle.Call`` the golden was computed from (flags from the recipe)."""
        r = self.case.recipe
        get = self._arrays.get
        cu = get("cu_seqlens")
        lower_bound = get("lower_bound")
        return Call(*(self[n] for n in oracle.INPUTS), scale=float(self["scale"]), initial_state=get("initial_state"),
                    cu_seqlens=None if cu is None else cu.astype(np.int64), gate_in_kernel=r.gate is not None,
                    A_log=get("A_log"), dt_bias=get("dt_bias"),
                    lower_bound=None if lower_bound is None else float(lower_bound), qk_l2norm=r.qk_l2norm,
                    state_v_first=r.state_v_first, intermediate_chunk_size=r.intermediate_chunk_size)

    def reference(self) -> dict[str, np.ndarray]:
        """The exact results by name: the nine of ``oracle.RESULTS`` and those of :data:`MODE_EXTRA_RESULTS`
        the call has."""
        return {n: self[n] for n in MODE_RESULT_ARRAYS if n in self}

    def errors(self) -> dict[str, float]:
        """Largest absolute error estimate of each result."""
        return {n: float(self[f"err_{n}"]) for n in MODE_RESULT_ARRAYS if n in self}


class FamilyGolden(_Stored):
    """One loaded family golden (a KDA or Gated DeltaNet call): the arrays of :data:`FAMILY_ARRAY_ORDER` it has,
    plus helpers."""

    @property
    def shape(self):
        """``(B, T, H, HV, K, V)``."""
        return self.case.shape

    @property
    def family(self) -> str:
        """``"gdn"`` or ``"kda"``."""
        return self.case.family

    def flags(self) -> dict:
        """FLA's keywords the call sets (only those that are True)."""
        return self.case.flags()

    def call(self) -> families.FamilyCall:
        """The exact ``oracle.families.FamilyCall`` the golden was computed from (flags from the case)."""
        get = self._arrays.get
        lower_bound = get("lower_bound")
        return families.call(self.family, *(self[n] for n in ("q", "k", "v", "g", "beta")), scale=float(self["scale"]),
                             initial_state=get("initial_state"), A_log=get("A_log"), dt_bias=get("dt_bias"),
                             lower_bound=None if lower_bound is None else float(lower_bound), **self.flags())

    def reference(self) -> dict[str, np.ndarray]:
        """The exact results by name: ``o, final_state, dq, dk, dv, dg, dbeta, dh0`` and ``dA_log``, ``ddt_bias``
        when the call has them."""
        return {n: self[n] for n in FAMILY_RESULT_ARRAYS if n in self}

    def errors(self) -> dict[str, float]:
        """Largest absolute error estimate of each result."""
        return {n: float(self[f"err_{n}"]) for n in FAMILY_RESULT_ARRAYS if n in self}


def load(name: str, *, data_dir=None, manifest=None) -> Golden:
    """Load case ``name`` after checking its sha256 against the manifest.

    ``data_dir`` (default ``golden/data``) holds ``<name>.npz``; ``manifest`` is a path or an
    already-read dict (default ``golden/MANIFEST.json``). Unknown name: ValueError. Missing,
    truncated, altered or stale file: :class:`GoldenError` naming the case and both hashes.
    """
    case = catalogue.get(name)
    return Golden(name, case, *_verified(name, case, SECTION, data_dir, manifest))


def load_mode(name: str, *, data_dir=None, manifest=None) -> ModeGolden:
    """Load mode case ``name`` (``golden/mode_catalogue.py``) after checking it against the manifest's
    ``mode_cases`` section, with the checks and messages of :func:`load`."""
    case = mode_catalogue.get(name)
    return ModeGolden(name, case, *_verified(name, case, MODE_SECTION, data_dir, manifest))


def load_family(name: str, *, data_dir=None, manifest=None) -> FamilyGolden:
    """Load family case ``name`` (``golden/family_catalogue.py``) after checking it against its family's manifest
    section (:data:`FAMILY_SECTIONS`), with the checks and messages of :func:`load`."""
    case = family_catalogue.get(name)
    return FamilyGolden(name, case, *_verified(name, case, FAMILY_SECTIONS[case.family], data_dir, manifest))


def _verified(name, case, section, data_dir, manifest):
    """``(arrays, manifest entry)`` of case ``name`` from manifest ``section``, after the recipe checksum and the
    file's sha256 are checked (:class:`GoldenError` naming the case, both hashes and the recovery)."""
    if not isinstance(manifest, Mapping):
        manifest = read_manifest(manifest)
    entry = manifest.get(section, {}).get(name)
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
    return arrays, entry


def problem(name: str, **kw) -> oracle.Problem:
    """``load(name, **kw).problem()``."""
    return load(name, **kw).problem()


def cotangents(name: str, **kw):
    """``load(name, **kw).cotangents()``: ``(do, dfinal_state)``."""
    return load(name, **kw).cotangents()


class FamilyJudgedCase(NamedTuple):
    """What a judge needs of one family golden: ``build()`` -> ``(fcall, do, dfinal_state)`` and ``reference()`` ->
    the stored mpmath results by name (:data:`FAMILY_RESULT_ARRAYS` the call has), both from the verified file;
    ``flags``: FLA's keywords the call sets (True), sorted; ``regime``: the case as a report describes it;
    ``modes``: the registry's training modes (``oracle.call_modes``) whose FLA keywords the call sets."""

    name: str
    dtype: str
    shape: tuple
    family: str
    flags: tuple
    build: Callable
    reference: Callable
    regime: dict
    modes: tuple


def family_judged_cases(families_selected=families.MAPPED, dtypes=("float32", "bfloat16")) -> list[FamilyJudgedCase]:
    """A :class:`FamilyJudgedCase` per family golden of the selected families and input dtypes, in catalogue order
    (a file is read and hash-checked only when its ``build`` or ``reference`` is called)."""
    out = []
    for c in family_catalogue.CASES:
        if c.family not in families_selected or c.precision not in dtypes:
            continue

        def build(name=c.name):
            g = load_family(name)
            return (g.call(), *g.cotangents())

        def reference(name=c.name):
            return load_family(name).reference()

        flags = tuple(sorted(c.flags()))
        modes = tuple(m for m in call_modes.names("training") if set(call_modes.get(m).keywords) & set(flags))
        out.append(FamilyJudgedCase(c.name, c.precision, c.shape, c.family, flags, build, reference, c.regime(),
                                    modes))
    return out
