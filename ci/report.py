"""Report helpers shared by ``gdn2-oracle validate`` and ``bench``: kernel specs, provenance, JSON, tables, plot."""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]


class UsageError(ValueError):
    """A command-line problem (unknown kernel, import failure, bad option): exit status 2."""


# --- kernel specs ---------------------------------------------------------------------------

@dataclass
class KernelSpec:
    """A kernel named on the command line: ``NAME``, ``package.module:attr``, optionally ``[key=value,...]``."""

    spec: str
    name: str
    options: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, text):
        from gdn2_oracle.kernels import parse_spec  # noqa: PLC0415

        try:
            name, options = parse_spec(text)
        except ValueError as exc:
            raise UsageError(f"--kernel {text!r}: {str(exc).removeprefix('name: ')}") from None
        return cls(text.strip(), name, options)

    @staticmethod
    def split(text):
        """The specs in a ``--kernel`` value: ``"a,b[x=1,y=2]"`` -> ``["a", "b[x=1,y=2]"]`` (commas inside
        ``[...]`` separate options, not kernels); UsageError for an empty item or unbalanced brackets."""
        items, depth, start = [], 0, 0
        for i, ch in enumerate(text):
            if ch == "[":
                depth += 1
            elif ch == "]":
                depth -= 1
                if depth < 0:
                    break
            elif ch == "," and depth == 0:
                items.append(text[start:i])
                start = i + 1
        if depth != 0:
            raise UsageError(f"--kernel {text!r}: unbalanced '[' ']'")
        items.append(text[start:])
        if not all(item.strip() for item in items):
            raise UsageError(f"--kernel {text!r}: empty kernel name in the comma-separated list")
        return [item.strip() for item in items]

    def label(self, extra=None):
        opts = {**self.options, **(extra or {})}
        if not opts:
            return self.name
        return f"{self.name}[{','.join(f'{k}={v}' for k, v in opts.items())}]"

    def build(self, **extra):
        """The kernel callable (``kernels.get``); UsageError with the registry's message on failure."""
        from gdn2_oracle import kernels  # noqa: PLC0415

        _ensure_peers()
        try:
            return kernels.get(self.name, **{**self.options, **extra})
        except ValueError as exc:
            raise UsageError(f"--kernel {self.spec}: {exc}") from None
        except SystemExit as exc:  # a kernel module that calls sys.exit() on import
            raise UsageError(f"--kernel {self.spec}: building it called sys.exit({exc.code!r})") from None
        except Exception as exc:  # noqa: BLE001 - a broken external factory is a usage problem too
            raise UsageError(f"--kernel {self.spec}: {type(exc).__name__}: {exc}") from None


def _ensure_peers():
    """Make the optional peer adapters (kernels/peers.py) known to the registry (no-op if already)."""
    try:
        from gdn2_oracle.kernels import peers  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001 - peers are optional
        pass


def kernel_notes(fn):
    """Notes a kernel declares about itself (e.g. a peer's documented domain)."""
    note = getattr(fn, "note", None) or getattr(getattr(fn, "func", None), "note", None)
    return [note] if note else []


# --- provenance -----------------------------------------------------------------------------

def _root_object(fn):
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _module_of(obj):
    mod = inspect.getmodule(obj)
    if mod is None and not inspect.isfunction(obj) and not inspect.isclass(obj):
        mod = sys.modules.get(type(obj).__module__)
    return mod


def _package_of(module_name):
    """The package a module's kernel code belongs to: its top-level package, or for ours the
    subpackage (``gdn2_oracle.kernels``), so a kernel's hash never covers the oracle or the CLI."""
    parts = module_name.split(".")
    return ".".join(parts[:2]) if parts[0] == "gdn2_oracle" else parts[0]


def kernel_modules(fn):
    """The modules whose source defines kernel ``fn``: its module and, recursively, the modules of
    the same top-level package it refers to (or ``fn.modules`` when the kernel lists them)."""
    listed = getattr(fn, "modules", None)
    if listed:
        import importlib  # noqa: PLC0415
        return [importlib.import_module(m) for m in listed]
    start = _module_of(_root_object(fn))
    if start is None:
        return []
    top = _package_of(start.__name__)
    seen, todo = {}, [start]
    while todo:
        mod = todo.pop()
        if mod.__name__ in seen:
            continue
        seen[mod.__name__] = mod
        if top in ("__main__",):
            continue
        for value in list(vars(mod).values()):
            if inspect.ismodule(value):
                dep = value
            else:
                name = getattr(value, "__module__", None)
                if not isinstance(name, str):
                    continue
                dep = sys.modules.get(name)
            if dep is not None and _package_of(dep.__name__) == top and dep.__name__ not in seen:
                todo.append(dep)
    return [seen[n] for n in sorted(seen)]


def source_sha256(fn):
    """``{"sha256": hex over all modules' sources, "modules": {module: sha256}}`` for kernel ``fn``."""
    per, total = {}, hashlib.sha256()
    for mod in kernel_modules(fn):
        try:
            src = inspect.getsource(mod)
        except (OSError, TypeError):
            src = ""
        h = hashlib.sha256(src.encode("utf-8")).hexdigest()
        per[mod.__name__] = h
        total.update(f"{mod.__name__}\0{h}\n".encode())
    return {"sha256": total.hexdigest() if per else None, "modules": per}


def git_commit():
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout holding this package."""
    def run(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    try:
        head = run("rev-parse", "HEAD")
        if head.returncode:
            return {"commit": None, "dirty": None}
        dirty = run("status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def environment():
    """Device and software provenance recorded in every report."""
    dev = jax.devices()[0]
    try:
        import jaxlib  # noqa: PLC0415
        jaxlib_version = jaxlib.__version__
    except Exception:  # noqa: BLE001
        jaxlib_version = None
    return {
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "device_count": jax.device_count(),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib_version,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "git": git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# --- JSON -----------------------------------------------------------------------------------

def jsonable(x):
    """Plain-JSON form: non-finite floats become the strings "inf", "-inf", "nan"."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if hasattr(x, "item") and not isinstance(x, (list, tuple, dict)):
        x = x.item()
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    return x


def write_json(path, data):
    """Write ``data`` as plain JSON, atomically (a temporary file beside ``path``, then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(jsonable(data), indent=1, allow_nan=False) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def output_path(text, *, option, default_name, suffixes):
    """The file an output option (``--json``, ``--plot``) will write, checked before any work.

    An existing directory (or a path ending in ``/``) means ``<dir>/<default_name>``. The file must end
    in one of ``suffixes`` and its directory must be creatable and writable (probed by creating and
    removing a temporary file there). UsageError naming the option otherwise.
    """
    path = Path(text)
    if path.is_dir() or str(text).endswith(("/", os.sep)):
        path = path / default_name
    if path.suffix.lower() not in suffixes:
        raise UsageError(f"{option} {text}: expected a {' or '.join(suffixes)} file or a directory")
    if path.is_dir():
        raise UsageError(f"{option} {text}: {path} is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.with_name(f".{path.name}.{os.getpid()}.probe")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{option} {text}: cannot write to {path.parent} ({exc.strerror or exc})") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {text}: {path} is not writable")
    return path


# --- tables ---------------------------------------------------------------------------------

def table(headers, rows, aligns=None):
    """A fixed-width text table; ``aligns`` is a string of '<' / '>' per column."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]
    aligns = aligns or "<" * len(headers)
    fmt = "  ".join(f"{{:{a}{w}}}" for a, w in zip(aligns, widths))
    out = [fmt.format(*headers), "  ".join("-" * w for w in widths)]
    out += [fmt.format(*r) for r in rows]
    return "\n".join(out)


def fmt_err(x):
    return "inf" if x == float("inf") else ("nan" if x != x else f"{x:.2e}")


def progress(*, total, desc="", unit="it"):
    """Progress on stderr: a tqdm bar on a terminal, else a line every few seconds (``golden.progress``)."""
    from gdn2_oracle.golden.progress import Progress  # noqa: PLC0415

    return Progress(total, desc, unit)
