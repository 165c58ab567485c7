"""Putting a serving (decode) kernel to work on a :class:`ci.grading.serving.Session` and judging it.

Which kernels take part (:func:`accepts_serving`), by the names their signature takes:

* ``state_pool`` (+ ``state_indices``, ``cu_seqlens``, ``num_accepted_tokens``, ``scale``): the suite's decode
  contract (``kernels/decode.py``, docs/DESIGN.md §2 "Decode contract"); a JAX function returning
  ``(o, new_pool)`` (a functional pool update);
* FLA's keywords ``initial_state`` + ``ssm_state_indices`` (+ ``cu_seqlens``, ``num_accepted_tokens``,
  ``inplace_final_state``): the convention of FLA's ``fused_recurrent_gdn2_fwd``. This is the one a torch kernel
  (a ``torch:`` spec) must use: it is called through ``kernels/serving_bridge.py`` with the pool as
  ``initial_state`` and ``inplace_final_state=True``, and its pool is read back after the call (an in-place
  update). A JAX function with these names is called the same way and must return ``(o, new_pool)``.

A ``**kwargs``-only signature does not take part: FLA's public ``fused_recurrent_gdn2`` has one, and silently
drops the slot arguments. A kernel's pool dtype is its ``state_dtype`` attribute (``decode[state_dtype=bfloat16]``)
or, for a ``torch:`` spec, its ``state_dtype`` option; float32 otherwise. Inputs are handed over in the session's
input dtype (exact), indices as int32 (``cu_seqlens`` int64 to torch).

:class:`ServingCase` (``describe()``, ``run(fn)``, ``release()``) is what ``validate --modes decode,speculative``
runs: :func:`serving_cases` gives them for ``oracle/serving_recipes.py``'s recipes.
"""

from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np

from gdn2_oracle.kernels.serving_bridge import TorchDecode, takes_fla_pool
from gdn2_oracle.kernels.spec import accepts_keywords
from gdn2_oracle.kernels.torch_bridge import TorchKernel
from gdn2_oracle.oracle import serving_recipes as recipes

from ..grading.result import CaseResult
from ..grading.serving import STATE_DTYPES, Session
from .harness import host_cast, to_device

CONVENTIONS = ("pool", "fla")  # state_pool / FLA's initial_state + ssm_state_indices


def _named(fn, name):
    """Whether ``fn``'s signature names the keyword ``name`` (not through ``**kwargs``)."""
    return accepts_keywords(fn, (name,), var_keyword=False)


def convention(fn):
    """``"pool"`` (takes ``state_pool``), ``"fla"`` (takes ``initial_state`` and ``ssm_state_indices``; a torch
    kernel must) or None (not a serving kernel)."""
    if isinstance(fn, TorchKernel):
        return "fla" if takes_fla_pool(fn.fn) else None
    if _named(fn, "state_pool"):
        return "pool"
    return "fla" if takes_fla_pool(fn) else None


def accepts_serving(fn) -> bool:
    """Whether kernel ``fn`` (as ``kernels.get`` builds it) can be run on a state pool (module docstring)."""
    return convention(fn) is not None


def state_dtype(fn):
    """The dtype kernel ``fn`` stores its pool in: its ``state_dtype`` (attribute, or a ``torch:`` option)."""
    if isinstance(fn, TorchKernel):
        sd = fn.kwargs.get("state_dtype", "float32")
    else:
        sd = getattr(fn, "state_dtype", None) or getattr(fn, "keywords", {}).get("state_dtype", "float32")
    sd = jnp.dtype(sd).name
    if sd not in STATE_DTYPES:
        raise ValueError(f"state_dtype: {sd!r} not one of {STATE_DTYPES}")
    return sd


class ServingRunner:
    """One kernel's decode calls on NumPy arguments: :meth:`step` ``(call, pool, dtype) -> (o, new_pool)``."""

    def __init__(self, fn):
        conv = convention(fn)
        if conv is None:
            raise ValueError(f"kernel: {getattr(fn, '__name__', fn)!r} takes no state pool (neither state_pool nor "
                             "FLA's initial_state + ssm_state_indices by name): not a serving kernel")
        self.fn, self.convention = fn, conv
        self.torch = None
        if isinstance(fn, TorchKernel):
            options = {k: v for k, v in fn.kwargs.items() if k != "output_final_state"}
            self.torch = TorchDecode(fn.fn, name=fn.__name__, device=fn.device, options=options)
        self.state_dtype = state_dtype(fn)
        self._inplace = self.torch is None and conv == "fla" and _named(fn, "inplace_final_state")

    def pool(self, values):
        """The initial pool in the kernel's state dtype (NumPy; ``values`` exact in it)."""
        return host_cast(np.asarray(values, np.float32), self.state_dtype)

    def step(self, call, pool, dtype):
        """Run one :class:`DecodeCall` on ``pool`` with inputs in ``dtype``: ``(o, new_pool)`` as NumPy arrays."""
        bk = call.bookkeeping()
        if self.torch is not None:
            xs = [host_cast(x, dtype) for x in call.inputs()]
            return self.torch(*xs, state_pool=pool, **bk)
        xs = [to_device(x, dtype) for x in call.inputs()]
        ints = {k: jnp.asarray(np.asarray(v).astype(np.int32)) for k, v in bk.items() if k != "scale"}
        scale = bk.get("scale")
        if self.convention == "pool":
            out = self.fn(*xs, state_pool=jnp.asarray(pool), scale=scale, **ints)
        else:
            ints["ssm_state_indices"] = ints.pop("state_indices")
            extra = {"inplace_final_state": True} if self._inplace else {}
            out = self.fn(*xs, initial_state=jnp.asarray(pool), scale=scale, **ints, **extra)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError(f"o: a serving kernel returns (o, new_pool), got {type(out).__name__}")
        return np.asarray(out[0]), np.asarray(out[1])


def run_session(fn, session: Session, *, keep=False):
    """Run kernel ``fn`` (or a :class:`ServingRunner`) on every call of ``session``, chained on its own pool, and
    grade it (``ci/grading/serving.py``): the Report, or with ``keep`` ``(report, [(o, pool after), ...])``."""
    runner = fn if isinstance(fn, ServingRunner) else ServingRunner(fn)
    judge = session.judge(runner.state_dtype)
    pool = runner.pool(session.initial_pool())
    kept = []
    for i, call in enumerate(session.calls):
        o, new_pool = runner.step(call, pool, session.dtype)
        judge.add(i, o, pool, new_pool)
        if keep:
            kept.append((o, new_pool))
        pool = new_pool
    return (judge.report(), kept) if keep else judge.report()


class ServingCase:
    """A serving session as a case (``ci/running/cases.py``'s protocol): ``name``, ``dtype``, ``shape``, ``modes``,
    ``describe()``, ``run(kernel, mesh)``, ``release()``."""

    compiles_ahead = False  # a kernel's decode calls compile as they run

    def __init__(self, session: Session):
        self.session = session
        self.name, self.dtype, self.mode, self.modes = session.name, session.dtype, session.mode, session.modes
        self.shape = session.shape

    def describe(self):
        return self.session.describe()

    def run(self, fn, mesh=None, *, capture=False, program=None) -> CaseResult:
        """Judge kernel ``fn`` on the session's calls chained on its own pool (no mesh: a decode call is not
        sharded); a kernel that raises, or is no serving kernel, fails the case. Nothing is captured for
        ``--dump``: the result's ``arrays`` are empty."""
        t0 = time.perf_counter()
        arrays = {} if capture else None
        try:
            report = run_session(fn, self.session)
        except Exception as exc:  # noqa: BLE001 - a kernel that raises (or is no serving kernel) fails this case
            return CaseResult.failed(self.describe(), exc, time.perf_counter() - t0, arrays=arrays)
        return CaseResult.judged(self.describe(), report, time.perf_counter() - t0, arrays=arrays)

    def release(self):
        self.session.release()


def serving_cases(dtypes=("float32", "bfloat16"), seed=0, modes=recipes.MODES, only=None):
    """The serving cases (:class:`ServingCase`) of ``oracle/serving_recipes.py`` for ``dtypes`` and ``modes``."""
    return [ServingCase(Session.from_script(s)) for s in recipes.sessions(dtypes, seed, modes, only)]
