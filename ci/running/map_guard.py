"""Keeps a long process below Linux's limit on memory mappings (``vm.max_map_count``), which compiled programs fill.

Each XLA CPU executable holds a few hundred memory mappings for as long as it lives (LLVM's JIT code and data: about
380 for a family kernel's forward and VJP, measured), and JAX's caches keep every executable a process compiled. After
a few hundred programs a process reaches the limit (65,530 by default): LLVM fails ("LLVM compilation error: Cannot
allocate memory") and XLA then crashes with a segfault inside ``backend_compile_and_load``; a test worker died so in
this suite's fresh-clone runs (docs/DESIGN.md §4). :func:`relieve`, called between units of work (the pytest plugin
after each test, the commands' run loop after each unit), clears JAX's caches when the process holds more than
:data:`FRACTION` of the limit; programs a caller still holds keep working, the others are compiled again if needed.
"""

from __future__ import annotations

import gc
import sys

MAPS = "/proc/self/maps"
LIMIT_FILE = "/proc/sys/vm/max_map_count"
DEFAULT_LIMIT = 65530  # Linux's default vm.max_map_count
FRACTION = 0.5


def mappings() -> int | None:
    """The number of memory mappings this process holds (None where ``/proc`` does not say: not Linux)."""
    try:
        with open(MAPS, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


def limit() -> int:
    """The most mappings a process may hold (``vm.max_map_count``; the Linux default where it cannot be read)."""
    try:
        with open(LIMIT_FILE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return DEFAULT_LIMIT


def relieve(fraction: float = FRACTION) -> bool:
    """Clear JAX's caches (``jax.clear_caches``, then a garbage collection) when this process holds more than
    ``fraction`` of its mapping limit; whether it did. Never imports JAX: a process without it has nothing to clear."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction: expected a number in (0, 1], got {fraction!r}")
    jax = sys.modules.get("jax")
    held = mappings()
    if jax is None or held is None or held <= fraction * limit():
        return False
    jax.clear_caches()
    gc.collect()
    return True
