"""Provenance recorded in every report: the kernel's source hash, the checkout's commit, the device and versions."""

from __future__ import annotations

import platform
import subprocess
import time
from pathlib import Path

import jax

from ..running import flag_probe, xla_cpu

ROOT = Path(__file__).resolve().parents[2]


def kernel_notes(fn):
    """Notes a kernel declares about itself (e.g. a peer's documented domain), and the FLA keywords a family kernel
    takes through ``**kwargs`` but was probed to ignore or refuse (``ci/running/flag_probe.py``)."""
    note = getattr(fn, "note", None) or getattr(getattr(fn, "func", None), "note", None)
    return ([note] if note else []) + flag_probe.notes(fn)


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
        import jaxlib
        jaxlib_version = jaxlib.__version__
    except Exception:  # noqa: BLE001 - provenance only: a jaxlib that cannot say is recorded as unknown
        jaxlib_version = None
    return {
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "device_count": jax.device_count(),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib_version,
        "xla_flags": xla_cpu.in_force(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "git": git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }




def source_lines(kernels_out):
    """Console lines naming the code each kernel's verdict belongs to: its source sha256 and every module of it
    (through wrappers, factories and peers; ``ci/running/fingerprint.py``) with a short hash, by package."""
    lines = []
    for k in kernels_out:
        src = k.get("source") or {}
        packages = {}
        for module, h in (src.get("modules") or {}).items():
            package, _, name = module.rpartition(".")
            packages.setdefault(package, []).append(f"{name} {h[:8]}")
        mods = "; ".join(f"{p}.{{{', '.join(n)}}}" if p else ", ".join(n) for p, n in packages.items())
        lines.append(f"  {k['name']}: source {(src.get('sha256') or 'none')[:12]} = {mods or 'no module source found'}")
    return lines
