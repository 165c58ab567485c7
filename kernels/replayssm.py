"""vLLM's ReplaySSM Gated DeltaNet functions found by name: the kernel ``replayssm:PACKAGE[capacity=16,spec_len=4]``.

``PACKAGE`` is a package with vLLM's module and function names (docs/DESIGN.md §2, "Replay states and session
drivers"): ``PACKAGE.fused_recurrent_replayssm.fused_recurrent_gated_delta_rule_replayssm`` (one token per row) and
``PACKAGE.gdn_replayssm_spec_decode.{gdn_replayssm_spec_decode, commit_gdn_replayssm_spec,
reset_gdn_replayssm_spec_cursors}``: vLLM's own, ``vllm.model_executor.layers.fla.ops``, or the stand-in here,
``gdn2_oracle.kernels.replayssm_standin`` (torch on the CPU over our JAX replay kernel).

A :class:`ReplaySSMKernel` carries the four functions and the options of the storage a serving engine allocates:
``capacity`` (the ring L of the one-token path and the flush threshold ``max_cache_len`` of the window path),
``spec_len`` (the window path's ``max_spec_len``, raised to a session's longest window when that is longer),
``state_dtype`` (the one-token path's checkpoint; the window path's is float32, as vLLM forces it), ``cache_dtype``
(the ``d`` / ``k`` rings; default ``state_dtype``), the torch ``device`` (default CUDA when available),
``session_size`` (the serving sessions' size, ``oracle/serving_recipes.py: SIZES``: default ``k128``, K = V = 128
heads, the shapes vLLM launches at: its window path splits K into tiles of ``K / nk`` with ``nk`` 2 or 4 and needs
tiles of at least 16 for ``tl.dot``, so the small sessions' K = 16 is refused; ``small`` for a package that takes
them, e.g. the stand-in) and ``strict_drafts`` (a rejected NaN draft that reaches accepted outputs through a window's
arithmetic is graded FAIL, not only reported; docs/serving.md). Its ``session_driver`` tells the suite to run
serving sessions through a replay driver; the backend that calls the
functions is ``ci/running/replayssm_backend.py``. It has no call without a session.
"""

from __future__ import annotations

import importlib

import numpy as np

from .contract import storage_dtype
from .replay_kernel import MAX_CAPACITY, MAX_CAPACITY_WHY

PREFIX = "replayssm:"
# the serving session sizes (oracle/serving_recipes.py: SIZES; kernels never import oracle) and vLLM's
SESSION_SIZES = ("small", "k128")
SESSION_SIZE = "k128"
# module -> the functions looked up in it, by name
FUNCTIONS = {
    "fused_recurrent_replayssm": ("fused_recurrent_gated_delta_rule_replayssm",),
    "gdn_replayssm_spec_decode": ("gdn_replayssm_spec_decode", "commit_gdn_replayssm_spec",
                                  "reset_gdn_replayssm_spec_cursors"),
}


def _count(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


def find_functions(package):
    """``{function name: function}`` of :data:`FUNCTIONS` in ``package``; ValueError naming ``package`` when a module
    cannot be imported or lacks a function."""
    if not isinstance(package, str) or not package or not all(p.isidentifier() for p in package.split(".")):
        raise ValueError(f"package: expected a dotted package name, got {package!r}")
    found = {}
    for module_name, names in FUNCTIONS.items():
        target = f"{package}.{module_name}"
        try:
            module = importlib.import_module(target)
        except SystemExit as exc:
            raise ValueError(f"package: importing {target!r} called sys.exit({exc.code!r})") from None
        except Exception as exc:  # noqa: BLE001 - any import failure is reported with the package named
            raise ValueError(f"package: {package!r} has no module {module_name!r} ({type(exc).__name__}: {exc}); "
                             f"a ReplaySSM package has the modules {sorted(FUNCTIONS)}") from None
        for name in names:
            fn = getattr(module, name, None)
            if not callable(fn):
                raise ValueError(f"package: {package!r}: module {target!r} has no function {name!r}")
            found[name] = fn
    return found


class ReplaySSMKernel:
    """vLLM's ReplaySSM functions of ``package`` and the storage options (module docstring)."""

    session_driver = "replay"
    family = "gdn"
    serving_only = "vLLM's ReplaySSM functions run on a state cache only: no call without one"

    def __init__(self, package, capacity=16, spec_len=4, state_dtype="float32", cache_dtype=None, device=None,
                 session_size=SESSION_SIZE, strict_drafts=False):
        self.capacity, self.spec_len = _count("capacity", capacity), _count("spec_len", spec_len)
        if session_size not in SESSION_SIZES:
            raise ValueError(f"session_size: {session_size!r} not one of {SESSION_SIZES}")
        if strict_drafts not in (True, False, 0, 1):
            raise ValueError(f"strict_drafts: expected a boolean, got {strict_drafts!r}")
        self.session_size, self.strict_drafts = session_size, bool(strict_drafts)
        if self.capacity > MAX_CAPACITY:
            raise ValueError(f"capacity: {self.capacity} is over {MAX_CAPACITY} tokens ({MAX_CAPACITY_WHY})")
        if device is not None:  # checked now (a device this host lacks is a usage error, not a failed session)
            from .torch_bridge import resolve_device

            resolve_device(device)
        self.state_dtype = storage_dtype("state_dtype", state_dtype)
        self.cache_dtype = storage_dtype("cache_dtype", cache_dtype or state_dtype)
        self.device = device
        self.package = package
        functions = find_functions(package)
        self.recurrent = functions["fused_recurrent_gated_delta_rule_replayssm"]
        self.window = functions["gdn_replayssm_spec_decode"]
        self.commit = functions["commit_gdn_replayssm_spec"]
        self.reset = functions["reset_gdn_replayssm_spec_cursors"]
        self.__name__ = PREFIX + package
        # the sources a report's fingerprint covers (ci/running/fingerprint.py): the package's two modules and this
        self.modules = (*(f"{package}.{m}" for m in FUNCTIONS), __name__)

    def __repr__(self):
        return (f"ReplaySSMKernel({self.package!r}, capacity={self.capacity}, spec_len={self.spec_len}, "
                f"state_dtype={self.state_dtype!r}, cache_dtype={self.cache_dtype!r}, device={self.device!r}, "
                f"session_size={self.session_size!r}, strict_drafts={self.strict_drafts})")

    def __call__(self, q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False):
        """No call without a session: the kernel is judged on the gdn serving sessions (its replay driver)."""
        raise ValueError(f"kernel: {self.__name__!r} runs only on serving sessions (its replay driver, "
                         "ci/running/replayssm_backend.py): give validate the serving --modes")


def replayssm_kernel(package, capacity=16, spec_len=4, state_dtype="float32", cache_dtype=None, device=None,
                     session_size=SESSION_SIZE, strict_drafts=False):
    """The ``replayssm:PACKAGE`` spec's kernel: a :class:`ReplaySSMKernel`."""
    return ReplaySSMKernel(package, capacity, spec_len, state_dtype, cache_dtype, device, session_size, strict_drafts)
