"""A cache of programs per kernel *object*: a kernel is looked up by identity, never by name or equality.

``functools.cache`` keys a callable by ``==``: two kernel objects that compare equal (a dataclass of options, an
object with ``__eq__``) would share one jitted program although their calls may differ. :func:`per_kernel` keys
by ``id(fn)`` and keeps ``fn`` alive with its entry, so an id is never reused while its entry exists.
:class:`Identity` is the same idea as a dictionary key: what keys a program, a runner or a signature by its kernel
(``ahead.py``'s jobs and signatures, ``validate``'s keys) holds ``Identity(fn)``, never ``fn`` itself.
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


class Identity:
    """A hashable handle on ``obj`` that equals only a handle on the very same object (``is``), never by ``==``;
    it holds ``obj``, so the id it hashes is not reused while the handle lives."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, Identity) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)

    def __repr__(self):
        return f"Identity({type(self.obj).__qualname__} at {id(self.obj):#x})"
