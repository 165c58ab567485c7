"""Triton kernels on a CPU, in Triton's interpreter (``TRITON_INTERPRET=1``), for validation only.

The interpreter runs a ``@triton.jit`` kernel as NumPy code, program by program, on the host: no GPU, no
compiler, a few seconds for a small problem. It is how a kernel author runs FLA's Triton chunk kernels
(``kernels/fla_peers.py``, option ``interpret=1``) on a machine without a GPU. Three things make it usable:

* **Before or after Triton is imported.** ``triton.jit`` decides at decoration time whether a function becomes
  an ``InterpretedFunction`` or a compiled ``JITFunction``, and Triton's own library functions
  (``tl.sum``, ``tl.cumsum``, ``tl.max``, ... in ``triton/language/standard.py``) are decorated when
  ``triton`` is imported. Imported without the variable, those stay compiled functions and an interpreted
  kernel that calls them fails ("Cannot call @triton.jit'd outside of the scope of a kernel"; checked on
  triton 3.9.0); without a GPU a compiled kernel fails with "0 active drivers". :func:`enable` sets
  ``TRITON_INTERPRET=1``; when Triton was already imported without it (transformers imports FLA, and so Triton,
  when its models load), it also switches every ``JITFunction`` already made to the interpreter
  (:func:`interpret_loaded`: each gets the interpreter's methods, which Triton's knobs read at call time as
  well), so a kernel loaded before gives bit for bit what it gives when the variable was set first. The
  variable stays set for the process: every Triton kernel decorated afterwards is interpreted too.
* **Four shims** (:func:`install_shims`), each a workaround for the interpreter, not for the kernel:
  :func:`_largest_blocks_when_interpreting` (the autotuner), :func:`_loop_indices` (loop indices),
  :func:`_one_launch_at_a_time` (launches from two threads) and :func:`_patch_once_per_launch` (speed: one patch of
  ``triton.language`` per launch, not one per device-function call).
* **float32 only** (:data:`BF16_DOT_NOTE`): the interpreter's ``tl.dot`` on bfloat16 operands is wrong.

Nothing here imports Triton at module import; the functions do, when asked.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import math
import os
import sys
import threading

ENV = "TRITON_INTERPRET"
TRITON_PIN = "triton==3.9.0"  # the version these shims were written and checked against
_INSTALL = f"install Triton: pip install --no-deps '{TRITON_PIN}' (the fla extra lists it)"
BF16_DOT_NOTE = ("Triton's interpreter computes tl.dot on bfloat16 operands wrongly (relative error ~4e9 on a "
                 "16x16 product, triton 3.9.0), so interpreted Triton kernels are validated in float32 only")
_LOOP_HELPER = "_gdn2_oracle_loop_indices"  # the name the rewritten kernels call (shim 2)


def triton_installed():
    """Whether the ``triton`` package is imported or can be (found without importing it)."""
    if "triton" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def interpreting():
    """Whether ``TRITON_INTERPRET`` is on in this process (as Triton reads it: 1, true, on, yes)."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "on", "yes")


def enable(who="kernel"):
    """Put Triton into interpreter mode for this process and install the shims; returns the ``triton`` module.
    Triton imported before without ``TRITON_INTERPRET=1``: its JIT functions made so far are switched to the
    interpreter (:func:`interpret_loaded`).

    ValueError (naming ``interpret``) when Triton is not installed, or was imported without the internals the
    switch needs (then: start a fresh process, or set the variable before anything imports Triton).
    """
    if not triton_installed():
        raise ValueError(f"interpret: {who} runs in Triton's interpreter, but Triton is not installed; {_INSTALL}")
    if "triton" in sys.modules and not interpreting():
        try:
            from triton.runtime import interpreter, jit  # noqa: F401 - the switch's internals must exist
        except Exception as exc:  # noqa: BLE001 - a Triton without them cannot be switched: say how to start
            raise ValueError(f"interpret: {who} needs Triton's interpreter, but triton was already imported in this "
                             f"process without {ENV}=1 and its loaded JIT functions cannot be switched "
                             f"({type(exc).__name__}: {exc}); set {ENV}=1 in the environment before starting "
                             f"Python, or ask for this kernel before anything imports triton") from None
        os.environ[ENV] = "1"
        interpret_loaded()
    before = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        triton = importlib.import_module("triton")
    except Exception as exc:  # noqa: BLE001 - any import failure: say what to install
        if before is None:  # nothing was interpreted: leave the process as it was
            os.environ.pop(ENV, None)
        raise ValueError(f"interpret: cannot import triton ({type(exc).__name__}: {exc}); {_INSTALL}") from None
    install_shims()
    return triton


@functools.cache
def _interpreted_class():
    """A subclass of ``JITFunction`` whose methods are ``InterpretedFunction``'s (its instances' layout is
    ``JITFunction``'s, so a made one can take it as its class; Triton refuses ``InterpretedFunction`` itself)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    skip = ("__init__", "__dict__", "__weakref__", "__module__", "__doc__", "__orig_bases__", "__parameters__")
    methods = {n: v for n, v in vars(InterpretedFunction).items() if n not in skip}
    return type("InterpretedJITFunction", (JITFunction,), {**methods, "__module__": __name__})


def interpret_loaded():
    """Switch every compiled ``JITFunction`` alive in this process (found through the garbage collector: Triton's
    library functions, kernels of modules imported before, those inside autotuners and heuristics) to the
    interpreter, as ``triton.jit`` would have made it with ``TRITON_INTERPRET=1`` set: the same function and
    options, the interpreter's ``run`` and call. Returns how many were switched."""
    import gc

    from triton.runtime.interpreter import FunctionRewriter
    from triton.runtime.jit import JITFunction

    switched = _interpreted_class()
    count = 0
    for obj in gc.get_objects():
        if type(obj) is not JITFunction:
            continue
        options = dict(version=obj.version, do_not_specialize=obj.do_not_specialize,
                       do_not_specialize_on_alignment=obj.do_not_specialize_on_alignment, debug=obj.debug,
                       noinline=obj.noinline, repr=getattr(obj, "_repr", None), launch_metadata=obj.launch_metadata)
        obj.__class__ = switched
        obj.rewriter, obj.kwargs = FunctionRewriter(obj.fn, **options), options
        count += 1
    return count


# --- shim 1: the autotuner --------------------------------------------------------------------------------

def _largest_blocks_when_interpreting(prune_configs):
    """Shim 1, for ``triton.runtime.autotuner.Autotuner.prune_configs`` (triton 3.9.0).

    Works around: a kernel with several ``triton.Config``s is timed on first use (``Autotuner.run`` ->
    ``_bench`` -> ``driver.active.get_benchmarker()``), and without a GPU there is no active driver:
    "RuntimeError: 0 active drivers". FLA 0.6.0 autotunes nearly every kernel (``num_warps`` x
    ``num_stages``, and for some ``BK``/``BV``/``BH``). Here, when interpreting, the configs left after Triton's own
    pruning are cut to one (:func:`largest_blocks`), which is ``Autotuner.run``'s single-config path: nothing is
    timed, nothing runs twice (timing would run the kernel once per config, slowly, in the interpreter).

    Why the results do not change beyond what FLA itself varies: the interpreter ignores ``num_warps``,
    ``num_stages`` and the other launch settings, all that distinguishes most of FLA's configs. Where configs
    also differ in a block size (FLA 0.6.0: ``BK``/``BV`` of ``chunk_gdn2_bwd_kernel_wy_dqkg_fused``,
    ``chunk_gla_fwd_kernel_o``, ``chunk_gdn2_fwd_kernel_inter_solve_fused``, ``BS`` of
    ``chunk_local_cumsum_vector_kernel``, ``BH`` of the ``*_intra_token_parallel`` kernels), the tiling
    of a float32 sum changes and with it the last bits (first vs last config on T = 70, K = 32, V = 16: up to
    2.4e-7 absolute on O(1) results): the kept config is one of the launches FLA's own autotuner may pick on a
    GPU, where the choice is made by timing and so varies between machines; here it is deterministic. Compiled
    autotuning is left as it was.
    """

    def prune(self, kwargs):
        configs = prune_configs(self, kwargs)
        if _interpreting_now():
            return largest_blocks(configs)
        return configs

    prune.__wrapped__ = prune_configs
    prune.__doc__ = _largest_blocks_when_interpreting.__doc__
    return prune


def largest_blocks(configs):
    """``[config]``: the first of ``configs`` whose integer meta-parameters (block sizes: ``BK``, ``BV``, ``BH``,
    ``BS``, ...) have the largest product. The interpreter runs a kernel program by program in Python, each program
    one NumPy step per operation on its whole block, so larger blocks mean fewer programs: FLA's KDA chunk kernel
    (its ``BH`` heads a program) ran its T = 50 forward and backward in 5.7 s instead of 16 s with the first
    config, measured side by side."""
    configs = list(configs)

    def size(config):
        return math.prod(v for v in config.kwargs.values() if type(v) is int)

    return [max(configs, key=size)] if configs else configs


def _interpreting_now():
    from triton import knobs

    return bool(knobs.runtime.interpret)


# --- shim 2: loop indices ---------------------------------------------------------------------------------

class LoopIndex(int):
    """A ``for`` loop's index in an interpreted kernel: a Python int that also has ``.to(dtype)``.

    Compiled Triton makes the index of ``for i in range(n)`` an integer *tensor*, so kernels write
    ``i.to(tl.int64)`` (FLA 0.6.0: ``i_t_int64 = i_t.to(tl.int64)`` in ``fla/ops/common/chunk_delta_h.py``,
    ``chunk_h.py``, ``fused_chunk.py``, ...). The interpreter runs the loop as Python's ``range``, so the index
    is a plain int and ``.to`` fails: "AttributeError: 'int' object has no attribute 'to'". ``.to`` here is
    the tensor's: the same integer as an interpreter scalar tensor, cast to ``dtype``. Every other operation
    is int's own (``i * BT`` is a plain int, as the interpreter had it), so the kernel computes exactly what
    it computed before, with the one call that failed now working.
    """

    __slots__ = ()

    def to(self, dtype, *args, **kwargs):
        from triton.runtime.interpreter import _implicit_cvt

        return _implicit_cvt(int(self)).to(dtype, *args, **kwargs)


def _loop_indices(iterable):
    """Shim 2: the items of a kernel's ``for`` loop, ints as :class:`LoopIndex` (bools and tensors as they are)."""
    for item in iterable:
        yield LoopIndex(item) if type(item) is int else item


def _loop_transformer(base):
    """The interpreter's AST rewriter (``FunctionRewriter.ast_transformer``) plus: ``for x in it`` runs as
    ``for x in _gdn2_oracle_loop_indices(it)`` (shim 2)."""

    class LoopIndexTransformer(base):
        def visit_For(self, node):  # ast.NodeTransformer's naming
            node = self.generic_visit(node)
            node.iter = ast.copy_location(
                ast.Call(func=ast.Name(id=_LOOP_HELPER, ctx=ast.Load()), args=[node.iter], keywords=[]), node.iter)
            return node

    return LoopIndexTransformer()


def _with_loop_helper(compile_and_exec):
    """``FunctionRewriter._compile_and_exec`` with the shim's helper visible to the rewritten kernel (its module's
    globals get the one name ``_gdn2_oracle_loop_indices``; the interpreter puts its own names there the same way)."""

    def run(self, transformed_ast):
        self.fn.__globals__.setdefault(_LOOP_HELPER, _loop_indices)
        return compile_and_exec(self, transformed_ast)

    run.__wrapped__ = compile_and_exec
    return run


# --- shim 3: one interpreted launch at a time ------------------------------------------------------------

_LAUNCH = threading.RLock()


def _one_launch_at_a_time(call):
    """Shim 3, for ``triton.runtime.interpreter.GridExecutor.__call__`` (triton 3.9.0).

    Works around: the interpreter keeps a launch's state in globals (the grid and program index in
    ``interpreter_builder``, ``triton.language``'s builtins re-bound to itself and restored when the launch ends),
    so two launches in two threads corrupt each other: "ValueError('x >= grid_dim[0]')", or "Did you forget to add
    @triton.jit ?" once the other launch restored the builtins. validate traces the next case on a lookahead
    thread (ci/running/ahead.py), and tracing a torch kernel runs it once on zeros (kernels/torch_bridge.py's
    probe) while the main thread runs the current case: 45 of 49 cases of ``validate --kernel
    'fla-gdn2-chunk[interpret=1]' --cases quick`` ended in those errors. Each launch now holds one process-wide lock
    (reentrant). Nothing is lost: the interpreter is Python and NumPy steps under one GIL, so two launches never ran
    side by side anyway.
    """

    def run(self, *args, **kwargs):
        with _LAUNCH:
            outer = _Launch.thread, _Launch.patched
            _Launch.thread, _Launch.patched = threading.get_ident(), frozenset()  # shim 4: a launch begins
            try:
                return call(self, *args, **kwargs)
            finally:
                _Launch.thread, _Launch.patched = outer

    run.__wrapped__ = call
    return run


# --- shim 4: one patch of triton.language per launch ----------------------------------------------------

class _Launch:
    """The launch in progress (:func:`_one_launch_at_a_time` sets it): its thread and the ids of the
    ``triton.language`` modules patched since it began."""

    thread = None
    patched = frozenset()


class _Unpatched:
    """The patch scope of a device call that patched nothing: nothing to restore."""

    @staticmethod
    def restore():
        pass


def _patch_once_per_launch(patch_lang):
    """Shim 4, for ``triton.runtime.interpreter._patch_lang`` (triton 3.9.0): a speed-up; the kernels' results do not
    change (bit for bit, tested).

    Works around: every call of a ``@triton.jit`` device function (``tl.sum``, ``tl.cumsum``, FLA's ``exp``, ...)
    inside a kernel, in every program of the grid, patches ``triton.language`` again
    (``InterpretedFunction.__call__`` -> ``_patch_lang``: ``inspect.getmembers`` over ``tl``, ``tl.core``,
    ``tl.math`` and ``tl.tensor``, about a millisecond), though nothing restores the launch's patch before the launch
    ends: a second patch of a module finds its builtins replaced already and sets its other names to equal
    functions. A quarter of the interpreter's time on FLA's KDA chunk kernel. Within a launch, the first patch of
    each module is made as before (the launch's own; a device function's module the launch had not patched) and the
    later ones are skipped; outside a launch, or on another thread, every patch is made as before.
    """

    from triton import language as tl  # imported already: the interpreter being shimmed imports it

    def patch(fn):
        if _Launch.thread != threading.get_ident():
            return patch_lang(fn)
        langs = {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}
        if langs and langs <= _Launch.patched:
            return _Unpatched
        scope = patch_lang(fn)
        _Launch.patched |= langs
        return scope

    patch.__wrapped__ = patch_lang
    return patch


def install_shims():
    """Install the four shims into the imported Triton (idempotent). Triton must be imported in interpreter mode."""
    from triton.runtime import autotuner, interpreter

    if getattr(autotuner.Autotuner.prune_configs, "__wrapped__", None) is None:
        autotuner.Autotuner.prune_configs = _largest_blocks_when_interpreting(autotuner.Autotuner.prune_configs)
    rewriter = interpreter.FunctionRewriter
    if getattr(rewriter._compile_and_exec, "__wrapped__", None) is None:
        rewriter.ast_transformer = _loop_transformer(type(rewriter.ast_transformer))
        rewriter._compile_and_exec = _with_loop_helper(rewriter._compile_and_exec)
        # A kernel rewritten before shim 2 was installed would keep its unshimmed code.
        interpreter.InterpretedFunction.rewritten_fn.clear()
    if getattr(interpreter.GridExecutor.__call__, "__wrapped__", None) is None:
        interpreter.GridExecutor.__call__ = _one_launch_at_a_time(interpreter.GridExecutor.__call__)
    if getattr(interpreter._patch_lang, "__wrapped__", None) is None:
        interpreter._patch_lang = _patch_once_per_launch(interpreter._patch_lang)
