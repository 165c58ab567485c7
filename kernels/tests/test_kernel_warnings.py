"""A kernel's own warnings are reported at the kernel, not at the suite's line that called it
(kernels/kernel_warnings.py): a warning a kernel raises with ``stacklevel=2`` names the kernel's file and first line
and its name, whatever option wraps it; one raised at the kernel's own line keeps it; the filters in force apply.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle.kernels import kernel_warnings, spec

HERE = __name__  # specs "module:attr" of this module resolve by this name
B, T, H, K = 1, 4, 1, 8


class KernelWarning(UserWarning):
    """A package's own warning category."""


def inputs():
    x = jnp.ones((B, T, H, K), jnp.float32)
    return x, x, x, -0.1 * x, 0.5 * x, x


def at_caller(q, k, v, g, b, w, *, scale=None, initial_state=None, qk_norm=False):
    """Warns at its caller (``stacklevel=2``), as a library's deprecation does."""
    warnings.warn("chunk sizes below 64 are slow", KernelWarning, stacklevel=2)
    return v, jnp.zeros((q.shape[0], q.shape[2], q.shape[3], v.shape[3]), jnp.float32)


def at_own_line(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """Warns at its own line (``stacklevel=1``)."""
    warnings.warn("own line", KernelWarning, stacklevel=1)
    return v, jnp.zeros((q.shape[0], q.shape[2], q.shape[3], v.shape[3]), jnp.float32)


OWN_LINE = inspect.getsourcelines(at_own_line)[1] + 2


def make(*, chunk=64):
    """A factory warning at its caller, whose kernel does too."""
    warnings.warn(f"factory chunk={chunk}", KernelWarning, stacklevel=2)
    return at_caller


def fails_after_warning(q, k, v, g, b, w, *, scale=None, initial_state=None):
    warnings.warn("about to fail", KernelWarning, stacklevel=2)
    raise RuntimeError("the kernel's own error")


def outer(q, k, v, g, b, w, *, scale=None, initial_state=None):
    """A kernel calling another kernel built from a spec."""
    return spec.get(f"{HERE}:at_caller")(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


def recorded(fn, *args, action="always", **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        fn(*args, **kwargs)
    return caught


def assert_at(w, fn, text, name):
    assert w.category is KernelWarning and isinstance(w.message, KernelWarning), w
    assert Path(w.filename).resolve() == Path(__file__).resolve(), w.filename
    assert w.lineno == inspect.getsourcelines(fn)[1], (w.lineno, fn)
    assert str(w.message) == f"kernel {name!r}: {text}", str(w.message)


@pytest.mark.parametrize("options", ["", "[rename=qk_norm:use_qk_l2norm_in_kernel]", "[order=qkvgbw]",
                                     "[layout=bhtk]", "[modes=dense]", "[pad=K16T8]", "[o_dtype=float32]",
                                     "[qk_norm=True]"])
def test_a_warning_at_the_caller_is_reported_at_the_kernel_through_every_option(options):
    kernel = spec.KernelSpec.parse(f"{HERE}:at_caller{options}").build()
    (w,) = recorded(kernel, *inputs())
    assert_at(w, at_caller, "chunk sizes below 64 are slow", f"{HERE}:at_caller")


def test_under_jit_the_warning_is_reported_at_trace_time():
    kernel = spec.get(f"{HERE}:at_caller[order=qkvgbw]")
    (w,) = recorded(jax.jit(kernel), *inputs())
    assert_at(w, at_caller, "chunk sizes below 64 are slow", f"{HERE}:at_caller")
    o, _ = jax.jit(kernel)(*inputs())
    np.testing.assert_array_equal(o, inputs()[2])


def test_a_factory_and_its_kernel_are_both_reported_at_themselves():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = spec.KernelSpec.parse(f"{HERE}:make[factory=1,chunk=32]").build()
        kernel(*inputs())
    first, second = caught
    assert_at(first, make, "factory chunk=32", f"{HERE}:make")
    assert_at(second, at_caller, "chunk sizes below 64 are slow", f"{HERE}:make")


def test_a_registered_factory_is_reported_at_itself():
    spec.register("test-warning-kernel", f"{HERE}:make")
    try:
        caught = recorded(spec.get, "test-warning-kernel", chunk=16)
    finally:
        spec.unregister("test-warning-kernel")
    (w,) = caught
    assert_at(w, make, "factory chunk=16", "test-warning-kernel")


def test_a_warning_at_the_kernels_own_line_keeps_its_place():
    (w,) = recorded(spec.get(f"{HERE}:at_own_line[order=qkvgbw]"), *inputs())
    assert Path(w.filename).resolve() == Path(__file__).resolve() and w.lineno == OWN_LINE, w
    assert str(w.message) == "own line" and w.category is KernelWarning


def test_the_filters_in_force_apply():
    kernel = spec.get(f"{HERE}:at_caller[modes=dense]")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(KernelWarning, match=f"kernel '{HERE}:at_caller': chunk sizes"):
            kernel(*inputs())
    assert recorded(kernel, *inputs(), action="ignore") == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=KernelWarning, module=HERE)  # the kernel's module, as warn() has it
        kernel(*inputs())
    assert caught == []


def test_the_default_action_shows_a_warning_once_per_place():
    kernel = spec.get(f"{HERE}:at_caller")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            kernel(*inputs())
        assert len(caught) == 1
        warnings.filterwarnings("default", category=DeprecationWarning)  # the filters changed: shown again
        kernel(*inputs())
    assert len(caught) == 2
    assert len(recorded(lambda: [kernel(*inputs()) for _ in range(3)])) == 3  # always: every time


def test_a_kernel_that_raises_after_warning_reports_both():
    kernel = spec.get(f"{HERE}:fails_after_warning")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="the kernel's own error"):
            kernel(*inputs())
    (w,) = caught
    assert_at(w, fails_after_warning, "about to fail", f"{HERE}:fails_after_warning")


def test_a_kernel_calling_a_kernel_reports_the_warning_once_at_the_inner_one():
    (w,) = recorded(spec.get(f"{HERE}:outer"), *inputs())
    assert_at(w, at_caller, "chunk sizes below 64 are slow", f"{HERE}:at_caller")


def test_the_wrapped_kernel_keeps_its_signature_and_attributes():
    at_caller.family = "gdn2"
    try:
        kernel = spec.get(f"{HERE}:at_caller")
        assert kernel is not at_caller and kernel.__wrapped__ is at_caller and kernel.family == "gdn2"
        assert inspect.signature(kernel) == inspect.signature(at_caller) and kernel.__name__ == "at_caller"
    finally:
        del at_caller.family


class NeedsTwo(UserWarning):
    def __init__(self, text, code):
        super().__init__(text)
        self.code = code


def test_a_warning_class_with_another_constructor_keeps_its_class():
    out = kernel_warnings.prefixed(NeedsTwo("slow", 7), "kernel 'x': ")
    assert type(out) is NeedsTwo and str(out) == "kernel 'x': slow" and out.code == 7


def torch_at_caller(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False):
    """A torch kernel warning at its caller (the torch bridge)."""
    from gdn2_oracle.kernels.testing_torch import recurrent

    warnings.warn("torch kernel at its caller", KernelWarning, stacklevel=2)
    return recurrent(q, k, v, g, b, w, scale=scale, initial_state=initial_state, output_final_state=output_final_state)


def test_a_torch_kernel_is_reported_at_itself():
    pytest.importorskip("torch")
    kernel = spec.get(f"torch:{HERE}:torch_at_caller[output_final_state=True]")
    caught = recorded(kernel, *inputs())
    assert caught, "no warning"
    for w in caught:
        assert_at(w, torch_at_caller, "torch kernel at its caller", f"torch:{HERE}:torch_at_caller")
