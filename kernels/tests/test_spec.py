"""The one kernel-spec grammar and its resolution (kernels/spec.py, docs/DESIGN.md §2): names, options, lists,
registration, which options a kernel takes."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from gdn2_oracle import kernels
from gdn2_oracle.kernels import spec


def _inputs(T=5, K=4, V=3):
    r = np.random.default_rng(0)
    q, k, g, b = (jnp.asarray(r.standard_normal((1, T, 1, K)), jnp.float32) for _ in range(4))
    v, w = (jnp.asarray(r.standard_normal((1, T, 1, V)), jnp.float32) for _ in range(2))
    return [q, k, v, -jnp.abs(g), b, w]


def external_kernel(q, k, v, g, b, w, *, scale=None, initial_state=None, chunk_size=16):
    """A stand-in external kernel for ``kernels.get("module:attr")``."""
    return kernels.get("pairwise", chunk_size=chunk_size)(q, k, v, g, b, w, scale=scale, initial_state=initial_state)


@pytest.mark.parametrize("text, specs", [
    ("factorized[chunk_size=32,leaf=8],pairwise", ["factorized[chunk_size=32,leaf=8]", "pairwise"]),
    ("pairwise", ["pairwise"]),
    (" a , b[x=(1,2),y='p,q'] ", ["a", "b[x=(1,2),y='p,q']"]),
    ("torch:m.n:f[order=qkvwbg,device=cpu],mod:fn", ["torch:m.n:f[order=qkvwbg,device=cpu]", "mod:fn"]),
])
def test_lists_split_at_commas_outside_brackets(text, specs):
    assert kernels.split_specs(text) == specs


@pytest.mark.parametrize("text", ["pairwise,,factorized", "pairwise[chunk_size=16", "pairwise]", ",", ""])
def test_malformed_lists_are_value_errors_naming_name(text):
    with pytest.raises(ValueError, match="^name: "):
        for item in kernels.split_specs(text):
            kernels.parse_spec(item)


def test_options_are_literals_else_strings_and_keys_are_unique():
    assert kernels.parse_spec("factorized[chunk_size=32,leaf=8]") == ("factorized", {"chunk_size": 32, "leaf": 8})
    assert kernels.parse_spec("m:f[a=None,b=xla,c=(1, 2)]") == ("m:f", {"a": None, "b": "xla", "c": (1, 2)})
    for bad in ("pairwise[chunk_size=16,chunk_size=32]", "torch:m:f[order=qkvgbw,order=qkvwbg]"):
        with pytest.raises(ValueError, match="given twice"):
            kernels.parse_spec(bad)
    with pytest.raises(ValueError, match="not of the form key=value"):
        kernels.parse_spec("pairwise[16]")


def test_accepts_is_declared_by_the_factory_not_sniffed_from_errors():
    assert kernels.accepts("factorized", "leaf") and not kernels.accepts("pairwise", "leaf")
    assert kernels.accepts("pallas-factorized", "interpret")
    assert kernels.accepts(f"{__name__}:external_kernel", "chunk_size")
    assert not kernels.accepts(f"{__name__}:external_kernel", "leaf")
    assert kernels.accepts("torch:m:f", "anything")  # passed to the torch function
    with pytest.raises(ValueError, match="does not accept \\['leaf'\\]"):
        kernels.get("pairwise", leaf=8)


def test_kernel_spec_labels_and_builds():
    s = kernels.KernelSpec.parse(" factorized[chunk_size=32] ")
    assert (s.spec, s.name, s.options) == ("factorized[chunk_size=32]", "factorized", {"chunk_size": 32})
    assert s.label({"leaf": 8}) == "factorized[chunk_size=32,leaf=8]"
    assert s.build(leaf=8).chunk_size == 32 and s.accepts("split")
    with pytest.raises(ValueError, match="unknown kernel"):
        kernels.KernelSpec.parse("nope").build()


def test_names_and_external_callables():
    assert {"pairwise", "factorized"} <= set(kernels.names())
    assert {"cp-factorized", "fla-gdn2-chunk", "atomic-ops"} <= set(kernels.known())
    fn = kernels.get(f"{__name__}:external_kernel", chunk_size=32)
    o, _ = fn(*_inputs())
    o_ref, _ = kernels.get("pairwise", chunk_size=32)(*_inputs())
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o_ref))
    with pytest.raises(ValueError, match="no_such_module_xyz"):
        kernels.get("no_such_module_xyz.sub:fn")
    with pytest.raises(ValueError, match="no attribute 'nope'"):
        kernels.get("gdn2_oracle.kernels:nope")
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        kernels.get("nope")


def test_register_and_unregister():
    factory = functools.partial(kernels.get, "factorized")
    try:
        kernels.register("test-factorized", factory)
        kernels.register("test-factorized", factory)  # idempotent
        assert "test-factorized" in kernels.names()
        assert kernels.get("test-factorized", chunk_size=16).chunk_size == 16
        with pytest.raises(ValueError, match="already registered"):
            kernels.register("test-factorized", kernels.get)
        with pytest.raises(ValueError, match="already registered"):
            kernels.register("pairwise", factory)
        for bad in ("a:b", "a[b]", "a,b", ""):
            with pytest.raises(ValueError, match="name"):
                kernels.register(bad, factory)
    finally:
        spec.unregister("test-factorized")
    assert "test-factorized" not in kernels.known()


def test_kernel_modules_do_not_register_themselves():
    """The registry maps names to "module:factory"; importing a kernel module adds no name."""
    import importlib

    before = kernels.known()
    for module in ("context_parallel", "pallas", "peers", "fla_peers", "torch_bridge"):
        importlib.import_module(f"gdn2_oracle.kernels.{module}")
    assert kernels.known() == before and not spec._REGISTERED


class _HubFunc:
    """What the Hugging Face Hub's ``use_kernel_forward_from_hub`` makes of a function (transformers' GDN and KDA
    fallbacks): a callable object whose ``__call__`` and ``forward`` pass everything on to a closure's function."""

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def _hub(fn):
    """``fn`` behind transformers' ``functools.wraps`` wrapper and the Hub's module, as transformers exports it."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        return fn(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return wrapped(*args, **kwargs)

    return type("Func", (_HubFunc,), {"forward": forward})()


def _fallback(query, key, value, g, beta, chunk_size=64, initial_state=None, use_qk_l2norm_in_kernel=False,
              **kwargs):
    """A signature like transformers' ``torch_chunk_gated_delta_rule``."""


def test_signatures_are_read_through_pass_through_wrappers():
    """A ``(*args, **kwargs)`` object is read through its ``forward``, a closure and ``__wrapped__`` to the function
    that names its parameters; a wrapper that names its own is not looked through."""
    import inspect

    hidden = _hub(_fallback)
    assert str(inspect.signature(hidden)) == "(*args, **kwargs)"
    assert spec.signature_of(hidden) == inspect.signature(_fallback)
    assert spec.keyword_names(hidden) == (frozenset(inspect.signature(_fallback).parameters) - {"kwargs"}, True)
    assert not spec.accepts_keywords(hidden, ("use_gate_in_kernel",), var_keyword=False)

    def own(*args, scale=None, **kwargs):
        return _fallback(*args, **kwargs)

    assert spec.keyword_names(own) == (frozenset({"scale"}), True)
