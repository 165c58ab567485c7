"""A cache of programs per kernel *object*: a kernel is looked up by identity, never by name or equality.

``functools.cache`` keys a callable by ``==``: two kernel objects that compare equal (a dataclass of options, an
object with ``__eq__``) would share one jitted program although their calls may differ. :func:`per_kernel` keys
by ``id(fn)`` and keeps ``fn`` alive with its entry, so an id is never reused while its entry exists.
"""

from __future__ import annotations

import functools


def per_kernel(make):
    """``make(fn, *rest)`` cached per kernel object ``fn`` (identity) and the other arguments (hashed as usual)."""
    entries: dict = {}

    @functools.wraps(make)
    def cached(fn, *rest):
        key = (id(fn), *rest)
        held = entries.get(key)
        if held is None or held[0] is not fn:
            held = entries[key] = (fn, make(fn, *rest))
        return held[1]

    cached.cache_clear = entries.clear
    return cached
