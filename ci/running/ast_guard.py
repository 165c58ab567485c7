"""``ast.parse`` made safe to call from several threads at once (CPython's AST constructor is not).

CPython up to 3.12 keeps the AST constructor's recursion counter in per-interpreter state: two threads turning a
parse into Python ``ast`` objects at the same time (a switch happens inside it whenever a gc callback runs) reset
each other's counter, and one of them raises ``SystemError: AST constructor recursion depth mismatch (before=72,
after=42)`` (python/cpython#106905). A run has such threads: the compile-ahead threads trace kernels, and tracing
parses (``inspect.signature`` of a builtin reads its text signature with ``ast.parse``; so do ``ast.literal_eval``
and Triton's interpreter), while the main thread judges. :func:`install` wraps ``ast.parse`` -- which
``literal_eval``, ``inspect`` and every library reach through the module attribute -- in one process-wide lock,
so no two parses overlap. The suite's own import walk does not parse at all (``reference_cache._imports`` reads
bytecode). Installed by every command's process (``ci/cli.py``) and by the conformance suite's conftest.
"""

from __future__ import annotations

import ast
import functools
import threading

_LOCK = threading.RLock()  # re-entrant: a gc callback run inside a parse may itself parse on the same thread


def install():
    """Wrap ``ast.parse`` in the process-wide lock (once; idempotent). Returns the function now installed."""
    if getattr(ast.parse, "gdn2_serialised", False):
        return ast.parse
    unlocked = ast.parse

    @functools.wraps(unlocked)
    def parse(*args, **kwargs):
        with _LOCK:
            return unlocked(*args, **kwargs)

    parse.gdn2_serialised = True
    ast.parse = parse
    return parse
