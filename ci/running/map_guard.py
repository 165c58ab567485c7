"""Keeps a long process below Linux's limit on memory mappings (``vm.max_map_count``), which compiled programs fill.

Each XLA CPU executable holds a hundred or a few hundred memory mappings for as long as it lives (LLVM's JIT code
and data: about 380 for a family kernel's forward and VJP, measured; 86 with the judging commands' CPU flags,
``xla_cpu.py``), and JAX's caches keep every executable a process compiled. After a few hundred programs a process
reaches the limit (65,530 by default): LLVM fails ("LLVM compilation error: Cannot allocate memory") and XLA then
crashes with a segfault inside ``backend_compile_and_load``; a test worker died so in this suite's fresh-clone runs
(docs/DESIGN.md §4). :func:`relieve`, called between units of work (the pytest plugin after each test, the commands'
run loop after each unit), clears JAX's caches when the process holds more than :data:`FRACTION` of the limit;
programs a caller still holds keep working, the others are compiled again if needed.

Counting is not free (``/proc/self/maps`` is read whole: ~20 ms at 17,000 mappings, after every test and every case),
and only a program JAX builds adds mappings that clearing its caches gives back, so :func:`relieve` counts again only
once :data:`EVERY` programs were built since its last count (JAX's backend-compile event, a compile or a read from the
persistent cache), or after :data:`CALLS` calls (should something unregister the listener). 16 programs hold ~6,000
mappings, well inside the 32,765 between half the default limit and the limit.
"""

from __future__ import annotations

import gc
import sys

MAPS = "/proc/self/maps"
LIMIT_FILE = "/proc/sys/vm/max_map_count"
DEFAULT_LIMIT = 65530  # Linux's default vm.max_map_count
FRACTION = 0.5
EVERY = 16  # programs JAX may build between two counts
CALLS = 64  # calls between two counts, whatever the listener saw
BUILT_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT

_built = 0  # programs JAX built in this process since the listener was registered
_counted_at = None  # _built when the mappings were last counted (None: never)
_calls = 0  # calls since the last count


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


def _on_event(event, duration, **kwargs):
    global _built
    if event == BUILT_EVENT:
        _built += 1


def relieve(fraction: float = FRACTION, every: int = EVERY) -> bool:
    """Clear JAX's caches (``jax.clear_caches``, then a garbage collection) when this process holds more than
    ``fraction`` of its mapping limit; whether it did. The mappings are counted on the first call and then once
    ``every`` programs were built since the last count (0: every call) or :data:`CALLS` calls went by. Never imports
    JAX: a process without it has nothing to clear."""
    global _counted_at, _calls
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction: expected a number in (0, 1], got {fraction!r}")
    if not isinstance(every, int) or every < 0:
        raise ValueError(f"every: expected a whole number of programs >= 0, got {every!r}")
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    if _counted_at is None:
        jax.monitoring.register_event_duration_secs_listener(_on_event)
    elif _built - _counted_at < every and _calls < CALLS:
        _calls += 1
        return False
    _counted_at, _calls = _built, 0
    held = mappings()
    if held is None or held <= fraction * limit():
        return False
    jax.clear_caches()
    gc.collect()
    return True
