"""Run a kernel with the contract of docs/DESIGN.md §2 on an oracle Problem: forward and all seven gradients."""

from __future__ import annotations

import contextlib
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np

from gdn2_oracle import oracle
from gdn2_oracle.golden.processes import by_signal
from gdn2_oracle.oracle import KERNEL_DTYPES, RESULTS

from ..grading.case import Case
from ..grading.tolerance import Report, agreement, dtype_name
from . import mesh as mesh_lib
from . import program_cache, supervised
from .per_kernel import Identity, per_kernel


def check_dtype(dtype):
    """The JAX dtype of a kernel input dtype name (one of ``oracle.KERNEL_DTYPES``)."""
    if dtype not in KERNEL_DTYPES:
        raise ValueError(f"dtype: {dtype!r} not one of {KERNEL_DTYPES}")
    return jnp.dtype(dtype)


class ContractError(ValueError):
    """A kernel's results break the contract of docs/DESIGN.md §2; the message says how, in plain words."""


class KernelError(RuntimeError):
    """A kernel raised inside a host callback (e.g. a torch kernel); the message is the callback's exception."""


def o_dtype_hint(name, got, declared):
    """What to add to a wrong-dtype message: for an ``o`` returned in float32 by a kernel that declares no
    ``o_dtype``, the spec option that accepts it."""
    if name != "o" or declared or jnp.dtype(got) != jnp.dtype(jnp.float32):
        return ""
    return "; a kernel that returns o in float32 whatever its inputs is run with the spec option o_dtype=float32"


def check_results(out, q, v, o_dtype=None):
    """ContractError unless ``out`` is ``(o, final_state)``: o ``[B, T, H, V]`` in v's dtype (or the ``o_dtype``
    the kernel declares), the final state ``[B, H, K, V]`` float32, for inputs ``q`` ``[B, T, H, K]`` and ``v``
    (NaN/inf is judged by the tolerance)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    o_want = (jnp.dtype(o_dtype), " (the kernel's o_dtype)") if o_dtype else (jnp.dtype(v.dtype), " (v's dtype)")
    want = {"o": ((B, T, H, V), *o_want),
            "final_state": ((B, H, K, V), jnp.dtype(jnp.float32), "")}
    if not isinstance(out, (tuple, list)):
        what = f"one array of shape {tuple(out.shape)}" if hasattr(out, "shape") else f"a {type(out).__name__}"
        raise ContractError(f"returned {what}, expected 2 results (o, final_state)")
    if len(out) != len(want):
        raise ContractError(f"returned {len(out)} results, expected 2 (o, final_state)")
    for (name, (shape, dtype, why)), x in zip(want.items(), out):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise ContractError(f"returned {name} = {x!r:.60}, expected an array of shape {shape}")
        if tuple(x.shape) != shape:
            raise ContractError(f"returned {name} of shape {tuple(x.shape)}, expected {shape}")
        if jnp.dtype(x.dtype) != dtype:
            raise ContractError(f"returned {name} of dtype {jnp.dtype(x.dtype).name}, expected {dtype.name}{why}"
                                + o_dtype_hint(name, x.dtype, o_dtype))


@per_kernel
def runner(fn):
    """A jitted ``(inputs, h0, do, dfs, scale) -> results`` for kernel ``fn`` (compiled once per shape);
    a result that breaks the contract raises ContractError while tracing. One per kernel object
    (``per_kernel.py``): two kernels that compare equal or share a name get programs of their own."""

    def run(inputs, h0, do, dfs, scale):
        def call(q, k, v, g, b, w, h0):
            out = fn(q, k, v, g, b, w, scale=scale, initial_state=h0)
            check_results(out, q, v, getattr(fn, "o_dtype", None))
            return tuple(out)

        (o, S), pullback = jax.vjp(call, *inputs, h0)
        grads = pullback((do.astype(o.dtype), dfs))
        return (o, S) + tuple(grads)

    return jax.jit(run, static_argnames="scale")


def host_cast(x, dtype):
    """``x`` rounded to ``dtype`` on the host (NumPy / ml_dtypes, round to nearest even).

    Not ``jnp.asarray(x, dtype)``: that compiles an XLA ``convert_element_type`` program for every new shape
    and dtype (39 of the 77 programs of a ``validate --cases quick`` run were these)."""
    return np.asarray(x).astype(jnp.dtype(dtype))


def to_device(x, dtype):
    """``x`` in ``dtype`` as a JAX array: cast on the host (:func:`host_cast`), then transferred."""
    return jax.device_put(host_cast(x, dtype))


def device_inputs(problem: oracle.Problem, do, dfinal_state, dtype="float32"):
    """The problem's inputs and cotangents as JAX arrays in the kernel's input dtype."""
    jdt = check_dtype(dtype)
    inputs = tuple(to_device(x, jdt) for x in problem.inputs())
    return inputs, to_device(problem.h0(), jnp.float32), to_device(do, jdt), to_device(dfinal_state, jnp.float32)


def program_signature(fn, problem: oracle.Problem, dtype):
    """What decides the program :func:`runner` compiles for ``fn`` on ``problem``: the kernel object (by identity:
    two kernels that compare equal are two programs), the input shapes, the dtype and the (static) scale."""
    return Identity(fn), tuple(x.shape for x in problem.inputs()), jnp.dtype(dtype).name, problem.scale


def lower(fn, problem: oracle.Problem, dtype, *, cache=False):
    """Trace and lower :func:`runner`'s forward-and-gradients program for ``problem`` in ``dtype`` on abstract
    values (``ci/running/ahead.py`` compiles it; the compiled program takes ``(inputs, h0, do, dfs)``).
    ``cache``: through the program cache (``ci/running/program_cache.py``): the program is always traced, and a
    call to the exported program stored under the traced program's content key is lowered instead of it."""
    jdt, S = check_dtype(dtype), jax.ShapeDtypeStruct
    B, T, H, K = problem.q.shape
    V = problem.v.shape[-1]
    state = S((B, H, K, V), jnp.float32)
    args = (tuple(S(x.shape, jdt) for x in problem.inputs()), state, S((B, T, H, V), jdt), state)
    program = runner(fn)
    traced = program.trace(*args, problem.scale)
    if cache:
        signature = {"inputs": [list(x.shape) for x in problem.inputs()], "dtype": jdt.name,
                     "scale": repr(problem.scale)}
        exp = program_cache.exported(traced, signature, lambda: jax.export.export(program)(*args, problem.scale),
                                     lambda: program.trace(*args, problem.scale))
        if exp is not None:
            return jax.jit(exp.call).lower(*args)
    return traced.lower()


def kernel_results(fn, problem: oracle.Problem, do, dfinal_state, *, dtype="float32", mesh=None, program=None):
    """``{name: np.ndarray}`` for o, final_state and the seven gradients, in the dtypes the kernel returned.

    The kernel sees exactly the problem's values (they are representable in ``dtype`` when the
    problem was generated or rounded for it; otherwise the rounding is the caller's choice).
    With a ``mesh`` (ci/running/mesh.py; default: the one set by ``jax.set_mesh``, if any) the inputs are placed
    with NamedSharding and the kernel runs inside it. ``program()``: the program compiled ahead of time
    (``ci/running/ahead.py``; None or a raise as when tracing it), else it is compiled on this call.
    """
    inputs, h0, jdo, jdfs = device_inputs(problem, do, dfinal_state, dtype)
    mesh = mesh_lib.current() if mesh is None else mesh
    if mesh is not None:
        (*inputs, jdo), h0 = mesh_lib.place(mesh, (*inputs, jdo), h0)
    try:
        with quiet_callback_failures(), mesh_lib.using(mesh), guarded():
            compiled = program() if program is not None and mesh is None else None
            if compiled is not None:
                out = compiled(tuple(inputs), h0, jdo, jdfs)
            else:
                out = runner(fn)(tuple(inputs), h0, jdo, jdfs, problem.scale)
            out = jax.block_until_ready(out)
    except Exception as exc:
        line = host_callback_error(exc)
        if line is None:
            raise
        raise KernelError(line) from None
    return {name: mesh_lib.to_host(x) for name, x in zip(RESULTS, out)}


@contextlib.contextmanager
def guarded():
    """Around a kernel call: ``sys.exit()``, ``os._exit()`` (once ``supervised.guard_exit`` is installed), a
    ``KeyboardInterrupt`` raised by the kernel itself or a ``BaseException`` of the kernel's own class becomes a
    :class:`KernelError` (the case fails, the run goes on); a real Ctrl-C or SIGTERM still stops the run."""
    try:
        with supervised.kernel_call():  # os._exit in the kernel raises (supervised.guard_exit) instead of ending us
            yield
    except supervised.ProcessExitInKernel as exc:
        raise KernelError(str(exc)) from None
    except SystemExit as exc:
        raise KernelError(f"the kernel called sys.exit({exc.code!r})") from None
    except KeyboardInterrupt:
        if by_signal():
            raise
        raise KernelError("the kernel raised KeyboardInterrupt itself (no Ctrl-C was pressed)") from None
    except (Exception, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - a kernel's own BaseException subclass: the kernel's error
        raise KernelError(f"the kernel raised {type(exc).__module__}.{type(exc).__qualname__} (a BaseException, "
                          f"not an Exception): {exc}") from exc


_CALLBACK_LOGGER = "jax._src.callback"  # logs a failed callback's traceback; we report its last line instead


class _DropCallbackTracebacks(logging.Filter):
    def filter(self, record):
        return not record.getMessage().startswith("jax.pure_callback failed")


@contextlib.contextmanager
def quiet_callback_failures():
    """While a kernel runs, drop JAX's log of a failed host callback (its error is reported by KernelError)."""
    logger, quiet = logging.getLogger(_CALLBACK_LOGGER), _DropCallbackTracebacks()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def host_callback_error(exc):
    """``"Type: message"`` of the exception a host callback raised, from the traceback JAX puts in the
    runtime error's text (None if ``exc`` did not come from a callback)."""
    text = str(exc).rstrip()
    if "callback" not in text.lower() or "Traceback (most recent call last)" not in text:
        return None
    m = re.match(r"^([\w.]+): (.*)$", text.splitlines()[-1].strip())
    return f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}" if m else text.splitlines()[-1].strip()


def check_representable(problem: oracle.Problem, dtype):
    """Raise ValueError if the problem's inputs are not exactly representable in ``dtype``."""
    jdt = check_dtype(dtype)
    for name, x in zip(oracle.INPUTS, problem.inputs()):
        if not np.array_equal(host_cast(x, jdt).astype(np.float64), x):
            raise ValueError(f"{name}: values are not exactly representable in {dtype}; "
                             f"generate the problem with precision={dtype!r}")


def validate(fn, problem: oracle.Problem, do, dfinal_state, *, dtype="float32", ref=None) -> Report:
    """Run ``fn`` and judge it against the float64 oracle (or a given reference, e.g. a golden)."""
    check_representable(problem, dtype)
    got = kernel_results(fn, problem, do, dfinal_state, dtype=dtype)
    return Case.of(problem, do, dfinal_state, dtype=dtype, ref=ref).judge(got)


def piece(problem: oracle.Problem, lo, hi, initial_state):
    """Tokens ``[lo, hi)`` of ``problem`` (``hi`` None: to the end) starting from ``initial_state``."""
    return oracle.Problem(*(x[:, lo:hi] for x in problem.inputs()), scale=problem.scale, initial_state=initial_state)


def carried_results(fn, problem: oracle.Problem, do, dfinal_state, t, *, dtype="float32"):
    """``{name: np.ndarray}`` of the nine results as two calls give them: ``[0, t)``, then ``[t, T)`` from the first
    call's final state (docs/DESIGN.md §2's state carry). The forward outputs are concatenated along T, the final
    state is the second call's; the gradients chain the two calls' VJPs: the second call's ``dh0`` is the first
    call's final-state cotangent, ``dh0`` is the first call's. Three kernel calls: the first piece's forward (its
    final state), the second piece, the first piece again with the chained cotangent."""
    first_fwd = kernel_results(fn, piece(problem, 0, t, problem.initial_state), do[:, :t], dfinal_state,
                               dtype=dtype)  # dfinal_state: a placeholder, only its final state is used
    second = kernel_results(fn, piece(problem, t, None, first_fwd["final_state"].astype(np.float64)), do[:, t:],
                            dfinal_state, dtype=dtype)
    first = kernel_results(fn, piece(problem, 0, t, problem.initial_state), do[:, :t],
                           second["dh0"].astype(np.float64), dtype=dtype)
    out = {"final_state": second["final_state"], "dh0": first["dh0"]}
    for name in RESULTS:
        if name not in out:
            out[name] = np.concatenate([first[name], second[name]], axis=1)
    return {name: out[name] for name in RESULTS}


def validate_carried(fn, problem: oracle.Problem, do, dfinal_state, t, *, dtype="float32"):
    """``(report, agreement)``: :func:`carried_results` of ``fn`` split at ``t`` judged against the float64 oracle,
    and against ``fn``'s one call on the whole problem (``tolerance.agreement``: the tight agreement bound)."""
    check_representable(problem, dtype)
    whole = kernel_results(fn, problem, do, dfinal_state, dtype=dtype)
    got = carried_results(fn, problem, do, dfinal_state, t, dtype=dtype)
    case = Case.of(problem, do, dfinal_state, dtype=dtype)
    dtypes = {n: dtype_name(got[n]) for n in RESULTS}
    return case.judge(got), agreement(problem, got, whole, case.reference(), case.baseline(dtypes), dtype,
                                      what="carried~one call", cum=lambda: case.cum_baseline(dtypes))
