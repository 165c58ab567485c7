"""References and baselines cached by recipe on disk (docs/DESIGN.md §4, "References cached by recipe").

A case built from a recipe (a dense :class:`oracle.Recipe`, a :class:`oracle.mode_recipes.ModeRecipe`, a golden
file by its sha256) always has the same float64 reference and working-precision baselines, so they are stored in
the user's cache and read back by a later run instead of being computed again. Nothing is trusted blindly:

* the file name is the sha256 of the canonical key: what is cached (the recipe, which value, the result dtypes a
  baseline is rounded to; a golden case by its file's sha256), :func:`oracle_fingerprint` (every ``.py`` file of
  the installed ``gdn2_oracle.oracle`` package, the modules that compute or shape a cached value -- the grading
  modules and the golden loader -- and every module of the package they import, found by reading their imports),
  the versions of NumPy and mpmath, NumPy's BLAS, the BLAS environment (``OPENBLAS_CORETYPE``, thread counts:
  a float64 product may round differently), the machine and the CPU features NumPy dispatches on;
* the key carries :data:`FORMAT`: version 2 came with the content-keyed program cache, so every entry
  written before it is ignored;
* the entry is an ``.npz`` holding the arrays, that key and a sha256 over all of them; a read checks both, and a
  missing, truncated, altered, unreadable or mismatched entry is recomputed and overwritten;
* an entry is written to a temporary file and renamed into place (``os.replace``), so concurrent writers (xdist
  workers, several runs) and readers only ever see whole entries;
* a cache that cannot be written (read-only, no space) warns once (:class:`ReferenceCacheWarning`) and the run
  goes on computing;
* in a multi-process JAX run the cache is off: a host that found an entry would skip the collective the other
  hosts wait in (``ci/running/multihost.py``). JAX is never imported here; it is asked only when the caller has
  imported it.

Where: ``$GDN2_REFERENCE_CACHE`` (a directory; ``0``, ``off``, ``false``, ``no`` or empty: no cache), else
``$XDG_CACHE_HOME/gdn2-oracle/references``, else ``~/.cache/gdn2-oracle/references``. ``validate
--no-reference-cache``, ``pytest --gdn2-no-reference-cache`` and :func:`bypassed` neither read nor write it. The
directory is kept under :data:`MAX_BYTES` (least recently used entries go first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import functools
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gdn2_oracle import oracle

ENV = "GDN2_REFERENCE_CACHE"
# Values of ENV that turn the cache off.
OFF = ("", "0", "off", "false", "no")
# Bump when the entry format or the meaning of a key changes (2: the audit with the content-keyed program cache).
FORMAT = 2
# The directory is pruned (least recently used first) to 80% of this once it holds more.
MAX_BYTES = 2 * 2**30
# The modules whose code computes or shapes a cached value (besides the whole oracle package); what they import
# from the package is added (:func:`source_closure`).
VALUE_MODULES = ("ci.grading.references", "ci.grading.tolerance", "ci.grading.case", "ci.grading.modes",
                 "ci.grading.families", "ci.grading.reference_cache", "golden.load")
# Environment variables that change how NumPy's BLAS rounds a float64 product.
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "MKL_CBWR")
KEY, SECONDS, SHA256 = "__key__", "__seconds__", "__sha256__"  # the entry's own arrays
STALE_TEMP_SECONDS = 3600  # a temporary file this old belongs to a writer that died


class ReferenceCacheWarning(RuntimeWarning):
    """The reference cache could not be written; references are computed and not stored."""


@dataclasses.dataclass
class Stats:
    """Counts of this process: values read from the cache, values computed, entries written, entries rejected
    (damaged or mismatched, then recomputed), and the seconds the read values had taken to compute."""

    from_cache: int = 0
    computed: int = 0
    written: int = 0
    rejected: int = 0
    seconds_saved: float = 0.0

    def since(self, before: Stats) -> Stats:
        """The counts added after ``before`` (a copy taken earlier)."""
        return Stats(**{f.name: getattr(self, f.name) - getattr(before, f.name) for f in dataclasses.fields(self)})


STATS = Stats()
_enabled = True  # set by set_enabled / bypassed
_unwritable: set = set()  # directories that failed a write in this process (warned once, not tried again)
_pruned: set = set()  # directories checked against MAX_BYTES in this process


def directory() -> Path | None:
    """The cache directory the environment names (``$GDN2_REFERENCE_CACHE``, else the XDG cache), or None: off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gdn2-oracle" / "references"


def _multi_process():
    """Whether this process is one of a multi-process JAX run (only asked when the caller imported JAX)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    try:
        return jax.process_count() > 1
    except Exception:  # noqa: BLE001 - a JAX that cannot say is treated as one process, as it runs
        return False


def active_directory() -> Path | None:
    """Where entries are read and written now, or None: the cache is off (environment, :func:`set_enabled`,
    :func:`bypassed`, or a multi-process JAX run)."""
    if not _enabled:
        return None
    root = directory()
    return None if root is None or _multi_process() else root


def set_enabled(flag: bool):
    """Turn the cache on or off for this process (``pytest --gdn2-no-reference-cache``)."""
    global _enabled
    _enabled = bool(flag)


@contextlib.contextmanager
def bypassed(bypass=True):
    """Within the block the cache is neither read nor written when ``bypass`` (``validate --no-reference-cache``)."""
    global _enabled
    before = _enabled
    _enabled = before and not bypass
    try:
        yield
    finally:
        _enabled = before


def _cpu_dispatch():
    """The CPU targets NumPy dispatches its kernels on here (their float64 rounding may differ between them)."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # NumPy 1.x
        from numpy.core import _multiarray_umath as umath
    features = getattr(umath, "__cpu_features__", {})
    return sorted(t for t in getattr(umath, "__cpu_dispatch__", ()) if features.get(t))


def _package_root() -> Path:
    return Path(oracle.__file__).resolve().parent.parent


def _imports(path: Path, module: str):
    """The ``gdn2_oracle`` modules (names relative to the package) that the source at ``path`` imports, function-local
    imports included.

    Read from the compiled code's ``IMPORT_NAME`` instructions (each after its level and from-list constants), not
    from ``ast.parse``: CPython 3.11's AST constructor keeps its recursion counter per interpreter and miscounts when
    another thread parses at the same time (python/cpython#106905, ``SystemError: AST constructor recursion depth
    mismatch``), and this runs while a run's compile threads trace kernels. ``compile`` to bytecode builds no
    Python AST objects."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for name, level, fromlist in _import_instructions(compile(path.read_bytes(), str(path), "exec", dont_inherit=True)):
        if level:
            base = package[:len(package) - (level - 1)]
        elif name.split(".")[0] == "gdn2_oracle":
            base, name = [], name.removeprefix("gdn2_oracle").lstrip(".")
        else:
            continue
        head = base + (name.split(".") if name else [])
        yield ".".join(head)
        yield from (".".join([*head, alias]) for alias in fromlist or ())


def _import_instructions(code):
    """``(name, level, fromlist)`` of every import statement in ``code`` and the code objects nested in it."""
    ops = list(dis.get_instructions(code))
    for i, op in enumerate(ops):
        if op.opname == "IMPORT_NAME" and i >= 2:
            yield op.argval, ops[i - 2].argval, ops[i - 1].argval
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _import_instructions(const)


def _file_of(root: Path, module: str):
    """The source file of package module ``module`` (relative name), or None when it is not a module of ours."""
    if not module:
        return None
    for path in (root / Path(*module.split(".")).with_suffix(".py"), root / Path(*module.split(".")) / "__init__.py"):
        if path.is_file():
            return path
    return None


def source_closure():
    """``{relative module: path}``: the oracle package (tests excepted), :data:`VALUE_MODULES` and every module of
    the package they import, directly or through others."""
    root = _package_root()
    todo = [f"oracle.{p.relative_to(root / 'oracle').with_suffix('').as_posix().replace('/', '.')}".removesuffix(
        ".__init__") for p in sorted((root / "oracle").rglob("*.py")) if "tests" not in p.parts] + list(VALUE_MODULES)
    found = {}
    while todo:
        module = todo.pop()
        path = _file_of(root, module)
        if path is None or module in found:
            continue
        found[module] = path
        todo.extend(m for m in _imports(path, module) if m not in found)
    return dict(sorted(found.items()))


@functools.cache
def oracle_fingerprint() -> str:
    """sha256 over the sources a cached value depends on (:func:`source_closure`), each with its module name."""
    h = hashlib.sha256()
    for name, path in source_closure().items():
        h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return h.hexdigest()


@functools.cache
def _blas():
    """NumPy's BLAS as its build reports it (name and version), or None."""
    with contextlib.suppress(Exception):
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{info.get('name')} {info.get('version')}"
    return None


def canonical(what: dict) -> str:
    """The canonical key text of a cached value ``what`` (JSON, sorted keys, no whitespace), with everything else
    the value depends on: the sources, NumPy's and mpmath's versions and BLAS, the BLAS environment, the machine
    and NumPy's CPU targets."""
    import mpmath

    key = {"format": FORMAT, "what": what, "oracle": oracle_fingerprint(), "numpy": np.__version__,
           "mpmath": mpmath.__version__, "blas": _blas(), "blas_env": {n: os.environ.get(n) for n in BLAS_ENV},
           "machine": platform.machine(), "cpu": _cpu_dispatch()}
    return json.dumps(key, sort_keys=True, separators=(",", ":"), allow_nan=False)


def payload_sha256(arrays: dict) -> str:
    """sha256 over the named arrays (name, dtype, shape and bytes of each, in name order)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def entry_path(root: Path, text: str) -> Path:
    """The file of the entry whose canonical key is ``text``."""
    return Path(root) / f"{hashlib.sha256(text.encode()).hexdigest()}.npz"


def read(path: Path, text: str):
    """``(arrays, seconds)`` of a sound entry at ``path`` for key ``text``, else None (no file, or rejected:
    unreadable, truncated, altered, or stored under another key)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - any damage (zip, header, truncation) means: recompute, never trust
        STATS.rejected += 1
        return None
    digest = arrays.pop(SHA256, None)
    try:
        sound = (digest is not None and str(digest.tobytes(), "utf-8") == payload_sha256(arrays)
                 and str(arrays.pop(KEY).tobytes(), "utf-8") == text)
        seconds = float(arrays.pop(SECONDS))
    except (KeyError, TypeError, ValueError, UnicodeDecodeError):
        sound = False
    if not sound:
        STATS.rejected += 1
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: pruned last
    return arrays, seconds


def write(path: Path, text: str, arrays: dict, seconds: float):
    """Store ``arrays`` as the entry of key ``text`` at ``path``: a temporary file renamed into place. An OSError
    warns once per directory (:class:`ReferenceCacheWarning`) and stops writes there for this process."""
    root = Path(path).parent
    if root in _unwritable:
        return
    payload = {**{n: np.asarray(a) for n, a in arrays.items()}, KEY: np.frombuffer(text.encode(), np.uint8),
               SECONDS: np.float64(seconds)}
    payload[SHA256] = np.frombuffer(payload_sha256(payload).encode(), np.uint8)
    tmp = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=root)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **payload)
        os.replace(tmp, path)
        tmp = None
        STATS.written += 1
    except OSError as exc:
        _unwritable.add(root)
        warnings.warn(ReferenceCacheWarning(f"reference cache {root}: cannot write ({type(exc).__name__}: {exc}); "
                                            f"references are computed and not stored (env {ENV}=0 turns the cache "
                                            "off)"), stacklevel=3)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    if root not in _pruned and root not in _unwritable:
        _pruned.add(root)
        prune(root)


def prune(root: Path, max_bytes: int = MAX_BYTES):
    """Keep ``root`` under ``max_bytes``: past it, delete the least recently used entries down to 80% of it; also
    delete temporary files of writers that died. Errors are ignored (another process may prune too)."""
    entries, now = [], time.time()
    with contextlib.suppress(OSError):
        for p in Path(root).iterdir():
            with contextlib.suppress(OSError):
                st = p.stat()
                if p.suffix == ".tmp" and now - st.st_mtime > STALE_TEMP_SECONDS:
                    p.unlink()
                elif p.suffix == ".npz":
                    entries.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    if total <= max_bytes:
        return
    for _, size, p in sorted(entries):
        if total <= 0.8 * max_bytes:
            break
        with contextlib.suppress(OSError):
            p.unlink()
            total -= size


def cached(what: dict, compute: Callable[[], dict]) -> dict:
    """``compute()`` (a dict of arrays) for the value ``what`` (a JSON-ready dict naming it completely), read from
    the cache when a sound entry exists, else computed and stored. With the cache off: ``compute()``."""
    root = active_directory()
    if root is None:
        STATS.computed += 1
        return compute()
    text = canonical(what)
    path = entry_path(root, text)
    found = read(path, text)
    if found is not None:
        arrays, seconds = found
        STATS.from_cache += 1
        STATS.seconds_saved += seconds
        return arrays
    t0 = time.perf_counter()
    arrays = compute()
    seconds = time.perf_counter() - t0
    STATS.computed += 1
    write(path, text, arrays, seconds)
    return arrays


def provenance(before: Stats) -> dict:
    """What a report records of the cache since ``before``: the directory (None: off), the values read from it and
    computed, entries rejected, and the seconds the read values had taken to compute."""
    d = STATS.since(before)
    root = active_directory()
    return {"directory": None if root is None else str(root), "from_cache": d.from_cache, "computed": d.computed,
            "rejected": d.rejected, "seconds_saved": round(d.seconds_saved, 3)}


def snapshot() -> Stats:
    """A copy of this process's counts (for :func:`provenance`)."""
    return dataclasses.replace(STATS)
